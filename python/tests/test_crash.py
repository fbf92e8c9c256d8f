"""A process using crashreplay dies in each way the recorder must survive.

Each case runs tests/crash_child.py in a subprocess, which records STEPS
steps of real numpy tensors and then fails; the capture must be readable
and hold every accepted step, plus what the failure path promises:
  * an exception through the failure hook: a FailureRecord with the class
    guessed from the message, the snapshot ring, re-raised (exit 1);
  * abort / SIGSEGV: the signal handler writes the ring and a failure record
    with the signal, then the process dies by that signal;
  * SIGKILL from the parent: whatever the writer had written (every step,
    since the child flushed before saying READY), no failure record.
When CRASHREPLAY_BIN names the CLI, `crashreplay info --json` and `verify`
must agree.
"""
import json
import os
import signal
import subprocess
import sys

import pytest

import crashreplay

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = os.path.join(HERE, "crash_child.py")
STEPS = 5


def run_child(mode, path, wait=True):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    cmd = [sys.executable, CHILD, mode, str(path), str(STEPS)]
    if not wait:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


def check_cli(path, expect_steps):
    binary = os.environ.get("CRASHREPLAY_BIN")
    if not binary or not os.path.exists(binary):
        return
    info = subprocess.run([binary, "info", "--json", str(path)], capture_output=True, text=True, timeout=60)
    assert info.returncode == 0, info.stderr
    j = json.loads(info.stdout)
    j = j[0] if isinstance(j, list) else j
    assert j["steps"] == expect_steps
    verify = subprocess.run([binary, "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def check_steps(cap):
    steps = [s["step"] for s in cap["step_records"]]
    assert steps == list(range(STEPS))
    last = cap["step_records"][-1]
    assert last["token_ids"] == crashreplay_child_inputs(STEPS - 1)["input_ids"].tolist()
    assert last["seq_lens"] == [STEPS + 3, STEPS + 4]
    assert last["sampling"][0]["seed"] == 1234 and last["sampling"][1]["seed"] is None
    assert cap["verify"]["ok"], cap["verify"]


def crashreplay_child_inputs(step):
    sys.path.insert(0, HERE)
    try:
        import crash_child

        return crash_child.inputs(step)
    finally:
        sys.path.remove(HERE)


def check_snapshots_round_trip(path, cap):
    """The ring written on failure holds the tensors exactly as submitted."""
    snaps = cap["snapshot_records"]
    assert snaps, "the failure path wrote no snapshot"
    f = crashreplay.CaptureFile(str(path))
    newest = max(snaps, key=lambda s: s["step"])
    assert newest["step"] == STEPS - 1
    want = crashreplay_child_inputs(newest["step"])
    got = {d["name"]: crashreplay.load_tensor(f, d) for d in newest["tensors"]}
    assert set(got) == set(want)
    for name, arr in want.items():
        assert got[name].dtype == arr.dtype and (got[name] == arr).all(), name


@pytest.mark.parametrize("mode,failure_class", [("exception", "device-assert"), ("oom", "out-of-memory")])
def test_exception_through_failure_hook_is_recorded_and_reraised(tmp_path, mode, failure_class):
    path = tmp_path / "cap.crcap"
    r = run_child(mode, path)
    assert r.returncode == 1, r.stderr  # the exception still escapes
    assert ("device-side assert" if mode == "exception" else "CUDA out of memory") in r.stderr
    cap = crashreplay.read_capture(str(path))
    check_steps(cap)
    assert len(cap["failure_records"]) == 1
    f = cap["failure_records"][0]
    assert f["failure_class"] == failure_class
    assert f["step"] == STEPS and f["stage"] == "decode"
    assert f["exception_type"] in ("RuntimeError", "OutOfMemoryError")
    assert "Traceback" in f["backtrace"]
    check_snapshots_round_trip(path, cap)
    check_cli(path, STEPS)


@pytest.mark.parametrize("mode,sig", [("abort", signal.SIGABRT), ("segv", signal.SIGSEGV),
                                      ("segv_ctypes", signal.SIGSEGV)])
def test_fatal_signal_leaves_readable_capture_and_process_still_dies(tmp_path, mode, sig):
    path = tmp_path / "cap.crcap"
    r = run_child(mode, path)
    assert r.returncode == -sig, (r.returncode, r.stderr)
    cap = crashreplay.read_capture(str(path))
    assert not cap["ok"]  # never closed
    check_steps(cap)
    assert len(cap["failure_records"]) == 1
    f = cap["failure_records"][0]
    assert f["signal"] == sig and f["failure_class"] == "crash"
    assert f["step"] == STEPS - 1  # the last step the recorder accepted
    check_snapshots_round_trip(path, cap)
    check_cli(path, STEPS)


def test_sigkill_keeps_every_step_the_writer_wrote(tmp_path):
    path = tmp_path / "cap.crcap"
    p = run_child("sigkill", path, wait=False)
    try:
        line = p.stdout.readline()
        assert line.strip() == "READY", p.stderr.read()
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == -signal.SIGKILL
    cap = crashreplay.read_capture(str(path))
    assert not cap["ok"] and not cap["corrupt"]
    check_steps(cap)
    assert cap["failure_records"] == []
    check_cli(path, STEPS)


def test_clean_close_is_ok(tmp_path):
    path = tmp_path / "cap.crcap"
    r = run_child("clean", path)
    assert r.returncode == 0, r.stderr
    cap = crashreplay.read_capture(str(path))
    assert cap["ok"] and not cap["truncated"]
    check_steps(cap)
    check_cli(path, STEPS)
