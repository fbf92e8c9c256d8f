"""Recorder.fingerprint over numpy tensors: the summaries read back equal
what numpy computes from the same arrays (ml_dtypes for bf16 and fp8), a
failure marks the step incomplete, and bad input is refused by name."""
import subprocess

import numpy as np
import pytest

import crashreplay

ml_dtypes = pytest.importorskip("ml_dtypes")


def make(tmp_path):
    return crashreplay.Recorder(str(tmp_path / "cap.crcap"), engine="unit", engine_version="0",
                                install_signal_handlers=False, overwrite=True)


def numpy_summary(a):
    """The fingerprint's statistics as numpy computes them (fp64)."""
    x = a.astype(np.float64).reshape(-1)
    finite = x[np.isfinite(x)]
    bad = np.flatnonzero(~np.isfinite(x))
    cols = a.shape[-1]
    return {
        "numel": x.size, "nan": int(np.isnan(x).sum()), "pos_inf": int(np.isposinf(x).sum()),
        "neg_inf": int(np.isneginf(x).sum()), "min": float(finite.min()), "max": float(finite.max()),
        "max_abs": float(np.abs(finite).max()), "sum": float(np.sum(finite)),
        "sum_squares": float(np.sum(finite * finite)),
        "first_nonfinite": (int(bad[0] // cols), int(bad[0] % cols)) if bad.size else None,
    }


@pytest.mark.parametrize("dtype", [np.float16, np.float32, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn])
def test_summaries_match_numpy(tmp_path, dtype):
    rng = np.random.default_rng(3)
    a = (rng.standard_normal((5, 48)) * 3).astype(dtype)
    if dtype in (np.float16, np.float32, ml_dtypes.bfloat16):
        a[2, 7], a[3, 1], a[4, 0] = np.inf, -np.inf, np.nan
    with make(tmp_path) as rec:
        rec.record_step(0, mode="prefill", token_ids=np.arange(5))
        rec.fingerprint("L0.attention", a)
        path = rec.path
    (r,) = crashreplay.read_capture(path)["fingerprints"]
    assert r["step"] == 0 and r["complete"] and r["source"] == "host"
    (f,) = r["fingerprints"]
    want = numpy_summary(a)
    for k in ("numel", "nan", "pos_inf", "neg_inf", "min", "max", "max_abs", "first_nonfinite"):
        assert f[k] == want[k], k
    # fp64 sums: 8 interleaved lanes here, numpy's pairwise order there.
    assert f["sum"] == pytest.approx(want["sum"], rel=1e-12, abs=1e-12)
    assert f["sum_squares"] == pytest.approx(want["sum_squares"], rel=1e-12)
    assert f["columns"] == 48 and not f["is_int"]


def test_integer_ids_give_their_range_and_hash(tmp_path):
    ids = np.array([[3, 250], [0, 7]], np.int64)
    with make(tmp_path) as rec:
        rec.record_step(4, mode="decode", token_ids=np.arange(2))
        rec.fingerprint("L1.topk", ids)
        path = rec.path
    (f,) = crashreplay.read_capture(path)["fingerprints"][0]["fingerprints"]
    assert f["is_int"] and (f["min"], f["max"]) == (0, 250)
    # The content hash is XXH3-128 of the bytes, as xxhsum -H2 prints it.
    raw = tmp_path / "ids.bin"
    raw.write_bytes(ids.tobytes())
    out = subprocess.run(["xxhsum", "-H2", str(raw)], capture_output=True, text=True, check=True).stdout
    assert f["content_hash"] == out.split()[0].split("_")[-1]


def test_a_failure_writes_the_steps_boundaries_so_far_as_incomplete(tmp_path):
    h = np.ones((2, 4), np.float16)
    with make(tmp_path) as rec:
        for step in range(2):
            rec.record_step(step, mode="decode", token_ids=np.arange(2))
            rec.fingerprint("L0.attention", h)
            if step == 1:
                break
            rec.fingerprint("L0.o_proj", h)
        rec.on_failure("CUDA error: device-side assert triggered", stage="decode", step=1)
        path = rec.path
    recs = crashreplay.read_capture(path)["fingerprints"]
    assert [(r["step"], r["complete"], [f["name"] for f in r["fingerprints"]]) for r in recs] == [
        (0, True, ["L0.attention", "L0.o_proj"]), (1, False, ["L0.attention"])]


def test_bad_input_is_refused_by_name(tmp_path):
    with make(tmp_path) as rec:
        with pytest.raises(ValueError, match="no step given"):
            rec.fingerprint("L0.mlp", np.zeros(4, np.float32))
        rec.record_step(0, mode="decode", token_ids=np.arange(1))
        with pytest.raises((ValueError, TypeError)):
            rec.fingerprint("L0.mlp", "not a tensor")


def test_a_steps_boundaries_in_one_call_read_back_as_one_at_a_time(tmp_path):
    rng = np.random.default_rng(5)
    tensors = [("embedding", rng.standard_normal((3, 16)).astype(np.float32)),
               ("L0.attention", rng.standard_normal((3, 16)).astype(ml_dtypes.bfloat16)),
               ("L0.topk", np.array([[1, 9], [4, 2], [0, 7]], np.int32))]
    records = []
    for batched in (False, True):
        with crashreplay.Recorder(str(tmp_path / f"b{batched}.crcap"), engine="unit",
                                  install_signal_handlers=False) as rec:
            rec.record_step(2, mode="decode", token_ids=np.arange(3))
            if batched:
                rec.fingerprints(tensors)
            else:
                for name, t in tensors:
                    rec.fingerprint(name, t)
            path = rec.path
        records.append(crashreplay.read_capture(path)["fingerprints"])
    assert records[0] == records[1]
    assert [f["name"] for f in records[1][0]["fingerprints"]] == ["embedding", "L0.attention", "L0.topk"]


def test_one_bad_tensor_in_a_batch_is_named(tmp_path):
    with make(tmp_path) as rec:
        rec.record_step(0, mode="decode", token_ids=np.arange(1))
        with pytest.raises(Exception, match="L0.mlp"):
            rec.fingerprints({"L0.attention": np.zeros((1, 4), np.float32), "L0.mlp": np.zeros((1, 4), np.complex64)})


def test_the_hooks_by_address_call_checks_what_it_can_and_matches_dlpack(tmp_path):
    # _fingerprints_at (crashreplay._fingerprint_hooks' call) trusts an
    # address, but not a dtype name, an element count that is not whole rows,
    # or a null address with elements; what it reads is what DLPack reads.
    a = np.arange(-12, 12, dtype=np.float32).reshape(4, 6) / 7
    with make(tmp_path) as rec:
        rec.record_step(0, mode="decode", token_ids=np.arange(1))
        for bad, what in [(("x", a.ctypes.data, 24, "F33", 6), "unknown dtype"),
                          (("x", a.ctypes.data, 24, "F32", 5), "rows of 5"),
                          (("x", 0, 24, "F32", 6), "24 elements at 0x0"),
                          (("x", a.ctypes.data, -1, "F32", 6), "-1 elements")]:
            with pytest.raises(ValueError, match=what):
                rec._impl._fingerprints_at(0, [bad])
        rec._impl._fingerprints_at(0, [("by_address", a.ctypes.data, a.size, "F32", 6)])
        rec.fingerprints({"by_dlpack": a}, step=1)
    (one,), (two,) = [r["fingerprints"] for r in crashreplay.read_capture(str(tmp_path / "cap.crcap"))["fingerprints"]]
    assert (one.pop("name"), two.pop("name")) == ("by_address", "by_dlpack")
    assert one == two and one["numel"] == 24 and one["columns"] == 6


class _DeviceArray:
    """A DLPack producer that says it lives on CUDA (device type 2): no CUDA here to make a real one."""

    def __init__(self, host=None):
        self._host = host

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None):
        raise AssertionError("a device tensor's memory must not be read on the host")


class _CopyableDeviceArray(_DeviceArray):
    def cpu(self):
        return self._host


def test_a_device_tensor_is_summarised_from_its_host_copy_or_refused_by_name(tmp_path):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    with make(tmp_path) as rec:
        rec.record_step(0, mode="decode", token_ids=np.arange(3))
        rec.fingerprint("L0.mlp", _CopyableDeviceArray(a))
        with pytest.raises(ValueError, match="L0.o_proj: a device tensor without .cpu()"):
            rec.fingerprints([("L0.o_proj", _DeviceArray())])
        path = rec.path
    (r,) = crashreplay.read_capture(path)["fingerprints"]
    (f,) = r["fingerprints"]
    assert f["name"] == "L0.mlp" and f["max"] == 11.0 and f["sum"] == 66.0


def test_without_a_device_the_device_table_says_why_and_the_hooks_copy_to_the_host(tmp_path, caplog):
    # The device path (DeviceFingerprints) needs a CUDA device; here the
    # table refuses by name, and the hooks' device path steps aside (host
    # copies) and says so once. tests/gpu (test_cuda_fingerprints.py) runs it.
    with pytest.raises(crashreplay.Error, match="no CUDA (device|backend)"):
        crashreplay.DeviceFingerprints(8)
    from crashreplay._fingerprint_hooks import DeviceSteps, FingerprintHooks

    with pytest.raises(ValueError, match="device must be"):
        FingerprintHooks(None, device="gpu")
    with make(tmp_path) as rec, caplog.at_level("INFO", logger="crashreplay"):
        assert DeviceSteps.make(rec, 8) is None
        assert "device fingerprints unavailable" in caplog.text
        assert rec._before_failure == [] and rec._before_close == []
