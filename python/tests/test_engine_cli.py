"""`crashreplay make-model` and `crashreplay run` end to end: the GLM-style
NVFP4 MoE at tensor parallel 8 on a scaled 96 GB device fails with an OOM at
graph capture at mem_fraction_static 0.95, starts at 0.88 and then fails in
decode when the paged decode kernel meets 16-token pages; the conservative
configuration runs clean; results do not depend on the thread count."""
import json
import os
import subprocess

import pytest

BIN = os.environ.get("CRASHREPLAY_BIN", "build/tools/crashreplay")
PROMPT = "Say hello in one sentence"


def run(*args):
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, check=False)


@pytest.fixture(scope="module")
def glm(tmp_path_factory):
    d = tmp_path_factory.mktemp("glm") / "model"
    r = run("make-model", d, "--arch", "glm4_moe", "--quant", "nvfp4", "--heads", 8, "--kv-heads", 2,
            "--moe-intermediate", 128, "--intermediate", 128, "--layers", 3, "--experts", 16,
            "--experts-per-tok", 4, "--n-group", 4, "--topk-group", 2)
    assert r.returncode == 0, r.stderr
    return d


def run_json(model, *sets, threads=1, max_new=4):
    args = ["run", model, "--prompt", PROMPT, "--max-new-tokens", max_new, "--json", "--threads", threads]
    for s in sets:
        args += ["--set", s]
    r = run(*args)
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout)


def deployment(model, fraction):
    _, probe = run_json(model, "tp_size=8", max_new=1)
    scale = probe["plan"]["weights"] / 0.7 / 96e9
    return ["tp_size=8", "device_memory_gb=96", f"device_memory_scale={scale!r}",
            f"mem_fraction_static={fraction}", "cuda_graph_max_bs=64"]


def test_high_memory_fraction_is_an_oom_at_graph_capture(glm):
    rc, out = run_json(glm, *deployment(glm, 0.95))
    assert rc == 1
    assert out["outcome"] == "failed"
    assert out["signature"] == {"class": "oom", "stage": "graph_capture", "kernel": "memory_planner",
                                "check": "graph_memory_fits"}
    assert out["steps"] == []


def test_paged_decode_kernel_fails_in_decode_after_prefill(glm):
    rc, out = run_json(glm, *deployment(glm, 0.88), "attention_backend=paged64", "page_size=16")
    assert rc == 1
    assert out["signature"] == {"class": "device_assert", "stage": "decode", "kernel": "attention",
                                "check": "page_size_is_64"}
    assert [s["mode"] for s in out["steps"]] == ["prefill", "decode"]
    assert out["fault"]["layer"] == 0 and out["fault"]["index"] == 16
    assert out["kernels"][-1]["name"] == "L0.attention" and out["kernels"][-1]["failed"]


def test_ue8m0_kernel_rejects_nvfp4_scales(glm):
    rc, out = run_json(glm, "tp_size=8", "scale_format=ue8m0")
    assert rc == 1
    assert out["signature"]["check"] == "ue8m0_scale_layout"
    assert out["signature"]["stage"] == "prefill"
    rc, out = run_json(glm, "tp_size=8", "scale_format=ue8m0_requant")
    assert rc == 0, out.get("fault")


def test_conservative_configuration_runs_and_is_thread_count_independent(glm):
    rc1, a = run_json(glm, *deployment(glm, 0.88), threads=1)
    rc2, b = run_json(glm, *deployment(glm, 0.88), threads=2)
    assert rc1 == 0 and rc2 == 0
    assert [s["digest"] for s in a["steps"]] == [s["digest"] for s in b["steps"]]
    assert len(a["outputs"][0]["tokens"]) == 4


def test_bad_toggle_is_a_usage_error(glm):
    r = run("run", glm, "--prompt", "x", "--set", "attention_backend=flashmla")
    assert r.returncode == 2
    assert "attention_backend" in r.stderr
