"""`crashreplay demo --json`: the end-to-end story's conclusions.

The expectations are derived from the demo's configuration files
(configs/demo/*.toml, sglang server arguments and environment on a recorded
RTX PRO 6000, sm_120) and the mechanism behind each failure:

* launch1_oom.toml differs from conservative.toml in mem_fraction_static,
  cuda_graph_max_bs and the DSA decode backend. The memory planner's
  graph-capture check fails only when the static fraction leaves too little
  dynamic memory AND the graphs up to the larger batch need more than that
  (each change alone fits); the decode backend never runs, since the server
  dies before serving. The culprit is exactly the two memory changes.
* launch2_assert.toml differs in the same keys, but at 0.88 the memory fits;
  the first decode step runs flashmla_kv's kernel, FlashMLA's sparse decode,
  which has no sm_120 code (replay/config/src/kernel_archs.cc): unsupported_arch.
  The culprit is exactly {dsa_decode_backend: flashmla_kv}.
"""
import json
import os
import pathlib
import re
import subprocess
import tomllib

import pytest

BIN = os.environ.get("CRASHREPLAY_BIN", "build/tools/crashreplay")
ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs" / "demo"


def load(name):
    with open(CONFIGS / name, "rb") as f:
        return tomllib.load(f)


def diff(good, bad):
    return {k: v for k, v in bad.items() if good.get(k) != v}


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    r = subprocess.run([BIN, "demo", "--json", "--out", str(out), "--configs", str(CONFIGS)],
                       capture_output=True, text=True, check=False, timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), out, r.stderr


def finding(result, stage):
    found = [f for f in result["findings"] if f["signature"]["stage"] == stage]
    assert len(found) == 1, result["findings"]
    return found[0]


def test_the_oom_is_found_at_graph_capture_with_both_memory_changes_as_culprit(demo):
    result, _, _ = demo
    good, bad = load("conservative.toml"), load("launch1_oom.toml")
    expected = diff(good, bad)
    assert set(expected) == {"mem_fraction_static", "cuda_graph_max_bs", "dsa_decode_backend"}  # what the files say
    f = finding(result, "graph_capture")
    assert f["signature"] == {"class": "oom", "stage": "graph_capture", "kernel": "memory_planner",
                              "check": "graph_memory_fits"}
    assert f["culprit"] == {k: expected[k] for k in ("mem_fraction_static", "cuda_graph_max_bs")}
    assert f["culprit_minimal"] is True
    assert f["first_bad_kernel"]["kernel"] == "memory_planner"
    assert result["launches"]["launch1"]["exit_code"] == 1


def test_the_decode_failure_is_the_dsa_decode_kernel_without_sm120_code(demo):
    result, _, _ = demo
    good, bad = load("conservative.toml"), load("launch2_assert.toml")
    changes = diff(good, bad)
    assert bad["crashreplay"]["device_arch"] == "sm_120" and bad["dsa_decode_backend"] == "flashmla_kv"
    assert "dsa_decode_backend" in changes and len(changes) > 1  # the bisector has something to isolate
    f = finding(result, "decode")
    assert f["signature"] == {"class": "unsupported_arch", "stage": "decode", "kernel": "attention",
                              "check": "flashmla_sparse_on_sm_120"}
    assert f["culprit"] == {"dsa_decode_backend": "flashmla_kv"}
    # The failing step ran up to the attention kernel of layer 0 and stopped there.
    assert f["first_bad_kernel"]["kernel"] == "L0.attention"
    steps = result["launches"]["launch2"]["steps"]
    assert [s["mode"] for s in steps] == ["prefill", "decode"]


def test_the_two_failures_are_different_bugs(demo):
    result, _, _ = demo
    assert result["distinct_bugs"] is True
    assert len(result["findings"]) == 2


def test_replay_of_the_failing_step_reproduces_the_failure_kernel_by_kernel(demo):
    result, _, _ = demo
    rep = result["replay"]
    # `replay` reports the step failing again, and says it is the recorded failure.
    assert rep["outcome"] == "failed" and rep["matches_recorded_failure"] is True
    # The capture is in sglang's manifest form: weights verified in sglang's layout on all 8 ranks.
    assert rep["weights"].startswith("verified") and "of 8 ranks (sglang layout)" in rep["weights"], rep["weights"]
    assert rep["config"]["device_arch"] == "sm_120" and rep["config"]["dsa_kernel"] == "flashmla_sparse"
    assert rep["fault"]["signature"]["kernel"] == "attention" and rep["fault"]["layer"] == 0
    assert rep["fault"]["signature"]["check"] == "flashmla_sparse_on_sm_120" and rep["fault"]["value"] == 120
    assert rep["kernels_run"] > 1
    assert rep["first_bad_kernel_vs_conservative"]["kernel"] == "L0.attention"
    trace = json.loads(pathlib.Path(rep["trace"]).read_text())
    assert trace["traceEvents"][-1]["name"] == "L0.attention"


def test_html_reports_are_written_and_self_contained(demo):
    result, out, _ = demo
    pages = [pathlib.Path(result["report"])] + [pathlib.Path(f["report"]) for f in result["findings"]]
    for page in pages:
        assert page.is_file() and page.parent == out
        html = page.read_text()
        assert "<html" in html.lower()
        # An SVG namespace name is an identifier, never fetched; any other URL would be.
        assert not re.search(r"https?://", re.sub(r"""xmlns(:\w+)?=(["'])[^"']*\2""", "", html)), page
        assert not re.search(r"<script[^>]*\bsrc\s*=", html, re.I), page
        assert not re.search(r"<link[^>]*\bhref\s*=", html, re.I), page
    summary = pages[0].read_text()
    for f in result["findings"]:
        assert pathlib.Path(f["report"]).name in summary  # linked, relative
    assert "<svg" in pages[2].read_text()  # the bisection report's kernel chart


def test_culprits_follow_edited_configuration_files(tmp_path):
    """The failures come from the files, not from the demo: turn JIT DeepGEMM
    back on in launch 2 (sglang's default) and on sm_120 it reads the NVFP4
    checkpoint's e4m3 scales as UE8M0; the UE8M0 kernel's layout check fires in
    the first prefill, before the decode backend ever runs, and the culprit
    moves to the environment variable."""
    configs = tmp_path / "configs"
    configs.mkdir()
    for name in ("launch1_oom.toml", "launch2_assert.toml", "conservative.toml"):
        text = (CONFIGS / name).read_text()
        if name == "launch2_assert.toml":
            text = re.sub(r'(?m)^env.SGLANG_ENABLE_JIT_DEEPGEMM = "0"$', 'env.SGLANG_ENABLE_JIT_DEEPGEMM = "1"', text)
        (configs / name).write_text(text)
    r = subprocess.run([BIN, "demo", "--json", "--out", str(tmp_path / "out"), "--configs", str(configs)],
                       capture_output=True, text=True, check=False, timeout=600)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    f = finding(result, "prefill")
    assert f["signature"]["class"] == "device_assert" and f["signature"]["check"] == "ue8m0_scale_layout"
    assert f["culprit"] == {"env.SGLANG_ENABLE_JIT_DEEPGEMM": "1"}
    assert finding(result, "graph_capture")["culprit"] == {"mem_fraction_static": 0.95, "cuda_graph_max_bs": 64}


def test_bisecting_the_recorded_capture_replays_the_step_and_finds_the_same_culprit(demo):
    # `crashreplay bisect CAPTURE`: every trial replays launch 2's recorded
    # decode step, a capture in sglang's manifest form, under the trial's
    # configuration in sglang's words; the culprit is the decode backend, as
    # with `run` trials.
    _, out, _ = demo
    (out / "bisect-capture").mkdir(exist_ok=True)
    r = subprocess.run([BIN, "bisect", str(out / "launch2"), "--good", str(CONFIGS / "conservative.toml"),
                        "--bad", str(CONFIGS / "launch2_assert.toml"), "--json", "-q",
                        "--workdir", str(out / "bisect-capture")],
                       capture_output=True, text=True, check=False, timeout=600)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["culprit"] == {"dsa_decode_backend": "flashmla_kv"}
    sig = report["target_signature"]
    assert (sig["class"], sig["stage"], sig["kernel"], sig["check"]) == \
        ("unsupported_arch", "decode", "attention", "flashmla_sparse_on_sm_120")
    assert report["first_bad_kernel"]["kernel"] == "L0.attention"
    assert "replay" in report["reproduce"]
