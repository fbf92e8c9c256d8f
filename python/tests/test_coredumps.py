"""GPU core dumps armed from Python (docs/capture.md, "GPU core dumps"):
crashreplay.Recorder(coredumps=True), the adapters' pass-through, and what
the manifest records. No GPU here: arming through the environment is
checked in a fresh interpreter (a subprocess, so this process's own
environment stays as it was), and the attribute API path is taken with a
driver library that does not exist, which must say why, not fail.
The recorder's failure path naming a dump, and `crashreplay info` showing
it, are tests/capture/coredump_arming_test.cc's (it needs the C++ dump
builder)."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

import crashreplay
from crashreplay._adapter_common import coredumps_from_env

LIGHTWEIGHT = ("skip_nonrelocated_elf_images,skip_global_memory,skip_shared_memory,skip_local_memory,skip_abort,"
               "skip_constbank_memory")


def run_fresh(code, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    for k in ("CUDA_ENABLE_COREDUMP_ON_EXCEPTION", "CUDA_COREDUMP_GENERATION_FLAGS", "CUDA_COREDUMP_FILE"):
        env.pop(k, None)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code), str(tmp_path)], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_fresh_process_is_armed_through_the_environment(tmp_path):
    out = run_fresh("""
        import ctypes, json, os, sys
        import crashreplay
        with crashreplay.Recorder(sys.argv[1] + "/session", engine="unit", install_signal_handlers=False,
                                  coredumps=True) as rec:
            path = rec.path
        # The C environment, which the driver reads at cuInit (os.environ is
        # Python's copy from startup and does not see setenv).
        libc = ctypes.CDLL(None)
        libc.getenv.restype = ctypes.c_char_p
        env = {k: (libc.getenv(k.encode()) or b"").decode() or None
               for k in ("CUDA_ENABLE_COREDUMP_ON_EXCEPTION", "CUDA_COREDUMP_GENERATION_FLAGS", "CUDA_COREDUMP_FILE")}
        assert os.environ.get("CUDA_COREDUMP_FILE") is None  # not mirrored into Python's copy
        print(json.dumps({"env": env, "manifest": crashreplay.read_capture(path)["manifest"]["coredump"]}))
    """, tmp_path)
    pattern = str(tmp_path / "session" / "rank-00000.%p.cudacore")
    assert out["env"] == {"CUDA_ENABLE_COREDUMP_ON_EXCEPTION": "1", "CUDA_COREDUMP_GENERATION_FLAGS": LIGHTWEIGHT,
                          "CUDA_COREDUMP_FILE": pattern}
    m = out["manifest"]
    assert m["mode"] == "env" and "not loaded yet" in m["reason"]
    assert m["file_pattern"] == pattern and m["generation_flags"] == 0x3f


def test_off_by_default_leaves_the_environment_alone(tmp_path):
    out = run_fresh("""
        import ctypes, json, sys
        import crashreplay
        with crashreplay.Recorder(sys.argv[1] + "/c.crcap", engine="unit", install_signal_handlers=False) as rec:
            path = rec.path
        libc = ctypes.CDLL(None)
        libc.getenv.restype = ctypes.c_char_p
        print(json.dumps({"env": libc.getenv(b"CUDA_ENABLE_COREDUMP_ON_EXCEPTION"),
                          "manifest": crashreplay.read_capture(path)["manifest"]["coredump"]}))
    """, tmp_path)
    assert out["env"] is None
    assert out["manifest"]["mode"] == "off" and "not measured" in out["manifest"]["reason"]


def test_the_attribute_api_without_a_driver_says_why_and_recording_goes_on(tmp_path):
    with crashreplay.Recorder(str(tmp_path / "c.crcap"), engine="unit", install_signal_handlers=False,
                              coredumps=True, coredump_method="driver_api",
                              coredump_driver_library="libcrashreplay-no-such-driver.so.1") as rec:
        rec.record_step(0, mode="decode", request_ids=["a"], token_ids=[1], positions=[0], seq_lens=[1])
        rec.on_failure("CUDA error: device-side assert triggered", stage="decode", step=0)
        path = rec.path
    cap = crashreplay.read_capture(path)
    m = cap["manifest"]["coredump"]
    assert m["mode"] == "failed"
    assert "libcrashreplay-no-such-driver.so.1" in m["reason"] and "cannot be loaded" in m["reason"]
    (f,) = cap["failure_records"]
    assert f["coredump"] == "" and not f["coredump_complete"]
    assert len(cap["step_records"]) == 1


def test_an_unknown_method_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match='coredump_method: "ptrace" is not one of auto, env, driver_api'):
        crashreplay.Recorder(str(tmp_path / "c.crcap"), engine="unit", install_signal_handlers=False,
                             coredumps=True, coredump_method="ptrace")


def test_the_install_hooks_read_crashreplay_coredumps(monkeypatch):
    monkeypatch.delenv("CRASHREPLAY_COREDUMPS", raising=False)
    assert coredumps_from_env() is False
    monkeypatch.setenv("CRASHREPLAY_COREDUMPS", "1")
    assert coredumps_from_env() is True
    monkeypatch.setenv("CRASHREPLAY_COREDUMPS", "0")
    assert coredumps_from_env() is False


def test_transformers_record_passes_coredumps_through(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    out = run_fresh("""
        import json, sys
        import torch, transformers
        import crashreplay
        from crashreplay.transformers import record
        cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                       num_attention_heads=4, num_key_value_heads=2)
        model = transformers.LlamaForCausalLM(cfg).eval()
        with record(model, sys.argv[1] + "/session", coredumps=True, install_signal_handlers=False) as rec:
            path = rec.rec.path
            with torch.no_grad():
                rec.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=2, do_sample=False)
        print(json.dumps(crashreplay.read_capture(path)["manifest"]["coredump"]))
    """, tmp_path)
    # torch on the CPU never loads the CUDA driver: the environment arms it.
    assert out["mode"] == "env", out
    assert out["file_pattern"] == str(tmp_path / "session" / "rank-00000.%p.cudacore")
