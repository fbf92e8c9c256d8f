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
    text = html.read_text()
    assert "<h2>Culprit</h2>" in text
    assert "Per-kernel" not in text  # the trials gave no kernel tables


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


ORACLE = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "bisect", "oracles", "oracle.sh")


def keys(tmp_path, n, width=3):
    names = [f"k{i:0{width}d}" for i in range(n)]
    good = write(tmp_path / "good.toml", "".join(f"{k} = false\n" for k in names))
    bad = write(tmp_path / "bad.toml", "".join(f"{k} = true\n" for k in names))
    return good, bad


def test_two_bugs_are_two_findings_each_narrowed(tmp_path):
    good, bad = keys(tmp_path, 16)
    r = bisect("--good", good, "--bad", bad, "--json", "--workdir", str(tmp_path), "--",
               "sh", ORACLE, "k011:oom", "k004:assert")
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert out["culprit"] == {"k011": True}
    assert out["target_signature"]["class"] == "oom"
    [other] = out["other_findings"]
    assert other["signature"]["class"] == "device_assert"
    assert other["signature"]["kernel"] == "IndexKernel.cu:111"
    assert other["status"] == "narrowed"
    assert other["culprit"] == ["k004"]
    # Its configuration file reproduces the other failure.
    rerun = subprocess.run(other["reproduce"], shell=True, capture_output=True, text=True)
    assert rerun.returncode == 1
    assert "device-side assert triggered" in rerun.stderr


def test_exit_codes_alone_tell_bugs_apart(tmp_path):
    good, bad = keys(tmp_path, 16)
    r = bisect("--good", good, "--bad", bad, "--json", "--workdir", str(tmp_path), "--",
               "sh", ORACLE, "k011:exit3", "k004:exit7")
    assert r.returncode == 0
    out = json.loads(r.stdout)
    assert out["culprit"] == {"k011": True}
    assert out["target_signature"]["check"] == "exit 3"
    assert [(o["signature"]["check"], o["culprit"]) for o in out["other_findings"]] == [("exit 7", ["k004"])]


def test_flaky_search_exits_6_and_claims_no_culprit(tmp_path):
    good, bad = keys(tmp_path, 8)
    html = tmp_path / "r.html"
    r = bisect("--good", good, "--bad", bad, "--json", "--repeat", "3", "--report", str(html), "--",
               "sh", ORACLE, "--seed=1", "k005~50:assert")
    assert r.returncode == 6, r.stdout
    out = json.loads(r.stdout)
    assert out["status"] == "flaky"
    assert out["culprit"] is None
    assert out["flaky"], out
    assert "rerun with --repeat to see" not in out["message"]
    assert "Flaky configurations" in html.read_text()


def test_signature_regex_names_the_bug(tmp_path):
    good, bad = configs(tmp_path, 8)
    script = trial(tmp_path, "on t6 && { echo 'FAULT code=PAGE_OOB' >&2; exit 1; }\n"
                             "on t2 && { echo 'FAULT code=BAD_SCALE' >&2; exit 1; }\nexit 0")
    r = bisect("--good", good, "--bad", bad, "--json", "--signature-regex", "FAULT code=([A-Z_]+)", "--",
               script)
    assert r.returncode == 0
    out = json.loads(r.stdout)
    assert out["target_signature"]["check"] == "PAGE_OOB"
    assert out["culprit"] == {"t6": True}
    assert [o["signature"]["check"] for o in out["other_findings"]] == ["BAD_SCALE"]
    bad_regex = bisect("--good", good, "--bad", bad, "--signature-regex", "([", "--", script)
    assert bad_regex.returncode == 2
    assert "([" in bad_regex.stderr


def test_invalid_utf8_in_a_value_does_not_abort(tmp_path):
    good = tmp_path / "good.toml"
    good.write_bytes(b't0 = false\nname = "caf\xc3\xa9 \xff\xfe"\n')
    bad = write(tmp_path / "bad.toml", 't0 = true\nname = "x"\n')
    script = trial(tmp_path, "on t0 && exit 1\nexit 0")
    html = tmp_path / "r.html"
    r = subprocess.run([BIN, "bisect", "-q", "--good", str(good), "--bad", bad, "--json", "--report", str(html),
                        "--", script], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.decode("utf-8"))  # valid UTF-8 whatever the configuration held
    assert out["culprit"] == {"t0": True}
    html.read_bytes().decode("utf-8")


def test_a_nul_byte_does_not_cut_the_error_message(tmp_path):
    _, bad = configs(tmp_path)
    nul = tmp_path / "nul.toml"
    nul.write_bytes(b"t0 = tr\x00ue\n")
    r = bisect("--good", str(nul), "--bad", bad, "--", "true")
    assert r.returncode == 2
    assert "'tr\\x00ue' is not a supported value" in r.stderr


def test_an_unwritable_report_is_refused_before_any_trial(tmp_path):
    good, bad = configs(tmp_path)
    marker = tmp_path / "ran"
    script = trial(tmp_path, f"touch {marker}\non t1 && exit 1\nexit 0")
    for report in (str(tmp_path / "no" / "such" / "dir" / "r.html"), str(tmp_path)):
        r = bisect("--good", good, "--bad", bad, "--report", report, "--", script)
        assert r.returncode == 3, r.stderr
        assert "cannot write the HTML report" in r.stderr
    assert not marker.exists()


def test_integer_threshold_is_an_integer_in_json(tmp_path):
    good = write(tmp_path / "good.toml", "max_batch = 16\nt0 = false\n")
    bad = write(tmp_path / "bad.toml", "max_batch = 64\nt0 = true\n")
    script = write(tmp_path / "t.sh", "#!/bin/sh\n"
                   "v=$(sed -n 's/^max_batch = //p' \"$CRASHREPLAY_CONFIG\")\n[ \"$v\" -ge 37 ] && exit 1\nexit 0\n",
                   executable=True)
    r = bisect("--good", good, "--bad", bad, "--json", "--threshold", "max_batch", "--", script)
    assert r.returncode == 0, r.stdout
    assert '"first_fail": 37,' in r.stdout or '"first_fail": 37\n' in r.stdout
    out = json.loads(r.stdout)
    assert out["threshold"]["last_pass"] == 36 and isinstance(out["threshold"]["last_pass"], int)


def test_ten_thousand_keys_give_bounded_progress_and_a_readable_report(tmp_path):
    good, bad = keys(tmp_path, 10000, width=4)
    html = tmp_path / "r.html"
    r = subprocess.run([BIN, "bisect", "--good", good, "--bad", bad, "--report", str(html), "--",
                        "sh", ORACLE, "k7321:oom", "k1234:assert"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout
    assert max(len(line) for line in r.stderr.splitlines()) <= 200
    assert len(r.stderr) < 30000
    text = html.read_text()
    assert len(text) < 100_000
    assert text.index("<h2>Culprit</h2>") < text.index("<h2>Search history</h2>")
    assert "k7321" in text and "narrowed" in text


def test_first_bad_kernel_compares_the_step_the_culprit_failed_in(tmp_path):
    # A decode step's replay under scale_format=ue8m0 fails in step 0 (the
    # prefill it re-executes first, at the first projection); the reference
    # table must then be step 0's too, not the target step's (which put the
    # "first bad kernel" at the embedding, comparing different steps' tokens).
    model, rec = tmp_path / "m", tmp_path / "rec"
    subprocess.run([BIN, "make-model", str(model), "--arch", "glm4_moe", "--quant", "nvfp4"], check=True,
                   capture_output=True)
    subprocess.run([BIN, "run", str(model), "--prompt", "Say hello in one sentence", "--max-new-tokens", "4",
                    "--record", str(rec)], check=True, capture_output=True)
    good = write(tmp_path / "good.toml", 'device = "cpu"\n')
    bad = write(tmp_path / "bad.toml", 'device = "cpu"\nscale_format = "ue8m0"\nattention_backend = "paged64"\n'
                'page_size = 16\n')
    (tmp_path / "w").mkdir()
    r = bisect(str(rec), "--good", good, "--bad", bad, "--json", "--workdir", str(tmp_path / "w"))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["culprit"] == {"scale_format": "ue8m0"}
    assert out["target_signature"]["kernel"] == "q_proj"
    assert out["target_signature"]["step"] == 0
    first = out["first_bad_kernel"]
    assert (first["kernel"], first["layer"]) == ("L0.q_proj", 0), first
    # The failing step's own kernels, in the same order on both sides.
    assert first["reference"]["name"] == first["test"]["name"] == "L0.q_proj"
