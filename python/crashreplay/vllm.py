"""crashreplay.vllm: record vLLM (v1 engine) forward passes.

Hook: GPUModelRunner._prepare_inputs (after it returns, the step's inputs are
in the runner's buffers and the model forward has not been launched yet) and
GPUModelRunner.execute_model / sample_tokens (failure hook). Weight hashes:
after GPUModelRunner.load_model.

  step log field      vLLM source (GPUModelRunner after _prepare_inputs)
  ------------------  ---------------------------------------------------------
  mode                derived: all requests 1 token with computed context ->
                      decode; all without computed tokens -> prefill; else
                      extend (vLLM has no forward-mode field)
  request_ids         input_batch.req_ids[:num_reqs]
  token_ids           input_ids (.gpu of the CpuGpuBuffer, or the tensor on
                      older versions)[:total_num_scheduled_tokens]; with async
                      scheduling these are the resolved ids (the previous
                      step's sampled tokens are scattered in _prepare_inputs)
  positions           positions[:total_num_scheduled_tokens]
  seq_lens            input_batch.num_computed_tokens_cpu + scheduled tokens
  extend_lens         scheduler_output.num_scheduled_tokens[req_id]
  req_pool_indices    the persistent-batch row of each request (0..num_reqs-1)
  page_table          input_batch.block_table.block_tables[0].block_table rows
                      cut to ceil(seq_len / block_size) entries: BLOCK ids
                      (toggle vllm.page_table_unit = "block")
  out_cache_loc       block_tables[0].slot_mapping[:total tokens] (token slots)
  sampling            requests[req_id].sampling_params: temperature, top_p,
                      top_k, min_p, seed
Manifest toggles: vllm_config's model/cache/parallel/scheduler/compilation
configs flattened ("cache_config.cache_dtype", ...), plus env.NAME switches.

Enabling: crashreplay registers `crashreplay` in the "vllm.general_plugins"
entry-point group, which vLLM loads in every process it starts; set
CRASHREPLAY_DIR=/path/to/session. Versions: SUPPORTED below, checked against
vLLM's v1 gpu_model_runner source (0.10-era layout and main as of late
2026). This module cannot be exercised here (vLLM needs a GPU); its
extraction is tested with stand-ins shaped like GPUModelRunner.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from crashreplay._adapter_common import (
    UnsupportedVersion,
    check_version,
    drop_secrets,
    env_toggles,
    guarded,
    logger,
    named_parameters,
    require_fields,
    wrap_method,
)
from crashreplay._manifest import config_to_toggles

SUPPORTED = ((0, 10, 0), (1, 0, 0))
CHECKED = "vLLM v1 gpu_model_runner, 0.10-era layout and main, late 2026"


def check_vllm_version(version: str) -> None:
    check_version("vllm", version, SUPPORTED[0], SUPPORTED[1], CHECKED)


def _device_part(buf: Any, n: int) -> Any:
    """First n entries of a CpuGpuBuffer (its device tensor) or a tensor/array."""
    if hasattr(buf, "gpu"):
        return buf.gpu[:n]
    return buf[:n]


def _host_part(buf: Any, n: int) -> Any:
    for attr in ("np", "cpu"):
        if hasattr(buf, attr):
            return getattr(buf, attr)[:n]
    return buf[:n]


def step_mode(num_scheduled: np.ndarray, num_computed: np.ndarray) -> str:
    if num_scheduled.size == 0:
        return "idle"
    if np.all(num_computed == 0):
        return "prefill"
    if np.all(num_scheduled == 1):
        return "decode"
    return "mixed" if np.any(num_scheduled == 1) else "extend"


def extract_step(runner: Any, scheduler_output: Any) -> Dict[str, Any]:
    """record_step keyword arguments for the step _prepare_inputs just built."""
    require_fields(runner, ("input_batch", "input_ids", "positions"), "GPUModelRunner", "vllm")
    ib = runner.input_batch
    require_fields(ib, ("req_ids", "num_computed_tokens_cpu", "block_table"), "InputBatch", "vllm")
    n_tok = int(scheduler_output.total_num_scheduled_tokens)
    num_reqs = int(getattr(ib, "num_reqs", len(ib.req_ids)))
    req_ids = [str(r) for r in list(ib.req_ids)[:num_reqs]]
    scheduled = np.array([int(scheduler_output.num_scheduled_tokens[r]) for r in req_ids], dtype=np.int64)
    computed = np.asarray(ib.num_computed_tokens_cpu[:num_reqs], dtype=np.int64)
    seq_lens = computed + scheduled
    fields: Dict[str, Any] = dict(
        mode=step_mode(scheduled, computed), request_ids=req_ids,
        token_ids=_device_part(runner.input_ids, n_tok), positions=_device_part(runner.positions, n_tok),
        seq_lens=seq_lens, extend_lens=scheduled, req_pool_indices=np.arange(num_reqs, dtype=np.int64))
    bt = ib.block_table
    table = bt.block_tables[0] if hasattr(bt, "block_tables") else bt
    block_size = int(getattr(table, "block_size", 0) or 0)
    if block_size > 0:
        rows = np.asarray(_host_part(getattr(table, "block_table_np", None)
                                     if getattr(table, "block_table_np", None) is not None
                                     else table.block_table, num_reqs))
        blocks = (seq_lens + block_size - 1) // block_size
        fields["page_table"] = [rows[i, :blocks[i]] for i in range(num_reqs)]
    slot = getattr(table, "slot_mapping", None)
    if slot is not None:
        fields["out_cache_loc"] = _device_part(slot, n_tok)
    requests = getattr(runner, "requests", {}) or {}
    params = [getattr(requests.get(r), "sampling_params", None) for r in req_ids]
    if all(p is not None for p in params) and params:
        fields["sampling"] = [dict(temperature=float(p.temperature), top_p=float(p.top_p),
                                   top_k=int(p.top_k) if p.top_k is not None else -1,
                                   min_p=float(getattr(p, "min_p", 0.0) or 0.0),
                                   seed=getattr(p, "seed", None)) for p in params]
    return fields


def config_toggles(vllm_config: Any, environ: Optional[Dict[str, str]] = None) -> List[Tuple[str, Any]]:
    toggles: List[Tuple[str, Any]] = [("vllm.page_table_unit", "block")]
    for part in ("model_config", "cache_config", "parallel_config", "scheduler_config",
                 "compilation_config", "speculative_config", "kv_transfer_config"):
        cfg = getattr(vllm_config, part, None)
        if cfg is None:
            continue
        try:
            toggles += [(f"{part}.{k}", v) for k, v in config_to_toggles(cfg)]
        except TypeError:
            toggles.append((part, str(cfg)))
    return sorted(drop_secrets(toggles) + env_toggles(environ))


class VLLMAdapter:
    def __init__(self, recorder: Any, snapshot: bool = True):
        self.recorder = recorder
        self.snapshot = snapshot
        self.step = 0
        self.mode = ""

    def after_prepare(self, runner: Any, scheduler_output: Any) -> None:
        step = self.step
        self.step += 1
        fields = extract_step(runner, scheduler_output)
        self.mode = fields["mode"]
        if self.snapshot:
            self.recorder.snapshot(step, {k: fields[k] for k in ("token_ids", "positions", "out_cache_loc")
                                          if fields.get(k) is not None})
        self.recorder.record_step(step, **fields)


def _vllm_version() -> str:
    import vllm  # type: ignore

    return str(getattr(vllm, "__version__", "0"))


def _rank(runner: Any) -> Tuple[int, Dict[str, Any]]:
    pc = getattr(getattr(runner, "vllm_config", None), "parallel_config", None)
    tp = int(getattr(pc, "tensor_parallel_size", 1) or 1)
    pp = int(getattr(pc, "pipeline_parallel_size", 1) or 1)
    dp = int(getattr(pc, "data_parallel_size", 1) or 1)
    rank = 0
    try:
        import torch.distributed as dist  # type: ignore

        if dist.is_available() and dist.is_initialized():
            rank = dist.get_rank()
    except Exception:
        pass
    return rank, {"tp_size": tp, "tp_rank": rank % tp, "rank": rank, "world_size": tp * pp * dp,
                  "pp_size": pp, "dp_size": dp}


def attach(runner: Any, session_dir: str, **recorder_options: Any) -> VLLMAdapter:
    from crashreplay._recorder import Recorder

    version = _vllm_version()
    check_vllm_version(version)
    rank, parallel = _rank(runner)
    rec = Recorder(session_dir, engine="vllm", engine_version=version,
                   toggles=config_toggles(getattr(runner, "vllm_config", None)),
                   parallel=parallel, **recorder_options)
    adapter = VLLMAdapter(rec)
    runner._crashreplay_adapter = adapter
    return adapter


def install() -> bool:
    """Patches GPUModelRunner in this process when CRASHREPLAY_DIR is set."""
    session_dir = os.environ.get("CRASHREPLAY_DIR")
    if not session_dir:
        return False
    check_vllm_version(_vllm_version())
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner  # type: ignore

    if getattr(GPUModelRunner, "_crashreplay_installed", False):
        return True

    def adapter_of(runner: Any) -> VLLMAdapter:
        a = getattr(runner, "_crashreplay_adapter", None)
        return a if a is not None else attach(runner, session_dir)

    def after_load(runner, result, args, kwargs):
        if os.environ.get("CRASHREPLAY_HASH_WEIGHTS", "1") != "0" and getattr(runner, "model", None) is not None:
            adapter_of(runner).recorder.record_weight_hashes(named_parameters(runner.model))

    def after_prepare(runner, result, args, kwargs):
        so = kwargs.get("scheduler_output", args[0] if args else None)
        adapter_of(runner).after_prepare(runner, so)

    wrap_method(GPUModelRunner, "load_model", after=guarded(after_load, "hashing vLLM weights"))
    if not wrap_method(GPUModelRunner, "_prepare_inputs", after=guarded(after_prepare, "recording a vLLM step")):
        raise UnsupportedVersion("crashreplay.vllm: GPUModelRunner has no _prepare_inputs")
    for name in ("execute_model", "sample_tokens"):
        _hook_failure(GPUModelRunner, name)
    GPUModelRunner._crashreplay_installed = True
    logger.info("crashreplay: recording vLLM model runners into %s", session_dir)
    return True


def _hook_failure(cls: Any, name: str) -> None:
    orig = getattr(cls, name, None)
    if orig is None:
        return

    def method(self, *args, **kwargs):
        try:
            return orig(self, *args, **kwargs)
        except Exception as exc:
            adapter = getattr(self, "_crashreplay_adapter", None)
            if adapter is not None:
                adapter.recorder.failure_hook(step=adapter.step - 1 if adapter.step else None,
                                              stage=adapter.mode or name).record(exc, exc.__traceback__)
            raise

    method.__name__ = name
    setattr(cls, name, method)


def plugin() -> None:
    """Entry point for vLLM's "vllm.general_plugins" group (loaded in every process)."""
    install()
