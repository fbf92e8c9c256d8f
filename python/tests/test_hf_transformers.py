"""crashreplay's engine against Hugging Face transformers' own modeling code
(PyTorch eager), on tiny random checkpoints written by `crashreplay make-model`.

Runs only where torch and transformers are installed (they are not part of CI:
the torch wheel on PyPI is a CUDA build of several GB); CI covers the same
ground with the numpy transcription in test_reference_logits.py.

Quantized checkpoints: transformers cannot run FP8-block / NVFP4 / MXFP4
weights on CPU, so this test dequantizes them itself (torch's float8_e4m3fn
and float8_e8m0fnu decoders, an e2m1 table, ModelOpt's low-nibble-first
packing) into a float32 checkpoint of the same architecture and loads that
with `AutoModelForCausalLM`. The engine runs on the quantized checkpoint with
its default dequantize-then-matmul backend and bf16 activations (NVFP4 with
`nvfp4_activation=w4a16`: the w4a4 default quantizes activations too), so the two
compute the same function up to summation order and the engine's bf16 KV
cache.

Tolerance: |engine - hf| <= 2e-2 + 2e-2 * |hf| on every logit of the prefill
and of each greedy decode step (HF recomputes the whole sequence in float32
each step). The engine stores K and V in bf16; HF keeps them in float32. On
these sizes that moves logits by up to ~1e-2: measured max |engine - hf|
1.05-1.31e-2 for bf16 checkpoints, 1.2-2.2e-2 for fp8/nvfp4/mxfp4 (whose
larger weights give larger logits); a numpy transcription that skips the
bf16 rounding of K and V matches HF to ~2e-6.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import numpy_reference as ref  # noqa: E402

BIN = os.environ.get("CRASHREPLAY_BIN", "build/tools/crashreplay")
ATOL = 2e-2
RTOL = 2e-2
PROMPT = "Say hello in one sentence"
NEW_TOKENS = 4

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def run(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, check=False)


def unpack_e2m1(packed):
    """[R, C/2] uint8 -> [R, C] float32; element 2i is the low nibble."""
    lo = E2M1[(packed & 0x0F).long()]
    hi = E2M1[(packed >> 4).long()]
    return torch.stack([lo, hi], dim=-1).reshape(packed.shape[0], -1)


def expand_blocks(scale, rows, cols, br, bc):
    return scale.repeat_interleave(br, 0)[:rows].repeat_interleave(bc, 1)[:, :cols]


def dequantize(tensors):
    """Checkpoint tensors -> float32 tensors with every quantized weight decoded."""
    out = {}
    for name, t in tensors.items():
        if name.endswith((".weight_scale_inv", ".weight_scale", ".weight_scale_2", ".input_scale")):
            continue
        base = name[: -len(".weight")] if name.endswith(".weight") else None
        if base and base + ".weight_scale_inv" in tensors:  # FP8 block, 128x128
            s = tensors[base + ".weight_scale_inv"].float()
            w = t.float()
            out[name] = w * expand_blocks(s, w.shape[0], w.shape[1], 128, 128)
        elif base and base + ".weight_scale_2" in tensors:  # NVFP4 (ModelOpt)
            w = unpack_e2m1(t)
            s = tensors[base + ".weight_scale"].float()
            g = tensors[base + ".weight_scale_2"].float()
            out[name] = w * expand_blocks(s, w.shape[0], w.shape[1], 1, 16) * g
        elif base and base + ".weight_scale" in tensors:  # MXFP4: e8m0 scales per 32
            w = unpack_e2m1(t)
            s = tensors[base + ".weight_scale"].view(torch.float8_e8m0fnu).float()
            out[name] = w * expand_blocks(s, w.shape[0], w.shape[1], 1, 32)
        else:
            out[name] = t.float()
    return out


def hf_model(model_dir, tmp_path):
    """An HF model holding the checkpoint's weights, dequantized to float32."""
    tensors = {}
    for f in sorted(os.listdir(model_dir)):
        if f.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(model_dir, f)))
    with open(os.path.join(model_dir, "config.json")) as fh:
        config = json.load(fh)
    config.pop("quantization_config", None)
    config["torch_dtype"] = "float32"
    plain = tmp_path / "hf_float32"
    plain.mkdir()
    with open(plain / "config.json", "w") as fh:
        json.dump(config, fh)
    save_file({k: v.contiguous() for k, v in dequantize(tensors).items()}, str(plain / "model.safetensors"))
    m = transformers.AutoModelForCausalLM.from_pretrained(str(plain), dtype=torch.float32)
    m.eval()
    return m


@pytest.mark.parametrize(
    "arch,quant",
    [
        ("llama", "bf16"),
        ("qwen3", "bf16"),
        ("qwen3_moe", "bf16"),
        ("mixtral", "bf16"),
        ("deepseek_v3", "bf16"),
        ("llama", "fp8"),
        ("qwen3", "nvfp4"),
        ("qwen3_moe", "mxfp4"),
        ("deepseek_v3", "nvfp4"),
    ],
)
def test_engine_logits_match_hf_transformers(tmp_path, arch, quant):
    torch.set_num_threads(1)
    model = tmp_path / "model"
    r = run("make-model", str(model), "--arch", arch, "--quant", quant, "--seed", "11")
    assert r.returncode == 0, r.stderr
    dump = tmp_path / "dump"
    # NVFP4 defaults to w4a4 (activations quantized to e2m1 too, as on
    # Blackwell); HF's dequantized float checkpoint computes w4a16.
    sets = ["--set", "nvfp4_activation=w4a16"] if quant == "nvfp4" else []
    r = run("run", str(model), "--prompt", PROMPT, "--max-new-tokens", str(NEW_TOKENS), "--dump", str(dump), *sets)
    assert r.returncode == 0, r.stderr
    m = hf_model(str(model), tmp_path)

    tokens = list(PROMPT.encode())
    steps = sorted(os.listdir(dump))
    assert len(steps) == NEW_TOKENS
    worst = 0.0
    for i, name in enumerate(steps):
        got = ref.read_safetensors(str(dump / name))
        with torch.no_grad():
            want = m(torch.tensor([tokens])).logits[0, -1].double().numpy()
        logits = got["logits"][0].astype(np.float64)
        excess = np.abs(logits - want) - (ATOL + RTOL * np.abs(want))
        worst = max(worst, float(np.abs(logits - want).max()))
        assert excess.max() <= 0, (
            f"{arch}/{quant} step {i}: engine {logits[excess.argmax()]:.6g} vs HF {want[excess.argmax()]:.6g} "
            f"at token {int(excess.argmax())}"
        )
        nxt = int(got["next_tokens"][0])
        top2 = np.sort(want)[-2:]
        if top2[1] - top2[0] > 2 * (ATOL + RTOL * abs(top2[1])):
            assert nxt == int(want.argmax()), f"{arch}/{quant} step {i}: greedy token {nxt} vs HF {int(want.argmax())}"
        tokens.append(nxt)
    print(f"{arch}/{quant}: max |engine - hf| = {worst:.3g}")
