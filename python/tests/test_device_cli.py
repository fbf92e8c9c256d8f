"""`--set device=cuda` on `run` and `replay`: the step runs on the GPU where
there is one (tests/gpu/cli_cuda.sh covers that on a GPU machine), and where
there is none the command fails with its own exit code (7) and a message that
says why, before any step runs; it never runs on the CPU instead."""
import json
import os
import subprocess

import pytest

BIN = os.environ.get("CRASHREPLAY_BIN", "build/tools/crashreplay")
EXIT_NO_DEVICE = 7


def run(*args):
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, check=False)


def has_cuda_device():
    return run("devices", "--device", "cuda").returncode == 0


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    d = tmp_path_factory.mktemp("dev")
    assert run("make-model", d / "m", "--arch", "llama", "--quant", "bf16").returncode == 0
    r = run("run", d / "m", "--prompt", "Hi", "--max-new-tokens", 2, "--record", d / "cap")
    assert r.returncode == 0, r.stderr
    return d


def test_run_on_a_missing_gpu_fails_with_its_own_exit_code_and_runs_nothing(capture):
    if has_cuda_device():
        pytest.skip("this machine has a CUDA device; tests/gpu/cli_cuda.sh covers it")
    r = run("run", capture / "m", "--prompt", "Hi", "--max-new-tokens", 2, "--set", "device=cuda", "--json")
    assert r.returncode == EXIT_NO_DEVICE, (r.returncode, r.stderr)
    assert r.stdout == "", "no result: nothing ran"
    assert "CUDA" in r.stderr and ("no CUDA device" in r.stderr or "without the CUDA backend" in r.stderr), r.stderr


def test_replay_on_a_missing_gpu_fails_with_its_own_exit_code(capture):
    if has_cuda_device():
        pytest.skip("this machine has a CUDA device; tests/gpu/cli_cuda.sh covers it")
    r = run("replay", capture / "cap", "--set", "device=cuda", "--json")
    assert r.returncode == EXIT_NO_DEVICE, (r.returncode, r.stderr)
    assert r.stdout == ""
    assert "CUDA" in r.stderr, r.stderr


def test_the_same_replay_on_the_cpu_reproduces(capture):
    r = run("replay", capture / "cap", "--set", "device=cpu", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["outcome"] == "reproduced"
    assert out["config"]["device"] == "cpu"
