"""What the engine computed, held against the replay: the built-in engine's
path, with no torch (CI).

A llama checkpoint whose layer 2 down_proj weights are scaled by 2^20 (an
exact bf16 exponent shift, done with ml_dtypes on the safetensors bytes)
makes that layer's MLP output exceed 65504, which bf16 and fp32 hold and fp16
does not. `run --set activation_dtype=fp16 --record` stores activations as an
fp16 engine does: the MLP output becomes Inf, the next norm turns it into NaN
and sampling fails on non-finite probabilities. The capture's fingerprints
name the first non-finite boundary (`info`); replaying in fp32 or bf16 is
finite there and reports an engine_divergence at that boundary; replaying
under the recorded fp16 reproduces the failure without a departure. The
unscaled checkpoint runs clean in fp16, so the failure comes from the data."""
import glob
import json
import os
import struct
import subprocess

import ml_dtypes
import numpy as np
import pytest

BIN = os.environ.get("CRASHREPLAY_BIN", "build/tools/crashreplay")
PROMPT = "Say hello in one sentence"
LAYER = 2
SCALE = 2.0 ** 20


def run(*args):
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, check=False)


def scale_tensor(model_dir, name, factor):
    """Multiplies one bf16 tensor of a safetensors checkpoint in place."""
    for path in glob.glob(os.path.join(model_dir, "*.safetensors")):
        with open(path, "r+b") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
            if name not in header:
                continue
            meta = header[name]
            assert meta["dtype"] == "BF16"
            begin, end = meta["data_offsets"]
            f.seek(8 + n + begin)
            w = np.frombuffer(f.read(end - begin), dtype=ml_dtypes.bfloat16).copy()
            scaled = (w.astype(np.float32) * np.float32(factor)).astype(ml_dtypes.bfloat16)
            assert np.array_equal(scaled.astype(np.float32), w.astype(np.float32) * np.float32(factor))  # exact
            f.seek(8 + n + begin)
            f.write(scaled.tobytes())
            return
    raise AssertionError(f"{name} not in {model_dir}")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp")
    plain, hot = root / "plain", root / "hot"
    for d in (plain, hot):
        r = run("make-model", d, "--arch", "llama", "--quant", "bf16", "--layers", 4, "--seed", 5)
        assert r.returncode == 0, r.stderr
    scale_tensor(str(hot), f"model.layers.{LAYER}.mlp.down_proj.weight", SCALE)
    return plain, hot


def record(model, cap, *sets):
    args = ["run", model, "--prompt", PROMPT, "--max-new-tokens", 2, "--json", "--record", cap]
    for s in sets:
        args += ["--set", s]
    r = run(*args)
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout)


def replay(cap, *sets):
    args = ["replay", cap, "--json"]
    for s in sets:
        args += ["--set", s]
    r = run(*args)
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout)


@pytest.fixture(scope="module")
def fp16_capture(models, tmp_path_factory):
    cap = tmp_path_factory.mktemp("cap") / "fp16"
    rc, out = record(models[1], cap, "activation_dtype=fp16")
    return cap, rc, out


def test_the_unscaled_checkpoint_runs_clean_in_fp16(models, tmp_path):
    rc, out = record(models[0], tmp_path / "cap", "activation_dtype=fp16")
    assert rc == 0, out
    info = json.loads(run("info", tmp_path / "cap", "--json").stdout)
    assert info["first_nonfinite_boundary"] is None
    assert info["files"][0]["fingerprint_records"] == len(out["steps"])


def test_fp16_overflow_fails_in_sampling(fp16_capture):
    _, rc, out = fp16_capture
    assert rc == 1
    assert out["signature"]["class"] == "device_assert"
    assert out["signature"]["kernel"] == "sampler"
    assert out["signature"]["check"] in ("probs_finite", "logits_finite")


def test_info_names_the_overflowing_layer(fp16_capture):
    cap, _, _ = fp16_capture
    r = run("info", cap, "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    first = info["first_nonfinite_boundary"]
    assert first["boundary"] == f"L{LAYER}.mlp", first
    assert first["step"] == 0
    assert first["pos_inf"] + first["neg_inf"] > 0 and first["nan"] == 0
    step0 = info["files"][0]["fingerprints"][0]
    assert step0["complete"] is False  # the sampler's check fired: the step did not finish
    assert step0["last_boundary"] == "lm_head"
    text = run("info", cap).stdout
    assert f"first non-finite at L{LAYER}.mlp" in text


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_wider_dtype_is_finite_and_reports_the_divergence_there(fp16_capture, dtype):
    cap, _, _ = fp16_capture
    rc, out = replay(cap, f"activation_dtype={dtype}")
    assert rc == 1
    assert out["outcome"] == "diverged"
    d = out["engine_divergence"]
    assert d["boundary"] == f"L{LAYER}.mlp", d
    assert d["engine"]["pos_inf"] + d["engine"]["neg_inf"] > 0
    assert d["replay"]["nan"] + d["replay"]["pos_inf"] + d["replay"]["neg_inf"] == 0
    assert d["replay"]["max_abs"] > 65504  # the premise: the value fits bf16, not fp16
    sig = dict(out["signature"])
    assert "where the reference is finite" in sig.pop("detail")  # both records, for the reports
    assert sig == {"class": "engine_divergence", "stage": "prefill", "kernel": f"L{LAYER}.mlp",
                   "check": "fingerprint"}
    # Every earlier boundary agreed within the tolerance.
    assert out["fingerprints"]["compared"] > 4 * LAYER


def test_the_recorded_dtype_reproduces_the_failure_without_departure(fp16_capture):
    cap, _, _ = fp16_capture
    rc, out = replay(cap)
    assert rc == 1
    assert out["outcome"] == "failed"
    assert out["matches_recorded_failure"] is True
    assert "engine_divergence" not in out
    assert out["config"]["activation_dtype"] == "fp16"


def test_bisect_over_the_dtype_finds_it(fp16_capture, tmp_path):
    cap, _, _ = fp16_capture
    good, bad = tmp_path / "good.toml", tmp_path / "bad.toml"
    good.write_text('activation_dtype = "bf16"\n')
    bad.write_text('activation_dtype = "fp16"\n')
    r = run("bisect", cap, "--good", good, "--bad", bad, "--json", "--quiet", "--workdir", tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert rep["status"] == "culprit_found", rep["message"]
    assert rep["culprit"] == {"activation_dtype": "fp16"}
    assert rep["first_bad_kernel"]["kernel"] == f"L{LAYER}.down_proj"
    assert rep["first_bad_kernel"]["reason"] == "non_finite"


def test_bisect_targets_an_engine_divergence_and_its_report_shows_both_records(models, tmp_path):
    # A clean fp16 run replayed with an fp8 KV cache departs from what the
    # engine computed: a finding bisection can target
    # (--diverged-is-bad); the report carries the boundary and both records.
    cap = tmp_path / "clean"
    rc, _ = record(models[0], cap, "activation_dtype=fp16")
    assert rc == 0
    good, bad = tmp_path / "good.toml", tmp_path / "bad.toml"
    good.write_text('activation_dtype = "fp16"\n')
    bad.write_text('activation_dtype = "fp16"\nkv_cache_dtype = "fp8_e4m3"\nrope_config = "legacy"\n')
    report = tmp_path / "report.html"
    r = run("bisect", cap, "--good", good, "--bad", bad, "--diverged-is-bad", "--json", "--quiet",
            "--workdir", tmp_path, "--report", report)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert rep["status"] == "culprit_found", rep["message"]
    assert rep["culprit"] == {"kv_cache_dtype": "fp8_e4m3"}
    sig = rep["target_signature"]
    assert (sig["class"], sig["check"]) == ("engine_divergence", "fingerprint")
    assert "the engine: F16" in sig["detail"] and "the reference: F16" in sig["detail"]
    html = report.read_text()
    assert f"engine_divergence during {sig['stage']} at {sig['kernel']}/fingerprint" in html
    assert "the engine: F16" in html and "the reference: F16" in html
