"""sglang's own model runner, built and driven on the CPU.

The machinery behind crashreplay.engine_replay's sglang driver (and the
tests' recordings): what sglang's Scheduler does to bring up one rank,
without the server around it, then forward passes built from a step's
recorded inputs.

What is sglang's own: ServerArgs and its resolution, publish() of the
process's configuration (what run_scheduler_process does), the process
groups (bootstrap.init_parallel_runtime, gloo on the CPU), ModelConfig, the
GEMM/MoE configuration the Scheduler initialises, TpModelWorker (which
builds the ModelRunner and loads the checkpoint through sglang's loaders),
the memory pools (alloc_memory_pool: ReqToTokenPool, the KV pool in the
configured kv_cache_dtype, the allocator), the attention backend, the
eager runner (init_cuda_graphs with graphs disabled), ForwardBatch,
SamplingParams' normalisation, and TpModelWorker.forward_batch_generation:
ModelRunner.forward then ModelRunner.sample (sglang's Sampler, logits bias,
NaN handling). The model's layers are sglang's (RMSNorm, get_rope,
SiluAndMul, QKVParallelLinear, RadixAttention ...), each taking its
forward_native path on the CPU.

What is not: the Scheduler object (its __init__ builds the whole server:
ZMQ sockets, tokenizer, radix cache, watchdogs), so no ScheduleBatch and no
ForwardBatch.init_new (it needs Req objects). A ForwardBatch is built here
from a step's recorded fields with what init_new would add for a batch of
plain generation requests (extend_start_loc from sglang's compute_position,
the *_cpu mirrors, capture_hidden_mode NULL, the KV location plan bound by
the runner's kv_index_translator, the non-padded token count); its
SamplingBatchInfo holds what SamplingBatchInfo.from_schedule_batch
computes for requests without penalties, grammars, logit bias or custom
processors. crashreplay.sglang.attach() is handed an object with the
Scheduler's attributes it reads (server_args, model_config,
tp_worker.model_runner, max_running_requests, max_total_num_tokens,
max_prefill_tokens).

What runs on the CPU (checked with sglang 0.5.23 from PyPI, torch 2.15 CPU,
a bf16 llama): attention_backend torch_native and flex_attention (torch
inductor compiles its kernel: a C++ compiler at run time), sampling_backend
pytorch, kv_cache_dtype auto and fp8_e4m3, page_size 1 and 16, no CUDA
graphs, one process (every parallel width 1). sglang's CPU engine (SGLANG_USE_CPU_ENGINE=1) is not
used: it needs sgl-kernel's CPU build, which is not on PyPI. Without it,
sglang's RotaryEmbedding.__init__ imports `rotary_embedding` from
vllm._custom_ops as a fallback kernel its forward_native never calls; where
vLLM is not installed, _rotary_without_vllm() says so to sglang instead.

One runner a process: sglang's process groups and published configuration
are process-wide (init_parallel_runtime refuses a second call).

`python -m crashreplay._sglang_cpu_runner record ...` records a schedule of
requests (prefill, then decode steps) through the real runner with
crashreplay.sglang's recorder: a session to replay (see main()).
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import json
import os
import socket
import sys
import types
import typing
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from crashreplay.engine_replay import EXIT_NO_DEVICE, EXIT_USAGE, Refusal

# Attention backends whose kernels run on the CPU (the rest are CUDA, ROCm,
# NPU or XPU kernels; intel_amx is sgl-kernel's CPU build, not on PyPI).
CPU_ATTENTION_BACKENDS = ("torch_native", "flex_attention")
CPU_SAMPLING_BACKENDS = ("pytorch",)
# ServerArgs fields that say where the server ran, not what it computed:
# the replay's own values replace them.
_PLACEMENT = ("model_path", "tokenizer_path", "served_model_name", "dist_init_addr", "host", "port", "nnodes",
              "node_rank", "base_gpu_id", "gpu_id_step")
# Parallel widths: the replay is one process.
_WIDTHS = ("tp_size", "pp_size", "dp_size", "ep_size", "attn_cp_size", "attn_dp_size", "moe_dp_size", "dcp_size",
           "moe_dense_tp_size", "shared_experts_tp_size", "dwdp_size")
# Attention-backend fields (a setting of one of these names a kernel that must run here).
_ATTENTION_FIELDS = ("attention_backend", "prefill_attention_backend", "decode_attention_backend")


def _rotary_without_vllm() -> Optional[str]:
    """Lets sglang's RotaryEmbedding be built where vLLM is not installed.

    Without CUDA or sglang's CPU engine, RotaryEmbedding.__init__ stores
    `rotary_embedding` from vllm._custom_ops as a fallback kernel; on the CPU
    its forward_native runs and the fallback is never called. Where vLLM
    imports, nothing is changed. Where it does not, the rotary module's
    platform flag _is_cpu (what SGLANG_USE_CPU_ENGINE=1 would set: that
    module reads it only to decide whether to take the fallback) is set, so
    that no fallback is looked for. Returns a note when it did so."""
    try:
        importlib.import_module("vllm._custom_ops")
        return None
    except Exception as e:  # noqa: BLE001 - any import failure of vLLM
        reason = f"{type(e).__name__}: {e}"
    from sglang.srt.layers.rotary_embedding import base as rotary

    if not hasattr(rotary, "_is_cpu"):
        raise Refusal(EXIT_NO_DEVICE,
                      f"sglang on the CPU without its CPU engine imports vllm._custom_ops while building the model's "
                      f"rotary embedding, and it does not import here ({reason}); install vllm beside sglang")
    rotary._is_cpu = True
    return (f"vllm._custom_ops does not import here ({reason}): sglang's rotary embedding was told it runs on the "
            "CPU, so it keeps no vLLM fallback kernel (forward_native, which runs either way, is unchanged)")


# ---- configuration ----------------------------------------------------------
def _convert(value: Any, hint: Any) -> Any:
    """A recorded toggle value as the ServerArgs field's type (lists and
    dicts are recorded as their JSON text)."""
    import msgspec

    if value is None:
        return None
    try:
        return msgspec.convert(value, hint, strict=False)
    except Exception:
        if isinstance(value, str) and value[:1] in "[{":
            return msgspec.convert(json.loads(value), hint, strict=False)
        raise


def _field_types() -> Dict[str, Any]:
    from sglang.srt.server_args import ServerArgs

    return typing.get_type_hints(ServerArgs)


def recorded_server_args(toggles: Dict[str, Any]) -> Tuple[Dict[str, Any], List[str]]:
    """Every top-level ServerArgs field the manifest records, as its type;
    and the names whose recorded value does not convert (left to sglang's
    default)."""
    from sglang.srt.server_args import ServerArgs

    hints = _field_types()
    out: Dict[str, Any] = {}
    unreadable: List[str] = []
    for name in ServerArgs.__struct_fields__:
        if name.startswith("_") or name not in toggles:
            continue
        try:
            out[name] = _convert(toggles[name], hints[name])
        except Exception:  # noqa: BLE001 - msgspec's and json's errors alike
            unreadable.append(name)
    return out, unreadable


def wants_gpu(settings: Dict[str, str]) -> bool:
    """--setting device=cuda: sglang on this machine's GPU, with the
    recorded (or set) kernel backends, instead of the CPU's reference ones."""
    return str(settings.get("device", "cpu")).strip().lower() == "cuda"


def check_settings(settings: Dict[str, str]) -> Dict[str, Any]:
    """--setting name=value pairs as ServerArgs values; refuses what cannot
    run here (on the CPU: a GPU attention or sampling kernel; a device
    without one; a width > 1) or is no ServerArgs field."""
    from sglang.srt.server_args import ServerArgs

    hints = _field_types()
    gpu = wants_gpu(settings)
    if gpu:
        import torch

        if not torch.cuda.is_available():
            raise Refusal(EXIT_NO_DEVICE, "--setting device=cuda: torch sees no CUDA device here; replay on the CPU "
                                          "(the default) or on a machine with a GPU")
    out: Dict[str, Any] = {}
    for name, raw in settings.items():
        if name not in ServerArgs.__struct_fields__ or name.startswith("_"):
            near = difflib.get_close_matches(name, [f for f in ServerArgs.__struct_fields__ if not f.startswith("_")],
                                             n=3)
            hint = f"; did you mean {' or '.join(near)}?" if near else ""
            raise Refusal(EXIT_USAGE, f"--setting {name}: sglang's ServerArgs has no field '{name}'{hint} (the driver "
                                      "takes ServerArgs fields under their own names: attention_backend, "
                                      "kv_cache_dtype, page_size, dtype, ...)")
        try:
            value = _convert(raw, hints[name])
        except Exception as e:  # noqa: BLE001
            raise Refusal(EXIT_USAGE, f"--setting {name}={raw}: not a value of ServerArgs.{name} "
                                      f"({hints[name]}): {e}") from e
        if gpu and name != "device" and name not in _WIDTHS:
            out[name] = value  # sglang's own checks decide what this GPU runs
            continue
        if name in _ATTENTION_FIELDS and value is not None and value not in CPU_ATTENTION_BACKENDS:
            raise Refusal(EXIT_NO_DEVICE, f"--setting {name}={value}: the {value} attention backend needs a GPU "
                                          f"(its kernels are CUDA/ROCm/NPU/XPU or sgl-kernel's CPU build); the sglang "
                                          f"driver replays on the CPU with {' or '.join(CPU_ATTENTION_BACKENDS)}")
        if name == "sampling_backend" and value not in CPU_SAMPLING_BACKENDS:
            raise Refusal(EXIT_NO_DEVICE, f"--setting sampling_backend={value}: the {value} sampler needs a GPU; the "
                                          "sglang driver samples on the CPU with sglang's pytorch sampler")
        if name == "device" and value not in ("cpu", "cuda"):
            raise Refusal(EXIT_NO_DEVICE, f"--setting device={value}: the sglang driver runs sglang on the CPU or, "
                                          "with device=cuda, on a CUDA GPU")
        if name == "disable_cuda_graph" and value is False:
            raise Refusal(EXIT_NO_DEVICE, "--setting disable_cuda_graph=false: CUDA graphs need a GPU; the sglang "
                                          "driver runs sglang eagerly on the CPU")
        if name == "tp_size" and isinstance(value, int) and value > 1:
            pass  # N ranks, one process each (the driver starts them)
        elif name in _WIDTHS and value not in (None, 1):
            raise Refusal(EXIT_USAGE, f"--setting {name}={value}: the sglang driver runs tensor-parallel ranks "
                                      "(tp_size) only; other widths replay at 1")
        out[name] = value
    return out


def server_args_kwargs(model_dir: str, recorded: Dict[str, Any], settings: Dict[str, Any], *,
                       max_total_tokens: int, max_running_requests: int) -> Tuple[Dict[str, Any], List[str]]:
    """ServerArgs keyword arguments: the recorded fields, then the settings,
    then what the CPU forces (on a GPU, settings.device == "cuda": nothing
    beyond the placement and the pool sizes; the recorded kernel backends
    and CUDA-graph choice stay). Returns them with notes on what changed."""
    from sglang.srt.server_args import ServerArgs

    notes: List[str] = []
    kw = {k: v for k, v in recorded.items() if k not in _PLACEMENT}
    wide = {k: kw[k] for k in _WIDTHS if isinstance(kw.get(k), int) and kw[k] > 1 and k not in settings}
    if wide:
        notes.append(f"recorded with {', '.join(f'{k}={v}' for k, v in wide.items())}; replayed in one process "
                     "(width 1): the same model, its reductions in another order (--setting tp_size=N runs N "
                     "ranks)")
    for k in _WIDTHS:
        kw.pop(k, None)
    kw.pop("enable_dp_attention", None)
    if settings.get("device") == "cuda":
        kw.update(settings)
        kw.update(model_path=model_dir, tokenizer_path=model_dir, device="cuda", skip_tokenizer_init=True,
                  max_total_tokens=max_total_tokens, max_running_requests=max_running_requests)
        return kw, notes
    # A kernel backend recorded on a GPU (moe_runner_backend=deep_gemm,
    # fp8_gemm_runner_backend, ...) has no CPU implementation: sglang picks
    # its own for this device unless a setting names one.
    dropped = sorted(k for k in kw if k.endswith("_backend") and k not in settings)
    for k in dropped:
        kw.pop(k)
    kw.update(settings)
    recorded_attention = recorded.get("attention_backend")
    attention = settings.get("attention_backend") or (
        recorded_attention if recorded_attention in CPU_ATTENTION_BACKENDS else CPU_ATTENTION_BACKENDS[0])
    if recorded_attention and recorded_attention != attention and "attention_backend" not in settings:
        notes.append(f"recorded attention_backend={recorded_attention}: replayed with {attention}, sglang's reference "
                     "attention on the CPU (the recorded kernel needs a GPU)")
    kw.update(model_path=model_dir, tokenizer_path=model_dir, device="cpu", attention_backend=attention,
              prefill_attention_backend=settings.get("prefill_attention_backend"),
              decode_attention_backend=settings.get("decode_attention_backend"),
              sampling_backend=CPU_SAMPLING_BACKENDS[0], disable_cuda_graph=True, enable_torch_compile=False,
              # No tokenizer: the steps are token ids (and a checkpoint may come without one).
              skip_tokenizer_init=True,
              # Sized to the recorded slots and rows, which the replay writes where sglang wrote them.
              max_total_tokens=max_total_tokens, max_running_requests=max_running_requests)
    unknown = sorted(set(kw) - set(ServerArgs.__struct_fields__))
    if unknown:  # a bug here, not the user's
        raise AssertionError(f"not ServerArgs fields: {unknown}")
    return kw, notes


def recorded_env(toggles: Dict[str, Any]) -> Dict[str, str]:
    """The recorded env.NAME toggles of sglang's envs registry whose value
    differs from what this process reads: to set before sglang reads them."""
    try:
        from sglang.srt.environ import EnvField, Envs, envs  # type: ignore
    except Exception:  # noqa: BLE001 - another layout: nothing to apply
        return {}
    from crashreplay._manifest import _toggle_value

    out: Dict[str, str] = {}
    for name, field in vars(Envs).items():
        key = f"env.{name}"
        if not isinstance(field, EnvField) or key not in toggles or name in os.environ:
            continue  # the user's environment wins over the recording's
        want = toggles[key]
        try:
            have = _toggle_value(getattr(envs, name).get())
            # A variable set in the recording's environment is recorded as its
            # text ("0"); sglang's own parser says what it meant.
            meant = _toggle_value(field.parse(want)) if isinstance(want, str) else want
        except Exception:  # noqa: BLE001 - a default that cannot be computed here, text sglang would not parse
            continue
        if want is not None and meant != have:
            out[name] = ("true" if want else "false") if isinstance(want, bool) else str(want)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _groups_over_gloo() -> None:
    """sglang's model-parallel groups without PyNccl or the custom
    all-reduce (both need CUDA): its collectives then go through
    torch.distributed on the groups' gloo backend."""
    import sglang.srt.distributed.parallel_state as ps

    if getattr(ps.init_model_parallel_group, "_crashreplay_gloo", False):
        return
    orig = ps.init_model_parallel_group

    def cpu_group(*args: Any, **kwargs: Any) -> Any:
        kwargs["use_pynccl"] = False
        kwargs["use_custom_allreduce"] = False
        return orig(*args, **kwargs)

    cpu_group._crashreplay_gloo = True  # type: ignore[attr-defined]
    ps.init_model_parallel_group = cpu_group


# ---- the runner -------------------------------------------------------------
class CpuModelRunner:
    """One sglang rank on the CPU: TpModelWorker, its ModelRunner, pools,
    attention backend and sampler, built as the Scheduler builds them."""

    def __init__(self, server_args: Any, rank: int = 0, port: Optional[int] = None) -> None:
        """rank, port: this process's tensor-parallel rank of
        server_args.tp_size, and the port its process groups meet on (every
        rank the same; any free one for a single rank). The groups run over
        gloo: PyNccl and the custom all-reduce need CUDA."""
        import torch
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.distributed import bootstrap
        from sglang.srt.managers.tp_worker import TpModelWorker
        from sglang.srt.runtime_context import SpawnRanks, publish

        self.notes: List[str] = []
        self.device = "cuda" if str(server_args.device) == "cuda" else "cpu"
        note = _rotary_without_vllm() if self.device == "cpu" else None
        if note:
            self.notes.append(note)
        self.torch = torch
        self.server_args = server_args
        self.rank = rank
        width = int(server_args.tp_size or 1)
        if width > 1 and self.device == "cpu":
            _groups_over_gloo()
            # sglang binds each CPU rank to a NUMA node unless told which
            # cores: one machine's cores, shared round-robin, here.
            cores = os.cpu_count() or 1
            os.environ.setdefault("SGLANG_CPU_OMP_THREADS_BIND", "|".join(str(r % cores) for r in range(width)))
        # What run_scheduler_process and Scheduler.__init__ do before the worker.
        publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=rank, gpu_id=rank))
        port = _free_port() if port is None else port
        bootstrap.init_parallel_runtime(server_args=server_args, device=self.device, dist_port=port)
        model_config = ModelConfig.from_server_args(server_args)
        bootstrap.init_layer_runtime(model_config=model_config)
        self._init_gemm_config(model_config)
        self.worker = TpModelWorker(server_args=server_args, gpu_id=rank, nccl_port=port)
        self.runner = self.worker.model_runner
        self.model_config = self.worker.model_config
        # Scheduler.init_memory_pools, init_all_attention_backends, init_all_cuda_graphs.
        self.runner.account_preloaded_weights(self.worker.preloaded_weights_bytes)
        self.worker.alloc_memory_pool()
        self.worker.init_attention_backends()
        with torch.no_grad():
            self.worker.init_cuda_graphs()
        self.req_to_token = self.runner.req_to_token_pool.req_to_token
        self.adapter: Any = None

    @staticmethod
    def _init_gemm_config(model_config: Any) -> None:
        """Scheduler.init_moe_gemm_config: the MoE and FP8/FP4/BF16 GEMM
        configuration sglang's layers read."""
        from sglang.srt.layers.moe import initialize_moe_config
        from sglang.srt.layers.quantization.fp4_utils import initialize_fp4_gemm_config
        from sglang.srt.layers.quantization.fp8_utils import initialize_fp8_gemm_config
        from sglang.srt.layers.quantization.unquant import initialize_bf16_gemm_config

        cfg = model_config.hf_text_config
        if any(hasattr(cfg, a) for a in ("num_experts_per_tok", "num_experts_per_token", "top_k_experts",
                                         "moe_top_k", "moe_topk")):
            initialize_moe_config()
        initialize_fp8_gemm_config()
        initialize_fp4_gemm_config()
        initialize_bf16_gemm_config()

    # -- recording ------------------------------------------------------
    def attach(self, session: str, fingerprints: bool = True, coredumps: bool = False) -> Any:
        """crashreplay.sglang.attach() on this rank: the recorder, weight
        hashes and fingerprint hooks exactly as on a server's scheduler."""
        from crashreplay import sglang as cr_sglang

        runner = self.runner
        scheduler = types.SimpleNamespace(  # the Scheduler attributes attach() reads
            server_args=self.server_args, model_config=self.model_config,
            tp_worker=types.SimpleNamespace(model_runner=runner),
            max_running_requests=runner.max_running_requests, max_total_num_tokens=runner.max_total_num_tokens,
            max_prefill_tokens=self.server_args.max_prefill_tokens)
        self.adapter = cr_sglang.attach(scheduler, session, fingerprints=fingerprints, install_signal_handlers=False,
                                        coredumps=coredumps)
        return self.adapter

    # -- one step -------------------------------------------------------
    def write_rows(self, rows: Iterable[Tuple[int, Sequence[int]]]) -> None:
        """Request rows of token slots into sglang's ReqToTokenPool, where
        the scheduler had written them before the forward."""
        torch = self.torch
        for index, slots in rows:
            if len(slots):
                self.req_to_token[int(index), :len(slots)] = torch.tensor(list(slots), dtype=self.req_to_token.dtype)

    def sampling_info(self, params: Sequence[Dict[str, Any]]) -> Any:
        """SamplingBatchInfo as from_schedule_batch makes it for requests with
        these sampling parameters (normalised by sglang's SamplingParams:
        temperature 0 is top_k 1) and no penalties, grammar or logit bias."""
        torch = self.torch
        from sglang.srt.runtime_context import get_exec
        from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
        from sglang.srt.sampling.sampling_params import TOP_K_ALL, SamplingParams

        dev = self.runner.device
        sps = []
        for p in params:
            sp = SamplingParams(temperature=float(p.get("temperature", 1.0)), top_p=float(p.get("top_p", 1.0)),
                                top_k=int(p.get("top_k", -1)), min_p=float(p.get("min_p", 0.0)),
                                sampling_seed=None if p.get("seed") is None else int(p["seed"]))
            sp.verify(self.model_config.vocab_size)
            sps.append(sp)
        seeded = get_exec().deterministic.enable_deterministic_inference
        return SamplingBatchInfo(
            temperatures=torch.tensor([sp.temperature for sp in sps], dtype=torch.float, device=dev).view(-1, 1),
            top_ps=torch.tensor([sp.top_p for sp in sps], dtype=torch.float, device=dev),
            top_ks=torch.tensor([sp.top_k for sp in sps], dtype=torch.int32, device=dev),
            min_ps=torch.tensor([sp.min_p for sp in sps], dtype=torch.float, device=dev),
            sampling_seed=(torch.tensor([42 if sp.sampling_seed is None else sp.sampling_seed for sp in sps],
                                        dtype=torch.int64, device=dev) if seeded else None),
            is_all_greedy=all(sp.top_k <= 1 for sp in sps), is_any_greedy=any(sp.top_k <= 1 for sp in sps),
            need_top_p_sampling=any(sp.top_p != 1.0 for sp in sps),
            need_top_k_sampling=any(sp.top_k != TOP_K_ALL for sp in sps),
            need_min_p_sampling=any(sp.min_p > 0 for sp in sps),
            max_top_k=(max(sp.top_k for sp in sps) if sps and all(1 <= sp.top_k < TOP_K_ALL for sp in sps)
                       else None),
            vocab_size=self.model_config.vocab_size, device=str(self.runner.device),
            return_sampling_masks=[False] * len(sps), return_sampling_support_logprobs=[False] * len(sps),
            sampling_mask_top_ks=[1] * len(sps))

    def forward_batch(self, *, mode: str, token_ids: Sequence[int], positions: Sequence[int],
                      seq_lens: Sequence[int], extend_lens: Sequence[int], req_pool_indices: Sequence[int],
                      out_cache_loc: Sequence[int], sampling: Sequence[Dict[str, Any]],
                      rids: Optional[Sequence[str]] = None) -> Any:
        """A ForwardBatch of one step (mode extend, decode or mixed), with
        what ForwardBatch.init_new derives for plain generation requests."""
        torch = self.torch
        from sglang.srt.model_executor.forward_batch_info import (
            CaptureHiddenMode,
            ForwardBatch,
            ForwardMode,
            compute_position,
        )
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        forward_mode = {"extend": ForwardMode.EXTEND, "prefill": ForwardMode.EXTEND, "decode": ForwardMode.DECODE,
                        "mixed": ForwardMode.MIXED}.get(mode)
        if forward_mode is None:
            raise ValueError(f"no sglang forward mode replays a '{mode}' step")
        n = len(seq_lens)

        dev = self.runner.device  # the tensors init_new would put on the model's device

        def i64(x: Sequence[int]) -> Any:
            return torch.tensor([int(v) for v in x], dtype=torch.int64, device=dev)

        seq_cpu = torch.tensor([int(v) for v in seq_lens], dtype=torch.int64)
        seq = seq_cpu.to(dev)
        kw: Dict[str, Any] = dict(
            forward_mode=forward_mode, batch_size=n, input_ids=i64(token_ids), req_pool_indices=i64(req_pool_indices),
            seq_lens=seq, out_cache_loc=i64(out_cache_loc), seq_lens_sum=int(seq_cpu.sum()), seq_lens_cpu=seq_cpu,
            positions=i64(positions), sampling_info=self.sampling_info(sampling),
            rids=list(rids) if rids else None, return_logprob=False,
            spec_algorithm=SpeculativeAlgorithm.NONE,
            # init_new's choice for a target worker with no hidden states requested.
            capture_hidden_mode=CaptureHiddenMode.NULL)
        if forward_mode.is_extend():
            ext = [int(v) for v in extend_lens]
            prefix = [int(s) - e for s, e in zip(seq_lens, ext)]
            ext_t = torch.tensor(ext, dtype=torch.int32, device=dev)
            prefix_t = torch.tensor(prefix, dtype=torch.int32, device=dev)
            _, start_loc = compute_position(self.runner.prefill_attention_backend_str, prefix_t, ext_t, sum(ext))
            kw.update(extend_num_tokens=sum(ext), extend_seq_lens=ext_t, extend_prefix_lens=prefix_t,
                      extend_seq_lens_cpu=ext, extend_prefix_lens_cpu=prefix, extend_start_loc=start_loc,
                      extend_logprob_start_lens_cpu=list(ext), req_pool_indices_cpu=kw["req_pool_indices"].cpu(),
                      is_extend_in_batch=True)
        fb = ForwardBatch(**kw)
        # What init_new does after building the batch.
        self.runner.kv_index_translator.bind_own_plan(fb)
        fb._init_num_token_non_padded(device=self.runner.device, is_draft_worker=False)
        return fb

    def generate(self, forward_batch: Any) -> List[int]:
        """sglang's TpModelWorker.forward_batch_generation: ModelRunner.forward,
        then ModelRunner.sample; the sampled token of each request."""
        with self.torch.no_grad():
            result = self.worker.forward_batch_generation(None, forward_batch=forward_batch)
            if getattr(result, "delay_sample_func", None) is not None:  # the overlap path's deferred sampling
                result = result.delay_sample_func()
        return [int(t) for t in result.next_token_ids.tolist()]


def build(model_dir: str, server_args: Dict[str, Any], rank: int = 0, port: Optional[int] = None) -> CpuModelRunner:
    """A CpuModelRunner for ServerArgs(**server_args), sglang's refusals
    of the configuration as Refusal (exit 2) naming it."""
    from sglang.srt.server_args import ServerArgs

    try:
        sa = ServerArgs(**server_args)
    except Exception as e:  # noqa: BLE001 - ServerArgs validation: the message names the field
        raise Refusal(EXIT_USAGE, f"sglang refused the configuration (ServerArgs): {type(e).__name__}: {e}") from e
    try:
        return CpuModelRunner(sa, rank, port)
    except Refusal:
        raise
    except Exception as e:  # noqa: BLE001 - a kernel or layer this configuration needs and the CPU lacks
        shown = {k: server_args[k] for k in ("attention_backend", "kv_cache_dtype", "dtype", "quantization",
                                             "page_size") if k in server_args}
        raise Refusal(EXIT_USAGE, f"sglang could not build {model_dir} on the CPU under {shown}: "
                                  f"{type(e).__name__}: {e}") from e


# ---- recording a schedule ----------------------------------------------------
def record_schedule(model_dir: str, session: str, requests: List[Dict[str, Any]], decode_steps: int,
                    server_args: Optional[Dict[str, Any]] = None, fingerprints: bool = True, rank: int = 0,
                    port: Optional[int] = None, coredumps: bool = False) -> Dict[str, Any]:
    """Serves requests [{"rid", "prompt": [ids], "temperature"?, "top_p"?,
    "top_k"?, "min_p"?, "seed"?}] through the real runner - one EXTEND step
    of every prompt, then decode_steps DECODE steps, each request fed the
    token sglang sampled for it - recorded by crashreplay.sglang into
    session. KV slots and request rows come from sglang's own allocator and
    ReqToTokenPool. Returns {"path", "tokens" (per request), "rows" (each request's row of
    KV slots as sglang's ReqToTokenPool holds it at the end), "rank", "boundaries",
    "failure" (None, or the exception's text: recorded in the session)}."""
    import torch

    kw = dict(server_args or {})
    # A small pool unless asked: sglang sizes it from free memory otherwise
    # (on the CPU: tens of millions of tokens, gigabytes zeroed at start).
    kw.setdefault("max_total_tokens", 4096)
    kw.setdefault("max_running_requests", 16)
    kw.update(model_path=model_dir, device="cpu", attention_backend=kw.get("attention_backend", "torch_native"),
              sampling_backend="pytorch", disable_cuda_graph=True, skip_tokenizer_init=True)
    cpu = build(model_dir, kw, rank, port)
    adapter = cpu.attach(session, fingerprints, coredumps)
    pool, alloc = cpu.runner.req_to_token_pool, cpu.runner.token_to_kv_pool_allocator
    page = int(cpu.server_args.page_size or 1)
    n = len(requests)
    rows = pool.alloc_rows(n)
    rids = [str(r["rid"]) for r in requests]
    sampling = [{k: r[k] for k in ("temperature", "top_p", "top_k", "min_p", "seed") if k in r} for r in requests]
    ctx = [list(r["prompt"]) for r in requests]  # each request's tokens so far
    generated: List[List[int]] = [[] for _ in requests]
    table: List[List[int]] = []
    failure = None
    try:
        lens = [len(c) for c in ctx]
        if page == 1:
            slots = alloc.alloc(sum(lens))
        else:
            lt = torch.tensor(lens, dtype=torch.int64)
            zeros = torch.zeros(n, dtype=torch.int64)
            slots = alloc.alloc_extend(zeros, zeros, lt, lt, torch.full((n,), -1, dtype=torch.int64), sum(lens))
        slots = [int(s) for s in slots.tolist()]
        at = 0
        for c in ctx:
            table.append(slots[at:at + len(c)])
            at += len(c)
        cpu.write_rows(zip(rows, table))
        fb = cpu.forward_batch(mode="extend", token_ids=[t for c in ctx for t in c],
                               positions=[p for c in ctx for p in range(len(c))], seq_lens=lens, extend_lens=lens,
                               req_pool_indices=rows, out_cache_loc=slots, sampling=sampling, rids=rids)
        with adapter.recorder.failure_hook(stage="extend"):
            nxt = cpu.generate(fb)
        for step in range(decode_steps):
            for i, t in enumerate(nxt):
                generated[i].append(t)
                ctx[i].append(t)
            lens = [len(c) for c in ctx]
            last = torch.tensor([table[i][-1] for i in range(n)], dtype=torch.int64)
            if page == 1:
                new = alloc.alloc(n)
            else:
                lt = torch.tensor(lens, dtype=torch.int64)
                new = alloc.alloc_decode(lt, lt.clone(), last)
            for i, s in enumerate(new.tolist()):
                table[i].append(int(s))
            cpu.write_rows(zip(rows, table))
            fb = cpu.forward_batch(mode="decode", token_ids=nxt, positions=[ln - 1 for ln in lens], seq_lens=lens,
                                   extend_lens=[1] * n, req_pool_indices=rows, out_cache_loc=[t[-1] for t in table],
                                   sampling=sampling, rids=rids)
            with adapter.recorder.failure_hook(stage="decode"):
                nxt = cpu.generate(fb)
        for i, t in enumerate(nxt):
            generated[i].append(t)
    except Exception as e:  # noqa: BLE001 - recorded by the failure hooks; reported to the caller
        failure = f"{type(e).__name__}: {e}"
    finally:
        adapter.recorder.close()
    held = [cpu.req_to_token[int(r), :len(t)].tolist() for r, t in zip(rows, table)] if table else []
    return {"path": adapter.recorder.path, "tokens": generated, "failure": failure, "rank": rank, "rows": held,
            "boundaries": adapter.hooks.names if adapter.hooks is not None else []}


def main(argv: Optional[List[str]] = None) -> int:
    """python -m crashreplay._sglang_cpu_runner record --model DIR --session DIR
    --requests JSON --decode-steps N [--server-arg name=value ...] [--setup MODULE ...]
    [--rank R --port P]

    With --server-arg tp_size=N, run it once per rank (--rank 0..N-1, one
    --port for all): every rank serves the same schedule, as sglang's tensor-
    parallel ranks do, and records its own file of the session.
    Prints record_schedule's report as one JSON line; exit 1 when the
    schedule failed (the failure is in the session)."""
    p = argparse.ArgumentParser(prog="python -m crashreplay._sglang_cpu_runner")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("record", help="record a schedule of requests through sglang's ModelRunner on the CPU")
    r.add_argument("--model", required=True)
    r.add_argument("--session", required=True)
    r.add_argument("--requests", required=True, help='JSON: [{"rid", "prompt": [ids], "temperature", ...}]')
    r.add_argument("--decode-steps", type=int, default=3)
    r.add_argument("--server-arg", action="append", default=[], help="a ServerArgs field, name=value")
    r.add_argument("--setup", action="append", default=[], help="a module to import first (patches, defects)")
    r.add_argument("--no-fingerprints", action="store_true")
    r.add_argument("--rank", type=int, default=0, help="this process's tensor-parallel rank (with tp_size > 1)")
    r.add_argument("--port", type=int, default=None, help="the port the ranks' process groups meet on")
    a = p.parse_args(argv)
    for m in a.setup:
        importlib.import_module(m)
    try:
        sa = {}
        for item in a.server_arg:
            k, _, v = item.partition("=")
            sa[k] = v
        tp = sa.pop("tp_size", None)  # a width the replay refuses, the recording runs as ranks
        sa = check_settings(sa) if sa else {}
        if tp is not None:
            sa["tp_size"] = int(tp)
        report = record_schedule(a.model, a.session, json.loads(a.requests), a.decode_steps, sa,
                                 fingerprints=not a.no_fingerprints, rank=a.rank, port=a.port)
    except Refusal as e:
        print(f"crashreplay._sglang_cpu_runner: {e}", file=sys.stderr)
        return e.code
    print(json.dumps(report))
    return 1 if report["failure"] else 0


if __name__ == "__main__":
    sys.exit(main())
