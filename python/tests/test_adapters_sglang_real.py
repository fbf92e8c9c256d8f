"""crashreplay.sglang against sglang's own classes, on the CPU.

Runs where sglang (and torch) import. CI has neither and cannot: sglang's
wheel needs torch, whose PyPI wheel is a 540 MB CUDA build that pulls
several GB of NVIDIA libraries (setup.sh installs no torch, and CI's 90
minutes cover the C++ build and every suite), and sglang's import chain
needs torchvision, apache-tvm-ffi and ~25 pure-Python packages on top of
`pip install --no-deps sglang`. There, test_adapters.py's stand-ins cover
the extraction and test_adapters_replay.py replays captures shaped as the
adapter writes them. Here the tp=2 sessions are served by sglang's own
ModelRunner on each rank (sglang_rank_child.py, through
crashreplay._sglang_cpu_runner, which says what stands in for the
Scheduler around it): ForwardMode, ForwardBatch, SamplingBatchInfo,
ReqToTokenPool, the paged KV allocator, ServerArgs and its resolution, the
published parallel context, the model class and its weight loaders, the
forward with the torch_native attention backend and its all-reduces over
gloo, and the sampler are sglang's. sglang's GPU kernels are never called;
its expert-parallel dispatch needs an accelerator, so an ep_size 2 session
fails at its first forward here (recorded as such). Last run: sglang
0.5.23 (pip install --no-deps, plus the imports it needs: see
docs/python.md), torch 2.15.0 CPU.
"""
import dataclasses
import inspect
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sglang")
try:  # any failure of sglang's import chain (a missing optional kernel package): skip, say why
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
    from sglang.srt.server_args import ServerArgs
except Exception as e:  # noqa: BLE001
    pytest.skip(f"sglang is installed but its scheduler does not import here: {e!r}", allow_module_level=True)

import crashreplay
from crashreplay import sglang as cr_sglang


def test_this_sglang_is_a_supported_version():
    cr_sglang.check_sglang_version(cr_sglang._sglang_version())


def test_every_forward_mode_of_this_sglang_has_a_capture_mode():
    unmapped = [m.name for m in ForwardMode if cr_sglang.forward_mode_name(m) == "unknown"]
    assert not unmapped, f"sglang ForwardMode members without a capture mode: {unmapped}"
    assert cr_sglang.forward_mode_name(ForwardMode.DECODE) == "decode"
    assert cr_sglang.forward_mode_name(ForwardMode.EXTEND) == "extend"


def test_forward_batch_and_sampling_info_have_the_fields_the_adapter_reads():
    fb = {f.name for f in dataclasses.fields(ForwardBatch)}
    want = set(cr_sglang._FORWARD_BATCH_FIELDS) | {"rids", "seq_lens_cpu", "extend_seq_lens", "sampling_info"}
    assert want <= fb, f"missing in ForwardBatch: {want - fb}"
    si = {f.name for f in dataclasses.fields(SamplingBatchInfo)}
    assert {"temperatures", "top_ps", "top_ks", "min_ps", "sampling_seed"} <= si


def real_batch(pool):
    """A decode batch of two requests in sglang's own ForwardBatch."""
    # Request in pool row 1 holds slots 10..13, pool row 0 holds 20..21.
    pool.req_to_token[1, :4] = torch.tensor([10, 11, 12, 13], dtype=torch.int32)
    pool.req_to_token[0, :2] = torch.tensor([20, 21], dtype=torch.int32)
    sampling = SamplingBatchInfo(
        temperatures=torch.tensor([[0.7], [1.0]]), top_ps=torch.tensor([0.9, 1.0]),
        top_ks=torch.tensor([20, -1], dtype=torch.int32), min_ps=torch.tensor([0.0, 0.05]),
        is_all_greedy=False, is_any_greedy=False, need_top_p_sampling=True, need_top_k_sampling=True,
        need_min_p_sampling=True, vocab_size=256, sampling_seed=torch.tensor([7, 8], dtype=torch.int64))
    return ForwardBatch(
        forward_mode=ForwardMode.DECODE, batch_size=2, input_ids=torch.tensor([101, 202], dtype=torch.int64),
        req_pool_indices=torch.tensor([1, 0], dtype=torch.int64), seq_lens=torch.tensor([4, 2], dtype=torch.int64),
        out_cache_loc=torch.tensor([13, 21], dtype=torch.int64), seq_lens_sum=6,
        seq_lens_cpu=torch.tensor([4, 2], dtype=torch.int64), positions=torch.tensor([3, 1], dtype=torch.int64),
        sampling_info=sampling, rids=["req-a", "req-b"])


def test_a_real_forward_batch_is_recorded_and_reads_back(tmp_path):
    pool = ReqToTokenPool(size=4, max_context_len=8, device="cpu", enable_memory_saver=False)
    # Whole rows (a first step of decode requests: the recorder has no prefill to continue).
    f = cr_sglang.extract_step(real_batch(pool), pool.req_to_token, page_deltas=False)
    assert f["mode"] == "decode" and f["request_ids"] == ["req-a", "req-b"]
    assert f["page_table"]["rows"].tolist() == [[10, 11, 12, 13], [20, 21, 0, 0]]
    # By default a decode row is its new slot, where sglang's pool holds it.
    d = cr_sglang.extract_step(real_batch(pool), pool.req_to_token)["page_table"]
    assert d["starts"].tolist() == [3, 1]
    assert d["rows"].reshape(-1).tolist() == [int(pool.req_to_token[1, 3]), int(pool.req_to_token[0, 1])]

    rec = crashreplay.Recorder(str(tmp_path / "c.crcap"), engine="sglang", install_signal_handlers=False)
    rec.record_step(0, **f)
    rec.close()
    cap = crashreplay.read_capture(rec.path)
    (s,) = cap["step_records"]
    assert s["mode"] == "decode" and s["token_ids"] == [101, 202] and s["positions"] == [3, 1]
    assert s["page_table"] == [{"req_pool_index": 1, "token_slots": [10, 11, 12, 13]},
                               {"req_pool_index": 0, "token_slots": [20, 21]}]
    assert [p["seed"] for p in s["sampling"]] == [7, 8]
    assert abs(s["sampling"][0]["temperature"] - 0.7) < 1e-6 and s["sampling"][0]["top_k"] == 20


def test_real_server_args_become_toggles_as_sglang_resolved_them(tmp_path):
    ckpt = make_checkpoint(tmp_path)
    sa = ServerArgs(model_path=ckpt, device="cpu", skip_tokenizer_init=True, tp_size=2, page_size=64,
                    attention_backend="torch_native", kv_cache_dtype="auto", max_total_tokens=8192,
                    max_prefill_tokens=4096, cuda_graph_max_bs_decode=256, api_key="hunter2")
    from sglang.srt.runtime_context import SpawnRanks, publish

    publish(sa, role="scheduler", ranks=SpawnRanks(world_rank=1, gpu_id=0))
    t = dict(cr_sglang.server_args_toggles(sa, environ={"SGLANG_ENABLE_JIT_DEEPGEMM": "1", "HF_TOKEN": "x"}))
    assert t["attention_backend"] == "torch_native" and t["tp_size"] == 2 and t["page_size"] == 64
    # the fields sglang 0.5.23 leaves raw and resolves beside them
    assert sa.mem_fraction_static is None and isinstance(t["mem_fraction_static"], float)
    assert t["max_total_tokens"] == 8192 and t["max_prefill_tokens"] == 4096
    assert t["cuda_graph_max_bs_decode"] == 256  # what was asked for ...
    # ... and what the process captures, which the replay plans: sglang turns
    # decode CUDA graphs off for torch_native attention (attention_hook.py)
    assert t["cuda_graph_config.decode.backend"] == "disabled" and t["cuda_graph_max_bs"] == 0
    assert {"dsa_prefill_backend", "dsa_decode_backend", "moe_runner_backend", "disable_shared_experts_fusion",
            "chunked_prefill_size", "ep_size", "disable_cuda_graph", "decode_attention_backend"} <= set(t)
    assert t["env.SGLANG_ENABLE_JIT_DEEPGEMM"] == "1" and "env.HF_TOKEN" not in t and "api_key" not in t
    assert len(t) > 300  # every field, not a hand-picked few
    live = dict(cr_sglang.server_args_toggles(sa))  # the process: sglang's envs registry with defaults
    assert live["env.SGLANG_ENABLE_JIT_DEEPGEMM"] is True and "deepgemm.DEEPGEMM_SCALE_UE8M0" in live


def test_the_published_parallel_context_gives_the_rank(tmp_path):
    # sglang 0.5.23's Scheduler has no tp_rank: run_scheduler_process
    # publishes the rank before building it, and the adapter reads it there.
    from sglang.srt.runtime_context import SpawnRanks, publish

    assert "tp_rank" not in Scheduler.__dict__
    sa = ServerArgs(model_path=make_checkpoint(tmp_path), device="cpu", skip_tokenizer_init=True, tp_size=2)
    publish(sa, role="scheduler", ranks=SpawnRanks(world_rank=1, gpu_id=1))
    scheduler = Scheduler.__new__(Scheduler)
    scheduler.server_args = sa
    r = cr_sglang.scheduler_ranks(scheduler)
    assert (r["rank"], r["tp_rank"], r["tp_size"], r["world_size"]) == (1, 1, 2, 2)


def test_model_runner_forward_takes_the_batch_first_and_failures_escaping_it_are_recorded(tmp_path):
    params = list(inspect.signature(ModelRunner.forward).parameters)
    assert params[:2] == ["self", "forward_batch"], params
    # A ModelRunner that never loaded a model: its real forward fails on the
    # missing state; the hook must record that and re-raise it unchanged.
    runner = ModelRunner.__new__(ModelRunner)
    runner.req_to_token_pool = ReqToTokenPool(size=4, max_context_len=8, device="cpu", enable_memory_saver=False)
    rec = crashreplay.Recorder(str(tmp_path / "c.crcap"), engine="sglang", install_signal_handlers=False)
    cr_sglang.SGLangAdapter(rec).attach_runner(runner)
    with pytest.raises(Exception) as raised:
        runner.forward(real_batch(runner.req_to_token_pool))
    rec.close()
    cap = crashreplay.read_capture(rec.path)
    assert [s["step"] for s in cap["step_records"]] == [0]
    (fail,) = cap["failure_records"]
    assert fail["step"] == 0 and fail["stage"] == "decode"
    assert fail["exception_type"] == type(raised.value).__name__ and str(raised.value) in fail["reason"]
    assert "model_runner.py" in fail["backtrace"]  # the traceback reaches into sglang's own forward


def test_a_real_decode_batch_records_one_new_token_per_request_and_the_rng(tmp_path):
    pool = ReqToTokenPool(size=4, max_context_len=8, device="cpu", enable_memory_saver=False)
    torch.manual_seed(99)
    fb = real_batch(pool)
    assert fb.extend_seq_lens is None  # sglang's decode batch says nothing
    f = cr_sglang.extract_step(fb, pool.req_to_token)
    rec = crashreplay.Recorder(str(tmp_path / "c.crcap"), engine="sglang", install_signal_handlers=False)
    rec.record_step(0, **f)
    rec.close()
    (s,) = crashreplay.read_capture(rec.path)["step_records"]
    assert s["extend_lens"] == [1, 1] and s["rng_seed"] == 99


def test_install_hooks_the_real_scheduler(tmp_path, monkeypatch):
    loops = [n for n in dir(Scheduler) if n.startswith("event_loop")]
    assert "event_loop_normal" in loops and "event_loop_overlap" in loops
    saved = {n: Scheduler.__dict__[n] for n in ["__init__", *loops] if n in Scheduler.__dict__}
    monkeypatch.setenv("CRASHREPLAY_DIR", str(tmp_path / "session"))
    try:
        assert cr_sglang.install() is True
        assert Scheduler._crashreplay_installed
        assert Scheduler.__init__ is not saved["__init__"]
        assert all(getattr(Scheduler, n) is not saved.get(n) for n in loops if n in saved)
    finally:
        for n, v in saved.items():
            setattr(Scheduler, n, v)
        if "_crashreplay_installed" in Scheduler.__dict__:
            delattr(Scheduler, "_crashreplay_installed")


def test_attaching_never_stops_the_scheduler(tmp_path, monkeypatch, caplog):
    # The session directory cannot be created (a file is in the way): the
    # real Scheduler class, hooked by install(), still comes up, unrecorded.
    # Its own __init__ builds a whole server (GPU, sockets), so a stand-in
    # sets what it would set.
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("CRASHREPLAY_DIR", str(blocker / "session"))
    saved = {n: Scheduler.__dict__[n] for n in ["__init__"] + [n for n in dir(Scheduler) if n.startswith("event_loop")]
             if n in Scheduler.__dict__}

    def init(self, server_args, port_args=None):
        self.server_args = server_args
        self.model_config = None
        runner = ModelRunner.__new__(ModelRunner)
        runner.model = torch.nn.Linear(2, 2)
        runner.req_to_token_pool = ReqToTokenPool(size=2, max_context_len=4, device="cpu", enable_memory_saver=False)
        worker = TpModelWorker.__new__(TpModelWorker)
        worker._model_runner = runner
        self.tp_worker = worker

    Scheduler.__init__ = init
    try:
        cr_sglang.install()
        with caplog.at_level("WARNING", logger="crashreplay"):
            scheduler = Scheduler(ServerArgs(model_path="m", device="cpu", tp_size=1))
        assert scheduler.tp_worker is not None and getattr(scheduler, "_crashreplay_adapter", None) is None
        assert "attaching to an sglang scheduler failed" in caplog.text and "serving goes on" in caplog.text
        # the plugin entry point never raises either, even where install() would
        monkeypatch.setattr(cr_sglang, "check_sglang_version", lambda v: (_ for _ in ()).throw(
            cr_sglang.UnsupportedVersion("sglang 9.9 is not supported")))
        with caplog.at_level("WARNING", logger="crashreplay"):
            cr_sglang.plugin()
        assert "sglang 9.9 is not supported" in caplog.text
    finally:
        for n, v in saved.items():
            setattr(Scheduler, n, v)
        if "_crashreplay_installed" in Scheduler.__dict__:
            delattr(Scheduler, "_crashreplay_installed")


# ---- a tp=2 session through the adapter, replayed ---------------------------
BIN = os.environ.get("CRASHREPLAY_BIN", "build/tools/crashreplay")
CHILD = os.path.join(os.path.dirname(__file__), "sglang_rank_child.py")
REQ_A = "3f2a9c1e-5b7d-4e8a-9c0f-1a2b3c4d5e6f"
REQ_B = "b7e1d2c3-0000-4e8a-9c0f-ffffffffffff"
SCHEDULE = {"page_size": 64, "seed": 1234, "max_total_tokens": 4096, "max_prefill_tokens": 2048,
            "cuda_graph_max_bs_decode": 256, "mem_fraction_static": 0.85, "decode_steps": 4,
            "requests": [{"rid": REQ_A, "prompt": list(range(1, 63)), "temperature": 0.0},
                         {"rid": REQ_B, "prompt": [5, 6, 7], "temperature": 0.8, "seed": 42}]}


def make_checkpoint(tmp_path, vocab=300, arch="llama"):
    d = tmp_path / arch
    if not d.exists():
        r = subprocess.run([BIN, "make-model", str(d), "--arch", arch, "--quant", "bf16", "--vocab", str(vocab)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
    return str(d)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def record_tp2_session(session, ckpt, **schedule):
    return [rep["path"] for rep in record_tp2_session_reports(session, ckpt, **schedule)]


def test_decode_rows_recorded_as_deltas_are_the_rows_sglangs_pool_holds(tmp_path):
    # Decode steps give the recorder one slot a request (out_cache_loc from
    # column seq_len - 1); every step's rows read back whole and, at the
    # end, equal what sglang's ReqToTokenPool holds.
    if not os.path.exists(BIN):
        pytest.skip("needs the crashreplay binary (CRASHREPLAY_BIN)")
    ckpt = make_checkpoint(tmp_path)
    reports = record_tp2_session_reports(tmp_path / "session", ckpt, decode_steps=70)
    for rep in reports:
        steps = crashreplay.read_capture(rep["path"])["step_records"]
        assert [s["mode"] for s in steps] == ["extend"] + ["decode"] * 70
        assert [r["token_slots"] for r in steps[-1]["page_table"]] == rep["rows"]
        for s in steps:
            assert [len(r["token_slots"]) for r in s["page_table"]] == s["seq_lens"]
            assert all("start" not in r for r in s["page_table"])


def record_tp2_session_reports(session, ckpt, allow_failure=False, **schedule):
    """record_tp2_session, returning each rank's whole report (with
    allow_failure, also when sglang raised: the failure is in the report
    and the session)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    port = free_port()
    procs = [subprocess.Popen([sys.executable, CHILD, ckpt, str(session), str(rank), "2", str(port),
                               json.dumps({**SCHEDULE, **schedule})], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for rank in (0, 1)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0 or (allow_failure and p.returncode == 1), err[-4000:]
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]


@pytest.fixture(scope="module")
def tp2_session(tmp_path_factory):
    if not os.path.exists(BIN):
        pytest.skip("needs the crashreplay binary (CRASHREPLAY_BIN)")
    tmp = tmp_path_factory.mktemp("tp2")
    ckpt = make_checkpoint(tmp)
    session = tmp / "session"
    # coredumps=True through attach(): each rank's manifest says what was
    # armed (GPU core dumps, docs/capture.md); nothing else changes on the CPU.
    return ckpt, str(session), record_tp2_session(session, ckpt, coredumps=True)


def test_each_rank_of_a_tp2_session_writes_its_own_file(tp2_session):
    _, session, paths = tp2_session
    assert [os.path.basename(p) for p in paths] == ["rank-00000.crcap", "rank-00001.crcap"]
    files = crashreplay.read_capture(session)["files"]
    for rank, f in enumerate(files):
        m = f["manifest"]
        assert m["parallel"]["rank"] == rank and m["parallel"]["tp_rank"] == rank and m["parallel"]["tp_size"] == 2
        assert m["coredump"]["mode"] in ("env", "driver_api", "failed") and m["coredump"]["reason"]
        assert m["coredump"]["file_pattern"].endswith(f"/session/rank-0000{rank}.%p.cudacore")
        toggles = m["toggles"]
        assert toggles["max_total_tokens"] == 4096 and toggles["max_prefill_tokens"] == 2048
        assert toggles["sglang.page_table_unit"] == "token" and toggles["scheduler.max_running_requests"] == 8
        (w,) = f["weight_hashes"]
        assert w["rank"] == rank and "model.layers.0.self_attn.qkv_proj.weight" in w["tensors"]
        steps = f["step_records"]
        assert [s["mode"] for s in steps] == ["extend"] + ["decode"] * 4
        assert all(s["request_ids"] == [REQ_A, REQ_B] for s in steps)
        assert all(s["extend_lens"] == [1, 1] for s in steps[1:])
        assert all(s["rng_seed"] == 1234 for s in steps)  # torch.manual_seed(random_seed)
        # token slots of 64-token pages, as sglang's paged allocator hands them out
        row = steps[-1]["page_table"][0]["token_slots"]
        assert len(row) == 66 and row[64] % 64 == 0 and row[:64] == list(range(row[0], row[0] + 64))


def test_a_tp2_session_replays_reproduced_with_both_ranks_weights_verified(tp2_session):
    _, session, paths = tp2_session
    for path in (session, paths[1]):
        t0 = time.monotonic()
        r = subprocess.run([BIN, "replay", path, "--json"], capture_output=True, text=True, timeout=300)
        took = time.monotonic() - t0
        assert r.returncode == 0, r.stderr
        j = json.loads(r.stdout)
        assert j["outcome"] == "reproduced" and j["step"] == 4
        # 15 parameters per rank, each checked against sglang's loader output
        assert j["weights"] == "verified 30 tensors of 2 ranks (sglang layout)"
        assert j["config"]["page_size"] == "64" and j["config"]["tp_size"] == "2"
        assert j["config"]["max_total_tokens"] == "4096" and j["config"]["mem_fraction_static"] == "0.85"
        # sglang's own words through the engine vocabulary (docs/engines.md): torch_native is the
        # reference kernel, and nothing the table models is left to a note
        assert j["config"]["attention_backend"] == "reference" and j["config"]["attention_kernel"] == "torch_native"
        assert not any("attention_backend" in n for n in j.get("notes", [])), j.get("notes")
        assert took < 30, took  # token slots read as pages once took 7.8 s and 6 GB


def test_a_checkpoint_that_is_not_the_recorded_one_fails_weight_verification(tp2_session, tmp_path):
    ckpt, session, _ = tp2_session
    other = tmp_path / "other"
    shutil.copytree(ckpt, other)
    st = other / "model.safetensors"
    raw = bytearray(st.read_bytes())
    header = 8 + int.from_bytes(raw[:8], "little")
    meta = json.loads(raw[8:header])
    name = "model.layers.1.mlp.down_proj.weight"
    begin, end = meta[name]["data_offsets"]
    raw[header + end - 2] ^= 0x40  # the last bf16 of the last row: rank 1's columns
    st.write_bytes(bytes(raw))
    r = subprocess.run([BIN, "replay", session, "--model", str(other)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 3, r.stderr
    assert "rank 1 tensor 'model.layers.1.mlp.down_proj.weight'" in r.stderr and "the checkpoint gives" in r.stderr


@pytest.mark.parametrize("ep_size", [1, 2])
def test_a_moe_session_verifies_the_fused_experts_as_sglang_lays_them_out(tmp_path, ep_size):
    # qwen3_moe: sglang's FusedMoE holds experts.w13_weight [local experts,
    # 2 * I / moe_tp, H] and w2_weight; with ep_size 2 each rank holds half
    # the experts whole, with ep_size 1 every expert's half.
    if not os.path.exists(BIN):
        pytest.skip("needs the crashreplay binary (CRASHREPLAY_BIN)")
    ckpt = make_checkpoint(tmp_path, arch="qwen3_moe")
    reports = record_tp2_session_reports(tmp_path / "session", ckpt, allow_failure=ep_size > 1, ep_size=ep_size)
    if ep_size > 1:
        # sglang's expert-parallel dispatch asks torch for an accelerator even
        # where its experts run natively: on a CPU the first forward raises,
        # after the weights were loaded and hashed (and the failure recorded).
        assert all("No accelerator" in (rep["failure"] or "") for rep in reports), reports
    else:
        assert all(rep["failure"] is None for rep in reports), reports
    (w,) = crashreplay.read_capture(str(tmp_path / "session"))["files"][1]["weight_hashes"]
    assert "model.layers.0.mlp.experts.w13_weight" in w["tensors"]
    r = subprocess.run([BIN, "replay", str(tmp_path / "session"), "--json"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["outcome"] == "reproduced"
    assert j["weights"] == "verified 42 tensors of 2 ranks (sglang layout)"


def test_fingerprint_hooks_on_sglangs_model_record_what_its_modules_computed_and_replay_agrees(tmp_path):
    # crashreplay.sglang.attach(fingerprints=True) hooks sglang's own model
    # (LlamaForCausalLM as get_model builds it): at tp 2 only the points that
    # are the same on every rank. sglang's forward runs whole on each step
    # (VocabParallelEmbedding, the layers with their all-reduces over gloo,
    # the final RMSNorm, the vocabulary-parallel lm_head); its outputs'
    # fingerprints are held against the replay's, a computation nobody here
    # wrote against ours.
    if not os.path.exists(BIN):
        pytest.skip("needs the crashreplay binary (CRASHREPLAY_BIN)")
    ckpt = make_checkpoint(tmp_path)
    session = tmp_path / "session"
    reports = record_tp2_session_reports(session, ckpt, fingerprints=True)
    for rep in reports:
        assert rep["boundaries"] == ["embedding", "final_norm", "lm_head"]
    files = crashreplay.read_capture(str(session))["files"]
    for f in files:
        fps = f["fingerprints"]
        assert [r["step"] for r in fps] == [0, 1, 2, 3, 4]
        # final_norm's prefill output is changed in place after its hook ran
        # (its version moves): that step drops it, and from then on the hook
        # summarises it at once (_fingerprint_hooks.py).
        assert [x["name"] for x in fps[0]["fingerprints"]] == ["embedding", "lm_head"]
        assert all([x["name"] for x in r["fingerprints"]] == ["embedding", "final_norm", "lm_head"] for r in fps[1:])
        assert fps[1]["fingerprints"][2]["numel"] == 2 * 300  # the logits of both requests' last tokens
        hidden = json.load(open(os.path.join(ckpt, "config.json")))["hidden_size"]
        assert fps[0]["fingerprints"][0]["numel"] == (62 + 3) * hidden  # the prefill's tokens
        assert fps[1]["fingerprints"][0]["numel"] == 2 * hidden  # a decode step's
    r = subprocess.run([BIN, "replay", str(session), "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["outcome"] == "reproduced", j.get("engine_divergence")
    assert j["fingerprints"]["compared"] == 3
    # Re-executed by sglang itself at the recorded width: two ranks again,
    # their all-reduces over gloo, the same bits at every boundary.
    r = subprocess.run([BIN, "replay", str(session), "--json", "--engine", "sglang", "--engine-python", sys.executable,
                        "--engine-out", str(tmp_path / "again"), "--set", "tp_size=2"], capture_output=True,
                       text=True, timeout=600, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    j = json.loads(r.stdout)
    assert r.returncode == 0 and j["outcome"] == "reproduced", r.stdout[-3000:] + r.stderr[-3000:]
    assert j["fingerprints"] == {"compared": 3, "identical": 3, "recorded": 3, "replayed": 3}
    # REQ_B samples at temperature 0.8 without a seed, so the steps' tokens
    # are reported, not compared; REQ_A's are greedy: the same argmax again.
    sampled = j["real_engine"]["sampled"]
    assert len(sampled) == 4 and all(row["recorded"][0] == row["replayed"][0] for row in sampled), sampled
    assert sorted(os.listdir(tmp_path / "again" / "session")) == ["rank-00000.crcap", "rank-00001.crcap"]


def test_the_dsa_indexer_is_where_the_fingerprint_hooks_read_it():
    # install_engine_boundaries hooks model.layers[n].self_attn.indexer when
    # its class has a forward of its own (test_torch runs the hook on a
    # stand-in: the real Indexer needs CUDA). Checked against this sglang:
    # GLM-5 (GlmMoeDsaForCausalLM) and DeepSeek V3.2 are DeepseekV2 models
    # whose MLA attention sets self.indexer, an Indexer with a forward.
    from sglang.srt.layers.attention.dsa.dsa_indexer import Indexer
    from sglang.srt.models import deepseek_v2, glm4_moe

    from crashreplay._fingerprint_hooks import class_has_own_forward

    assert issubclass(glm4_moe.GlmMoeDsaForCausalLM, deepseek_v2.DeepseekV2ForCausalLM)
    assert "self.indexer = " in inspect.getsource(deepseek_v2.DeepseekV2AttentionMLA.__init__)
    assert issubclass(Indexer, torch.nn.Module) and class_has_own_forward(Indexer)
    assert not class_has_own_forward(torch.nn.Module)
