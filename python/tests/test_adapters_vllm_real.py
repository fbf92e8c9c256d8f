"""crashreplay.vllm against vLLM's own classes, on the CPU.

Runs where vLLM (and torch) import; CI has neither (torch's wheel and its
CUDA libraries are several GB; vLLM's import chain needs ~20 packages on top
of `pip install --no-deps vllm`), so there it is skipped and
test_adapters.py's stand-ins cover the extraction. vLLM's GPU-only
pieces (BlockTables and SamplingStates allocate through the CUDA driver) are
replaced by objects holding the same arrays, written by vLLM's own
SamplingStates.add_request. Last run: vLLM 0.34.0 (pip install --no-deps
plus the pure-Python imports it needs; no vllm._C), torch 2.15.0 CPU.
"""
import dataclasses
import inspect
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")
try:
    from crashreplay import vllm as cr_vllm

    GPUModelRunner, V2 = cr_vllm._runner_class()
    from vllm.sampling_params import SamplingParams
except Exception as e:  # noqa: BLE001
    pytest.skip(f"vLLM is installed but its model runner does not import here: {e!r}", allow_module_level=True)

import crashreplay

if V2:
    from vllm.v1.worker.gpu.input_batch import InputBatch
    from vllm.v1.worker.gpu.sample.states import SamplingStates


def test_this_vllm_is_a_supported_version():
    cr_vllm.check_vllm_version(cr_vllm._vllm_version())


def test_vllms_dsa_indexer_module_is_never_called_so_it_is_not_hooked():
    # vLLM's DeepseekV32Indexer holds the indexer's weights and cache but has
    # no forward: the attention calls sparse_attn_indexer() with them, into a
    # buffer all layers share. install_engine_boundaries passes over such a
    # module (a hook on it would never fire); docs/replay.md "Boundaries".
    from crashreplay._fingerprint_hooks import class_has_own_forward

    try:
        from vllm.models.deepseek_v32.attention import DeepseekV32Indexer
    except ImportError as e:  # its import chain needs a kernel package here
        pytest.skip(f"vllm's deepseek_v32 does not import here: {e!r}")
    assert issubclass(DeepseekV32Indexer, torch.nn.Module)
    assert not class_has_own_forward(DeepseekV32Indexer)


def test_the_runner_has_the_methods_the_hooks_wrap():
    names = ["load_model", "execute_model", "sample_tokens"]
    names += ["prepare_inputs", "prepare_attn"] if V2 else ["_prepare_inputs"]
    assert all(hasattr(GPUModelRunner, n) for n in names), [n for n in names if not hasattr(GPUModelRunner, n)]
    if V2:
        assert list(inspect.signature(GPUModelRunner.prepare_attn).parameters)[:2] == ["self", "input_batch"]
        assert list(inspect.signature(GPUModelRunner.execute_model).parameters)[:2] == ["self", "scheduler_output"]


needs_v2 = pytest.mark.skipif(not V2, reason="this vLLM has the first-generation gpu_model_runner")


def sampling_states(max_reqs=4, vocab=256):
    """The arrays of vLLM's SamplingStates (whose constructor needs CUDA),
    written by vLLM's own add_request."""
    def buf(dtype):
        return SimpleNamespace(np=np.zeros(max_reqs, dtype))

    s = SimpleNamespace(max_num_reqs=max_reqs, vocab_size=vocab, temperature=buf(np.float32),
                        top_k=buf(np.int32), top_p=buf(np.float32), min_p=buf(np.float32), seeds=buf(np.int64),
                        seeds_set=np.zeros(max_reqs, bool), num_logprobs=np.full(max_reqs, -1, np.int32))
    s.top_k.np.fill(vocab)
    s.top_p.np.fill(1.0)
    return s


def real_input_batch(num_computed):
    """vLLM's InputBatch for two requests in request-state slots 2 and 0."""
    scheduled = np.array([1, 1] if num_computed[0] else [3, 2], np.int32)
    n = int(scheduled.sum())
    fields = {f.name for f in dataclasses.fields(InputBatch)}
    values = dict(
        req_ids=["req-a", "req-b"], num_reqs=2, num_reqs_after_padding=2,
        idx_mapping=torch.tensor([2, 0]), idx_mapping_np=np.array([2, 0]), expanded_idx_mapping=torch.tensor([2, 0]),
        expanded_local_pos=torch.zeros(2, dtype=torch.int32), num_scheduled_tokens=scheduled, num_tokens=n,
        num_tokens_after_padding=n + 2, num_draft_tokens=0, num_draft_tokens_per_req=None,
        query_start_loc=torch.tensor([0, scheduled[0], n]), query_start_loc_np=np.array([0, scheduled[0], n]),
        seq_lens=torch.tensor(np.array(num_computed) + scheduled), seq_lens_cpu_upper_bound=None,
        dcp_local_seq_lens=None, num_computed_tokens_np=np.array(num_computed, np.int32),
        prefill_len_np=np.array([3, 2]), num_computed_prefill_tokens_np=np.array([0, 0]),
        is_prefilling_np=np.array([not num_computed[0]] * 2), has_prefill=not num_computed[0],
        decode_graph_eligible=bool(num_computed[0]),
        input_ids=torch.arange(100, 100 + n + 2), positions=torch.arange(n + 2), is_padding=torch.zeros(n + 2, dtype=bool),
        logits_indices=torch.tensor([scheduled[0] - 1, n - 1]), cu_num_logits=torch.tensor([0, 1, 2]),
        cu_num_logits_np=np.array([0, 1, 2]), has_structured_output_reqs=False, prompt_lens=np.array([3, 2]))
    return InputBatch(**{k: v for k, v in values.items() if k in fields})


@needs_v2
def test_a_v2_decode_step_is_recorded_with_block_rows_slots_and_sampling(tmp_path):
    runner = GPUModelRunner.__new__(GPUModelRunner)
    runner.block_tables = SimpleNamespace(block_sizes=[2])
    states = sampling_states()
    SamplingStates.add_request(states, 2, SamplingParams(temperature=0.7, top_p=0.9, top_k=20, seed=7))
    SamplingStates.add_request(states, 0, SamplingParams(temperature=1.0, min_p=0.05))
    runner.sampler = SimpleNamespace(sampling_states=states)
    rec = crashreplay.Recorder(str(tmp_path / "c.crcap"), engine="vllm", install_signal_handlers=False)
    adapter = cr_vllm.VLLMAdapter(rec)
    ib = real_input_batch([3, 2])  # decode: seq lens 4 and 3
    block_tables = (torch.tensor([[5, 6, 0, 0], [9, 8, 0, 0], [0, 0, 0, 0]], dtype=torch.int32),)
    slot_mappings = torch.tensor([[11, 16, -1, -1]])
    adapter.after_prepare_v2(runner, ib)
    adapter.after_attn_v2(runner, ib, (block_tables, slot_mappings))
    rec.close()
    cap = crashreplay.read_capture(rec.path)
    (s,) = cap["step_records"]
    assert s["mode"] == "decode" and s["token_ids"] == [100, 101] and s["positions"] == [0, 1]
    assert s["seq_lens"] == [4, 3] and s["extend_lens"] == [1, 1]
    # ceil(seq_len / block_size) block ids per row
    assert [r["token_slots"] for r in s["page_table"]] == [[5, 6], [9, 8]]
    assert [r["req_pool_index"] for r in s["page_table"]] == [2, 0]
    assert s["out_cache_loc"] == [11, 16]
    a, b = s["sampling"]
    assert (a["seed"], a["top_k"], b["top_k"]) == (7, 20, -1)  # vocab-sized top_k: no top-k
    assert abs(a["temperature"] - 0.7) < 1e-6 and abs(b["min_p"] - 0.05) < 1e-6
    # an unseeded request draws with the seed add_request picked for it: that
    # (with the position) is its RNG state, so it is recorded too
    assert b["seed"] == int(states.seeds.np[0]) % 2**64 and "rng_seed" in s  # int64 bits, stored as uint64


@needs_v2
def test_running_requests_rows_go_as_deltas_and_read_back_whole(tmp_path):
    # vLLM's real InputBatch over five steps, block size 2: a prefill, three
    # decode steps (rows gain a block every other step), then slot 2 taken by
    # a new request. Running requests' rows are given from the block holding
    # their first new token (the recorder is handed 1-2 block ids a row, not
    # the row), a new request's whole; the capture reads back the whole rows
    # of vLLM's block table at every step. Whole rows (snapshot off the
    # delta path: previous=None) give the same capture rows.
    runner = GPUModelRunner.__new__(GPUModelRunner)
    runner.block_tables = SimpleNamespace(block_sizes=[2])
    runner.sampler = SimpleNamespace(sampling_states=None)
    table = torch.zeros(3, 8, dtype=torch.int32)
    table[0, :2] = torch.tensor([5, 6])  # req-a (slot 2): blocks for 3 tokens
    table[1, :1] = torch.tensor([9])     # req-b (slot 0): 2 tokens
    steps = [[0, 0], [3, 2], [4, 3], [5, 4], [6, 5]]
    grown = {2: (0, 2, 7), 3: (1, 2, 4)}  # step: (row, column, block id) vLLM appends
    given, want = [], []
    rec = crashreplay.Recorder(str(tmp_path / "c.crcap"), engine="vllm", install_signal_handlers=False)
    adapter = cr_vllm.VLLMAdapter(rec)
    for step, computed in enumerate(steps):
        ib = real_input_batch(computed)
        if step == 4:  # req-a finished; req-c takes its slot and its row (prefix-cached start)
            ib.req_ids[0] = "req-c"
            table[0, :4] = torch.tensor([21, 22, 23, 24])
        if step in grown:
            r, c, b = grown[step]
            table[r, c] = b
        seq = np.array(computed) + np.asarray(ib.num_scheduled_tokens[:2])
        blocks = (seq + 1) // 2
        want.append([table[i, :blocks[i]].tolist() for i in range(2)])
        adapter.after_prepare_v2(runner, ib)
        fields = cr_vllm.extract_step_v2(runner, ib, ((table,), None), previous=adapter._rows.copy())
        given.append(fields["page_table"].get("starts"))
        adapter.after_attn_v2(runner, ib, ((table,), torch.zeros(1, 4, dtype=torch.int64)))
    rec.close()
    got = [[r["token_slots"] for r in s["page_table"]] for s in crashreplay.read_capture(rec.path)["step_records"]]
    assert got == want
    assert [None if g is None else g.tolist() for g in given] == [None, [1, 1], [2, 1], [2, 2], [0, 2]]
    assert rec.stats()["page_rows_incomplete"] == 0


@needs_v2
def test_a_failing_execute_model_records_the_pending_step_then_the_failure(tmp_path, monkeypatch):
    monkeypatch.setenv("CRASHREPLAY_DIR", str(tmp_path / "session"))
    saved = {n: GPUModelRunner.__dict__[n] for n in ("load_model", "execute_model", "sample_tokens",
                                                       "prepare_inputs", "prepare_attn") if n in GPUModelRunner.__dict__}
    try:
        assert cr_vllm.install() is True
        assert all(getattr(GPUModelRunner, n) is not v for n, v in saved.items())
        runner = GPUModelRunner.__new__(GPUModelRunner)
        runner.block_tables = SimpleNamespace(block_sizes=[2])
        rec = crashreplay.Recorder(str(tmp_path / "c.crcap"), engine="vllm", install_signal_handlers=False)
        adapter = cr_vllm.VLLMAdapter(rec)
        runner._crashreplay_adapter = adapter
        adapter.after_prepare_v2(runner, real_input_batch([0, 0]))  # a prefill whose prepare_attn never returned
        # vLLM's real execute_model on a runner that never initialised fails
        # on the missing state; the hook records and re-raises.
        with pytest.raises(Exception) as raised:
            runner.execute_model(SimpleNamespace(total_num_scheduled_tokens=5))
        rec.close()
        cap = crashreplay.read_capture(rec.path)
        assert [(s["step"], s["mode"]) for s in cap["step_records"]] == [(0, "prefill")]
        (f,) = cap["failure_records"]
        assert f["step"] == 0 and f["stage"] == "prefill"
        assert f["exception_type"] == type(raised.value).__name__ and "model_runner.py" in f["backtrace"]
    finally:
        for n, v in saved.items():
            setattr(GPUModelRunner, n, v)
        if "_crashreplay_installed" in GPUModelRunner.__dict__:
            delattr(GPUModelRunner, "_crashreplay_installed")


@needs_v2
def test_a_runner_that_cannot_attach_serves_on_unrecorded(tmp_path, monkeypatch, caplog):
    # The session directory cannot be created (a file is in the way). The
    # real prepare_inputs needs an initialised GPU runner, so a stand-in
    # returning vLLM's own InputBatch takes its place under the hook.
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("CRASHREPLAY_DIR", str(blocker / "session"))
    names = ("load_model", "execute_model", "sample_tokens", "prepare_inputs", "prepare_attn")
    saved = {n: GPUModelRunner.__dict__[n] for n in names if n in GPUModelRunner.__dict__}
    batch = real_input_batch([3, 2])
    GPUModelRunner.prepare_inputs = lambda self, *a, **k: batch
    try:
        cr_vllm.install()
        runner = GPUModelRunner.__new__(GPUModelRunner)
        with caplog.at_level("WARNING", logger="crashreplay"):
            assert runner.prepare_inputs(None) is batch
            assert runner.prepare_inputs(None) is batch
        assert runner._crashreplay_adapter is False
        assert caplog.text.count("attaching to a vLLM model runner failed") == 1  # once, not every step
    finally:
        for n in names:
            if n in saved:
                setattr(GPUModelRunner, n, saved[n])
            elif n in GPUModelRunner.__dict__:
                delattr(GPUModelRunner, n)
        if "_crashreplay_installed" in GPUModelRunner.__dict__:
            delattr(GPUModelRunner, "_crashreplay_installed")


# ---- a session through the adapter, replayed ---------------------------------
import json  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

BIN = os.environ.get("CRASHREPLAY_BIN", "build/tools/crashreplay")
CHILD = os.path.join(os.path.dirname(__file__), "vllm_worker_child.py")
SCHEDULE = {"block_size": 16, "seed": 7, "decode_steps": 5,
            "requests": [{"rid": "cmpl-8f14e45fceea167a5a36dedd4bea2543-0", "prompt": list(range(1, 21)),
                          "temperature": 0.0},
                         {"rid": "cmpl-c9f0f895fb98ab9159f51fd0297e236d-0", "prompt": [9, 8, 7], "temperature": 0.7,
                          "seed": 3}]}


@needs_v2
def test_a_vllm_session_replays_reproduced_with_its_weights_verified(tmp_path):
    if not os.path.exists(BIN):
        pytest.skip("needs the crashreplay binary (CRASHREPLAY_BIN)")
    ckpt = tmp_path / "llama"
    r = subprocess.run([BIN, "make-model", str(ckpt), "--arch", "llama", "--quant", "bf16", "--vocab", "300"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    # coredumps=True through attach(): the manifest says what was armed
    # (GPU core dumps, docs/capture.md); nothing else changes on the CPU.
    r = subprocess.run([sys.executable, CHILD, str(ckpt), str(tmp_path / "session"), str(port),
                        json.dumps({**SCHEDULE, "coredumps": True})],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    (f,) = crashreplay.read_capture(str(tmp_path / "session"))["files"]
    m = f["manifest"]
    assert m["coredump"]["mode"] in ("env", "driver_api", "failed") and m["coredump"]["reason"]
    assert m["coredump"]["file_pattern"].endswith("/session/rank-00000.%p.cudacore")
    assert m["model"]["checkpoint_path"] == str(ckpt) and m["toggles"]["vllm.block_size"] == 16
    assert m["toggles"]["cache_config.block_size"] == 16 and "env.VLLM_USE_DEEP_GEMM" in m["toggles"]
    steps = f["step_records"]
    assert [s["mode"] for s in steps] == ["prefill"] + ["decode"] * 5
    assert steps[0]["request_ids"] == [q["rid"] for q in SCHEDULE["requests"]]
    assert [p["seed"] for p in steps[0]["sampling"]][1] == 3 and steps[0]["rng_seed"] == 7
    r = subprocess.run([BIN, "replay", str(tmp_path / "session"), "--json"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["outcome"] == "reproduced" and j["step"] == 5
    # 15 parameters and the 8 kv-cache scale buffers vLLM's Attention keeps
    assert j["weights"] == "verified 23 tensors of 1 rank (vllm layout)"


def test_fingerprint_hooks_on_vllms_model_record_what_its_modules_computed_and_replay_agrees(tmp_path):
    # crashreplay.vllm.attach(fingerprints=True) hooks vLLM's own model
    # (LlamaForCausalLM from get_model) at tp 1: every boundary it can name.
    # vLLM's VocabParallelEmbedding runs on each step's tokens; its output's
    # fingerprint is held against the replay's embedding.
    if not os.path.exists(BIN):
        pytest.skip("needs the crashreplay binary (CRASHREPLAY_BIN)")
    ckpt = tmp_path / "llama"
    r = subprocess.run([BIN, "make-model", str(ckpt), "--arch", "llama", "--quant", "bf16", "--vocab", "300"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, CHILD, str(ckpt), str(tmp_path / "session"), str(port),
                        json.dumps({**SCHEDULE, "fingerprints": True})], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    names = json.loads(r.stdout.strip().splitlines()[-1])["boundaries"]
    layers = json.load(open(ckpt / "config.json"))["num_hidden_layers"]
    want = ["embedding"] + [f"L{n}.{b}" for n in range(layers) for b in ("attention", "o_proj", "mlp")]
    assert names == want + ["final_norm", "lm_head"]
    (f,) = crashreplay.read_capture(str(tmp_path / "session"))["files"]
    fps = f["fingerprints"]
    assert [r["step"] for r in fps] == list(range(6))
    assert all([x["name"] for x in r["fingerprints"]] == ["embedding"] for r in fps)
    r = subprocess.run([BIN, "replay", str(tmp_path / "session"), "--json"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["outcome"] == "reproduced", j.get("engine_divergence")
    assert j["fingerprints"]["compared"] == 1


def test_vllms_moe_router_hands_its_logical_topk_ids_to_the_fingerprint_hooks(tmp_path):
    # vLLM's router ids never leave FusedMoE's forward (no module returns
    # them); its routers hand them to a capture callback, which the hooks
    # take as L{n}.topk. Here vLLM's own CustomRoutingRouter with Llama 4's
    # routing function (torch.topk, so it runs on the CPU), held where
    # vLLM's decoder layers hold it (mlp.experts.router: vLLM's MoE models
    # keep the FusedMoE runner at mlp.experts); the ids read back against
    # torch.topk of the same logits. A router whose callback vLLM's own
    # routed-experts capture holds is left alone, and remove() unsets ours.
    from vllm.model_executor.layers.fused_moe.router.custom_routing_router import CustomRoutingRouter
    from vllm.model_executor.models.llama4 import Llama4MoE

    from crashreplay._fingerprint_hooks import FingerprintHooks, install_engine_boundaries

    def layer(router):
        mlp = torch.nn.Module()
        mlp.experts = torch.nn.Module()
        mlp.experts.router = router
        block = torch.nn.Module()
        block.mlp = mlp
        return block

    ours = CustomRoutingRouter(top_k=2, global_num_experts=16, renormalize=False,
                               custom_routing_function=Llama4MoE.custom_routing_function)
    theirs = CustomRoutingRouter(top_k=2, global_num_experts=16, renormalize=False,
                                 custom_routing_function=Llama4MoE.custom_routing_function)
    vllms_own = []
    theirs.set_capture_fn(vllms_own.append)
    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.layers = torch.nn.ModuleList([layer(ours), layer(theirs)])

    rec = crashreplay.Recorder(str(tmp_path / "r.crcap"), engine="vllm-unit", install_signal_handlers=False)
    hooks = FingerprintHooks(rec)
    assert install_engine_boundaries(hooks, model, tp_size=2) == ["L0.topk"]
    hooks.step = 0
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(6, 16, generator=g)
    _, ids = ours.select_experts(torch.zeros(6, 8), logits)
    theirs.select_experts(torch.zeros(6, 8), logits)
    hooks.flush()
    hooks.remove()
    assert ours.capture_fn is None and len(vllms_own) == 1
    rec.close()
    (f,) = crashreplay.read_capture(str(tmp_path / "r.crcap"))["fingerprints"][0]["fingerprints"]
    want = torch.topk(logits, 2, dim=-1).indices
    assert f["name"] == "L0.topk" and f["is_int"] and f["numel"] == 12 and f["columns"] == 2
    assert (f["min"], f["max"], f["sum"]) == (want.min().item(), want.max().item(), want.sum().item())
    assert torch.equal(ids.long().sort(-1).values, want.sort(-1).values)
