#!/usr/bin/env bash
# The fidelity run: crashreplay's engine against transformers itself.
#
#   bash scripts/fidelity.sh            # fresh checkpoints in a temp dir, compare, print the table
#   bash scripts/fidelity.sh --update   # the same, written over tests/data/fidelity (CI's golden data)
#
# Installs what is missing (torch, transformers, nvidia-modelopt from PyPI;
# torch is a multi-GB wheel, which is why CI does not run this), builds
# crashreplay, writes every case of python/tests/fidelity_cases.py with
# transformers' `save_pretrained` (ModelOpt's `export_hf_checkpoint` for the
# quantized ones: bf16 and fp32 checkpoints, odd sizes, random norm weights
# and biases) together with transformers' float32 logits for prefill + 8
# greedy decode steps, then runs the engine on each with default toggles and
# compares: greedy tokens equal, every logit within 2e-4 + 2e-4 |hf| of
# transformers with K/V rounded to bf16 (the engine's KV cache), and the numpy
# transcription within the same of transformers as shipped. Then the torch
# tests (python/tests/test_hf_transformers.py). Exit 0 when everything holds.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
update=0
[ "${1:-}" = "--update" ] && update=1

missing=()
for mod in torch transformers modelopt safetensors numpy pytest; do
  $PY -c "import $mod" 2>/dev/null || missing+=("$mod")
done
if [ ${#missing[@]} -gt 0 ]; then
  pkgs=()
  for m in "${missing[@]}"; do
    case "$m" in
      modelopt) pkgs+=(nvidia-modelopt) ;;
      *) pkgs+=("$m") ;;
    esac
  done
  echo "fidelity: installing ${pkgs[*]} from PyPI"
  $PY -m pip install -q --disable-pip-version-check "${pkgs[@]}"
fi

bash scripts/build.sh >/dev/null
BIN=$PWD/${CRASHREPLAY_BUILD_DIR:-build}/tools/crashreplay

if [ $update = 1 ]; then
  out=tests/data/fidelity
  rm -rf "$out"
else
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
$PY -c 'import torch, transformers, modelopt; print(f"torch {torch.__version__}, transformers {transformers.__version__}, nvidia-modelopt {modelopt.__version__}")'
$PY python/tests/fidelity_cases.py write "$out" 2>/dev/null | sed 's/^/  /'
$PY python/tests/fidelity_cases.py compare "$out" --bin "$BIN"
FIDELITY_DIR=$out CRASHREPLAY_BIN=$BIN $PY -m pytest -q -p no:warnings python/tests/test_hf_transformers.py
