"""crashreplay.sglang: record sglang's forward passes.

What is recorded, and from where (sglang's own names):

  step log field      sglang source (ForwardBatch at ModelRunner.forward entry)
  ------------------  ---------------------------------------------------------
  mode                forward_mode (EXTEND->extend, DECODE->decode, MIXED->mixed,
                      IDLE->idle, TARGET_VERIFY/DRAFT_EXTEND*->extend)
  token_ids           input_ids (overlap schedule: already resolved; the hook
                      runs on sglang's forward stream after the future-token
                      resolution, and the staging copy is ordered after it)
  positions           positions
  seq_lens            seq_lens
  extend_lens         extend_seq_lens (extend modes)
  req_pool_indices    req_pool_indices
  page_table          req_to_token_pool.req_to_token[req_pool_indices, :max(seq_lens_cpu)],
                      each row cut to its seq_len (token slots of the KV pool)
  out_cache_loc       out_cache_loc
  sampling            sampling_info.temperatures / top_ps / top_ks / min_ps,
                      sampling_info.sampling_seed when sglang has it
  request_ids         rids (newer sglang; empty otherwise)
Snapshots (the ring) hold the same tensors, plus with snapshot_kv=True the
KV pages the rows select (token_to_kv_pool k_buffer/v_buffer/kv_buffer per
layer, gathered at those slots). Manifest toggles: every ServerArgs field
under its own name (attention_backend, prefill/decode_attention_backend,
quantization, moe_runner_backend, kv_cache_dtype, mem_fraction_static,
disable_cuda_graph, cuda_graph_max_bs (or, since 0.5.2x, cuda_graph_max_bs_decode,
also recorded as cuda_graph_max_bs), cuda_graph_bs, tp_size, ...; secrets
dropped), plus kernel-relevant environment switches as env.NAME
(SGLANG_ENABLE_JIT_DEEPGEMM, SGL_ENABLE_JIT_DEEPGEMM, *UE8M0*, ...) and,
when importable, sglang's resolved DeepGEMM flags
(deepgemm.ENABLE_JIT_DEEPGEMM, deepgemm.DEEPGEMM_SCALE_UE8M0). Weight hashes:
the model's parameters after loading (XXH3-128 per tensor, this rank's
shard as loaded).

Hooks: Scheduler.__init__ (attach to this rank's ModelRunner once weights
are loaded), ModelRunner.forward of that runner (record, snapshot, failure
hook), and every Scheduler.event_loop* method (failure hook for errors that
surface later, e.g. `CUDA error: device-side assert triggered` raised from
process_batch_result's synchronize).

Enabling: sglang starts its schedulers in spawned subprocesses, so the hooks
must be installed in each of them:
  * sglang with the plugin framework (sglang.srt.plugins): crashreplay
    registers the entry point `crashreplay` in group "sglang.srt.plugins";
    set CRASHREPLAY_DIR=/path/to/session and launch sglang as usual;
  * any sglang: `CRASHREPLAY_DIR=... python -m crashreplay.sglang <sglang
    launch_server arguments>`; spawned children import this module as their
    main module, which installs the hooks there too.

Versions: checked against sglang's source for 0.5.x (ForwardBatch,
SamplingBatchInfo, ServerArgs, plugins) and its main branch as of late 2026;
SUPPORTED below. Older versions are refused with a message; newer ones run
the structural check (require_fields) first.

sglang needs a GPU to serve; this module is tested against sglang's own
classes on the CPU where sglang imports (test_adapters_sglang_real.py) and
with stand-ins elsewhere (test_adapters.py).
"""
from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any, Dict, List, Optional, Tuple

from crashreplay._adapter_common import (
    UnsupportedVersion,
    check_version,
    drop_secrets,
    env_toggles,
    guarded,
    logger,
    named_parameters,
    require_fields,
)
from crashreplay._manifest import config_to_toggles

SUPPORTED = ((0, 5, 0), (0, 7, 0))
CHECKED = "sglang 0.5.x and main, late 2026"

_MODE_NAMES = {
    "EXTEND": "extend", "DECODE": "decode", "MIXED": "mixed", "IDLE": "idle",
    "TARGET_VERIFY": "extend", "DRAFT_EXTEND": "extend", "DRAFT_EXTEND_V2": "extend",
    "SPLIT_PREFILL": "prefill", "PREBUILT": "decode", "DLLM_EXTEND": "extend",
}
_FORWARD_BATCH_FIELDS = ("forward_mode", "input_ids", "positions", "seq_lens", "req_pool_indices", "out_cache_loc")


def check_sglang_version(version: str) -> None:
    check_version("sglang", version, SUPPORTED[0], SUPPORTED[1], CHECKED)


def forward_mode_name(mode: Any) -> str:
    """The capture's mode name for an sglang ForwardMode member."""
    return _MODE_NAMES.get(getattr(mode, "name", str(mode)), "unknown")


def extract_step(forward_batch: Any, req_to_token: Any = None) -> Dict[str, Any]:
    """record_step keyword arguments for one ForwardBatch.

    Values stay the engine's tensors (CUDA in production): the Recorder
    stages them asynchronously. Nothing here synchronises the device: the
    page-table width comes from the host mirror seq_lens_cpu, and rows are
    not recorded when sglang does not provide it.
    """
    fb = forward_batch
    require_fields(fb, _FORWARD_BATCH_FIELDS, "ForwardBatch", "sglang")
    mode = forward_mode_name(fb.forward_mode)
    fields: Dict[str, Any] = dict(mode=mode, token_ids=fb.input_ids, positions=fb.positions,
                                  seq_lens=fb.seq_lens, req_pool_indices=fb.req_pool_indices,
                                  out_cache_loc=fb.out_cache_loc)
    if mode in ("extend", "mixed", "prefill") and getattr(fb, "extend_seq_lens", None) is not None:
        fields["extend_lens"] = fb.extend_seq_lens
    rids = getattr(fb, "rids", None)
    if rids:
        fields["request_ids"] = [str(r) for r in rids]
    seq_cpu = getattr(fb, "seq_lens_cpu", None)
    if req_to_token is not None and seq_cpu is not None and len(seq_cpu) > 0:
        width = int(seq_cpu.max()) if hasattr(seq_cpu, "max") else max(int(x) for x in seq_cpu)
        fields["page_table"] = {"rows": req_to_token[fb.req_pool_indices, :width], "lengths": fb.seq_lens}
    si = getattr(fb, "sampling_info", None)
    if si is not None:
        sampling = {"temperatures": si.temperatures, "top_ps": si.top_ps, "top_ks": si.top_ks,
                    "min_ps": si.min_ps}
        seed = getattr(si, "sampling_seed", None)
        if seed is not None:
            sampling["seeds"] = seed
        fields["sampling"] = sampling
    return fields


def snapshot_tensors(fields: Dict[str, Any], kv_pool: Any = None) -> Dict[str, Any]:
    """The tensors of a step worth keeping in the ring (the step's inputs)."""
    snap = {k: fields[k] for k in ("token_ids", "positions", "seq_lens", "req_pool_indices", "out_cache_loc")
            if fields.get(k) is not None}
    pt = fields.get("page_table")
    if isinstance(pt, dict):
        snap["req_to_token_rows"] = pt["rows"]
        if kv_pool is not None:
            slots = pt["rows"].reshape(-1)
            for attr in ("k_buffer", "v_buffer", "kv_buffer"):
                bufs = getattr(kv_pool, attr, None)
                if isinstance(bufs, (list, tuple)):
                    for layer, buf in enumerate(bufs):
                        snap[f"kv.{attr}.{layer}"] = buf[slots]
    return snap


def server_args_toggles(server_args: Any, environ: Optional[Dict[str, str]] = None) -> List[Tuple[str, Any]]:
    """Every ServerArgs field as a toggle, plus kernel-relevant env switches."""
    toggles = drop_secrets(config_to_toggles(server_args)) + env_toggles(environ)
    # sglang 0.5.2x split cuda_graph_max_bs into _decode/_prefill; the
    # replay's cuda_graph_max_bs is the decode one (graphs are for decode).
    names = dict(toggles)
    if "cuda_graph_max_bs" not in names and names.get("cuda_graph_max_bs_decode") is not None:
        toggles.append(("cuda_graph_max_bs", names["cuda_graph_max_bs_decode"]))
    try:  # sglang's resolved DeepGEMM switches, when this version has the module
        from sglang.srt.layers.deep_gemm_wrapper import configurer  # type: ignore

        for name in ("ENABLE_JIT_DEEPGEMM", "DEEPGEMM_BLACKWELL", "DEEPGEMM_SCALE_UE8M0"):
            if hasattr(configurer, name):
                toggles.append((f"deepgemm.{name}", bool(getattr(configurer, name))))
    except Exception:  # not importable here, or another layout
        pass
    return sorted(toggles)


def model_info(model_config: Any, server_args: Any = None) -> Dict[str, Any]:
    """ModelConfigInfo fields from sglang's ModelConfig (hf_config inside)."""
    hf = getattr(model_config, "hf_config", None)
    info: Dict[str, Any] = {}
    if hf is not None:
        get = lambda *names: next((getattr(hf, n) for n in names if getattr(hf, n, None) is not None), None)  # noqa: E731
        try:
            info["config_json"] = json.dumps(hf.to_dict(), sort_keys=True, default=str)
        except Exception:
            pass
        info["model_type"] = str(get("model_type") or "")
        archs = get("architectures") or []
        info["architecture"] = str(archs[0]) if archs else ""
        for key, names in (("num_layers", ("num_hidden_layers",)), ("hidden_size", ("hidden_size",)),
                           ("vocab_size", ("vocab_size",)), ("num_heads", ("num_attention_heads",)),
                           ("num_kv_heads", ("num_key_value_heads",)), ("head_dim", ("head_dim",)),
                           ("intermediate_size", ("intermediate_size",)),
                           ("num_experts", ("num_local_experts", "n_routed_experts", "num_experts"))):
            v = get(*names)
            if isinstance(v, int) and v >= 0:
                info[key] = v
        q = getattr(hf, "quantization_config", None)
        if isinstance(q, dict) and q.get("quant_method"):
            info["quantization"] = str(q["quant_method"])
    if server_args is not None:
        if getattr(server_args, "quantization", None):
            info["quantization"] = str(server_args.quantization)
        if getattr(server_args, "dtype", None):
            info["dtype"] = str(server_args.dtype)
        if getattr(server_args, "model_path", None):
            info["checkpoint_path"] = str(server_args.model_path)
    return info


def find_model_runner(scheduler: Any) -> Any:
    """This rank's target ModelRunner (not a speculative draft runner)."""
    for path in (("tp_worker", "model_runner"), ("tp_worker", "worker", "model_runner"),
                 ("model_worker", "model_runner"), ("tp_worker", "target_worker", "model_runner")):
        obj = scheduler
        for p in path:
            obj = getattr(obj, p, None)
            if obj is None:
                break
        if obj is not None:
            return obj
    raise UnsupportedVersion("crashreplay.sglang: cannot find the scheduler's ModelRunner "
                             "(tried tp_worker.model_runner, tp_worker.worker.model_runner, model_worker.model_runner)")


class SGLangAdapter:
    """Records one scheduler's (one rank's) forward passes."""

    def __init__(self, recorder: Any, snapshot: bool = True, snapshot_kv: bool = False):
        self.recorder = recorder
        self.snapshot = snapshot
        self.snapshot_kv = snapshot_kv
        self.step = 0
        self._lock = threading.Lock()

    def before_forward(self, runner: Any, forward_batch: Any) -> Tuple[int, str]:
        with self._lock:
            step = self.step
            self.step += 1
        pool = getattr(runner, "req_to_token_pool", None)
        fields = extract_step(forward_batch, getattr(pool, "req_to_token", None))
        if self.snapshot:
            kv = getattr(runner, "token_to_kv_pool", None) if self.snapshot_kv else None
            self.recorder.snapshot(step, snapshot_tensors(fields, kv))
        self.recorder.record_step(step, **fields)
        return step, fields["mode"]

    def attach_runner(self, runner: Any) -> None:
        """Wraps runner.forward (this instance only: draft runners stay untouched)."""
        if getattr(runner, "_crashreplay_adapter", None) is not None:
            return
        orig = runner.forward
        adapter = self
        record = guarded(adapter.before_forward, "recording an sglang step")

        def forward(*args, **kwargs):
            fb = kwargs.get("forward_batch", args[0] if args else None)
            got = record(runner, fb)
            step, mode = got if got else (None, "")
            with adapter.recorder.failure_hook(step=step, stage=mode or "forward"):
                return orig(*args, **kwargs)

        runner.forward = forward
        runner._crashreplay_adapter = self

    def record_weights(self, runner: Any) -> Optional[Dict[str, Any]]:
        model = getattr(runner, "model", None)
        if model is None or os.environ.get("CRASHREPLAY_HASH_WEIGHTS", "1") == "0":
            return None
        return self.recorder.record_weight_hashes(named_parameters(model))


# ---- installation ------------------------------------------------------
_ACTIVE: Dict[int, SGLangAdapter] = {}


def attach(scheduler: Any, session_dir: str, **recorder_options: Any) -> SGLangAdapter:
    """Starts recording one sglang Scheduler (call after its __init__)."""
    import sglang  # noqa: F401

    from crashreplay._recorder import Recorder

    version = _sglang_version()
    check_sglang_version(version)
    sa = scheduler.server_args
    tp_rank = int(getattr(scheduler, "tp_rank", 0))
    tp_size = int(getattr(sa, "tp_size", 1))
    pp_rank = int(getattr(scheduler, "pp_rank", 0) or 0)
    pp_size = int(getattr(sa, "pp_size", 1) or 1)
    dp_rank = int(getattr(scheduler, "dp_rank", 0) or 0)
    dp_size = int(getattr(sa, "dp_size", 1) or 1)
    rank = tp_rank + tp_size * pp_rank + tp_size * pp_size * dp_rank
    rec = Recorder(session_dir, engine="sglang", engine_version=version,
                   toggles=server_args_toggles(sa),
                   model=model_info(getattr(scheduler, "model_config", None), sa),
                   parallel={"tp_size": tp_size, "tp_rank": tp_rank, "rank": rank,
                             "world_size": tp_size * pp_size * dp_size, "pp_size": pp_size,
                             "ep_size": int(getattr(sa, "ep_size", 1) or 1), "dp_size": dp_size},
                   **recorder_options)
    adapter = SGLangAdapter(rec, snapshot_kv=os.environ.get("CRASHREPLAY_SNAPSHOT_KV") == "1")
    runner = find_model_runner(scheduler)
    adapter.record_weights(runner)
    adapter.attach_runner(runner)
    scheduler._crashreplay_adapter = adapter
    _ACTIVE[id(scheduler)] = adapter
    return adapter


def _sglang_version() -> str:
    try:
        from sglang.version import __version__  # type: ignore

        return str(__version__)
    except Exception:
        import sglang  # type: ignore

        return str(getattr(sglang, "__version__", "0"))


def install() -> bool:
    """Patches sglang's Scheduler in this process when CRASHREPLAY_DIR is set.

    Idempotent. Returns False (and does nothing) without CRASHREPLAY_DIR.
    Raises UnsupportedVersion for an sglang outside SUPPORTED.
    """
    session_dir = os.environ.get("CRASHREPLAY_DIR")
    if not session_dir:
        return False
    check_sglang_version(_sglang_version())
    from sglang.srt.managers.scheduler import Scheduler  # type: ignore

    if getattr(Scheduler, "_crashreplay_installed", False):
        return True
    orig_init = Scheduler.__init__

    def __init__(self, *args, **kwargs):
        orig_init(self, *args, **kwargs)
        attach(self, session_dir)

    Scheduler.__init__ = __init__
    for name in [n for n in dir(Scheduler) if n.startswith("event_loop")]:
        _hook_event_loop(Scheduler, name)
    Scheduler._crashreplay_installed = True
    logger.info("crashreplay: recording sglang schedulers into %s", session_dir)
    return True


def _hook_event_loop(cls: Any, name: str) -> None:
    orig = getattr(cls, name)

    def loop(self, *args, **kwargs):
        try:
            return orig(self, *args, **kwargs)
        except Exception as exc:
            adapter = getattr(self, "_crashreplay_adapter", None)
            if adapter is not None:
                batch = getattr(self, "cur_batch", None) or getattr(self, "cur_batch_for_debug", None)
                stage = forward_mode_name(getattr(batch, "forward_mode", None)) if batch is not None else ""
                adapter.recorder.failure_hook(step=adapter.step - 1 if adapter.step else None,
                                              stage=stage if stage != "unknown" else "scheduler").record(
                    exc, exc.__traceback__)
            raise

    loop.__name__ = name
    setattr(cls, name, loop)


def plugin() -> None:
    """Entry point for sglang's plugin framework (group "sglang.srt.plugins")."""
    install()


def _main(argv: List[str]) -> int:
    """`python -m crashreplay.sglang ARGS`: sglang's launch_server with recording."""
    if not os.environ.get("CRASHREPLAY_DIR"):
        print("crashreplay.sglang: set CRASHREPLAY_DIR to the session directory to record into",
              file=sys.stderr)
        return 2
    install()
    import runpy

    sys.argv = ["sglang.launch_server"] + argv
    runpy.run_module("sglang.launch_server", run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
elif __name__ == "__mp_main__" and os.environ.get("CRASHREPLAY_DIR"):
    # A process spawned by the launcher imports this module as its main
    # module: install the hooks there too.
    install()
