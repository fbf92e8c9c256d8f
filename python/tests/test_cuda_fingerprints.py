"""Fingerprint hooks on CUDA tensors through the device path
(crashreplay.DeviceFingerprints, our summary kernel writing into mapped host
memory), on a GPU: the records match torch's own statistics of the same
tensors, and after a real device-side assert the failing step's record holds
exactly the boundaries whose kernels ran before it. Skipped without torch or
a CUDA device (as in CI); tests/gpu/run_all.sh runs it on a GPU machine.
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
from crashreplay._fingerprint_hooks import FingerprintHooks  # noqa: E402


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(64, 32)
        self.l0 = torch.nn.Linear(32, 32)
        self.l1 = torch.nn.Linear(32, 32)

    def forward(self, ids, gather=None):
        h = self.l0(self.embed(ids))
        if gather is not None:
            h = h[gather]
        return self.l1(h)


def _hooked(rec, net):
    hooks = FingerprintHooks(rec)
    hooks.output(net.embed, "embedding")
    hooks.output(net.l0, "L0.mlp")
    hooks.output(net.l1, "L1.mlp")
    return hooks


def test_device_records_are_torchs_statistics_of_the_same_tensors(tmp_path):
    rec = crashreplay.Recorder(str(tmp_path / "c.crcap"), engine="test", install_signal_handlers=False)
    net = Net().cuda().to(torch.bfloat16)
    hooks = _hooked(rec, net)
    outs = {}
    captured = {}
    for name, mod in (("embedding", net.embed), ("L0.mlp", net.l0), ("L1.mlp", net.l1)):
        mod.register_forward_hook(lambda m, a, o, name=name: captured.__setitem__(name, o.detach().clone()))
    with torch.no_grad():
        for step in range(4):
            hooks.step, hooks.mode = step, "decode"
            ids = torch.arange(step, step + 8, device="cuda")
            net(ids)
            hooks.flush()
            outs[step] = dict(captured)
    assert hooks.device is not None, "the device path was not taken"
    rec.close()
    recs = crashreplay.read_capture(rec.path)["fingerprints"]
    assert [(r["step"], r["source"], r["complete"]) for r in recs] == [(s, "device", True) for s in range(4)]
    for r in recs:
        assert [f["name"] for f in r["fingerprints"]] == ["embedding", "L0.mlp", "L1.mlp"]
        for f in r["fingerprints"]:
            t = outs[r["step"]][f["name"]].float()
            assert (f["dtype"], f["numel"], f["columns"]) == ("BF16", t.numel(), 32)
            assert (f["nan"], f["pos_inf"], f["neg_inf"]) == (0, 0, 0)
            assert f["min"] == t.min().item() and f["max"] == t.max().item()
            assert f["max_abs"] == t.abs().max().item()
            assert f["sum"] == pytest.approx(t.double().sum().item(), rel=1e-9, abs=1e-9)


CHILD = textwrap.dedent("""
    import sys, torch, crashreplay
    from crashreplay._fingerprint_hooks import FingerprintHooks
    sys.path.insert(0, sys.argv[2])
    from test_cuda_fingerprints import Net, _hooked
    rec = crashreplay.Recorder(sys.argv[1], engine="test")
    net = Net().cuda()
    hooks = _hooked(rec, net)
    with torch.no_grad():
        for step in range(3):
            hooks.step, hooks.mode = step, "decode"
            with rec.failure_hook(step=step, stage="decode"):
                ids = torch.arange(8, device="cuda")
                # step 2 gathers row 99 of 8: torch's index kernel asserts
                # after L0.mlp's summary ran and before l1 and its summary
                net(ids, torch.tensor([99], device="cuda") if step == 2 else None)
                hooks.flush()
                torch.cuda.synchronize()  # where the assert surfaces
    """)


def test_after_a_real_device_assert_the_failing_steps_record_ends_at_the_last_boundary_that_ran(tmp_path):
    path = str(tmp_path / "c.crcap")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.run([sys.executable, "-c", CHILD, path, os.path.dirname(__file__)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode != 0 and "device-side assert" in p.stderr, p.stderr[-2000:]
    cap = crashreplay.read_capture(path)
    (failure,) = cap["failure_records"]
    assert failure["step"] == 2
    recs = {r["step"]: r for r in cap["fingerprints"]}
    assert sorted(recs) == [0, 1, 2]
    assert recs[1]["complete"] and [f["name"] for f in recs[1]["fingerprints"]] == ["embedding", "L0.mlp", "L1.mlp"]
    assert not recs[2]["complete"]
    assert [f["name"] for f in recs[2]["fingerprints"]] == ["embedding", "L0.mlp"]
    assert all(r["source"] == "device" for r in recs.values())
