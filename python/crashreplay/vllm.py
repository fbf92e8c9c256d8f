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
vLLM's second-generation runner (vllm/v1/worker/gpu/model_runner.py, the
only one in 0.2x-0.34; gpu_model_runner.py is gone) builds a step in two
calls; the hooks are GPUModelRunner.prepare_inputs (it returns an
InputBatch) and prepare_attn (it returns (block_tables, slot_mappings)), and
the step is recorded when prepare_attn returns:

  request_ids         input_batch.req_ids[:num_reqs]
  token_ids           input_batch.input_ids[:num_tokens] (padding cut)
  positions           input_batch.positions[:num_tokens]
  seq_lens            num_computed_tokens_np + num_scheduled_tokens
  extend_lens         num_scheduled_tokens
  req_pool_indices    idx_mapping_np (each request's request-state slot)
  page_table          block_tables[0] rows cut to ceil(seq_len / block_size),
                      block_size = runner.block_tables.block_sizes[0]; a
                      request that ran in the last recorded step from the
                      same slot and continues where it stopped gives its
                      row from the block of its first new token on
                      ("starts", gathered on the device: the recorder's
                      cost does not grow with context), others whole
  out_cache_loc       slot_mappings[0][:num_tokens]
  sampling            runner.sampler.sampling_states at idx_mapping
                      (temperature, top_p, top_k (vocab size -> -1), min_p,
                      seed: the one the sampler draws with, for every
                      request; vLLM draws an unseeded request's seed at
                      add_request, and its Gumbel sampler hashes (seed,
                      position), so seed and positions are the RNG state)
  rng_seed/offset     the device's default torch generator (initial_seed,
                      Philox offset)

Manifest toggles: every part of vllm_config (model/cache/parallel/scheduler/
compilation/attention/kernel/load/device/... configs) flattened
("cache_config.cache_dtype", "attention_config.backend", ...; secrets such
as model_config.hf_token dropped), vllm.page_table_unit = "block" with
vllm.block_size (the rows' block size), plus env.NAME: kernel switches set
in the environment and every kernel-relevant entry of vllm.envs with the
value vLLM reads (VLLM_USE_DEEP_GEMM, VLLM_USE_DEEP_GEMM_E8M0, ...). Weight
hashes: parameters and persistent buffers after load_model, under vLLM's
names (qkv_proj, gate_up_proj, experts.w13_weight, attn._k_scale, ...).

Enabling: crashreplay registers `crashreplay` in the "vllm.general_plugins"
entry-point group, which vLLM loads in every process it starts; set
CRASHREPLAY_DIR=/path/to/session. Versions: SUPPORTED below, checked against
vLLM's v1 gpu_model_runner source (0.10-era layout and main as of late
2026). vLLM needs a GPU to serve; this module is tested against vLLM's own
classes on the CPU where vLLM imports (test_adapters_vllm_real.py) and with
stand-ins elsewhere (test_adapters.py).
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from crashreplay._adapter_common import (
    UnsupportedVersion,
    check_version,
    coredumps_from_env,
    drop_secrets,
    env_toggles,
    guarded,
    hf_model_info,
    is_kernel_env,
    logger,
    merge_toggles,
    named_parameters,
    require_fields,
    rng_state,
    wrap_method,
)
from crashreplay._fingerprint_hooks import FingerprintHooks, install_engine_boundaries
from crashreplay._manifest import _toggle_value, config_to_toggles

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
    fields["rng_seed"], fields["rng_offset"] = rng_state(fields["token_ids"])
    return fields


def _columns_from(table: Any, starts: np.ndarray, ends: np.ndarray) -> Any:
    """Each row of `table` (a torch tensor, on its device: no synchronisation)
    from column starts[i] on, padded to the widest ends[i] - starts[i]
    (the padding repeats a column; record_step cuts rows to their lengths)."""
    import torch

    width = int((ends - starts).max())
    cols = np.minimum(starts[:, None] + np.arange(width, dtype=np.int64)[None, :], table.shape[1] - 1)
    index = torch.from_numpy(cols)
    if table.device.type != "cpu":
        index = index.pin_memory().to(table.device, non_blocking=True)
    return torch.gather(table, 1, index)


class RowsGiven:
    """The rows the last recorded step gave: its request ids, their
    request-state slots and seq_lens (extract_step_v2's `previous`)."""

    def __init__(self) -> None:
        self.ids: List[str] = []
        self.idx = np.zeros(0, dtype=np.int64)
        self.seq = np.zeros(0, dtype=np.int64)

    def clear(self) -> None:
        self.__init__()

    def copy(self) -> "RowsGiven":
        c = RowsGiven()
        c.ids, c.idx, c.seq = list(self.ids), self.idx.copy(), self.seq.copy()
        return c

    def update(self, ids: List[str], idx: np.ndarray, seq: np.ndarray) -> None:
        self.ids, self.idx, self.seq = ids, np.array(idx, dtype=np.int64), np.array(seq, dtype=np.int64)

    def starts(self, ids: List[str], idx: np.ndarray, computed: np.ndarray, block: int) -> np.ndarray:
        """Per request: the block of its first new token when it continues its
        last row (same request, same slot, num_computed_tokens = its seq_len
        then), else 0 (whole)."""
        if ids == self.ids:  # vLLM's persistent batch keeps its order: no per-request Python
            prev_idx, prev_seq = self.idx, self.seq
        else:
            where = {r: i for i, r in enumerate(self.ids)}
            pos = np.array([where.get(r, -1) for r in ids], dtype=np.int64)
            known = pos >= 0
            prev_idx = np.where(known, self.idx[pos] if len(self.ids) else -1, -1)
            prev_seq = np.where(known, self.seq[pos] if len(self.ids) else -1, -1)
        go_on = (prev_idx == idx) & (prev_seq == computed)
        return np.where(go_on, computed // block, 0).astype(np.int64)


def extract_step_v2(runner: Any, input_batch: Any, attn: Any = None,
                    previous: Optional[RowsGiven] = None) -> Dict[str, Any]:
    """record_step keyword arguments for vLLM's second-generation model runner
    (vllm/v1/worker/gpu/model_runner.py, the only one since 0.2x): the
    InputBatch prepare_inputs returned and, when prepare_attn ran, its
    (block_tables, slot_mappings).

    previous: the rows the last recorded step gave (RowsGiven: request ids,
    request-state slots, seq_lens), updated here. A request that ran in that step
    from the same slot and continues where it stopped (num_computed_tokens
    = its seq_len then) has only gained blocks - vLLM appends to a running
    request's row; a preempted one leaves the batch - so its row is given
    from the block holding its first new token on (a delta: "starts"), the
    columns before as recorded; every other row is given whole. None: whole
    rows."""
    ib = input_batch
    require_fields(ib, ("req_ids", "num_reqs", "num_scheduled_tokens", "num_computed_tokens_np", "num_tokens",
                        "input_ids", "positions", "idx_mapping_np"), "InputBatch", "vllm")
    num_reqs = int(ib.num_reqs)
    n_tok = int(ib.num_tokens)
    req_ids = [str(r) for r in list(ib.req_ids)[:num_reqs]]
    scheduled = np.asarray(ib.num_scheduled_tokens[:num_reqs], dtype=np.int64)
    computed = np.asarray(ib.num_computed_tokens_np[:num_reqs], dtype=np.int64)
    seq_lens = computed + scheduled
    idx = np.asarray(ib.idx_mapping_np[:num_reqs], dtype=np.int64)  # request-state slots
    fields: Dict[str, Any] = dict(
        mode=step_mode(scheduled, computed), request_ids=req_ids, token_ids=ib.input_ids[:n_tok],
        positions=ib.positions[:n_tok], seq_lens=seq_lens, extend_lens=scheduled, req_pool_indices=idx)
    if attn is not None:
        block_tables, slot_mappings = attn
        sizes = getattr(getattr(runner, "block_tables", None), "block_sizes", None)
        if block_tables and sizes:
            bs = int(sizes[0])
            blocks = (seq_lens + bs - 1) // bs
            table = block_tables[0][:num_reqs]
            starts = None
            if previous is not None:
                starts = previous.starts(req_ids, idx, computed, bs)
                previous.update(req_ids, idx, seq_lens)
            if starts is not None and starts.any():
                fields["page_table"] = {"rows": _columns_from(table, starts, blocks), "lengths": blocks - starts,
                                        "starts": starts}
            else:
                fields["page_table"] = {"rows": table[:, :int(blocks.max()) if num_reqs else 0], "lengths": blocks}
        if slot_mappings is not None and len(slot_mappings) > 0:
            fields["out_cache_loc"] = slot_mappings[0][:n_tok]
    states = getattr(getattr(runner, "sampler", None), "sampling_states", None)
    if states is not None and num_reqs:
        vocab = int(getattr(states, "vocab_size", 0) or 0)
        sampling = []
        for i in idx:
            top_k = int(states.top_k.np[i])
            # seeds holds the seed the Gumbel sampler draws with for every
            # request (add_request draws one for an unseeded request).
            sampling.append(dict(temperature=float(states.temperature.np[i]), top_p=float(states.top_p.np[i]),
                                 top_k=-1 if vocab and top_k >= vocab else top_k, min_p=float(states.min_p.np[i]),
                                 seed=int(states.seeds.np[i])))
        fields["sampling"] = sampling
    fields["rng_seed"], fields["rng_offset"] = rng_state(fields["token_ids"])
    return fields


_CONFIG_PARTS = ("model_config", "cache_config", "parallel_config", "scheduler_config", "device_config",
                 "load_config", "attention_config", "kernel_config", "compilation_config", "speculative_config",
                 "kv_transfer_config", "quant_config", "lora_config", "offload_config", "mamba_config")


def _config_parts(vllm_config: Any) -> List[str]:
    """VllmConfig's parts: its dataclass fields, else the known names."""
    import dataclasses

    if dataclasses.is_dataclass(vllm_config) and not isinstance(vllm_config, type):
        return [f.name for f in dataclasses.fields(vllm_config) if not f.name.startswith("_")]
    return [p for p in _CONFIG_PARTS if hasattr(vllm_config, p)]


def _vllm_env_toggles() -> List[Tuple[str, Any]]:
    """Every kernel-relevant variable vllm.envs defines, with the value vLLM
    reads (its default when unset)."""
    try:
        import vllm.envs as venvs  # type: ignore
    except Exception:
        return []
    out = []
    for name in sorted(getattr(venvs, "environment_variables", {}) or {}):
        if not is_kernel_env(name):
            continue
        try:
            out.append((f"env.{name}", _toggle_value(getattr(venvs, name))))
        except Exception:  # a getter that fails here
            continue
    return out


def config_toggles(vllm_config: Any, environ: Optional[Dict[str, str]] = None) -> List[Tuple[str, Any]]:
    """Every part of vllm_config flattened, plus env switches (environ
    given: only those; else the process environment and vllm.envs)."""
    toggles: List[Tuple[str, Any]] = [("vllm.page_table_unit", "block")]
    for part in _config_parts(vllm_config):
        cfg = getattr(vllm_config, part, None)
        if cfg is None:
            continue
        try:
            toggles += [(f"{part}.{k}", v) for k, v in config_to_toggles(cfg)]
        except TypeError:
            toggles.append((part, str(cfg)))
    block_size = getattr(getattr(vllm_config, "cache_config", None), "block_size", None)
    if isinstance(block_size, int) and block_size > 0:
        toggles.append(("vllm.block_size", int(block_size)))
    envs = env_toggles(environ) if environ is not None else merge_toggles(_vllm_env_toggles(), env_toggles())
    return merge_toggles(drop_secrets(toggles), envs)


class VLLMAdapter:
    def __init__(self, recorder: Any, snapshot: bool = True, fingerprints: bool = False, tp_size: int = 1):
        self.recorder = recorder
        self.snapshot = snapshot
        self.fingerprints = fingerprints
        self.tp_size = tp_size
        self.hooks: Optional[FingerprintHooks] = None
        self.step = 0
        self.mode = ""
        self._pending: Any = None  # v2: an InputBatch whose prepare_attn has not returned yet
        # v2: the rows the last recorded step gave (extract_step_v2's
        # `previous`), so that running requests' rows go as deltas.
        self._rows = RowsGiven()

    def after_prepare(self, runner: Any, scheduler_output: Any) -> None:
        self._record(extract_step(runner, scheduler_output))

    # The v2 runner builds a step in two calls, prepare_inputs then
    # prepare_attn; the step is recorded when the second returns (or, should
    # it not run, before the next step or a failure).
    def after_prepare_v2(self, runner: Any, input_batch: Any) -> None:
        self.flush_pending(runner)
        self._pending = input_batch

    def after_attn_v2(self, runner: Any, input_batch: Any, attn: Any) -> None:
        if self._pending is input_batch:
            self._pending = None
            self._record(extract_step_v2(runner, input_batch, attn, previous=self._rows))

    def flush_pending(self, runner: Any) -> None:
        ib = self._pending
        if ib is not None:
            self._pending = None
            self._rows.clear()  # a step without rows: the next gives them whole
            self._record(extract_step_v2(runner, ib))

    def install_hooks(self, runner: Any) -> None:
        """Fingerprint hooks on the runner's model (after load_model), when switched on."""
        model = getattr(runner, "model", None)
        if not self.fingerprints or self.hooks is not None or model is None:
            return
        self.hooks = FingerprintHooks(self.recorder)
        hooked = install_engine_boundaries(self.hooks, model, self.tp_size)
        logger.info("crashreplay: fingerprints at %d boundaries (%s ...)", len(hooked), ", ".join(hooked[:4]))

    def flush_fingerprints(self) -> None:
        if self.hooks is not None:
            self.hooks.flush()

    def _record(self, fields: Dict[str, Any]) -> None:
        step = self.step
        self.step += 1
        self.mode = fields["mode"]
        if self.hooks is not None:
            self.hooks.step, self.hooks.mode = step, self.mode
        if self.snapshot:
            self.recorder.snapshot(step, {k: fields[k] for k in ("token_ids", "positions", "out_cache_loc")
                                          if fields.get(k) is not None})
        self.recorder.record_step(step, **fields)


def model_info(model_config: Any) -> Dict[str, Any]:
    """ModelConfigInfo fields from vLLM's ModelConfig."""
    info = hf_model_info(getattr(model_config, "hf_config", None))
    if model_config is None:
        return info
    if getattr(model_config, "model", None):
        info["checkpoint_path"] = str(model_config.model)
    if getattr(model_config, "dtype", None) is not None:
        info["dtype"] = str(model_config.dtype).replace("torch.", "")
    if getattr(model_config, "quantization", None):
        info["quantization"] = str(model_config.quantization)
    return info


def record_weights(adapter: VLLMAdapter, runner: Any) -> Optional[Dict[str, Any]]:
    """Hashes the runner's loaded model (after load_model) into the capture."""
    if os.environ.get("CRASHREPLAY_HASH_WEIGHTS", "1") == "0" or getattr(runner, "model", None) is None:
        return None
    return adapter.recorder.record_weight_hashes(named_parameters(runner.model))


def _vllm_version() -> str:
    import vllm  # type: ignore

    return str(getattr(vllm, "__version__", "0"))


def _group_rank(getter: str) -> Optional[int]:
    try:
        from vllm.distributed import parallel_state  # type: ignore

        return int(getattr(parallel_state, getter)().rank_in_group)
    except Exception:  # groups not initialised here
        return None


def _rank(runner: Any) -> Tuple[int, Dict[str, Any]]:
    """This worker's place: vLLM's tensor/pipeline group ranks when its
    groups exist (else the torch.distributed rank), and the data-parallel
    replica from parallel_config (each replica has its own world)."""
    pc = getattr(getattr(runner, "vllm_config", None), "parallel_config", None)
    tp = int(getattr(pc, "tensor_parallel_size", 1) or 1)
    pp = int(getattr(pc, "pipeline_parallel_size", 1) or 1)
    dp = int(getattr(pc, "data_parallel_size", 1) or 1)
    dp_rank = int(getattr(pc, "data_parallel_rank", 0) or 0)
    world = 0
    try:
        import torch.distributed as dist  # type: ignore

        if dist.is_available() and dist.is_initialized():
            world = dist.get_rank()
    except Exception:
        pass
    tp_rank = _group_rank("get_tp_group")
    pp_rank = _group_rank("get_pp_group")
    tp_rank = world % tp if tp_rank is None else tp_rank
    pp_rank = (world // tp) % pp if pp_rank is None else pp_rank
    rank = tp_rank + tp * pp_rank + tp * pp * dp_rank
    return rank, {"tp_size": tp, "tp_rank": tp_rank, "rank": rank, "world_size": tp * pp * dp,
                  "pp_size": pp, "dp_size": dp}


def attach(runner: Any, session_dir: str, fingerprints: Optional[bool] = None,
           **recorder_options: Any) -> VLLMAdapter:
    """Starts recording one GPUModelRunner. fingerprints: as crashreplay.sglang.attach
    (default CRASHREPLAY_FINGERPRINTS=1, else off); the hooks go on when the model is loaded."""
    from crashreplay._recorder import Recorder

    version = _vllm_version()
    check_vllm_version(version)
    rank, parallel = _rank(runner)
    vllm_config = getattr(runner, "vllm_config", None)
    rec = Recorder(session_dir, engine="vllm", engine_version=version, toggles=config_toggles(vllm_config),
                   model=model_info(getattr(vllm_config, "model_config", None)), parallel=parallel,
                   **recorder_options)
    if fingerprints is None:
        fingerprints = os.environ.get("CRASHREPLAY_FINGERPRINTS") == "1"
    adapter = VLLMAdapter(rec, fingerprints=fingerprints, tp_size=int(parallel.get("tp_size", 1) or 1))
    adapter.install_hooks(runner)
    runner._crashreplay_adapter = adapter
    return adapter


def install() -> bool:
    """Patches GPUModelRunner in this process when CRASHREPLAY_DIR is set."""
    session_dir = os.environ.get("CRASHREPLAY_DIR")
    if not session_dir:
        return False
    check_vllm_version(_vllm_version())
    GPUModelRunner, v2 = _runner_class()

    if getattr(GPUModelRunner, "_crashreplay_installed", False):
        return True

    def adapter_of(runner: Any) -> Optional[VLLMAdapter]:
        """The runner's adapter, attached on first use; None (and one
        warning) when attaching failed: that runner serves unrecorded."""
        a = getattr(runner, "_crashreplay_adapter", None)
        if a is None:
            a = guarded(attach, "attaching to a vLLM model runner")(runner, session_dir,
                                                                   coredumps=coredumps_from_env())
            if a is None:
                runner._crashreplay_adapter = False
        return a or None

    def after_load(runner, result, args, kwargs):
        a = adapter_of(runner)
        if a is not None:
            guarded(a.install_hooks, "installing vLLM fingerprint hooks")(runner)
            record_weights(a, runner)

    def after_prepare(runner, result, args, kwargs):
        so = kwargs.get("scheduler_output", args[0] if args else None)
        a = adapter_of(runner)
        if a is not None:
            a.after_prepare(runner, so)

    def after_prepare_v2(runner, result, args, kwargs):
        a = adapter_of(runner)
        if a is not None:
            a.after_prepare_v2(runner, result)

    def after_attn_v2(runner, result, args, kwargs):
        ib = kwargs.get("input_batch", args[0] if args else None)
        a = adapter_of(runner)
        if a is not None:
            a.after_attn_v2(runner, ib, result)

    wrap_method(GPUModelRunner, "load_model", after=guarded(after_load, "hashing vLLM weights"))
    if v2:
        for name, hook in (("prepare_inputs", after_prepare_v2), ("prepare_attn", after_attn_v2)):
            if not wrap_method(GPUModelRunner, name, after=guarded(hook, "recording a vLLM step")):
                raise UnsupportedVersion(f"crashreplay.vllm: vllm.v1.worker.gpu.model_runner.GPUModelRunner has no {name}")
    elif not wrap_method(GPUModelRunner, "_prepare_inputs", after=guarded(after_prepare, "recording a vLLM step")):
        raise UnsupportedVersion("crashreplay.vllm: GPUModelRunner has no _prepare_inputs")
    for name in ("execute_model", "sample_tokens"):
        _hook_failure(GPUModelRunner, name)
    GPUModelRunner._crashreplay_installed = True
    logger.info("crashreplay: recording vLLM model runners into %s", session_dir)
    return True


def _runner_class() -> Tuple[Any, bool]:
    """vLLM's GPUModelRunner and whether it is the second-generation one
    (vllm/v1/worker/gpu/model_runner.py) rather than gpu_model_runner.py."""
    try:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner  # type: ignore

        return GPUModelRunner, False
    except ModuleNotFoundError:
        pass
    try:
        from vllm.v1.worker.gpu.model_runner import GPUModelRunner  # type: ignore

        return GPUModelRunner, True
    except ModuleNotFoundError as e:
        raise UnsupportedVersion(
            f"crashreplay.vllm: this vLLM ({_vllm_version()}) has neither vllm.v1.worker.gpu_model_runner nor "
            f"vllm.v1.worker.gpu.model_runner ({e})") from e


def _hook_failure(cls: Any, name: str) -> None:
    orig = getattr(cls, name, None)
    if orig is None:
        return

    def method(self, *args, **kwargs):
        try:
            out = orig(self, *args, **kwargs)
        except Exception as exc:
            adapter = getattr(self, "_crashreplay_adapter", None)
            if adapter:  # None: never attached; False: attaching failed
                guarded(adapter.flush_pending, "recording a vLLM step")(self)
                guarded(adapter.flush_fingerprints, "fingerprinting a vLLM step")()
                adapter.recorder.failure_hook(step=adapter.step - 1 if adapter.step else None,
                                              stage=adapter.mode or name).record(exc, exc.__traceback__)
            raise
        adapter = getattr(self, "_crashreplay_adapter", None)
        if adapter and name == "execute_model":
            guarded(adapter.flush_fingerprints, "fingerprinting a vLLM step")()
        return out

    method.__name__ = name
    setattr(cls, name, method)


def plugin() -> None:
    """Entry point for vLLM's "vllm.general_plugins" group (loaded in every process).

    Never raises: a recorder that cannot install must not stop vLLM."""
    guarded(install, "installing the vLLM recorder")()
