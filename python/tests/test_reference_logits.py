"""crashreplay's engine against an independent numpy transcription of the HF
modeling code (numpy_reference.py), on tiny random bf16 checkpoints written by
`crashreplay make-model`.

Tolerance: |engine - reference| <= 2e-3 + 2e-3 * |reference| on every logit of
the prefill and of each greedy decode step. Both compute in float32; they
differ in summation order (the engine sums in 8 fixed lanes) and, rarely, in a
bf16 rounding of a K/V element whose float32 value differs in the last bits,
which moves a logit by ~1e-3 at most for these sizes. Greedy tokens must be
equal wherever the reference's top two logits differ by more than the
tolerance.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import numpy_reference as ref  # noqa: E402

BIN = os.environ.get("CRASHREPLAY_BIN", "build/tools/crashreplay")
ATOL = 2e-3
RTOL = 2e-3


def run(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, check=False)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen3_moe"])
def test_engine_logits_match_numpy_reference(tmp_path, arch):
    model = tmp_path / "model"
    r = run("make-model", str(model), "--arch", arch, "--quant", "bf16", "--seed", "7")
    assert r.returncode == 0, r.stderr
    dump = tmp_path / "dump"
    prompt = "Say hello in one sentence"
    r = run("run", str(model), "--prompt", prompt, "--max-new-tokens", "4", "--dump", str(dump), "--json")
    assert r.returncode == 0, r.stderr
    config, tensors = ref.load_checkpoint(str(model))
    tokens = list(prompt.encode())
    steps = sorted(os.listdir(dump))
    assert len(steps) == 4
    for i, name in enumerate(steps):
        got = ref.read_safetensors(str(dump / name))
        want = ref.forward(config, tensors, tokens)[-1]
        logits = got["logits"][0]
        err = np.abs(logits - want) - (ATOL + RTOL * np.abs(want))
        assert err.max() <= 0, f"{arch} step {i}: max excess {err.max():.3g} at token {int(err.argmax())}"
        nxt = int(got["next_tokens"][0])
        top2 = np.sort(want)[-2:]
        if top2[1] - top2[0] > ATOL + RTOL * abs(top2[1]):
            assert nxt == int(np.argmax(want)), f"{arch} step {i}: greedy token differs"
        tokens.append(nxt)  # teacher-force the engine's choice
