"""`crashreplay devices` and `--device cuda`: the binary runs without a GPU,
lists the backends it was built with, and asking for CUDA where it cannot run
is a usage error (exit 2) that says why and what to use instead."""
import json
import os
import shutil
import subprocess

import pytest

BIN = os.environ.get("CRASHREPLAY_BIN", "crashreplay")


def run(*args):
    if shutil.which(BIN) is None and not os.path.exists(BIN):
        pytest.skip("crashreplay binary not built")
    return subprocess.run([BIN, *args], capture_output=True, text=True)


def test_devices_lists_cpu_first_and_describes_cuda():
    r = run("devices", "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["backends"][0] == "cpu"
    if info["cuda_devices"]:
        assert "cuda" in info["backends"]
    else:
        assert info["cuda_note"]


def test_device_cuda_is_usable_or_a_clear_usage_error():
    info = json.loads(run("devices", "--json").stdout)
    r = run("devices", "--device", "cuda")
    if info["cuda_devices"]:
        assert r.returncode == 0, r.stderr
        return
    assert r.returncode == 2, (r.returncode, r.stderr)
    if "cuda" in info["backends"]:
        assert "no CUDA device" in r.stderr
    else:
        assert "without the CUDA backend" in r.stderr
    assert "--device cpu" in r.stderr


def test_unknown_device_is_a_usage_error():
    r = run("devices", "--device", "tpu")
    assert r.returncode == 2
    assert "unknown device 'tpu'" in r.stderr
