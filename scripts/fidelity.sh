#!/usr/bin/env bash
# The fidelity run: crashreplay's engine against transformers itself.
#
#   bash scripts/fidelity.sh            # fresh checkpoints in a temp dir, compare, print the table
#   bash scripts/fidelity.sh --update   # the same, written over tests/data/fidelity (CI's golden data)
#
# scripts/test-engines.sh --fidelity does the work: in its virtual
# environment (torch, transformers, nvidia-modelopt at the versions it
# prints; the same knobs), with crashreplay built, it writes every case of
# python/tests/fidelity_cases.py with transformers' `save_pretrained`
# (ModelOpt's `export_hf_checkpoint` for the quantized ones) together with
# transformers' float32 logits (K/V rounded to bf16) for prefill + 8 greedy
# decode steps - CI's golden data - and runs the engine on each with default
# toggles: greedy tokens equal and every logit within 2e-4 + 2e-4 |hf|, and
# the numpy transcription within the same of transformers as shipped. Then
# python/tests/test_hf_transformers.py on the same checkpoints (the engine
# against transformers in float64, within 1e-5 (1 + |ref|)). Exit 0 when
# everything holds.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  "") exec bash scripts/test-engines.sh --fidelity ;;
  --update) exec bash scripts/test-engines.sh --fidelity --update ;;
  *) echo "usage: bash scripts/fidelity.sh [--update]" >&2; exit 2 ;;
esac
