"""crashreplay's engine against the numpy transcription of the HF modeling code
(numpy_reference.py, itself checked against transformers' logits in
test_fidelity.py), on the tiny random checkpoints `crashreplay make-model`
writes: every architecture and quantization it has, default toggles (NVFP4
as nvfp4_activation=w4a16: the transcription does not quantize activations).

Tolerance: |engine - reference| <= 2e-3 + 2e-3 * |reference| on every logit
of the prefill and of each greedy decode step. Both compute in float32 with
K/V rounded to bf16; they differ in summation order (the engine sums in 8
fixed lanes) and, rarely, in the bf16 rounding of a K/V element whose float32
value differs in the last bit, which moves a logit by ~1e-3 at most for these
sizes. Observed max |engine - reference| over the 20 GQA cases: 1.4e-6 .. 6.7e-5,
and 1.5e-3 for llama/mxfp4 (the size of such a rounding). Greedy tokens must be equal
wherever the reference's top two logits differ by more than the tolerance.

One wider tolerance, 5e-3 + 5e-3 * |reference|: DSA models (deepseek_v32,
glm_moe_dsa) with fp8 weights. Their decode is always the absorbed form,
which reads kv_b_proj dequantized to bf16 (as sglang's w_kc / w_vc are),
while the reference multiplies by the exact fp8 x scale products; that
rounding is ~2^-9 of each weight. Observed max |engine - reference| on the
MLA cases: 1.1e-5 .. 1.3e-4, and 3.1e-3 / 3.4e-3 for glm_moe_dsa / deepseek_v32
with fp8 weights.
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
ARCHS = ["llama", "qwen3", "qwen3_moe", "mixtral", "glm4_moe", "deepseek_v3", "deepseek_v32", "glm_moe_dsa"]
QUANTS = ["bf16", "fp8", "nvfp4", "mxfp4"]


def run(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, check=False)


@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("arch", ARCHS)
def test_engine_logits_match_numpy_reference(tmp_path, arch, quant):
    model = tmp_path / "model"
    r = run("make-model", str(model), "--arch", arch, "--quant", quant, "--seed", "7")
    assert r.returncode == 0, r.stderr
    dump = tmp_path / "dump"
    prompt = "Say hello in one sentence"
    sets = ["--set", "nvfp4_activation=w4a16"] if quant == "nvfp4" else []
    r = run("run", str(model), "--prompt", prompt, "--max-new-tokens", "4", "--dump", str(dump), "--json", *sets)
    assert r.returncode == 0, r.stderr
    config, tensors = ref.load_checkpoint(str(model))
    tokens = list(prompt.encode())
    steps = sorted(os.listdir(dump))
    assert len(steps) == 4
    for i, name in enumerate(steps):
        got = ref.read_safetensors(str(dump / name))
        want = ref.forward(config, tensors, tokens)[-1]
        logits = got["logits"][0]
        atol, rtol = (5e-3, 5e-3) if arch in ("deepseek_v32", "glm_moe_dsa") and quant == "fp8" else (ATOL, RTOL)
        err = np.abs(logits - want) - (atol + rtol * np.abs(want))
        assert err.max() <= 0, f"{arch}/{quant} step {i}: max excess {err.max():.3g} at token {int(err.argmax())}"
        nxt = int(got["next_tokens"][0])
        top2 = np.sort(want)[-2:]
        if top2[1] - top2[0] > atol + rtol * abs(top2[1]):
            assert nxt == int(np.argmax(want)), f"{arch}/{quant} step {i}: greedy token differs"
        tokens.append(nxt)  # teacher-force the engine's choice
