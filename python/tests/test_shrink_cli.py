"""`crashreplay shrink`: the smallest capture that still fails the same way.

The captures are made by the built command itself (`demo`, `make-model` +
`run --record`); the oracle for "still fails the same way" is the replay of
the shrunk directory, run from its README's command, against the signature
the original's replay gives."""
import json
import os
import pathlib
import socket
import subprocess

import pytest

import crashreplay

BIN = os.environ.get("CRASHREPLAY_BIN", "build/tools/crashreplay")
VOCAB = 256


def run(*args, cwd=None):
    return subprocess.run([str(BIN) if os.path.isabs(BIN) else os.path.abspath(BIN), *map(str, args)],
                          capture_output=True, text=True, check=False, cwd=cwd, timeout=600)


def replay_signature(capture, *args, cwd=None):
    r = run("replay", capture, "--json", *args, cwd=cwd)
    assert r.returncode in (0, 1), r.stderr
    rep = json.loads(r.stdout)
    return rep["outcome"], rep.get("signature"), rep


def shrink(capture, out, *args):
    r = run("shrink", capture, "-o", out, "--json", *args)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def readme_command(out):
    """The README's replay command (after "crashreplay replay"); a
    make-model line before it (random weights) is run first, from OUT, as a
    user following the README would."""
    text = (pathlib.Path(out) / "README.md").read_text()
    for ln in text.splitlines():
        if ln.startswith("crashreplay make-model"):
            r = run(*ln.split()[1:], cwd=out)
            assert r.returncode == 0, r.stderr[-2000:]
    (line,) = [ln for ln in text.splitlines() if ln.startswith("crashreplay replay")]
    return line.split()[2:]  # after "crashreplay replay"


def stage(report, name):
    (s,) = [s for s in report["stages"] if s["stage"] == name]
    return s


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    d = tmp_path_factory.mktemp("demo")
    r = run("demo", "--out", d / "out", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    return d / "out"


def test_the_demos_decode_failure_shrinks_to_one_layer_and_no_original_token(demo, tmp_path):
    outcome, target, _ = replay_signature(demo / "launch2")
    assert outcome == "failed" and target["class"] == "unsupported_arch"
    rep = shrink(demo / "launch2", tmp_path / "s")
    assert {k: rep["target"][k] for k in ("class", "stage", "kernel", "check")} == \
        {k: target[k] for k in ("class", "stage", "kernel", "check")}
    assert stage(rep, "requests")["after"] == 1
    # The decode step's failure is its kernel's: the prefill before it is not needed.
    assert {k: stage(rep, "history")[k] for k in ("before", "after", "trials")} == {"before": 1, "after": 0, "trials": 1}
    assert stage(rep, "layers") == {"stage": "layers", "before": 3, "after": 1, "trials": 1}
    assert stage(rep, "token_ids")["after"] == 0 and rep["needs"]["token_ids"] == []
    assert rep["minimal"] is True and rep["bytes"]["after"] < rep["bytes"]["before"]
    assert "checkpoint" not in rep["needs"]  # the 1-layer slice replaces it
    # The failure is the configuration's, not the weights': random values of
    # the slice's tensors fail the same way, so OUT ships no model at all,
    # only its config files and the command that draws it.
    assert {k: stage(rep, "weights")[k] for k in ("after", "trials")} == {"after": 0, "trials": 1}
    assert stage(rep, "weights")["before"] > 0 and "weights" not in rep["needs"]
    assert not (tmp_path / "s" / "model").exists()
    assert rep["regenerate_command"].startswith("crashreplay make-model model --like model-config --seed ")
    # The shrunk directory fails the same way from its README's one command.
    outcome, sig, again = replay_signature(*readme_command(tmp_path / "s"), cwd=tmp_path / "s")
    assert outcome == "failed" and {k: sig[k] for k in ("class", "kernel", "check")} == \
        {k: target[k] for k in ("class", "kernel", "check")}
    assert again["fault"]["layer"] == 0
    cfg = json.loads((tmp_path / "s" / "model-config" / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 1
    # The README's make-model drew the model again: the slice's tensors, other values.
    drawn = json.loads((tmp_path / "s" / "model" / "config.json").read_text())
    assert drawn == cfg


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("m") / "model"
    r = run("make-model", d, "--arch", "llama", "--quant", "bf16", "--layers", "2", "--hidden", "64", "--heads", "4",
            "--kv-heads", "2", "--intermediate", "128", "--vocab", VOCAB)
    assert r.returncode == 0, r.stderr
    return d


PROMPTS = [[i + 1, i + 20, i + 40, 7] for i in range(7)]


def record(model, session, bad_id):
    args = []
    for p in PROMPTS:
        args += ["--prompt-ids", ",".join(map(str, p))]
    args += ["--prompt-ids", f"3,9,{bad_id},4"]
    return run("run", model, *args, "--max-new-tokens", "2", "--record", session)


def test_an_out_of_range_token_keeps_that_id_and_nothing_else_of_the_prompts(model, tmp_path):
    record(model, tmp_path / "rec", VOCAB + 44)
    rep = shrink(tmp_path / "rec", tmp_path / "s")
    assert rep["target"]["class"] == "device_assert" and rep["target"]["check"] == "token_id_in_vocab"
    assert stage(rep, "requests") == {"stage": "requests", "before": 8, "after": 1, "trials": rep["stages"][0]["trials"]}
    assert rep["needs"]["token_ids"] == [{"step": 0, "position": 2, "id": VOCAB + 44}]
    (f,) = crashreplay.read_capture(str(tmp_path / "s" / "capture"))["files"]
    (step,) = f["step_records"]
    assert step["request_ids"] in ([], ["r0"])
    ids = list(step["token_ids"])
    assert ids[2] == VOCAB + 44 and all(0 <= t < VOCAB for t in ids[:2] + ids[3:])
    assert ids[:2] + ids[3:] != [3, 9, 4]  # the others are drawn anew
    assert f["manifest"]["hostname"] == "" and not f["fingerprints"]
    assert all("/" not in str(v) for v in f["manifest"]["toggles"].values())
    # Nothing of the user's host or paths in any file of OUT.
    host = socket.gethostname().encode()
    for p in (tmp_path / "s").rglob("*"):
        if p.is_file():
            assert host not in p.read_bytes(), p
    outcome, sig, _ = replay_signature(*readme_command(tmp_path / "s"), cwd=tmp_path / "s")
    assert outcome == "failed" and sig["check"] == "token_id_in_vocab"


def test_a_capture_whose_replay_does_not_fail_has_nothing_to_shrink(model, tmp_path):
    r = run("run", model, "--prompt-ids", "1,2,3", "--max-new-tokens", "2", "--record", tmp_path / "rec")
    assert r.returncode == 0, r.stderr
    r = run("shrink", tmp_path / "rec", "-o", tmp_path / "s")
    assert r.returncode == 1
    assert "nothing to shrink" in r.stderr


def test_a_budget_hit_keeps_the_smallest_failing_capture_and_says_it_is_not_minimal(model, tmp_path):
    record(model, tmp_path / "rec", VOCAB + 1)
    rep = shrink(tmp_path / "rec", tmp_path / "s", "--max-trials", "3")
    assert rep["minimal"] is False and rep["trials"] <= 3 + 1
    assert "not a minimal one" in (tmp_path / "s" / "README.md").read_text()
    outcome, sig, _ = replay_signature(*readme_command(tmp_path / "s"), cwd=tmp_path / "s")
    assert outcome == "failed" and sig["check"] == "token_id_in_vocab"


def sglang_recorder(session, ckpt, session_id, page_size):
    """A Recorder writing a session as the sglang adapter does on an H100 at
    tp 1: rows of token slots."""
    return crashreplay.Recorder(str(session), engine="sglang", engine_version="0.5.23", session_id=session_id,
                                toggles=[("page_size", page_size), ("tp_size", 1), ("sglang.page_table_unit", "token"),
                                         ("attention_backend", "triton"), ("model_path", str(ckpt))],
                                model={"checkpoint_path": str(ckpt)},
                                device={"name": "NVIDIA H100 80GB HBM3", "sm_arch": 90,
                                        "memory_capacity_bytes": 80_000_000_000},
                                parallel={"tp_size": 1, "tp_rank": 0, "rank": 0, "world_size": 1},
                                install_signal_handlers=False)


def aliasing_session(session, ckpt, n=16, a=4, b=11, record_failure=False):
    """n requests as the sglang adapter records them (token slots, page_size
    16, UUID-like ids), each prompt in its own page; at the decode step the
    allocator's classic bug: request b's page-table row points at request
    a's page, so both write the slot of position 4 there. sglang itself
    would not fail: the two requests silently attend over each other's keys."""
    ids = [f"req-{i:02d}-{'ab' * 8}" for i in range(n)]
    rec = sglang_recorder(session, ckpt, "s", page_size=16)
    prompts = [[(7 * i + j) % VOCAB for j in range(4)] for i in range(n)]
    rows = [[16 * (i + 1) + j for j in range(4)] for i in range(n)]
    greedy = {"temperatures": [0.0] * n, "top_ps": [1.0] * n, "top_ks": [-1] * n, "min_ps": [0.0] * n}
    rec.record_step(0, mode="extend", request_ids=ids, token_ids=sum(prompts, []), positions=list(range(4)) * n,
                    seq_lens=[4] * n, extend_lens=[4] * n, req_pool_indices=list(range(n)), page_table=rows,
                    out_cache_loc=sum(rows, []), sampling=greedy)
    decode = [r + [r[0] + 4] for r in rows]
    decode[b] = [16 * (a + 1) + j for j in range(5)]  # b's row: a's page
    rec.record_step(1, mode="decode", request_ids=ids, token_ids=[1] * n, positions=[4] * n, seq_lens=[5] * n,
                    extend_lens=[1] * n, req_pool_indices=list(range(n)), page_table=decode,
                    out_cache_loc=[r[4] for r in decode], sampling=greedy)
    if record_failure:  # as an engine's message might put it
        rec.on_failure(f"requests '{ids[a]}' and '{ids[b]}' wrote one slot on {socket.gethostname()} "
                       f"serving {ckpt}", stage="decode", step=1, exception_type="AssertionError")
    rec.close()
    return ids


def strings_of(x):
    """Every string of at least 4 characters in a read_capture() tree."""
    if isinstance(x, dict):
        return set().union(*(strings_of(v) for v in x.values())) if x else set()
    if isinstance(x, (list, tuple)):
        return set().union(*(strings_of(v) for v in x)) if x else set()
    return {x} if isinstance(x, str) and len(x) >= 4 else set()


def test_no_id_or_string_of_the_users_capture_survives_unless_the_failure_needs_it(model, tmp_path):
    """The aliasing session with the engine's failure record naming both
    requests, the host and the checkpoint: every string of the input that
    says something of the user (ids, host, paths, session) is absent from
    every byte of OUT; the failure record names the kept requests by their
    new names."""
    ids = aliasing_session(tmp_path / "rec", model, record_failure=True)
    report = shrink(tmp_path / "rec", tmp_path / "s")
    assert stage(report, "requests")["after"] == 2
    src = crashreplay.read_capture(str(tmp_path / "rec"))
    (f,) = src["files"]
    personal = set(ids) | {f["manifest"]["session_id"], f["manifest"]["hostname"], str(model), str(tmp_path)}
    personal |= {s for s in strings_of(src) if "/" in s or socket.gethostname() in s}
    blob = b"".join(p.read_bytes() for p in (tmp_path / "s").rglob("*") if p.is_file())
    survivors = sorted(s for s in personal if s and len(s) >= 4 and s.encode() in blob)
    assert survivors == [], survivors
    (g,) = crashreplay.read_capture(str(tmp_path / "s" / "capture"))["files"]
    (fail,) = g["failure_records"]
    assert "'r0'" in fail["reason"] and "'r1'" in fail["reason"] and "<original>" in fail["reason"]


def test_two_requests_whose_cache_slots_alias_shrink_to_exactly_those_two(model, tmp_path):
    ids = aliasing_session(tmp_path / "rec", model)
    outcome, sig, rep = replay_signature(tmp_path / "rec")
    assert outcome == "failed" and sig["kernel"] == "kv_write" and sig["check"] == "kv_slot_written_once", rep
    assert f"'{ids[4]}'" in rep["detail"] and f"'{ids[11]}'" in rep["detail"]  # both requests named
    report = shrink(tmp_path / "rec", tmp_path / "s", "--export-kernel")
    assert stage(report, "requests")["before"] == 16 and stage(report, "requests")["after"] == 2
    # The failing kernel of the shrunk step, exported beside it (export-kernel).
    # The slot check names kv_write of every layer: layer 0's is exported.
    assert report["export_kernel"]["kernel"] == "L0.kv_write" and report["export_kernel"]["exit_code"] == 0
    params = json.loads((tmp_path / "s" / "kernel" / "params.json").read_text())
    assert params["kernel"] == "L0.kv_write" and (tmp_path / "s" / "kernel" / "repro.py").is_file()
    assert "kernel/" in (tmp_path / "s" / "README.md").read_text()
    (f,) = crashreplay.read_capture(str(tmp_path / "s" / "capture"))["files"]
    decode = f["step_records"][-1]
    assert decode["request_ids"] == ["r0", "r1"]
    # The two kept are a's and b's: their rows share a page.
    rows = [list(r["token_slots"]) if isinstance(r, dict) else list(r) for r in decode["page_table"]]
    assert rows[0][0] // 16 == rows[1][0] // 16 == 5
    # No request id, model path or prompt of the original survives in OUT.
    blob = b"".join(p.read_bytes() for p in (tmp_path / "s").rglob("*") if p.is_file())
    for rid in ids:
        assert rid.encode() not in blob
    assert str(model).encode() not in blob
    outcome, sig2, rep2 = replay_signature(*readme_command(tmp_path / "s"), cwd=tmp_path / "s")
    assert outcome == "failed" and sig2["check"] == "kv_slot_written_once"
    assert "'r0'" in rep2["detail"] and "'r1'" in rep2["detail"]


def test_a_prompt_is_shortened_to_the_tokens_from_the_one_the_failure_needs(model, tmp_path):
    """An sglang capture (rows of token slots): three prompts, the second
    holding an id past the vocabulary at position 5. The prompt stage cuts
    that request's prompt from its start, its positions, length and row
    moved down with it, to the shortest that still fails: from the bad id on."""
    bad = VOCAB + 9
    ids = [f"req-{i}-{'ef' * 6}" for i in range(3)]
    rec = sglang_recorder(tmp_path / "rec", model, "p", page_size=1)
    prompts = [[(3 * j + 1) % VOCAB for j in range(16)], [(5 * j + 2) % VOCAB for j in range(8)], [7, 8, 9, 10, 11]]
    prompts[1][5] = bad
    rows, at = [], 100
    for p in prompts:
        rows.append(list(range(at, at + len(p))))
        at += 32
    n = len(prompts)
    rec.record_step(0, mode="extend", request_ids=ids, token_ids=sum(prompts, []),
                    positions=[j for p in prompts for j in range(len(p))], seq_lens=[len(p) for p in prompts],
                    extend_lens=[len(p) for p in prompts], req_pool_indices=list(range(n)), page_table=rows,
                    out_cache_loc=sum(rows, []),
                    sampling={"temperatures": [0.0] * n, "top_ps": [1.0] * n, "top_ks": [-1] * n, "min_ps": [0.0] * n})
    rec.close()
    outcome, sig, _ = replay_signature(tmp_path / "rec")
    assert outcome == "failed" and sig["check"] == "token_id_in_vocab"
    rep = shrink(tmp_path / "rec", tmp_path / "s")
    assert stage(rep, "requests")["after"] == 1
    assert {k: stage(rep, "prompt")[k] for k in ("before", "after")} == {"before": 8, "after": 3}
    assert rep["needs"]["token_ids"] == [{"step": 0, "position": 0, "id": bad}]
    (f,) = crashreplay.read_capture(str(tmp_path / "s" / "capture"))["files"]
    (step,) = f["step_records"]
    assert list(step["positions"]) == [0, 1, 2] and list(step["seq_lens"]) == [3] and list(step["extend_lens"]) == [3]
    assert step["token_ids"][0] == bad
    # The row lost the slots of the cut positions: it starts where position 5 was written.
    (row,) = step["page_table"]
    assert list(row["token_slots"]) == rows[1][5:] and list(step["out_cache_loc"]) == rows[1][5:]
    outcome, sig, _ = replay_signature(*readme_command(tmp_path / "s"), cwd=tmp_path / "s")
    assert outcome == "failed" and sig["check"] == "token_id_in_vocab"


def scale_bf16(path, name, log2):
    """Multiplies bf16 tensor `name` of the safetensors file `path` by
    2**log2 in place: exactly, by adding to each non-zero value's exponent."""
    import numpy as np
    import struct
    b = bytearray(pathlib.Path(path).read_bytes())
    (n,) = struct.unpack("<Q", b[:8])
    header = json.loads(b[8:8 + n])
    s, e = header[name]["data_offsets"]
    assert header[name]["dtype"] == "BF16"
    a = np.frombuffer(bytes(b[8 + n + s:8 + n + e]), dtype=np.uint16).copy()
    nz = (a & 0x7FFF) != 0
    a[nz] += np.uint16(log2 << 7)
    b[8 + n + s:8 + n + e] = a.tobytes()
    pathlib.Path(path).write_bytes(b)


def test_a_failure_that_needs_the_real_weights_keeps_them_and_says_so(tmp_path):
    """Layer 1's MLP scaled by 2**8 (up) and 2**16 (down): in fp16
    activations its output overflows and sampling meets NaN probabilities.
    Random values of the same tensors do not overflow: the weights stage
    keeps the checkpoint's and says the failure needs them."""
    m = tmp_path / "model"
    r = run("make-model", m, "--arch", "llama", "--quant", "bf16", "--layers", "2", "--hidden", "64", "--heads", "4",
            "--kv-heads", "2", "--intermediate", "128", "--vocab", VOCAB)
    assert r.returncode == 0, r.stderr
    scale_bf16(m / "model.safetensors", "model.layers.1.mlp.up_proj.weight", 8)
    scale_bf16(m / "model.safetensors", "model.layers.1.mlp.down_proj.weight", 16)
    r = run("run", m, "--prompt-ids", "1,17,42,99,7", "--prompt-ids", "5,6,7", "--max-new-tokens", "2",
            "--temperature", "1", "--set", "activation_dtype=fp16", "--record", tmp_path / "rec")
    assert r.returncode != 0 and "probs_finite" in r.stdout + r.stderr
    outcome, sig, _ = replay_signature(tmp_path / "rec", "--set", "activation_dtype=fp16")
    assert outcome == "failed" and sig["check"] == "probs_finite"
    rep = shrink(tmp_path / "rec", tmp_path / "s", "--set", "activation_dtype=fp16")
    weights = stage(rep, "weights")
    assert weights["trials"] == 1 and weights["before"] == weights["after"] > 0
    assert "do not fail the same way" in rep["needs"]["weights"]
    assert rep["needs"]["checkpoint"] == str(m) and "regenerate_command" not in rep
    assert not (tmp_path / "s" / "model-config").exists()
    assert "needs the original checkpoint" in (tmp_path / "s" / "README.md").read_text()
    outcome, sig2, _ = replay_signature(*readme_command(tmp_path / "s"), cwd=tmp_path / "s")
    assert outcome == "failed" and sig2["check"] == "probs_finite"


def test_parallel_trials_shrink_to_the_same_capture_as_one_at_a_time(model, tmp_path):
    """dd's batches (its subsets, then its complements) run on the
    scheduler's workers; results come back in request order, so -j 3
    decides as -j 1 does: the same stages, the same shrunk capture."""
    aliasing_session(tmp_path / "rec", model)
    one = shrink(tmp_path / "rec", tmp_path / "j1", "--confirm", "1")
    three = shrink(tmp_path / "rec", tmp_path / "j3", "-j", "3", "--confirm", "1")
    assert one["stages"] == three["stages"] and one["trials"] == three["trials"]
    assert one["confirmed"] == three["confirmed"] == {"runs": 2, "failed_same_way": 2}
    (a,) = crashreplay.read_capture(str(tmp_path / "j1" / "capture"))["files"]
    (b,) = crashreplay.read_capture(str(tmp_path / "j3" / "capture"))["files"]
    assert a["step_records"] == b["step_records"]


def test_a_spent_time_budget_keeps_the_capture_as_it_is_and_says_it_is_not_minimal(model, tmp_path):
    record(model, tmp_path / "rec", VOCAB + 1)
    rep = shrink(tmp_path / "rec", tmp_path / "s", "--time-budget", "0.001")
    assert rep["minimal"] is False
    assert rep["trials"] == 1  # the capture as it is, then no trial started
    assert stage(rep, "requests")["after"] == stage(rep, "requests")["before"] == 8
    assert rep["confirmed"]["runs"] == 7 and rep["confirmed"]["failed_same_way"] == 7
    assert "not a minimal one" in (tmp_path / "s" / "README.md").read_text()
    outcome, sig, _ = replay_signature(*readme_command(tmp_path / "s"), cwd=tmp_path / "s")
    assert outcome == "failed" and sig["check"] == "token_id_in_vocab"


def set_f32(path, name, value):
    """Writes the f32 scalar tensor `name` of the safetensors file `path`."""
    import struct
    b = bytearray(pathlib.Path(path).read_bytes())
    (n,) = struct.unpack("<Q", b[:8])
    t = json.loads(b[8:8 + n])[name]
    assert t["dtype"] == "F32" and t["shape"] == []
    s, e = t["data_offsets"]
    b[8 + n + s:8 + n + e] = struct.pack("<f", value)
    pathlib.Path(path).write_bytes(b)


def test_a_check_at_layer_k_shrinks_to_a_k_plus_1_layer_slice_that_keeps_its_weights(tmp_path):
    """A 3-layer NVFP4 qwen3_moe whose layer 1 o_proj input_scale is 0:
    that layer's activation quantization fails its check. The slice keeps
    layers 0..1; random weights come with calibrated scales and do not fail,
    so the slice's values are kept, and shrink.json says the failure needs
    them."""
    m = tmp_path / "model"
    r = run("make-model", m, "--arch", "qwen3_moe", "--quant", "nvfp4", "--layers", "3", "--vocab", VOCAB)
    assert r.returncode == 0, r.stderr
    set_f32(m / "model.safetensors", "model.layers.1.self_attn.o_proj.input_scale", 0.0)
    r = run("run", m, "--prompt-ids", "1,2,3,4", "--prompt-ids", "5,6", "--max-new-tokens", "2", "--record",
            tmp_path / "rec")
    assert r.returncode != 0
    outcome, sig, rep = replay_signature(tmp_path / "rec")
    assert outcome == "failed" and sig["check"] == "nvfp4_input_scale_valid" and rep["fault"]["layer"] == 1
    report = shrink(tmp_path / "rec", tmp_path / "s", "-j", "2")
    assert {k: stage(report, "layers")[k] for k in ("before", "after")} == {"before": 3, "after": 2}
    weights = stage(report, "weights")
    assert weights["after"] == weights["before"] > 0 and "do not fail the same way" in report["needs"]["weights"]
    assert "checkpoint" not in report["needs"]  # the slice carries the values the failure needs
    cfg = json.loads((tmp_path / "s" / "model" / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 2
    assert "needs its values" in (tmp_path / "s" / "README.md").read_text()
    outcome, sig2, again = replay_signature(*readme_command(tmp_path / "s"), cwd=tmp_path / "s")
    assert outcome == "failed" and sig2["check"] == "nvfp4_input_scale_valid" and again["fault"]["layer"] == 1


def test_a_departure_from_the_recording_keeps_the_recording_and_what_it_was_computed_over(model, tmp_path):
    """Recorded with bf16 KV, replayed with fp8 KV: the exact engine departs
    from the recorded fingerprints at L0.attention of the decode step. That
    target needs the recording: its fingerprints stay (shrink.json says so),
    and neither the history nor any token id can go (a step without them
    departs from the recording under any configuration). The slice keeps
    layer 0, the boundaries past it are not compared; the repro departs at
    L0.attention under fp8 and reproduces the recording without it."""
    r = run("run", model, "--prompt-ids", "1,17,42,99,7", "--prompt-ids", "4,5,6", "--max-new-tokens", "3",
            "--record", tmp_path / "rec")
    assert r.returncode == 0, r.stderr
    fp8 = ("--set", "kv_cache_dtype=fp8_e4m3")
    outcome, sig, _ = replay_signature(tmp_path / "rec", *fp8)
    assert outcome == "diverged" and sig["class"] == "engine_divergence" and sig["kernel"] == "L0.attention"
    rep = shrink(tmp_path / "rec", tmp_path / "s", *fp8, "--confirm", "1")
    assert "recording" in rep["needs"] and rep["needs"]["token_ids"].startswith("all")
    assert stage(rep, "history")["after"] == stage(rep, "history")["before"] > 0
    assert stage(rep, "history")["trials"] == stage(rep, "token_ids")["trials"] == 0
    assert {k: stage(rep, "layers")[k] for k in ("before", "after")} == {"before": 2, "after": 1}
    assert rep["confirmed"] == {"runs": 2, "failed_same_way": 2}
    (f,) = crashreplay.read_capture(str(tmp_path / "s" / "capture"))["files"]
    names = {fp["name"] for rec in f["fingerprints"] for fp in rec["fingerprints"]}
    assert "L0.attention" in names and not {"final_norm", "lm_head"} & names
    assert not any(n.startswith("L1.") for n in names)
    words = readme_command(tmp_path / "s")
    outcome, sig2, _ = replay_signature(*words, cwd=tmp_path / "s")
    assert outcome == "diverged" and sig2["kernel"] == "L0.attention"
    plain = [w for w in words if w not in fp8]
    outcome, _, _ = replay_signature(*plain, cwd=tmp_path / "s")
    assert outcome == "reproduced"
