"""`crashreplay replay CAPTURE --dump DIR [--dump-kernels PATTERNS]`: the
replayed step's kernel outputs open with safetensors/numpy; the logits'
argmax is the greedy token the recording sampled; the file is byte-identical
across repeated dumps and thread counts; patterns select kernels and a
pattern that selects nothing is a usage error; a faulting step dumps the
kernels up to and including the faulting one; an unwritable DIR is a data
error naming the path."""
import json
import os
import subprocess

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file

BIN = os.environ.get("CRASHREPLAY_BIN", "build/tools/crashreplay")


def run(*args):
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, check=False)


def metadata(path):
    with safe_open(str(path), framework="numpy") as f:
        return f.metadata()


@pytest.fixture(scope="module")
def greedy(tmp_path_factory):
    d = tmp_path_factory.mktemp("dump")
    model, cap = d / "m", d / "cap"
    assert run("make-model", model, "--arch", "qwen3", "--quant", "bf16").returncode == 0
    r = run("run", model, "--prompt", "Say hello", "--prompt", "Hi", "--max-new-tokens", 3,
            "--record", cap, "--json")
    assert r.returncode == 0, r.stderr
    return cap, json.loads(r.stdout)["steps"]


@pytest.mark.parametrize("step", [0, 1, 2])
def test_logits_argmax_is_the_recorded_greedy_token(greedy, tmp_path, step):
    cap, steps = greedy
    out = tmp_path / "d"
    r = run("replay", cap, "--step", step, "--dump", out, "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    path = out / f"step{step}.rank0.safetensors"
    assert report["dump"]["path"] == str(path)
    tensors = load_file(str(path))
    assert report["dump"]["tensors"] == len(tensors)
    logits = tensors["logits_all_gather.logits"]
    assert logits.dtype == np.float32 and logits.shape[0] == len(steps[step]["sampled"])
    assert list(np.argmax(logits, axis=1)) == steps[step]["sampled"]
    assert list(tensors["sampler.next_tokens"]) == steps[step]["sampled"]
    assert tensors["sampler.next_tokens"].dtype == np.int32
    md = metadata(path)
    assert md["step"] == str(step) and md["rank"] == "0" and md["outcome"] == "reproduced"
    assert md["capture"] == os.path.abspath(cap) and md["complete"] == "true"
    assert json.loads(md["config"])["attention_backend"] == "reference"
    order = json.loads(md["kernel_order"])
    assert order[0] == "embedding" and order[-1] == "sampler" and "L1.attention" in order


def test_dumping_twice_gives_identical_bytes_on_any_thread_count(greedy, tmp_path):
    cap, _ = greedy
    blobs = []
    for i, threads in enumerate([1, 1, 2]):
        out = tmp_path / f"d{i}"
        assert run("replay", cap, "--step", 1, "--dump", out, "--threads", threads).returncode == 0
        blobs.append((out / "step1.rank0.safetensors").read_bytes())
    assert blobs[0] == blobs[1] == blobs[2]


def test_patterns_select_kernels(greedy, tmp_path):
    cap, _ = greedy
    out = tmp_path / "d"
    r = run("replay", cap, "--step", 1, "--dump", out, "--dump-kernels", "L*.attention,logits_*", "--json")
    assert r.returncode == 0, r.stderr
    tensors = load_file(str(out / "step1.rank0.safetensors"))
    assert sorted(tensors) == ["L0.attention.attn", "L1.attention.attn", "logits_all_gather.logits",
                               "logits_processor.probs"]
    assert json.loads(r.stdout)["dump"]["kernels"] == ["L0.attention", "L1.attention", "logits_all_gather",
                                                       "logits_processor"]


def test_pattern_matching_no_kernel_is_a_usage_error(greedy, tmp_path):
    cap, _ = greedy
    out = tmp_path / "d"
    r = run("replay", cap, "--dump", out, "--dump-kernels", "L0.*,L7.attention")
    assert r.returncode == 2
    assert "'L7.attention'" in r.stderr and "L0.q_proj" in r.stderr
    assert not out.exists()  # nothing ran, nothing written
    r = run("replay", cap, "--dump-kernels", "L0.*")
    assert r.returncode == 2 and "--dump" in r.stderr


def test_unwritable_dump_directory_is_a_data_error_naming_it(greedy, tmp_path):
    cap, _ = greedy
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    r = run("replay", cap, "--dump", blocker / "sub")
    assert r.returncode == 3
    assert str(blocker / "sub") in r.stderr


def test_faulting_step_dumps_up_to_the_faulting_kernel(tmp_path):
    model, cap, out = tmp_path / "m", tmp_path / "cap", tmp_path / "d"
    assert run("make-model", model, "--arch", "glm4_moe", "--quant", "nvfp4").returncode == 0
    r = run("run", model, "--prompt", "Say hello in one sentence", "--max-new-tokens", 4,
            "--set", "attention_backend=paged64", "--record", cap)
    assert r.returncode == 1
    r = run("replay", cap, "--dump", out, "--json")
    assert r.returncode == 1
    report = json.loads(r.stdout)
    assert report["outcome"] == "failed"
    path = out / f"step{report['step']}.rank0.safetensors"
    md = metadata(path)
    assert md["complete"] == "false" and md["outcome"] == "failed"
    assert md["fault"] == "assert/decode/attention/page_size_is_64" and md["fault_kernel"] == "L0.attention"
    tensors = load_file(str(path))
    assert "L0.attention.attn" in tensors and "L0.rope.q" in tensors
    assert not any(name.startswith("L0.o_proj") for name in tensors)
    assert json.loads(md["kernel_order"])[-1] == "L0.attention"
