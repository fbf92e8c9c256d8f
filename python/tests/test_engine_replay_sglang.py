"""`python -m crashreplay.engine_replay --engine sglang`: a capture re-executed in
sglang's own ModelRunner on the CPU.

Every session here is recorded by sglang's real ModelRunner (nothing stands
in for its forward: TpModelWorker, the torch_native attention backend, the
model's RMSNorm/rotary/SiluAndMul layers, the KV pool, sglang's sampler),
driven by crashreplay._sglang_cpu_runner's `record` and recorded by
crashreplay.sglang's attach() with fingerprints on; the replay builds the
runner again from the recorded ServerArgs and records itself with the same
adapter. So a replay of an unchanged configuration must give every greedy
token and every fingerprint of the recording bit for bit, and a defect
installed by a --setup module in both must show at the same boundary and
fail the same way. The last tests take the CLI's side: `crashreplay replay
--engine sglang` holds the driver's run against the recording with the
exact engine beside it, and `crashreplay bisect --engine sglang` finds the
ServerArgs flag under which a defect's code path runs. Each process spends
~12 s of a core importing sglang: the recordings run at once, and there
are few replays (the bisect's six runs take most of the suite's time).
Last run: sglang 0.5.23, torch 2.15.0 CPU, transformers 5.25, vLLM 0.34
beside them.

To rerun one case by hand (the failing test prints its commands):
    PYTHONPATH=build/python:python python -m crashreplay._sglang_cpu_runner record --model CKPT \\
        --session S --requests '[{"rid": "a", "prompt": [5, 6, 7], "temperature": 0}]' --decode-steps 3
    PYTHONPATH=build/python:python python -m crashreplay.engine_replay --engine sglang --capture S --step 3 --out O
    build/tools/crashreplay replay S --json --engine sglang --engine-python PY [--engine-setup MODULE]
"""
import json
import os
import shlex
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sglang")
transformers = pytest.importorskip("transformers")
try:  # any failure of sglang's import chain (a missing optional kernel package): skip, say why
    from sglang.srt.server_args import ServerArgs  # noqa: F401
except Exception as e:  # noqa: BLE001
    pytest.skip(f"sglang is installed but its configuration does not import here: {e!r}", allow_module_level=True)

import crashreplay

# Three requests of different prompt lengths, greedy: one EXTEND step, then
# DECODE steps 1..3.
REQUESTS = [{"rid": "req-a", "prompt": [5, 6, 7, 8, 9], "temperature": 0.0},
            {"rid": "req-b", "prompt": list(range(11, 20)), "temperature": 0.0},
            {"rid": "req-c", "prompt": list(range(30, 44)), "temperature": 0.0}]
DECODE_STEPS = 3
LAST = DECODE_STEPS
BOUNDARIES = ["embedding", "L0.attention", "L0.o_proj", "L0.mlp", "L1.attention", "L1.o_proj", "L1.mlp",
              "final_norm", "lm_head"]

# The defect a --setup module installs: sglang's RadixAttention of layer 1
# returns NaN for req-b's tokens from position 10 on (its prompt is 9
# tokens: the second decode step, step 2).
DEFECT = '''"""A defect: sglang's RadixAttention in layer {layer} returns NaN for request {rid}'s tokens
from position {start} on."""
import torch
from sglang.srt.layers.radix_attention import RadixAttention

_forward = RadixAttention.forward


def forward(self, q, k, v, forward_batch, *args, **kwargs):
    out = _forward(self, q, k, v, forward_batch, *args, **kwargs)
    rids = forward_batch.rids or []
    if self.layer_id != {layer} or {rid!r} not in rids:
        return out
    i = rids.index({rid!r})
    lens = forward_batch.extend_seq_lens_cpu if forward_batch.forward_mode.is_extend() else [1] * len(rids)
    rows = torch.arange(sum(lens[:i]), sum(lens[:i + 1]))
    rows = rows[forward_batch.positions[rows] >= {start}]
    if len(rows):
        out = out.clone()
        out.view(out.shape[0], -1)[rows] = float("nan")
    return out


RadixAttention.forward = forward
'''
DEFECT_LAYER, DEFECT_RID, DEFECT_FROM, DEFECT_STEP = 1, "req-b", 10, 2

# A defect on the code path of one flag's value: the branch of sglang's KV
# pool (MHATokenToKVPool.set_kv_buffer) that runs for fp8 storage only
# (keys cast to float8, kept as uint8) loses the keys layer 1 writes to one
# KV slot: they come back NaN. Under kv_cache_dtype=auto the pool stores
# bf16 and the branch never runs. The slot is req-b's token at position 10
# (step 2): sglang's allocator hands slots out in order from 1, the prompts
# first, then one a request each decode step (the test checks it).
FP8_DEFECT = '''"""A defect in sglang's fp8 KV store: the keys layer {layer} writes to KV slot {slot} come back NaN."""
from sglang.srt.mem_cache import memory_pool

_set_kv_buffer = memory_pool.MHATokenToKVPool.set_kv_buffer


def set_kv_buffer(self, layer, loc_info, cache_k, cache_v, *args, **kwargs):
    if self.store_dtype != self.dtype and getattr(layer, "layer_id", None) == {layer}:  # fp8 storage only
        loc, _, _ = memory_pool.unwrap_write_loc(loc_info)
        hit = loc == {slot}
        if bool(hit.any()):
            cache_k = cache_k.clone()
            cache_k[hit] = float("nan")
    return _set_kv_buffer(self, layer, loc_info, cache_k, cache_v, *args, **kwargs)


memory_pool.MHATokenToKVPool.set_kv_buffer = set_kv_buffer
'''
FP8_SLOT = (1 + sum(len(r["prompt"]) for r in REQUESTS) + (DEFECT_STEP - 1) * len(REQUESTS)
            + [r["rid"] for r in REQUESTS].index(DEFECT_RID))


def make_checkpoint(root):
    """A tiny llama (hidden 64, 2 layers, 4 heads, 2 KV heads, vocab 300) in bf16."""
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=300, max_position_embeddings=512)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    path = os.path.join(str(root), "llama")
    model.save_pretrained(path)
    return path


def start(args, modules=None, env=None):
    """A child Python with this one's import path (and `modules` first)."""
    paths = ([str(modules)] if modules else []) + sys.path
    full_env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p), **(env or {}))
    cmd = [sys.executable, *args]
    proc = subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.command = " ".join(shlex.quote(c) for c in cmd)  # for the failure messages
    return proc


def finish(proc):
    proc.stdout_text, proc.stderr_text = proc.communicate(timeout=600)
    return proc


def start_record(ckpt, session, server_args=(), setup=(), modules=None, env=None):
    """Records REQUESTS into session (finish() it, then report())."""
    args = ["-m", "crashreplay._sglang_cpu_runner", "record", "--model", ckpt, "--session", str(session),
            "--requests", json.dumps(REQUESTS), "--decode-steps", str(DECODE_STEPS)]
    args += [a for kv in server_args for a in ("--server-arg", kv)] + [a for m in setup for a in ("--setup", m)]
    return start(args, modules, env)


def report(proc):
    """record_schedule's report (its last line of output)."""
    assert proc.stdout_text.strip(), f"{proc.command}\n{proc.stderr_text[-4000:]}"
    return json.loads(proc.stdout_text.strip().splitlines()[-1])


def replay(session, out, step, settings=(), setup=(), modules=None, env=None, model=None):
    """(exit code, result.json, the process) of one engine replay."""
    args = ["-m", "crashreplay.engine_replay", "--engine", "sglang", "--capture", str(session), "--step", str(step),
            "--out", str(out)] + (["--model", model] if model else [])
    args += [a for kv in settings for a in ("--setting", kv)] + [a for m in setup for a in ("--setup", m)]
    proc = finish(start(args, modules, env))
    with open(os.path.join(str(out), "result.json")) as f:
        return proc.returncode, json.load(f), proc


def capture(path):
    return crashreplay.read_capture(str(path))["files"][0]


def fingerprints(path):
    return {fp["step"]: fp["fingerprints"] for fp in capture(path)["fingerprints"]}


def without_time(steps):
    return [{k: v for k, v in s.items() if k != "timestamp_nanos"} for s in steps]


def assert_replays_identically(session, out, rc, result, proc, last=LAST):
    why = f"{proc.command}\n{proc.stderr_text[-3000:]}"
    assert rc == 0 and "refused" not in result, why
    assert result.get("failure", "absent") is None, result.get("failure")
    assert result["steps_run"] == last + 1 and result["version"].startswith("0.5.")
    assert result["session"] == os.path.join(str(out), "session")
    # every greedy token of steps 0..last-1 against the next step's recorded ids
    assert [t["step"] for t in result["tokens"]] == list(range(last)) and not result["sampled"]
    for t in result["tokens"]:
        assert t["replayed"] == t["recorded"] and len(t["recorded"]) == len(REQUESTS), t
    # the replay's own session: the same step records and, step by step, the same fingerprints
    original, replayed = fingerprints(session), fingerprints(result["session"])
    assert sorted(replayed) == sorted(original) == list(range(last + 1))
    for step in original:
        assert replayed[step] == original[step], f"step {step} fingerprints differ; {why}"
    assert [f["name"] for f in replayed[last]] == BOUNDARIES
    assert without_time(capture(result["session"])["step_records"]) == without_time(capture(session)["step_records"])


# The sessions the tests replay: name -> (ServerArgs fields, --setup modules, environment).
RECORDINGS = {
    "bf16": ((), (), {}),
    "fp8": (("kv_cache_dtype=fp8_e4m3",), (), {}),
    # sglang sanitizes NaN logits by default: req-b goes on with the token its NaN logits give
    "nan": ((), ("nan_defect",), {}),
    # with sglang's NaN check on, its sampler raises on them
    "nan_check": ((), ("nan_defect",), {"SGLANG_ENABLE_NAN_LOGITS_CHECK": "1"}),
    # the fp8 store's defect where its branch runs: req-b's step-2 keys are NaN, and the NaN check raises
    "fp8_nan_check": (("kv_cache_dtype=fp8_e4m3",), ("fp8_defect",), {"SGLANG_ENABLE_NAN_LOGITS_CHECK": "1"}),
}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """(checkpoint, the defect's module folder, {name: (session, report)}):
    every recording at once (each child spends ~12 s of one core loading sglang)."""
    root = tmp_path_factory.mktemp("sglang")
    ckpt = make_checkpoint(root)
    modules = root / "modules"
    modules.mkdir()
    (modules / "nan_defect.py").write_text(DEFECT.format(layer=DEFECT_LAYER, rid=DEFECT_RID, start=DEFECT_FROM))
    (modules / "fp8_defect.py").write_text(FP8_DEFECT.format(layer=DEFECT_LAYER, slot=FP8_SLOT))
    procs = {name: start_record(ckpt, root / name, server_args, setup, modules, env)
             for name, (server_args, setup, env) in RECORDINGS.items()}
    return ckpt, modules, {name: (root / name, report(finish(p))) for name, p in procs.items()}


@pytest.fixture(scope="module")
def ckpt(recorded):
    return recorded[0]


@pytest.fixture(scope="module")
def defect(recorded):
    return recorded[1]


@pytest.fixture(scope="module")
def greedy_session(recorded):
    return recorded[2]["bf16"]


def test_the_recording_is_sglangs_real_forward_and_greedy_tokens_are_transformers(ckpt, greedy_session):
    session, rep = greedy_session
    assert rep["failure"] is None and rep["boundaries"] == BOUNDARIES
    f = capture(session)
    assert [s["mode"] for s in f["step_records"]] == ["extend"] + ["decode"] * DECODE_STEPS
    assert f["step_records"][0]["request_ids"] == [r["rid"] for r in REQUESTS]
    assert f["manifest"]["toggles"]["attention_backend"] == "torch_native"
    assert "model.layers.0.self_attn.qkv_proj.weight" in f["weight_hashes"][0]["tensors"]  # sglang's fused layout
    # An independent implementation of the same checkpoint agrees token for token.
    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16)
    for r, tokens in zip(REQUESTS, rep["tokens"]):
        out = model.generate(torch.tensor([r["prompt"]]), max_new_tokens=DECODE_STEPS + 1, do_sample=False)
        assert out[0, len(r["prompt"]):].tolist() == tokens, r["rid"]


def test_a_greedy_session_replays_with_every_token_and_fingerprint_identical(greedy_session, tmp_path):
    session, rep = greedy_session
    out = tmp_path / "out"
    rc, result, proc = replay(session, out, LAST)
    assert_replays_identically(session, out, rc, result, proc)
    applied = result["applied"]
    assert applied["device"] == "cpu" and applied["attention_backend"] == "torch_native"
    assert applied["sampling_backend"] == "pytorch" and applied["kv_cache_torch_dtype"] == "bfloat16"
    assert "kv_cache_dtype" not in applied["changed"] and "attention_backend" not in applied["changed"]
    # the tokens the recording's sampler chose are the ones the replay compared
    assert [t["recorded"] for t in result["tokens"]] == [list(col) for col in zip(*rep["tokens"])][:LAST]


def test_an_fp8_kv_cache_session_replays_identically(recorded, tmp_path):
    session, rep = recorded[2]["fp8"]
    assert rep["failure"] is None
    assert capture(session)["manifest"]["toggles"]["kv_cache_dtype"] == "fp8_e4m3"
    out = tmp_path / "out"
    rc, result, proc = replay(session, out, LAST)
    assert_replays_identically(session, out, rc, result, proc)
    assert result["applied"]["kv_cache_dtype"] == "fp8_e4m3"
    assert result["applied"]["kv_cache_torch_dtype"] == "float8_e4m3fn"


def served_on_a_gpu(session, path):
    """The session's steps under the configuration of an H100 server: how a
    capture from production reaches the CPU (fa3 attention and flashinfer
    sampling, CUDA graphs, DeepGEMM MoE, tp 2, a checkpoint path of that
    machine)."""
    import numpy as np

    src = capture(session)
    toggles = dict(src["manifest"]["toggles"])
    toggles.update({"device": "cuda", "attention_backend": "fa3", "prefill_attention_backend": "fa3",
                    "decode_attention_backend": "fa3", "sampling_backend": "flashinfer", "disable_cuda_graph": False,
                    "cuda_graph_max_bs": 256, "moe_runner_backend": "deep_gemm", "tp_size": 2,
                    "max_total_tokens": 500000, "model_path": "/models/on-the-gpu-server"})
    model = dict(src["manifest"]["model"], checkpoint_path="/models/on-the-gpu-server")
    rec = crashreplay.Recorder(str(path), engine="sglang", engine_version="0.5.23", toggles=sorted(toggles.items()),
                               model=model, parallel={"tp_size": 2, "tp_rank": 0, "world_size": 2, "rank": 0},
                               install_signal_handlers=False)
    for s in src["step_records"]:
        rows = [r["token_slots"] for r in s["page_table"]]
        table = np.zeros((len(rows), max(map(len, rows))), dtype=np.int64)
        for i, r in enumerate(rows):
            table[i, :len(r)] = r
        rec.record_step(s["step"], mode=s["mode"], request_ids=s["request_ids"], token_ids=s["token_ids"],
                        positions=s["positions"], seq_lens=s["seq_lens"], extend_lens=s["extend_lens"],
                        req_pool_indices=s["req_pool_indices"], out_cache_loc=s["out_cache_loc"],
                        page_table={"rows": table, "lengths": np.array([len(r) for r in rows])},
                        sampling=s["sampling"], rng_seed=s["rng_seed"])
    rec.close()
    return path


def test_a_gpu_servers_capture_replays_on_the_cpu_under_its_configuration_and_the_settings(ckpt, greedy_session,
                                                                                           tmp_path):
    session, _ = greedy_session
    gpu = served_on_a_gpu(session, tmp_path / "gpu")
    # its checkpoint path names the server's disk: the driver asks for --model
    rc, result, proc = replay(gpu, tmp_path / "nomodel", LAST)
    assert rc == 3 and "--model" in result["refused"], proc.stderr_text[-3000:]

    rc, result, proc = replay(gpu, tmp_path / "out", LAST, settings=["kv_cache_dtype=fp8_e4m3"], model=ckpt)
    assert rc == 0 and result["failure"] is None, proc.stderr_text[-3000:]
    changed = result["applied"]["changed"]
    # what the CPU forces and the setting, each reported against the recording
    for name, recorded, replayed in [("device", "cuda", "cpu"), ("attention_backend", "fa3", "torch_native"),
                                     ("sampling_backend", "flashinfer", "pytorch"), ("disable_cuda_graph", False, True),
                                     ("moe_runner_backend", "deep_gemm", "auto"), ("tp_size", 2, 1),
                                     ("kv_cache_dtype", "auto", "fp8_e4m3")]:
        assert changed[name] == {"recorded": recorded, "replayed": replayed}, name
    assert any("tp_size=2" in n for n in result["notes"]) and any("attention_backend=fa3" in n for n in result["notes"])
    assert result["applied"]["kv_cache_torch_dtype"] == "float8_e4m3fn"
    assert [t["step"] for t in result["tokens"]] == list(range(LAST))
    # the fp8 cache reaches sglang's attention: the embedding is the recording's, attention is not
    original, replayed = fingerprints(session)[0], fingerprints(result["session"])[0]
    differ = [a["name"] for a, b in zip(original, replayed) if a != b]
    assert "embedding" not in differ and "L0.attention" in differ


def first_nonfinite(path):
    for step, fps in sorted(fingerprints(path).items()):
        for fp in fps:
            if fp["nan"] or fp["pos_inf"] or fp["neg_inf"]:
                return step, fp["name"]
    return None


def test_a_nan_defect_shows_at_its_layer_and_the_replay_reproduces_it(recorded, defect, tmp_path):
    # sglang sanitizes NaN logits by default: req-b goes on with the token
    # its NaN logits give, and the NaN stays in its rows.
    session, rep = recorded[2]["nan"]
    assert rep["failure"] is None
    assert first_nonfinite(session) == (DEFECT_STEP, f"L{DEFECT_LAYER}.attention")
    out = tmp_path / "out"
    rc, result, proc = replay(session, out, LAST, setup=["nan_defect"], modules=defect)
    assert_replays_identically(session, out, rc, result, proc)
    assert first_nonfinite(result["session"]) == (DEFECT_STEP, f"L{DEFECT_LAYER}.attention")
    nan = {fp["name"]: fp["nan"] for fp in fingerprints(result["session"])[DEFECT_STEP]}
    assert nan["L0.mlp"] == 0 and nan[f"L{DEFECT_LAYER}.attention"] == 64  # one row of req-b, hidden 64


def test_a_failure_the_defect_causes_is_recorded_and_reproduced(recorded, defect, tmp_path):
    # With sglang's NaN check on, its sampler raises on req-b's NaN logits.
    session, rep = recorded[2]["nan_check"]
    env = RECORDINGS["nan_check"][2]
    assert rep["failure"] == "RuntimeError: NaN detected! sampler: next_token_logits"
    (fail,) = capture(session)["failure_records"]
    assert fail["step"] == DEFECT_STEP and fail["stage"] == "decode"
    out = tmp_path / "out"
    rc, result, proc = replay(session, out, DEFECT_STEP, setup=["nan_defect"], modules=defect, env=env)
    assert rc == 0, proc.stderr_text[-3000:]  # the engine's failure is the result, not the driver's
    f = result["failure"]
    assert (f["short_type"], f["message"], f["step"], f["mode"]) == (
        "RuntimeError", "NaN detected! sampler: next_token_logits", DEFECT_STEP, "decode")
    assert "sampler.py" in f["traceback"]
    assert result["steps_run"] == DEFECT_STEP
    assert all(t["recorded"] == t["replayed"] for t in result["tokens"]) and len(result["tokens"]) == DEFECT_STEP
    (replayed_fail,) = capture(result["session"])["failure_records"]
    assert {k: replayed_fail[k] for k in ("step", "stage", "reason", "exception_type")} == \
        {k: fail[k] for k in ("step", "stage", "reason", "exception_type")}
    assert fingerprints(result["session"]) == fingerprints(session)  # the failing step's NaN included
    assert first_nonfinite(result["session"]) == (DEFECT_STEP, f"L{DEFECT_LAYER}.attention")


def test_settings_that_need_a_gpu_or_that_sglang_has_no_field_for_are_refused():
    # (in this process: the CLI maps a Refusal to its code for every driver)
    from crashreplay._sglang_cpu_runner import check_settings
    from crashreplay.engine_replay import EXIT_NO_DEVICE, EXIT_USAGE, Refusal

    for setting, code, says in [({"attention_backend": "flashinfer"}, EXIT_NO_DEVICE,
                                 "the flashinfer attention backend needs a GPU"),
                                ({"decode_attention_backend": "fa3"}, EXIT_NO_DEVICE, "fa3 attention backend needs"),
                                ({"sampling_backend": "flashinfer"}, EXIT_NO_DEVICE, "sampler needs a GPU"),
                                ({"device": "xpu"}, EXIT_NO_DEVICE, "on the CPU or, with device=cuda"),
                                ({"attn_backend": "torch_native"}, EXIT_USAGE, "no field 'attn_backend'"),
                                ({"dp_size": "2"}, EXIT_USAGE, "tensor-parallel ranks (tp_size) only"),
                                ({"page_size": "many"}, EXIT_USAGE, "not a value of ServerArgs.page_size")]:
        with pytest.raises(Refusal) as r:
            check_settings(setting)
        assert r.value.code == code and says in str(r.value), (setting, str(r.value))
    assert check_settings({"page_size": "16", "kv_cache_dtype": "fp8_e4m3", "attention_backend": "flex_attention"}) \
        == {"page_size": 16, "kv_cache_dtype": "fp8_e4m3", "attention_backend": "flex_attention"}
    if not torch.cuda.is_available():
        with pytest.raises(Refusal) as r:
            check_settings({"device": "cuda", "attention_backend": "flashinfer"})
        assert r.value.code == EXIT_NO_DEVICE and "torch sees no CUDA device" in str(r.value)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_session_replays_in_sglang_with_its_gpu_backends(greedy_session, tmp_path):
    """--setting device=cuda: sglang's GPU kernels (the triton attention
    backend, CUDA graphs off so every step runs its hooks) re-execute the
    CPU recording; greedy tokens the same, fingerprints within the replay's
    one tolerance (other kernels, other summation order)."""
    session, rep = greedy_session
    out = tmp_path / "out"
    rc, result, proc = replay(session, out, LAST, settings=["device=cuda", "attention_backend=triton",
                                                            "sampling_backend=pytorch", "disable_cuda_graph=true"])
    assert rc == 0 and result["failure"] is None, proc
    assert result["applied"]["device"] == "cuda" and result["applied"]["attention_backend"] == "triton"
    assert result["tokens"] and all(t["recorded"] == t["replayed"] for t in result["tokens"])


def crashreplay_cli(args, modules=None, env=None):
    """(exit code, the --json report, what to run to reproduce it) of the
    crashreplay binary, its engine's Python this one (with `modules` first
    on its path)."""
    binary = os.environ.get("CRASHREPLAY_BIN", "build/tools/crashreplay")
    if not os.path.exists(binary):
        pytest.skip("needs the crashreplay binary (CRASHREPLAY_BIN)")
    paths = os.pathsep.join(p for p in ([str(modules)] if modules else []) + sys.path if p)
    extra = dict(env or {}, PYTHONPATH=paths)
    cmd = [binary, *map(str, args)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=dict(os.environ, **extra))
    why = " ".join([f"{k}={shlex.quote(v)}" for k, v in sorted(extra.items())] + [shlex.quote(c) for c in cmd])
    why += "\n" + r.stderr[-3000:]
    try:
        report = json.loads(r.stdout)
    except ValueError:
        pytest.fail(f"no JSON report (exit {r.returncode}) from {why}\n{r.stdout[-2000:]}")
    return r.returncode, report, why


def test_crashreplay_replay_engine_sglang_judges_the_run_reproduced(greedy_session, tmp_path):
    # The CLI's side: `crashreplay replay --engine sglang` starts this driver in
    # this Python and holds its run against the recording.
    session, _ = greedy_session
    rc, j, why = crashreplay_cli(["replay", session, "--json", "--engine", "sglang", "--engine-python", sys.executable,
                                  "--engine-out", tmp_path / "engine"])
    assert rc == 0, why
    assert j["outcome"] == "reproduced" and j["engine"] == "sglang", j.get("detail")
    assert j["fingerprints"] == {"compared": len(BOUNDARIES), "identical": len(BOUNDARIES),
                                 "recorded": len(BOUNDARIES), "replayed": len(BOUNDARIES)}
    assert j["tokens"]["compared"] == j["tokens"]["identical"] == LAST
    # The exact engine beside it agrees within its tolerances.
    assert j["exact"]["outcome"] == "reproduced", j["exact"].get("detail")
    assert "engine_divergence" not in j, j["engine_divergence"]


def test_crashreplay_replay_engine_sglang_fails_again_and_the_exact_engine_names_where(recorded, defect, tmp_path):
    # The session whose sampler raised on req-b's NaN logits, replayed in
    # sglang with the defect (--engine-setup) and the recording's environment.
    session, _ = recorded[2]["nan_check"]
    rc, j, why = crashreplay_cli(["replay", session, "--json", "--engine", "sglang", "--engine-python", sys.executable,
                                  "--engine-setup", "nan_defect", "--engine-out", tmp_path / "engine"],
                                 modules=defect, env=RECORDINGS["nan_check"][2])
    assert rc == 1, why
    assert j["outcome"] == "failed" and j["matches_recorded_failure"] is True, why
    sig = j["signature"]
    assert (sig["class"], sig["kernel"], sig["stage"], sig["step"]) == ("non_finite", "sampler", "decode", DEFECT_STEP)
    assert {k: sig[k] for k in ("class", "check", "kernel", "stage", "step")} == \
        {k: j["recorded_signature"][k] for k in ("class", "check", "kernel", "stage", "step")}
    assert "NaN detected! sampler: next_token_logits" in j["detail"]
    # sglang's replay computed the recording's NaN at the same boundaries.
    assert j["fingerprints"]["compared"] == j["fingerprints"]["identical"] == len(BOUNDARIES)
    # The exact engine stays finite and says where sglang leaves it: one row of req-b (hidden 64).
    assert j["exact"]["first_nonfinite_kernel"] == "", j["exact"]["first_nonfinite_kernel"]
    d = j["engine_divergence"]
    assert d["boundary"] == f"L{DEFECT_LAYER}.attention", d
    assert d["engine"]["nan"] == 64 and d["replay"]["nan"] == 0, d


def test_bisect_engine_sglang_finds_the_flag_whose_code_path_holds_the_defect(recorded, defect, tmp_path):
    # Recorded under kv_cache_dtype=fp8_e4m3 with the fp8 store's defect:
    # the capture holds the failure, at the step and layer of the NaN keys.
    session, rep = recorded[2]["fp8_nan_check"]
    assert rep["failure"] == "RuntimeError: NaN detected! sampler: next_token_logits"
    defect_step = capture(session)["step_records"][DEFECT_STEP]
    assert defect_step["out_cache_loc"][defect_step["request_ids"].index(DEFECT_RID)] == FP8_SLOT
    assert first_nonfinite(session) == (DEFECT_STEP, f"L{DEFECT_LAYER}.attention")
    # In sglang's words: the KV cache dtype, and a flag the replay does not
    # depend on (the capture's steps are the chunks sglang made).
    good, bad = tmp_path / "good.toml", tmp_path / "bad.toml"
    good.write_text('kv_cache_dtype = "auto"\nchunked_prefill_size = 4096\n')
    bad.write_text('kv_cache_dtype = "fp8_e4m3"\nchunked_prefill_size = 2048\n')
    rc, j, why = crashreplay_cli(["bisect", session, "--good", good, "--bad", bad, "--json", "--quiet", "--workdir",
                                  tmp_path, "--confirm", "1", "--engine", "sglang", "--engine-python", sys.executable,
                                  "--engine-setup", "fp8_defect"],
                                 modules=defect, env=RECORDINGS["fp8_nan_check"][2])
    assert rc == 0, why
    assert j["culprit"] == {"kv_cache_dtype": "fp8_e4m3"}, why
    t = j["target_signature"]
    assert (t["class"], t["kernel"], t["step"]) == ("non_finite", "sampler", DEFECT_STEP), t
    # Every trial ran in sglang, the exact engine beside it.
    engines = [h.get("engines", "") for h in j["history"]]
    assert engines and all(e.startswith("sglang: ") and "; exact engine: " in e for e in engines), engines
    # The harmless flag alone was tried and judged good; the bad trials left the exact engine at the defect's layer.
    alone = [h for h in j["history"] if h["changes"] == "chunked_prefill_size=2048"]
    assert alone and all(h["verdict"] == "good" for h in alone), j["history"]
    for h in j["history"]:
        if h["verdict"] == "bad":
            assert h["engines"].startswith("sglang: failed (non_finite"), h["engines"]
            assert f"departs from the exact engine at L{DEFECT_LAYER}.attention" in h["engines"], h["engines"]
    assert "--engine sglang" in j["reproduce"] and "--engine-setup fp8_defect" in j["reproduce"], j["reproduce"]
