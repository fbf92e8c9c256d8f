"""Engine adapters: extraction logic and recording, without the engines.

sglang and vLLM need a GPU and are not installed here, so these tests use
SMALL STAND-INS (classes named Fake*) shaped like sglang's ForwardBatch /
SamplingBatchInfo / ReqToTokenPool and vLLM's GPUModelRunner / InputBatch,
with the attribute names read from those projects' sources. They pin down
the extraction and what reaches the capture; they do not prove that a
given engine version still has these fields (the adapters check that at
run time with require_fields and the version gate).
"""
import enum
from types import SimpleNamespace

import numpy as np
import pytest

import crashreplay
from crashreplay import sglang as cr_sglang
from crashreplay import vllm as cr_vllm
from crashreplay._adapter_common import UnsupportedVersion, env_toggles


class FakeForwardMode(enum.IntEnum):  # sglang ForwardMode member names
    EXTEND = 1
    DECODE = 2
    MIXED = 3
    IDLE = 4
    TARGET_VERIFY = 5


def fake_forward_batch(mode=FakeForwardMode.DECODE, with_cpu_mirror=True):
    sampling = SimpleNamespace(temperatures=np.array([[0.7], [1.0]], np.float32),  # sglang keeps (bs, 1)
                               top_ps=np.array([0.9, 1.0], np.float32), top_ks=np.array([20, -1], np.int32),
                               min_ps=np.array([0.0, 0.05], np.float32),
                               sampling_seed=np.array([7, 8], np.int64))
    return SimpleNamespace(
        forward_mode=mode, batch_size=2, input_ids=np.array([101, 202], np.int64),
        positions=np.array([3, 1], np.int64), seq_lens=np.array([4, 2], np.int64),
        seq_lens_cpu=np.array([4, 2], np.int64) if with_cpu_mirror else None,
        req_pool_indices=np.array([1, 0], np.int64), out_cache_loc=np.array([13, 21], np.int64),
        extend_seq_lens=None, sampling_info=sampling, rids=["req-a", "req-b"])


# req_to_token: row r holds the KV slots of the request in pool row r.
REQ_TO_TOKEN = np.array([[20, 21, 0, 0, 0, 0],
                         [10, 11, 12, 13, 0, 0],
                         [0, 0, 0, 0, 0, 0]], np.int32)


def test_sglang_extract_step_maps_forward_batch_fields():
    f = cr_sglang.extract_step(fake_forward_batch(), REQ_TO_TOKEN, page_deltas=False)
    assert f["mode"] == "decode" and f["request_ids"] == ["req-a", "req-b"]
    assert f["token_ids"].tolist() == [101, 202] and f["out_cache_loc"].tolist() == [13, 21]
    # rows selected by req_pool_indices, cut to the widest seq_len
    assert f["page_table"]["rows"].tolist() == [[10, 11, 12, 13], [20, 21, 0, 0]]
    # by default a decode step's rows are their new slot, from column seq_len - 1
    d = cr_sglang.extract_step(fake_forward_batch(), REQ_TO_TOKEN)["page_table"]
    assert d["rows"].tolist() == [[13], [21]] and d["starts"].tolist() == [3, 1] and d["lengths"].tolist() == [1, 1]
    assert f["sampling"]["seeds"].tolist() == [7, 8]
    # a decode step adds one token per request (sglang's ForwardBatch has no
    # extend_seq_lens then); without it the replay could not split the tokens
    assert f["extend_lens"].tolist() == [1, 1]
    assert isinstance(f["rng_seed"], int) and isinstance(f["rng_offset"], int)


def test_sglang_mode_names_and_unknown_modes():
    assert cr_sglang.forward_mode_name(FakeForwardMode.EXTEND) == "extend"
    assert cr_sglang.forward_mode_name(FakeForwardMode.TARGET_VERIFY) == "extend"
    assert cr_sglang.forward_mode_name(FakeForwardMode.IDLE) == "idle"
    assert cr_sglang.forward_mode_name("SOMETHING_NEW") == "unknown"


def test_sglang_without_seq_lens_cpu_records_no_rows_rather_than_syncing():
    f = cr_sglang.extract_step(fake_forward_batch(with_cpu_mirror=False), REQ_TO_TOKEN)
    assert "page_table" not in f


def test_sglang_batch_missing_a_field_is_refused_by_name():
    fb = fake_forward_batch()
    del fb.out_cache_loc
    with pytest.raises(UnsupportedVersion, match="no field 'out_cache_loc'"):
        cr_sglang.extract_step(fb, REQ_TO_TOKEN)


def test_sglang_adapter_records_steps_snapshots_and_a_failing_forward(tmp_path):
    rec = crashreplay.Recorder(str(tmp_path / "c.crcap"), engine="sglang", install_signal_handlers=False)
    adapter = cr_sglang.SGLangAdapter(rec, snapshot_kv=True)
    kv = SimpleNamespace(k_buffer=[np.arange(40, dtype=np.float32).reshape(40, 1) * (layer + 1)
                                   for layer in range(2)])

    class FakeModelRunner:  # stand-in for sglang's ModelRunner
        req_to_token_pool = SimpleNamespace(req_to_token=REQ_TO_TOKEN)
        token_to_kv_pool = kv
        calls = 0

        def forward(self, forward_batch, skip_attn_backend_init=False):
            FakeModelRunner.calls += 1
            if FakeModelRunner.calls == 3:
                raise RuntimeError("CUDA error: device-side assert triggered")
            return "logits"

    runner = FakeModelRunner()
    adapter.attach_runner(runner)
    assert runner.forward(fake_forward_batch(FakeForwardMode.EXTEND)) == "logits"
    assert runner.forward(forward_batch=fake_forward_batch()) == "logits"
    with pytest.raises(RuntimeError, match="device-side assert"):
        runner.forward(fake_forward_batch())
    rec.close()
    cap = crashreplay.read_capture(rec.path)
    assert [s["step"] for s in cap["step_records"]] == [0, 1, 2]
    assert [s["mode"] for s in cap["step_records"]] == ["extend", "decode", "decode"]
    s = cap["step_records"][2]
    assert s["page_table"] == [{"req_pool_index": 1, "token_slots": [10, 11, 12, 13]},
                               {"req_pool_index": 0, "token_slots": [20, 21]}]
    assert [p["seed"] for p in s["sampling"]] == [7, 8] and abs(s["sampling"][0]["temperature"] - 0.7) < 1e-6
    (f,) = cap["failure_records"]
    assert (f["step"], f["stage"], f["failure_class"]) == (2, "decode", "device-assert")
    snap = [x for x in cap["snapshot_records"] if x["step"] == 2][0]
    names = {d["name"]: d for d in snap["tensors"]}
    assert {"token_ids", "req_to_token_rows", "kv.k_buffer.0", "kv.k_buffer.1"} <= set(names)
    # the KV pages the rows select, gathered at those slots
    got = crashreplay.load_tensor(crashreplay.CaptureFile(rec.path), names["kv.k_buffer.1"])
    assert got.reshape(-1).tolist() == [2.0 * x for x in [10, 11, 12, 13, 20, 21, 0, 0]]


def test_sglang_server_args_become_toggles_without_secrets():
    from dataclasses import dataclass

    @dataclass
    class FakeServerArgs:  # a few of sglang's ServerArgs fields
        attention_backend: str = "fa3"
        moe_runner_backend: str = "deep_gemm"
        kv_cache_dtype: str = "fp8_e4m3"
        mem_fraction_static: float = 0.95
        disable_cuda_graph: bool = False
        cuda_graph_max_bs: int = 256
        tp_size: int = 8
        quantization: str = "fp8"
        max_total_tokens: int = 65536
        max_prefill_tokens: int = 16384
        dsa_decode_backend: str = "flashmla_kv"
        api_key: str = "hunter2"
        hf_token: str = "hf_abc"

    t = dict(cr_sglang.server_args_toggles(FakeServerArgs(), environ={"SGLANG_ENABLE_JIT_DEEPGEMM": "1",
                                                                     "SGL_USE_DEEPGEMM_UE8M0": "0",
                                                                     "HF_TOKEN": "secret", "HOME": "/root"}))
    assert t["attention_backend"] == "fa3" and t["mem_fraction_static"] == 0.95 and t["tp_size"] == 8
    assert t["dsa_decode_backend"] == "flashmla_kv" and t["cuda_graph_max_bs"] == 256
    # the names hold "token" but are no secrets (an earlier filter dropped them)
    assert t["max_total_tokens"] == 65536 and t["max_prefill_tokens"] == 16384
    assert t["env.SGLANG_ENABLE_JIT_DEEPGEMM"] == "1" and t["env.SGL_USE_DEEPGEMM_UE8M0"] == "0"
    assert t["sglang.page_table_unit"] == "token"
    assert not {"api_key", "hf_token", "env.HF_TOKEN", "env.HOME"} & set(t)


def test_secrets_are_recognised_word_by_word():
    from crashreplay._adapter_common import is_secret

    secret = ["api_key", "admin_api_key", "hf_token", "HF_TOKEN", "ssl_keyfile_password", "env.VLLM_API_KEY",
              "model_config.hf_token", "aws_secret_access_key"]
    kept = ["max_total_tokens", "max_prefill_tokens", "tokenizer_path", "skip_tokenizer_init", "eos_token",
            "ssl_keyfile", "num_reserved_decode_tokens", "max_num_batched_tokens"]
    assert [n for n in secret if not is_secret(n)] == []
    assert [n for n in kept if is_secret(n)] == []


def test_sglang_records_the_decode_graph_size_the_engine_resolved():
    from dataclasses import dataclass, field

    @dataclass
    class Phase:  # sglang's CudaGraphConfig phase (model_executor/cuda_graph_config.py)
        backend: str = "full"
        max_bs: int = 32
        bs: list = field(default_factory=lambda: [1, 2, 4, 8, 16, 24, 32])

    @dataclass
    class GraphConfig:
        decode: Phase = field(default_factory=Phase)
        prefill: Phase = field(default_factory=lambda: Phase(backend="disabled", max_bs=4096))

    @dataclass
    class Args:
        cuda_graph_max_bs_decode: int = 256  # what was asked for
        cuda_graph_config: GraphConfig = field(default_factory=GraphConfig)  # what sglang resolved
        disable_cuda_graph: bool = False

    t = dict(cr_sglang.server_args_toggles(Args(), environ={}))
    assert t["cuda_graph_max_bs_decode"] == 256 and t["cuda_graph_config.decode.max_bs"] == 32
    assert t["cuda_graph_config.decode.backend"] == "full" and t["cuda_graph_config.prefill.backend"] == "disabled"
    assert t["cuda_graph_max_bs"] == 32  # the replay plans the graphs the engine captures
    off = Args(cuda_graph_config=GraphConfig(decode=Phase(backend="disabled")))
    assert dict(cr_sglang.server_args_toggles(off, environ={}))["cuda_graph_max_bs"] == 0
    assert dict(cr_sglang.server_args_toggles(Args(disable_cuda_graph=True), environ={}))["cuda_graph_max_bs"] == 0


def fake_scheduler(tp_size=2, **attrs):
    return SimpleNamespace(server_args=SimpleNamespace(tp_size=tp_size, pp_size=1, dp_size=1, ep_size=1), **attrs)


def test_sglang_ranks_come_from_the_scheduler_or_the_published_parallel_context(monkeypatch):
    monkeypatch.setattr(cr_sglang, "_parallel_context", lambda: None)
    r = cr_sglang.scheduler_ranks(fake_scheduler(tp_rank=1))  # older sglang: attributes
    assert (r["rank"], r["tp_rank"], r["tp_size"], r["world_size"]) == (1, 1, 2, 2)
    # sglang 0.5.2x: no attributes; the launcher published the ranks
    ctx = SimpleNamespace(tp_rank=1, tp_size=2, pp_rank=0, pp_size=1, dp_rank=None, dp_size=1, ep_size=1)
    monkeypatch.setattr(cr_sglang, "_parallel_context", lambda: ctx)
    r = cr_sglang.scheduler_ranks(fake_scheduler())
    assert (r["rank"], r["tp_rank"]) == (1, 1)
    ctx = SimpleNamespace(tp_rank=1, tp_size=2, pp_rank=1, pp_size=2, dp_rank=1, dp_size=2, ep_size=1)
    monkeypatch.setattr(cr_sglang, "_parallel_context", lambda: ctx)
    assert cr_sglang.scheduler_ranks(fake_scheduler())["rank"] == 1 + 2 * 1 + 4 * 1


def test_sglang_rank_that_cannot_be_found_is_refused_not_guessed(monkeypatch):
    monkeypatch.setattr(cr_sglang, "_parallel_context", lambda: None)
    with pytest.raises(UnsupportedVersion, match="tensor-parallel rank"):
        cr_sglang.scheduler_ranks(fake_scheduler(tp_size=2))
    assert cr_sglang.scheduler_ranks(fake_scheduler(tp_size=1))["rank"] == 0


def test_two_ranks_of_a_session_each_write_their_own_file(tmp_path, monkeypatch):
    session = tmp_path / "session"
    paths = []
    for rank in (0, 1):
        ctx = SimpleNamespace(tp_rank=rank, tp_size=2, pp_rank=0, pp_size=1, dp_rank=None, dp_size=1, ep_size=1)
        monkeypatch.setattr(cr_sglang, "_parallel_context", lambda ctx=ctx: ctx)
        rec = crashreplay.Recorder(str(session), engine="sglang", session_id="s1",
                                   parallel=cr_sglang.scheduler_ranks(fake_scheduler()), install_signal_handlers=False)
        rec.record_weight_hashes({"w": np.full(4, rank, np.float32)})
        rec.close()
        paths.append(rec.path)
    assert [p.rsplit("/", 1)[1] for p in paths] == ["rank-00000.crcap", "rank-00001.crcap"]
    files = crashreplay.read_capture(str(session))["files"]
    assert [f["manifest"]["parallel"]["rank"] for f in files] == [0, 1]


def test_recording_failures_are_warnings_and_never_raise(caplog):
    from crashreplay._adapter_common import guarded

    def attach_that_fails(*_):
        raise UnsupportedVersion("crashreplay.sglang: this layout is unknown")

    def recorder_that_fails(*_):
        raise OSError("No space left on device")

    with caplog.at_level("WARNING", logger="crashreplay"):
        assert guarded(attach_that_fails, "attaching")() is None
        assert guarded(recorder_that_fails, "recording a step")() is None
    assert "this layout is unknown" in caplog.text and "No space left on device" in caplog.text


def test_engine_plugins_never_raise_even_where_they_cannot_install(monkeypatch, caplog, tmp_path):
    # The plugin entry points run inside the engine's processes; sglang and
    # vLLM are not importable here, so install() fails: only a warning.
    import importlib.util

    if importlib.util.find_spec("sglang") or importlib.util.find_spec("vllm"):
        pytest.skip("an engine is importable here; test_adapters_*_real.py covers the plugins")
    monkeypatch.setenv("CRASHREPLAY_DIR", str(tmp_path))
    with caplog.at_level("WARNING", logger="crashreplay"):
        cr_sglang.plugin()
        cr_vllm.plugin()
    assert caplog.text.count("serving goes on") == 2


def test_version_gates_refuse_outside_the_checked_range(monkeypatch):
    monkeypatch.delenv("CRASHREPLAY_FORCE_VERSION", raising=False)
    cr_sglang.check_sglang_version("0.5.3rc2")
    with pytest.raises(UnsupportedVersion, match="sglang 0.4.6 is not supported"):
        cr_sglang.check_sglang_version("0.4.6")
    cr_vllm.check_vllm_version("0.11.0")
    with pytest.raises(UnsupportedVersion, match="vllm 0.6.3 is not supported"):
        cr_vllm.check_vllm_version("0.6.3")
    monkeypatch.setenv("CRASHREPLAY_FORCE_VERSION", "1")
    cr_sglang.check_sglang_version("0.4.6")  # a warning only


class FakeCpuGpuBuffer:  # vLLM's CpuGpuBuffer: .cpu/.np host side, .gpu device side
    def __init__(self, values):
        self.np = np.asarray(values)
        self.cpu = self.np
        self.gpu = self.np.copy()


def fake_vllm_runner():
    block_table = SimpleNamespace(block_size=2,
                                  block_table=FakeCpuGpuBuffer(np.array([[5, 6, 0], [7, 0, 0]], np.int32)),
                                  slot_mapping=FakeCpuGpuBuffer(np.array([11, 14, 15, 0], np.int64)))
    input_batch = SimpleNamespace(req_ids=["r0", "r1"], num_reqs=2,
                                  num_computed_tokens_cpu=np.array([3, 0], np.int32),
                                  block_table=SimpleNamespace(block_tables=[block_table]))
    sp = lambda **k: SimpleNamespace(**{"temperature": 1.0, "top_p": 1.0, "top_k": None, "min_p": 0.0,  # noqa: E731
                                        "seed": None, **k})
    return SimpleNamespace(input_batch=input_batch,
                           input_ids=FakeCpuGpuBuffer(np.array([9, 8, 7, 0], np.int32)),
                           positions=FakeCpuGpuBuffer(np.array([3, 0, 1, 0], np.int64)),
                           requests={"r0": SimpleNamespace(sampling_params=sp(temperature=0.5, seed=3)),
                                     "r1": SimpleNamespace(sampling_params=sp(top_k=40))})


def test_vllm_extract_step_from_runner_buffers():
    so = SimpleNamespace(total_num_scheduled_tokens=3, num_scheduled_tokens={"r0": 1, "r1": 2})
    f = cr_vllm.extract_step(fake_vllm_runner(), so)
    assert f["mode"] == "mixed" and f["request_ids"] == ["r0", "r1"]
    assert f["token_ids"].tolist() == [9, 8, 7] and f["positions"].tolist() == [3, 0, 1]
    assert f["seq_lens"].tolist() == [4, 2] and f["extend_lens"].tolist() == [1, 2]
    assert [r.tolist() for r in f["page_table"]] == [[5, 6], [7]]  # ceil(seq_len / block_size) blocks
    assert f["out_cache_loc"].tolist() == [11, 14, 15]
    assert f["sampling"][0]["seed"] == 3 and f["sampling"][1]["top_k"] == 40 and f["sampling"][0]["top_k"] == -1


def test_vllm_step_mode_rules():
    assert cr_vllm.step_mode(np.array([5, 3]), np.array([0, 0])) == "prefill"
    assert cr_vllm.step_mode(np.array([1, 1]), np.array([9, 4])) == "decode"
    assert cr_vllm.step_mode(np.array([4]), np.array([9])) == "extend"
    assert cr_vllm.step_mode(np.array([], dtype=np.int64), np.array([], dtype=np.int64)) == "idle"


def test_vllm_adapter_records_what_it_extracts(tmp_path):
    rec = crashreplay.Recorder(str(tmp_path / "v.crcap"), engine="vllm", install_signal_handlers=False)
    adapter = cr_vllm.VLLMAdapter(rec)
    so = SimpleNamespace(total_num_scheduled_tokens=3, num_scheduled_tokens={"r0": 1, "r1": 2})
    adapter.after_prepare(fake_vllm_runner(), so)
    rec.close()
    (s,) = crashreplay.read_capture(rec.path)["step_records"]
    assert s["page_table"] == [{"req_pool_index": 0, "token_slots": [5, 6]},
                               {"req_pool_index": 1, "token_slots": [7]}]
    assert s["request_ids"] == ["r0", "r1"] and s["out_cache_loc"] == [11, 14, 15]


def test_vllm_config_toggles_flatten_the_config_parts():
    cfg = SimpleNamespace(cache_config=SimpleNamespace(cache_dtype="fp8", gpu_memory_utilization=0.9, block_size=32),
                          parallel_config=SimpleNamespace(tensor_parallel_size=4),
                          attention_config=SimpleNamespace(backend="FLASHMLA_SPARSE"),
                          model_config=SimpleNamespace(hf_token="hf_x", max_model_len=4096))
    t = dict(cr_vllm.config_toggles(cfg, environ={"VLLM_ATTENTION_BACKEND": "FLASHINFER",
                                                  "VLLM_USE_DEEP_GEMM_E8M0": "1"}))
    assert t["cache_config.cache_dtype"] == "fp8" and t["parallel_config.tensor_parallel_size"] == 4
    assert t["attention_config.backend"] == "FLASHMLA_SPARSE" and t["model_config.max_model_len"] == 4096
    assert t["env.VLLM_ATTENTION_BACKEND"] == "FLASHINFER" and t["env.VLLM_USE_DEEP_GEMM_E8M0"] == "1"
    assert t["vllm.page_table_unit"] == "block" and t["vllm.block_size"] == 32
    assert "model_config.hf_token" not in t


def test_install_without_crashreplay_dir_does_nothing(monkeypatch):
    monkeypatch.delenv("CRASHREPLAY_DIR", raising=False)
    assert cr_sglang.install() is False and cr_vllm.install() is False


def test_env_toggles_pick_kernel_switches_only():
    t = env_toggles({"SGLANG_ENABLE_JIT_DEEPGEMM": "0", "CUDA_LAUNCH_BLOCKING": "1", "PATH": "/bin",
                     "VLLM_API_KEY": "x"})
    assert t == [("env.CUDA_LAUNCH_BLOCKING", "1"), ("env.SGLANG_ENABLE_JIT_DEEPGEMM", "0")]


def test_sglang_launcher_requires_a_session_directory():
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "CRASHREPLAY_DIR"}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    r = subprocess.run([sys.executable, "-m", "crashreplay.sglang", "--model-path", "x"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "set CRASHREPLAY_DIR" in r.stderr


def test_sglang_server_args_as_a_msgspec_struct():
    # sglang 0.5.2x declares ServerArgs as a msgspec.Struct: slots, no
    # __dict__ entries, not a dataclass; cuda_graph_max_bs is split in two.
    msgspec = pytest.importorskip("msgspec")

    class StructServerArgs(msgspec.Struct):
        attention_backend: str = "trtllm_mla"
        mem_fraction_static: float = 0.95
        cuda_graph_max_bs_decode: int = 160
        cuda_graph_max_bs_prefill: int = 8
        api_key: str = "hunter2"

    t = dict(cr_sglang.server_args_toggles(StructServerArgs(), environ={}))
    assert t["attention_backend"] == "trtllm_mla" and t["mem_fraction_static"] == 0.95
    assert t["cuda_graph_max_bs_decode"] == 160 and t["cuda_graph_max_bs"] == 160
    assert "api_key" not in t


def test_rng_state_is_zero_without_torch_and_the_generator_with_it():
    import sys

    from crashreplay._adapter_common import rng_state

    if "torch" not in sys.modules:
        assert rng_state(np.zeros(2)) == (0, 0)
    else:
        import torch

        torch.manual_seed(1234)
        assert rng_state(torch.zeros(2)) == (1234, 0)  # the CPU generator has no Philox offset
