"""`crashreplay bisect` as a user runs it: exit codes, --json, --report, SIGINT.

Needs CRASHREPLAY_BIN (scripts/test.sh sets it to the built executable).
"""
import json
import os
import signal
import stat
import subprocess
import time

import pytest

BIN = os.environ.get("CRASHREPLAY_BIN", "build/tools/crashreplay")
pytestmark = pytest.mark.skipif(not os.path.exists(BIN), reason="crashreplay executable not built")


def write(path, text, executable=False):
    path.write_text(text)
    if executable:
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def configs(tmp_path, n=6):
    good = write(tmp_path / "good.toml", "".join(f"t{i} = false\n" for i in range(n)))
    bad = write(tmp_path / "bad.toml", "".join(f"t{i} = true\n" for i in range(n)))
    return good, bad


def trial(tmp_path, body):
    return write(tmp_path / "trial.sh",
                 "#!/bin/sh\non() { grep -q \"^$1 = true\" \"$CRASHREPLAY_CONFIG\"; }\n" + body + "\n",
                 executable=True)


def bisect(*args, **kw):
    return subprocess.run([BIN, "bisect", "-q", *args], capture_output=True, text=True, timeout=60, **kw)


def test_culprit_found_exit_0_with_json_and_html(tmp_path):
    good, bad = configs(tmp_path)
    script = trial(tmp_path, "on t4 && exit 1\nexit 0")
    html = tmp_path / "report.html"
    r = bisect("--good", good, "--bad", bad, "--json", "--report", str(html), "--workdir", str(tmp_path), "--",
               script)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["culprit"] == {"t4": True}
    assert out["target_signature"]["class"] == "other"
    assert out["other_findings"] == []
    assert out["trials"] >= 3
    assert "culprit.toml" in out["reproduce"]
    # The reproduce command really reproduces the failure.
    assert subprocess.run(out["reproduce"], shell=True).returncode == 1
    assert "<svg" in html.read_text() or "No per-kernel tables" in html.read_text()


def test_bad_configuration_passing_exits_4(tmp_path):
    good, bad = configs(tmp_path)
    r = bisect("--good", good, "--bad", bad, "--", trial(tmp_path, "exit 0"))
    assert r.returncode == 4
    assert "does not fail" in r.stdout


def test_good_configuration_failing_exits_5(tmp_path):
    good, bad = configs(tmp_path)
    r = bisect("--good", good, "--bad", bad, "--", trial(tmp_path, "exit 1"))
    assert r.returncode == 5


def test_usage_errors_exit_2(tmp_path):
    good, bad = configs(tmp_path)
    assert bisect("--good", good, "--bad", bad).returncode == 2  # neither capture nor command
    assert bisect("--good", good, "--bad", bad, "cap", "--", "true").returncode == 2  # both
    malformed = write(tmp_path / "m.toml", "[table]\n")
    r = bisect("--good", malformed, "--bad", bad, "--", "true")
    assert r.returncode == 2
    assert "m.toml:1" in r.stderr


def test_missing_configuration_file_exits_3(tmp_path):
    _, bad = configs(tmp_path)
    r = bisect("--good", str(tmp_path / "nope.toml"), "--bad", bad, "--", "true")
    assert r.returncode == 3
    assert "nope.toml" in r.stderr


def test_sigint_kills_trials_and_exits_130(tmp_path):
    good, bad = configs(tmp_path)
    script = trial(tmp_path, "sleep 60\nexit 0")
    p = subprocess.Popen([BIN, "bisect", "-q", "--good", good, "--bad", bad, "--jobs", "2", "--", script],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)
    start = time.time()
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 130
    assert time.time() - start < 10
    assert "interrupted" in out
