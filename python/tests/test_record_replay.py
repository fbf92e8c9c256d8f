"""Record with `crashreplay run --record`, replay with `crashreplay replay`:
every architecture and quantization make-model writes reproduces every step
bit for bit; a recorded failure fires again (exit 1, its signature); a
configuration that removes the cause runs clean (exit 0); a changed
reduction order diverges at the first kernel it changes; tampered weights
are refused naming the tensor."""
import json
import os
import subprocess

import pytest

BIN = os.environ.get("CRASHREPLAY_BIN", "build/tools/crashreplay")
ARCHS = ["llama", "qwen3", "qwen3_moe", "mixtral", "glm4_moe"]
QUANTS = ["bf16", "fp8", "nvfp4", "mxfp4"]


def run(*args):
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, check=False)


def replay_json(capture, *args):
    r = run("replay", capture, "--json", *args)
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout)


# gpt_oss: make-model writes it in bf16 only.
@pytest.mark.parametrize("arch,quant", [(a, q) for q in QUANTS for a in ARCHS] + [("gpt_oss", "bf16")])
def test_every_step_reproduces(tmp_path, arch, quant):
    model, cap = tmp_path / "m", tmp_path / "cap"
    assert run("make-model", model, "--arch", arch, "--quant", quant).returncode == 0
    r = run("run", model, "--prompt", "Say hello", "--prompt", "Hi", "--max-new-tokens", 3,
            "--temperature", 0.7, "--seed", 5, "--record", cap)
    assert r.returncode == 0, r.stderr
    for step in range(3):
        rc, out = replay_json(cap, "--step", step, "--threads", 1 + step % 2)
        assert rc == 0 and out["outcome"] == "reproduced", out["detail"]
        assert out["weights"] == "verified"


@pytest.fixture(scope="module")
def failing_capture(tmp_path_factory):
    d = tmp_path_factory.mktemp("fail")
    model, cap = d / "m", d / "cap"
    assert run("make-model", model, "--arch", "glm4_moe", "--quant", "nvfp4").returncode == 0
    r = run("run", model, "--prompt", "Say hello in one sentence", "--max-new-tokens", 4,
            "--set", "attention_backend=paged64", "--record", cap)
    assert r.returncode == 1
    return model, cap


def test_recorded_failure_fires_again(failing_capture, tmp_path):
    _, cap = failing_capture
    trace = tmp_path / "trace.json"
    rc, out = replay_json(cap, "--trace", trace)
    assert rc == 1
    assert out["outcome"] == "failed" and out["step"] == 1
    assert out["signature"] == {"class": "device_assert", "stage": "decode", "kernel": "attention", "check": "page_size_is_64"}
    assert out["matches_recorded_failure"]
    assert out["kernels"][-1]["name"] == "L0.attention"
    assert len(json.loads(trace.read_text())["traceEvents"]) == len(out["kernels"])


def test_removing_the_cause_runs_clean(failing_capture, tmp_path):
    _, cap = failing_capture
    cfg = tmp_path / "good.toml"
    cfg.write_text('attention_backend = "reference"\n')
    rc, out = replay_json(cap, "--config", cfg)
    assert rc == 0 and out["outcome"] == "reproduced", out["detail"]
    rc, out = replay_json(cap, "--set", "page_size=64")
    assert rc == 0 and out["outcome"] == "reproduced"


def test_other_reduction_order_diverges_at_first_changed_kernel(tmp_path):
    model, cap = tmp_path / "m", tmp_path / "cap"
    assert run("make-model", model, "--arch", "qwen3", "--quant", "bf16").returncode == 0
    assert run("run", model, "--prompt", "x" * 40, "--max-new-tokens", 3, "--record", cap).returncode == 0
    rc, out = replay_json(cap, "--step", 1, "--set", "attention_backend=flashdecode")
    assert rc == 1 and out["outcome"] == "diverged"
    assert out["diverged"] == {"step": 1, "kernel": "L0.attention"}


def test_tampered_checkpoint_is_refused(failing_capture, tmp_path):
    model, cap = failing_capture
    import shutil
    bad = tmp_path / "bad"
    shutil.copytree(model, bad)
    st = bad / "model.safetensors"
    data = bytearray(st.read_bytes())
    data[-100] ^= 1
    st.write_bytes(bytes(data))
    r = run("replay", cap, "--model", bad, "--json")
    assert r.returncode == 3
    assert "shard hash" in r.stderr
