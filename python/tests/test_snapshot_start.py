"""`run --record` snapshots each step's state (the KV pages its batch reads)
into the recorder's ring, written on failure and at the end; `replay` starts
from the snapshot of step N when the capture has one and the configuration
is the recorded one, else re-executes steps 0..N-1 (`--from-start` forces
it). Both starts give the same step digest and per-kernel digests, for a
clean and for a failing capture; the JSON and text reports say which start
was used and why."""
import json
import os
import subprocess

import pytest
from safetensors.numpy import load_file

BIN = os.environ.get("CRASHREPLAY_BIN", "build/tools/crashreplay")


def run(*args):
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, check=False)


def replay_json(cap, *args):
    r = run("replay", cap, "--json", *args)
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout)


def same_bits(a, b):
    assert a["outcome"] == b["outcome"]
    assert a["digest"] == b["digest"]
    assert [(k["name"], k["digest"], k["failed"]) for k in a["kernels"]] == \
           [(k["name"], k["digest"], k["failed"]) for k in b["kernels"]]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    m = tmp_path_factory.mktemp("snap") / "m"
    assert run("make-model", m, "--arch", "qwen3_moe", "--quant", "fp8").returncode == 0
    return m


@pytest.fixture(scope="module")
def clean(model, tmp_path_factory):
    cap = tmp_path_factory.mktemp("clean") / "cap"
    r = run("run", model, "--prompt", "Say hello", "--prompt", "Hi", "--max-new-tokens", 4,
            "--temperature", 0.8, "--seed", 3, "--record", cap)
    assert r.returncode == 0, r.stderr
    assert "4 state snapshots taken" in r.stdout
    return cap


@pytest.mark.parametrize("step", [0, 1, 2, 3])
def test_snapshot_and_re_execution_give_the_same_bits(clean, step):
    rc, snap = replay_json(clean, "--step", step)
    assert rc == 0 and snap["outcome"] == "reproduced", snap["detail"]
    assert snap["start"] == "snapshot" and snap["snapshot_step"] == step
    rc, full = replay_json(clean, "--step", step, "--from-start")
    assert rc == 0 and full["start"] == "re-executed" and full["start_note"] == "--from-start"
    assert "snapshot_step" not in full
    same_bits(snap, full)


def test_text_report_names_the_start(clean):
    r = run("replay", clean, "--step", 2)
    assert r.returncode == 0 and "start: snapshot of step 2" in r.stdout
    r = run("replay", clean, "--step", 2, "--from-start")
    assert "start: re-executed steps 0..1 (--from-start)" in r.stdout


def test_a_re_execution_says_its_work_before_it_starts(clean):
    # Before re-executing, replay says why and how much (tokens, as the
    # capture's own step records count them), and its progress counts
    # tokens; a snapshot start re-executes nothing and says nothing of it.
    from crashreplay import read_capture

    cap = read_capture(str(clean))
    steps = (cap["files"][0] if "files" in cap else cap)["step_records"][:3]
    tokens = sum(len(s["token_ids"]) for s in steps)
    prefill = sum(len(s["token_ids"]) for s in steps if s["mode"] != "decode")
    r = run("replay", clean, "--step", 3, "--from-start")
    assert r.returncode == 0, r.stderr
    said = [line for line in r.stderr.splitlines() if "to rebuild step 3's KV cache" in line]
    assert said == [f"replay: re-executing steps 0..2 to rebuild step 3's KV cache (--from-start): "
                    f"{tokens} tokens in 3 steps ({prefill} of prefill)"]
    assert said[0] in r.stderr.split("re-executing steps (tokens)")[0]  # before the work
    assert f"re-executing steps (tokens)  {tokens}/{tokens}" in r.stderr
    rc, full = replay_json(clean, "--step", 3, "--from-start")
    assert full["re_executed"] == {"steps": 3, "tokens": tokens, "prefill_tokens": prefill}
    rc, snap = replay_json(clean, "--step", 3)
    assert snap["start"] == "snapshot" and "re_executed" not in snap


def test_only_the_last_steps_are_kept(model, tmp_path):
    cap = tmp_path / "cap"
    assert run("run", model, "--prompt", "Hi", "--max-new-tokens", 6, "--snapshots", 2,
               "--record", cap).returncode == 0
    # The ring is bounded and never makes a step wait: while the encoder is
    # busy with one snapshot, a new one evicts the staged one before it, so
    # which earlier steps are held depends on timing (4..5 or 3 and 5). What
    # holds: at most 2, the last step always, and every other step
    # re-executes to the recorded bits with a note naming what is held.
    starts = {}
    for step in range(6):
        rc, out = replay_json(cap, "--step", step)
        assert rc == 0 and out["outcome"] == "reproduced", (step, out.get("start_note"))
        starts[step] = out
    held = sorted(s for s, o in starts.items() if o["start"] == "snapshot")
    assert 1 <= len(held) <= 2 and held[-1] == 5, held
    for step, out in starts.items():
        if step in held:
            continue
        assert out["start"] == "re-executed"
        assert out["start_note"] == f"no snapshot of step {step} (the capture holds steps {held[0]}..{held[-1]})"


def test_failing_capture_fails_the_same_way_from_either_start(model, tmp_path):
    cap = tmp_path / "cap"
    r = run("run", model, "--prompt", "Say hello in one sentence", "--max-new-tokens", 4,
            "--set", "attention_backend=paged64", "--record", cap)
    assert r.returncode == 1
    rc, snap = replay_json(cap)
    assert rc == 1 and snap["outcome"] == "failed" and snap["matches_recorded_failure"]
    assert snap["start"] == "snapshot" and snap["snapshot_step"] == snap["step"] == 1
    rc, full = replay_json(cap, "--from-start")
    assert rc == 1 and full["start"] == "re-executed"
    same_bits(snap, full)
    assert snap["signature"] == full["signature"]
    # The dumps hold the same tensors, whichever start.
    d1, d2 = tmp_path / "d1", tmp_path / "d2"
    assert run("replay", cap, "--dump", d1).returncode == 1
    assert run("replay", cap, "--dump", d2, "--from-start").returncode == 1
    a, b = load_file(str(d1 / "step1.rank0.safetensors")), load_file(str(d2 / "step1.rank0.safetensors"))
    assert sorted(a) == sorted(b) and "L0.attention.attn" in a
    for name in a:
        assert a[name].tobytes() == b[name].tobytes(), name


def test_another_configuration_re_executes(clean):
    rc, out = replay_json(clean, "--step", 2, "--set", "attention_backend=flashdecode")
    assert out["start"] == "re-executed"
    assert "configuration differs from the recording (attention_backend)" in out["start_note"]


def test_snapshots_off(model, tmp_path):
    cap = tmp_path / "cap"
    r = run("run", model, "--prompt", "Hi", "--max-new-tokens", 3, "--snapshots", "off", "--record", cap)
    assert r.returncode == 0 and "0 state snapshots taken" in r.stdout
    rc, out = replay_json(cap, "--step", 2)
    assert rc == 0 and out["start"] == "re-executed"
    assert out["start_note"] == "the capture holds no snapshot"


@pytest.mark.parametrize("flag,value", [("--snapshots", "0"), ("--snapshots", "lots"),
                                        ("--snapshot-budget", "12Q"), ("--snapshot-budget", "0")])
def test_bad_snapshot_flags_are_usage_errors(model, tmp_path, flag, value):
    r = run("run", model, "--prompt", "Hi", "--record", tmp_path / "cap", flag, value)
    assert r.returncode == 2
    assert flag in r.stderr and value in r.stderr
