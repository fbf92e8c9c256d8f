"""crashreplay's engine against transformers itself, without torch: tiny
checkpoints written by transformers 5's `save_pretrained` (and nvidia-modelopt's
`export_hf_checkpoint` for the quantized ones) with transformers' own float32
logits stored beside them (tests/data/fidelity/<case>/golden.safetensors;
python/tests/fidelity_cases.py wrote them, scripts/fidelity.sh rewrites them).

Per case, with default toggles (plus the case's `engine_sets`, only where the
reference computes something other than the checkpoint's serving default):
prefill + 8 greedy decode steps; the greedy tokens equal transformers', and
every logit is within ATOL + RTOL * |hf| (2e-4 + 2e-4 |hf|) of transformers'
with K and V rounded to bf16 as they enter the cache (the engine's bf16 KV
cache; for MLA the latent and the DSA indexer's keys). Observed max
|engine - hf|: 8e-7 .. 3.1e-5 (MLA / DSA cases: 8.4e-7 .. 1.5e-6).

The numpy transcription (numpy_reference.py) is checked against the same
logits computed without that rounding (HF as shipped), within the same
tolerance, so it is itself tested against transformers in CI before
test_reference_logits.py uses it on `make-model` checkpoints.
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import fidelity_cases as fc  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data", "fidelity")
BIN = os.environ.get("CRASHREPLAY_BIN", os.path.join(ROOT, "build", "tools", "crashreplay"))
CASES = sorted(d for d in os.listdir(DATA) if os.path.isfile(os.path.join(DATA, d, "golden.safetensors")))

# What the engine must say about each case (a substring of one of its notes);
# every other case runs without a note.
EXPECTED_NOTES = {
    "llama_both_forms": "using rope_scaling, which transformers 5 reads over rope_parameters",
    "mistral": "sliding_window 4096",
    "llama_fp8": "(W8A16)",
}


def test_every_case_of_the_generator_is_shipped():
    assert CASES == sorted(c.name for c in fc.CASES)


@pytest.mark.parametrize("case", CASES)
def test_engine_matches_transformers_with_default_toggles(case, tmp_path):
    g, _ = fc.golden(os.path.join(DATA, case))
    logits, tokens, notes, _ = fc.run_engine(BIN, os.path.join(DATA, case), str(tmp_path))
    assert tokens == [int(t) for t in g["tokens"]], f"{case}: greedy tokens {tokens} vs transformers {list(g['tokens'])}"
    excess, worst = fc.excess(logits, g["logits"])
    assert excess <= 0, f"{case}: max |engine - transformers| = {worst:.3g}"
    want = EXPECTED_NOTES.get(case)
    if want is None:
        assert notes == [], f"{case}: unexpected notes {notes}"
    else:
        assert any(want in n for n in notes), f"{case}: no note containing '{want}' in {notes}"


@pytest.mark.parametrize("case", CASES)
def test_numpy_reference_matches_transformers(case):
    g, _ = fc.golden(os.path.join(DATA, case))
    excess, worst = fc.excess(fc.numpy_logits(os.path.join(DATA, case)), g["logits_fp32kv"])
    assert excess <= 0, f"{case}: max |numpy - transformers| = {worst:.3g}"


def test_rope_config_legacy_ignores_rope_parameters_and_says_so(tmp_path):
    # A transformers 5 file has only rope_parameters; an engine reading only
    # rope_theta/rope_scaling runs default RoPE (theta 10000): other tokens, and a note.
    d = os.path.join(DATA, "llama_llama3_rope")
    g, _ = fc.golden(d)
    _, tokens, notes, stderr = fc.run_engine(BIN, d, str(tmp_path), ["rope_config=legacy"])
    assert tokens != [int(t) for t in g["tokens"]]
    assert any("rope_config=legacy" in n and "ignores config.json's rope_parameters" in n for n in notes), notes
    assert "crashreplay: note: rope_config=legacy" in stderr


def test_rope_config_rope_parameters_on_a_legacy_file_says_so(tmp_path):
    _, _, notes, _ = fc.run_engine(BIN, os.path.join(DATA, "llama_legacy_linear"), str(tmp_path),
                                   ["rope_config=rope_parameters"])
    assert any("the file has no rope_parameters" in n for n in notes), notes
