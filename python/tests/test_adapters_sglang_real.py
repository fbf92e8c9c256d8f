"""crashreplay.sglang against sglang's own classes, on the CPU.

Runs where sglang (and torch) import; CI has neither (sglang's wheel needs
torch, several GB), so there it is skipped and test_adapters.py's stand-ins
cover the extraction. Here nothing is a stand-in except the model itself:
ForwardMode, ForwardBatch, SamplingBatchInfo, ReqToTokenPool, ServerArgs,
ModelRunner and Scheduler are sglang's. sglang's GPU kernels are never
called. Last run: sglang 0.5.23 (pip install --no-deps, plus the pure-Python
imports it needs), torch 2.15.0 CPU.
"""
import dataclasses
import inspect

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sglang")
try:  # any failure of sglang's import chain (a missing optional kernel package): skip, say why
    from sglang.srt.managers.scheduler import Scheduler
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
    f = cr_sglang.extract_step(real_batch(pool), pool.req_to_token)
    assert f["mode"] == "decode" and f["request_ids"] == ["req-a", "req-b"]
    assert f["page_table"]["rows"].tolist() == [[10, 11, 12, 13], [20, 21, 0, 0]]

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


def test_real_server_args_become_toggles_without_secrets():
    # sglang 0.5.2x's ServerArgs is a msgspec.Struct, not a dataclass: its
    # fields are slots and vars() is empty.
    graph = {"cuda_graph_max_bs_decode": 160} if "cuda_graph_max_bs_decode" in getattr(ServerArgs, "__struct_fields__", ()) else {
        "cuda_graph_max_bs": 160}
    sa = ServerArgs(model_path="/models/m", attention_backend="flashinfer", mem_fraction_static=0.95, tp_size=8,
                    kv_cache_dtype="fp8_e4m3", api_key="hunter2", **graph)
    t = dict(cr_sglang.server_args_toggles(sa, environ={"SGLANG_ENABLE_JIT_DEEPGEMM": "1"}))
    assert t["attention_backend"] == "flashinfer" and t["mem_fraction_static"] == 0.95 and t["tp_size"] == 8
    assert t["kv_cache_dtype"] == "fp8_e4m3" and t["env.SGLANG_ENABLE_JIT_DEEPGEMM"] == "1"
    assert "api_key" not in t
    assert t["cuda_graph_max_bs"] == 160  # what the replay's graph-capture planning reads
    assert len(t) > 100  # every field, not a hand-picked few


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
