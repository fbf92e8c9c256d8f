"""torch CUDA tensors through the Recorder (crashreplay.cuda_staging), on a
GPU: staged before the step's kernels, and still in the capture after a real
device-side assert. Skipped without torch or a CUDA device (as in CI);
tests/gpu/run_all.sh runs it on a GPU machine.
"""
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device, GPU test skipped", allow_module_level=True)

import crashreplay  # noqa: E402


def test_cuda_inputs_are_staged_before_the_step_overwrites_them(tmp_path):
    rec = crashreplay.Recorder(str(tmp_path / "c.crcap"), engine="test", install_signal_handlers=False)
    ids = torch.arange(1000, 1064, device="cuda", dtype=torch.int64)
    hidden = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16)
    want = hidden.float().cpu()
    for step in range(3):
        rec.snapshot(step, {"token_ids": ids, "hidden": hidden})
        rec.record_step(step, mode="decode", request_ids=[str(i) for i in range(64)], token_ids=ids,
                        positions=ids - 1000, seq_lens=ids - 999)
        # the step itself: overwrites its inputs on the compute stream
        ids.add_(1)
        hidden.mul_(2)
    rec.close()
    cap = crashreplay.read_capture(rec.path)
    assert [s["token_ids"][0] for s in cap["step_records"]] == [1000, 1001, 1002]
    f = crashreplay.CaptureFile(rec.path)
    for step in range(3):
        snap = [s for s in cap["snapshot_records"] if s["step"] == step][0]
        h = {d["name"]: d for d in snap["tensors"]}["hidden"]
        got = torch.from_numpy(crashreplay.load_tensor(f, h).astype("float32"))
        assert torch.equal(got, want * (2 ** step)), f"step {step}"


CHILD = textwrap.dedent("""
    import sys, torch, crashreplay
    rec = crashreplay.Recorder(sys.argv[1], engine="test")
    x = torch.arange(16, device="cuda", dtype=torch.float32)
    rec.snapshot(0, {"x": x})
    rec.record_step(0, mode="decode", request_ids=["a"], token_ids=torch.tensor([5], device="cuda"),
                    positions=torch.tensor([0], device="cuda"), seq_lens=torch.tensor([1], device="cuda"))
    with rec.failure_hook(step=1, stage="decode"):
        rec.snapshot(1, {"x": x})
        bad = torch.tensor([99], device="cuda")
        y = x[bad]              # out of bounds: a device-side assert in torch's index kernel
        torch.cuda.synchronize()  # where it surfaces
    """)


def test_a_real_device_assert_keeps_the_staged_steps(tmp_path):
    path = str(tmp_path / "c.crcap")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", CHILD, path], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode != 0
    assert "device-side assert" in r.stderr or "CUDA error" in r.stderr, r.stderr[-2000:]
    cap = crashreplay.read_capture(path)
    assert [s["step"] for s in cap["step_records"]] == [0]
    (fail,) = cap["failure_records"]
    assert fail["step"] == 1 and fail["failure_class"] == "device-assert", fail
    steps = sorted({s["step"] for s in cap["snapshot_records"]})
    assert 0 in steps  # staged before the fault; step 1's may or may not have landed
    snap = [s for s in cap["snapshot_records"] if s["step"] == 0][0]
    x = crashreplay.load_tensor(crashreplay.CaptureFile(path), snap["tensors"][0])
    assert x.tolist() == list(range(16))
