"""crashreplay.Recorder when the disk fills: a real file-size limit (RLIMIT_FSIZE).

A write past the limit fails with EFBIG (SIGXFSZ ignored), as a full disk
fails with ENOSPC; raising the limit again is "space freed". The limit is
this process's, so it is lowered only around the recording and restored in
every case. docs/capture.md, "Disk full and slow disks".
"""
import contextlib
import resource
import signal
import warnings

import numpy as np
import pytest

import crashreplay


@contextlib.contextmanager
def file_size_limit(nbytes):
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, old[1]))
    try:
        yield lambda: resource.setrlimit(resource.RLIMIT_FSIZE, old)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
        signal.signal(signal.SIGXFSZ, old_handler)


def make(path, **kw):
    return crashreplay.Recorder(str(path), engine="unit", engine_version="0", install_signal_handlers=False,
                                overwrite=True, disk_retry_interval_s=3600.0, **kw)


def record(rec, steps):
    """record_step for each step (64 requests decoding: new tokens every step, which is what fills the file;
    positions and lengths compress to almost nothing); the exceptions it raised."""
    raised = []
    for i in steps:
        tokens = np.random.default_rng(i).integers(0, 150000, 65)
        try:
            rec.record_step(i, mode="decode", request_ids=[f"r{k}" for k in range(64)], token_ids=tokens[:64],
                            positions=np.full(64, i, np.int64), seq_lens=np.full(64, i + 1, np.int64),
                            output_token_ids=tokens[1:])
        except crashreplay.Error as e:
            raised.append(e)
    return raised


def steps_of(path):
    return [s["step"] for s in crashreplay.read_capture(path)["step_records"]]


def test_disk_full_raises_once_and_held_steps_are_written_when_space_returns(tmp_path):
    path = tmp_path / "full.crcap"
    with file_size_limit(64 << 10) as free_space:
        rec = make(path)
        raised = record(rec, range(1000))
        with pytest.raises(crashreplay.Error, match="held in memory"):
            rec.flush()  # retries now; the limit still holds, so it says what is held
        # One report, on the first step after the disk refused; then silence.
        assert len(raised) == 1, raised
        assert "File too large" in str(raised[0]) and "reported only this once" in str(raised[0])
        s = rec.stats()
        assert s["write_errors"] >= 1 and s["steps_held"] > 0
        assert s["steps_written"] + s["steps_held"] == 1000
        # The intact prefix reads back now: whole steps 0..k-1, nothing torn.
        cap = crashreplay.read_capture(str(path))
        assert not cap["truncated"] and not cap["corrupt"] and cap["verify"]["ok"], cap["verify"]
        assert [r["step"] for r in cap["step_records"]] == list(range(s["steps_written"]))
        free_space()
        rec.flush()  # retries now: the held steps follow the prefix
        assert rec.stats()["steps_held"] == 0
        assert record(rec, range(1000, 1100)) == []
        assert rec.close() is None
    cap = crashreplay.read_capture(str(path))
    assert cap["ok"] and cap["verify"]["ok"]
    assert steps_of(str(path)) == list(range(1100))
    assert cap["write_errors"] >= 1 and cap["steps_dropped"] == 0


def test_close_reports_what_was_not_written_without_raising(tmp_path):
    path = tmp_path / "never.crcap"
    with file_size_limit(48 << 10):
        rec = make(path, held_steps=20)
        raised = record(rec, range(600))
        with pytest.warns(RuntimeWarning, match=r"not written: steps \d+-599 \(\d+ steps, held in memory\), "
                                                r"\d+ steps dropped"):
            report = rec.close()
        assert rec.close() is None  # closed: nothing more to say, nothing raised
    assert len(raised) == 1
    assert "index and end record" in report
    s = rec.stats()
    assert 0 < s["steps_held"] <= 20 and s["steps_written"] + s["steps_held"] + s["steps_dropped"] == 600
    cap = crashreplay.read_capture(str(path))
    assert not cap["ok"] and not cap["truncated"] and not cap["corrupt"] and cap["verify"]["ok"]
    steps = steps_of(str(path))
    assert len(steps) == s["steps_written"] and steps == sorted(set(steps))
    # Steps missing between the prefix and what a retry squeezed in are counted.
    assert steps[-1] + 1 - len(steps) <= cap["steps_dropped"]


def test_context_manager_exit_on_a_full_disk_warns_instead_of_raising(tmp_path):
    path = tmp_path / "ctx.crcap"
    with file_size_limit(32 << 10):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with make(path) as rec:
                record(rec, range(300))
    assert any("the disk refuses writes" in str(w.message) for w in caught)
    assert crashreplay.read_capture(str(path))["verify"]["ok"]
