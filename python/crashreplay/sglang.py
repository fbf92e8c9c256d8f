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
  extend_lens         extend_seq_lens (extend modes); one per request in decode
                      (batch_size ones: a decode step adds one token each)
  req_pool_indices    req_pool_indices
  page_table          req_to_token_pool.req_to_token[req_pool_indices, :max(seq_lens_cpu)],
                      each row cut to its seq_len (DECODE: out_cache_loc as each
                      row's slot at column seq_len - 1, page_table_starts; the
                      recorder keeps whole rows from the prefill's, docs/capture.md
                      "Page-table deltas"): TOKEN SLOTS of the KV pool
                      (one per token; a page of page_size tokens is
                      slot // page_size), toggle sglang.page_table_unit = "token"
  out_cache_loc       out_cache_loc
  sampling            sampling_info.temperatures / top_ps / top_ks / min_ps,
                      sampling_info.sampling_seed when sglang has it (seeded
                      sampling draws from (seed, position))
  rng_seed/offset     the device's default torch generator (initial_seed,
                      Philox offset): sglang's unseeded samplers draw from it
  request_ids         rids (newer sglang; empty otherwise)
Snapshots (the ring) hold the same tensors, plus with snapshot_kv=True the
KV pages the rows select (token_to_kv_pool k_buffer/v_buffer/kv_buffer per
layer, gathered at those slots). Manifest toggles: every ServerArgs field
under its own name with the value sglang resolved (0.5.2x keeps the launch
arguments raw and the resolution's decisions beside them:
mem_fraction_static None -> 0.711, cuda_graph_config.decode.max_bs 256 ->
32; the resolved view is what the engine ran with), nested configs as
dotted names (cuda_graph_config.decode.max_bs, .backend, .bs), secrets
dropped; cuda_graph_max_bs, the replay's name, is the effective decode
graph maximum (0 when decode graphs are disabled); the scheduler's runtime
sizes (scheduler.max_running_requests, scheduler.max_total_num_tokens,
scheduler.max_prefill_tokens); kernel-relevant environment switches as
env.NAME: those set in the environment, and every kernel-relevant entry of
sglang's envs registry with its effective value (SGLANG_ENABLE_JIT_DEEPGEMM
true by default); sglang's resolved DeepGEMM flags when importable
(deepgemm.ENABLE_JIT_DEEPGEMM, deepgemm.DEEPGEMM_SCALE_UE8M0). The device:
name, SM arch (major*10 + minor: 90 for sm_90) and memory capacity of the
rank's CUDA device. Weight hashes: the model's parameters and persistent
buffers after loading (XXH3-128 per tensor, this rank's shard as loaded,
under sglang's names: qkv_proj, gate_up_proj, experts.w13_weight, ...).

Ranks: the Scheduler's tp_rank/pp_rank/dp_rank where it has them, else
(sglang 0.5.2x) the process's parallel context (runtime_context.get_parallel()),
which the launcher publishes before the Scheduler is built; the file is
rank-NNNNN.crcap with NNNNN = tp_rank + tp_size * pp_rank + tp_size * pp_size * dp_rank.

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

import os
import sys
import threading
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
)
from crashreplay._fingerprint_hooks import FingerprintHooks, install_engine_boundaries
from crashreplay._manifest import _as_mapping, _toggle_value, config_to_toggles

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


def extract_step(forward_batch: Any, req_to_token: Any = None, page_deltas: bool = True) -> Dict[str, Any]:
    """record_step keyword arguments for one ForwardBatch.

    Values stay the engine's tensors (CUDA in production): the Recorder
    stages them asynchronously. Nothing here synchronises the device: the
    page-table width comes from the host mirror seq_lens_cpu, and rows are
    not recorded when sglang does not provide it. With page_deltas, a
    DECODE batch gives each row as its one new slot (out_cache_loc, which
    sglang wrote to req_to_token[req_pool_index, seq_len - 1] before the
    forward) from column seq_len - 1: the copy stays one slot a request
    whatever the context length, and the recorder rebuilds the whole rows
    from the rows it was given before (the request's prefill, recorded
    whole). Other modes give whole rows.
    """
    fb = forward_batch
    require_fields(fb, _FORWARD_BATCH_FIELDS, "ForwardBatch", "sglang")
    mode = forward_mode_name(fb.forward_mode)
    fields: Dict[str, Any] = dict(mode=mode, token_ids=fb.input_ids, positions=fb.positions,
                                  seq_lens=fb.seq_lens, req_pool_indices=fb.req_pool_indices,
                                  out_cache_loc=fb.out_cache_loc)
    if mode in ("extend", "mixed", "prefill") and getattr(fb, "extend_seq_lens", None) is not None:
        fields["extend_lens"] = fb.extend_seq_lens
    elif mode == "decode":  # one new token per request (batch_size and shapes are host values: no sync)
        n = getattr(fb, "batch_size", None)
        fields["extend_lens"] = np.ones(int(n if n is not None else len(fb.seq_lens)), dtype=np.int64)
    rids = getattr(fb, "rids", None)
    if rids:
        fields["request_ids"] = [str(r) for r in rids]
    seq_cpu = getattr(fb, "seq_lens_cpu", None)
    if req_to_token is not None and seq_cpu is not None and len(seq_cpu) > 0:
        n = len(seq_cpu)
        loc = fb.out_cache_loc
        if (page_deltas and getattr(fb.forward_mode, "name", "") == "DECODE" and loc is not None
                and tuple(getattr(loc, "shape", ())) == (n,)):
            starts = np.asarray(seq_cpu, dtype=np.int64) - 1
            fields["page_table"] = {"rows": loc.reshape(n, 1), "lengths": np.ones(n, dtype=np.int64),
                                    "starts": starts}
        else:
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
    fields["rng_seed"], fields["rng_offset"] = rng_state(fb.input_ids)
    return fields


def snapshot_tensors(fields: Dict[str, Any], kv_pool: Any = None) -> Dict[str, Any]:
    """The tensors of a step worth keeping in the ring (the step's inputs)."""
    snap = {k: fields[k] for k in ("token_ids", "positions", "seq_lens", "req_pool_indices", "out_cache_loc")
            if fields.get(k) is not None}
    pt = fields.get("page_table")
    if isinstance(pt, dict) and pt.get("starts") is None:  # whole rows (a decode step's delta rows are in the log)
        snap["req_to_token_rows"] = pt["rows"]
        if kv_pool is not None:
            slots = pt["rows"].reshape(-1)
            for attr in ("k_buffer", "v_buffer", "kv_buffer"):
                bufs = getattr(kv_pool, attr, None)
                if isinstance(bufs, (list, tuple)):
                    for layer, buf in enumerate(bufs):
                        snap[f"kv.{attr}.{layer}"] = buf[slots]
    return snap


def _resolved(server_args: Any) -> Any:
    """What sglang resolved the launch arguments to (0.5.2x keeps the raw
    arguments on the record and the resolution's declarations beside them);
    the record itself for older sglang or a plain object."""
    if getattr(server_args, "_resolved_overrides", None) is None:
        return server_args
    try:
        from sglang.srt.arg_groups.model_override_base import resolved_view  # type: ignore
    except Exception:
        return server_args
    return resolved_view(server_args)


def _fields(server_args: Any) -> Dict[str, Any]:
    view = _resolved(server_args)
    names = getattr(type(server_args), "__struct_fields__", None)
    if isinstance(names, tuple):
        return {n: getattr(view, n, None) for n in names if not n.startswith("_")}
    return _as_mapping(server_args)  # dataclass / namespace: no resolution layer


def _decode_graph_max_bs(fields: Dict[str, Any]) -> Optional[int]:
    """The largest decode batch sglang captures as a CUDA graph, 0 when decode
    graphs are off; None when the configuration does not say."""
    if fields.get("disable_cuda_graph") or fields.get("disable_decode_cuda_graph"):
        return 0
    cfg = fields.get("cuda_graph_config")
    decode = getattr(cfg, "decode", None) if cfg is not None else None
    if decode is not None:
        if str(getattr(decode, "backend", "")) == "disabled":
            return 0
        if getattr(decode, "max_bs", None) is not None:
            return int(decode.max_bs)
    for name in ("cuda_graph_max_bs_decode", "cuda_graph_max_bs"):
        if fields.get(name) is not None:
            return int(fields[name])
    return None


def _sglang_env_toggles() -> List[Tuple[str, Any]]:
    """Every kernel-relevant entry of sglang's envs registry with the value
    the engine reads (its default when unset), secrets excluded."""
    try:
        from sglang.srt.environ import EnvField, Envs, envs  # type: ignore
    except Exception:
        return []
    out = []
    for name, field in vars(Envs).items():
        if not isinstance(field, EnvField) or getattr(field, "secret", False) or not is_kernel_env(name):
            continue
        try:
            out.append((f"env.{name}", _toggle_value(getattr(envs, name).get())))
        except Exception:  # a lazily computed default that fails here
            continue
    return out


def server_args_toggles(server_args: Any, environ: Optional[Dict[str, str]] = None,
                        scheduler: Any = None) -> List[Tuple[str, Any]]:
    """Every ServerArgs field as sglang resolved it, plus kernel-relevant env
    switches (environ given: only those; else the process environment and
    sglang's envs registry), sglang's DeepGEMM decisions and the
    scheduler's runtime sizes."""
    fields = _fields(server_args)
    toggles = drop_secrets(config_to_toggles(fields))
    extra: List[Tuple[str, Any]] = [("sglang.page_table_unit", "token")]
    graph_max_bs = _decode_graph_max_bs(fields)
    if graph_max_bs is not None:  # the replay's name for the decode graph maximum
        extra.append(("cuda_graph_max_bs", graph_max_bs))
    for name in ("max_running_requests", "max_total_num_tokens", "max_prefill_tokens"):
        v = getattr(scheduler, name, None) if scheduler is not None else None
        if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
            extra.append((f"scheduler.{name}", int(v)))
    envs = env_toggles(environ) if environ is not None else merge_toggles(_sglang_env_toggles(), env_toggles())
    try:  # sglang's resolved DeepGEMM switches, when this version has the module
        from sglang.srt.layers.deep_gemm_wrapper import configurer  # type: ignore

        for name in ("ENABLE_JIT_DEEPGEMM", "DEEPGEMM_BLACKWELL", "DEEPGEMM_SCALE_UE8M0"):
            if hasattr(configurer, name):
                extra.append((f"deepgemm.{name}", bool(getattr(configurer, name))))
    except Exception:  # not importable here, or another layout
        pass
    return merge_toggles(toggles, envs, extra)


def model_info(model_config: Any, server_args: Any = None) -> Dict[str, Any]:
    """ModelConfigInfo fields from sglang's ModelConfig (hf_config inside)."""
    info = hf_model_info(getattr(model_config, "hf_config", None))
    if server_args is not None:
        server_args = _resolved(server_args)
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

    def __init__(self, recorder: Any, snapshot: bool = True, snapshot_kv: bool = False, fingerprints: bool = False,
                 tp_size: int = 1):
        self.recorder = recorder
        self.snapshot = snapshot
        self.snapshot_kv = snapshot_kv
        self.fingerprints = fingerprints
        self.tp_size = tp_size
        self.hooks: Optional[FingerprintHooks] = None
        self.step = 0
        self._lock = threading.Lock()

    def before_forward(self, runner: Any, forward_batch: Any) -> Tuple[int, str]:
        with self._lock:
            step = self.step
            self.step += 1
        pool = getattr(runner, "req_to_token_pool", None)
        # The KV snapshot gathers at every slot of the rows: whole rows then.
        fields = extract_step(forward_batch, getattr(pool, "req_to_token", None), page_deltas=not self.snapshot_kv)
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
        if self.fingerprints and getattr(runner, "model", None) is not None:
            self.hooks = FingerprintHooks(self.recorder)
            hooked = install_engine_boundaries(self.hooks, runner.model, self.tp_size)
            logger.info("crashreplay: fingerprints at %d boundaries (%s ...)", len(hooked), ", ".join(hooked[:4]))
        hooks = self.hooks
        flush = guarded(hooks.flush, "fingerprinting an sglang step") if hooks is not None else None

        def forward(*args, **kwargs):
            fb = kwargs.get("forward_batch", args[0] if args else None)
            got = record(runner, fb)
            step, mode = got if got else (None, "")
            if hooks is not None:
                hooks.step, hooks.mode = step, mode
            with adapter.recorder.failure_hook(step=step, stage=mode or "forward"):
                try:
                    out = orig(*args, **kwargs)
                except BaseException:
                    if flush is not None:
                        flush()  # the boundaries that ran, before the failure record
                    raise
            if flush is not None:
                flush()
            return out

        runner.forward = forward
        runner._crashreplay_adapter = self

    def record_weights(self, runner: Any) -> Optional[Dict[str, Any]]:
        model = getattr(runner, "model", None)
        if model is None or os.environ.get("CRASHREPLAY_HASH_WEIGHTS", "1") == "0":
            return None
        return self.recorder.record_weight_hashes(named_parameters(model))


# ---- installation ------------------------------------------------------
_ACTIVE: Dict[int, SGLangAdapter] = {}


def attach(scheduler: Any, session_dir: str, fingerprints: Optional[bool] = None,
           **recorder_options: Any) -> SGLangAdapter:
    """Starts recording one sglang Scheduler (call after its __init__).

    fingerprints: hook the model's modules at the replay's boundaries
    (crashreplay._fingerprint_hooks.install_engine_boundaries); default
    CRASHREPLAY_FINGERPRINTS=1, else off (docs/python.md: on a GPU each
    step's boundaries are copied to the host, one synchronisation a step,
    and CUDA-graph-replayed decode steps run no hooks).

    Raises on anything that prevents recording (install() turns that into a
    warning); a failure to hash the weights is only a warning: the step log
    is still recorded."""
    import sglang  # noqa: F401

    from crashreplay._recorder import Recorder

    version = _sglang_version()
    check_sglang_version(version)
    sa = scheduler.server_args
    parallel = scheduler_ranks(scheduler)
    runner = find_model_runner(scheduler)
    rec = Recorder(session_dir, engine="sglang", engine_version=version,
                   toggles=server_args_toggles(sa, scheduler=scheduler),
                   model=model_info(getattr(scheduler, "model_config", None), sa),
                   parallel=parallel, **recorder_options)
    if fingerprints is None:
        fingerprints = os.environ.get("CRASHREPLAY_FINGERPRINTS") == "1"
    adapter = SGLangAdapter(rec, snapshot_kv=os.environ.get("CRASHREPLAY_SNAPSHOT_KV") == "1",
                            fingerprints=fingerprints, tp_size=int(parallel.get("tp_size", 1) or 1))
    guarded(adapter.record_weights, "hashing sglang's weights")(runner)
    adapter.attach_runner(runner)
    scheduler._crashreplay_adapter = adapter
    _ACTIVE[id(scheduler)] = adapter
    return adapter


def _parallel_context() -> Any:
    try:
        from sglang.srt.runtime_context import get_parallel  # type: ignore
    except Exception:
        return None
    return get_parallel()


def scheduler_ranks(scheduler: Any) -> Dict[str, int]:
    """This scheduler's place in the parallel layout (ParallelLayout fields).

    Older sglang keeps tp_rank/pp_rank/dp_rank on the Scheduler; 0.5.2x
    reads them from the process's parallel context, published by the
    launcher (run_scheduler_process) before the Scheduler is built. A rank
    that can be found nowhere is an UnsupportedVersion: guessing 0 would make
    every rank write rank-00000.crcap.
    """
    sa = scheduler.server_args
    ctx = _parallel_context()

    def read(name: str, default: Any = None) -> Any:
        v = getattr(scheduler, name, None)
        if v is None and ctx is not None:
            try:
                v = getattr(ctx, name)
            except Exception:  # not published in this process
                v = None
        if v is None:
            v = getattr(sa, name, None) if name.endswith("_size") else None
        return default if v is None else v

    tp_size = int(read("tp_size", 1))
    tp_rank = read("tp_rank")
    if tp_rank is None:
        if tp_size == 1:
            tp_rank = 0
        else:
            raise UnsupportedVersion(
                "crashreplay.sglang: cannot tell this scheduler's tensor-parallel rank (no Scheduler.tp_rank, "
                "no published sglang parallel context); not recording rather than writing every rank as rank 0")
    pp_size, dp_size = int(read("pp_size", 1)), int(read("dp_size", 1))
    pp_rank, dp_rank = int(read("pp_rank", 0)), int(read("dp_rank", 0))
    tp_rank = int(tp_rank)
    return {"tp_size": tp_size, "tp_rank": tp_rank, "rank": tp_rank + tp_size * pp_rank + tp_size * pp_size * dp_rank,
            "world_size": tp_size * pp_size * dp_size, "pp_size": pp_size,
            "ep_size": int(read("ep_size", 1)), "dp_size": dp_size}


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
        # Attaching must never stop the server: any failure is a warning,
        # and this scheduler serves unrecorded.
        guarded(attach, "attaching to an sglang scheduler")(self, session_dir, coredumps=coredumps_from_env())

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
    """Entry point for sglang's plugin framework (group "sglang.srt.plugins").

    Never raises: sglang loads plugins in every process it starts, and a
    recorder that cannot install (an unsupported version) must not stop it."""
    guarded(install, "installing the sglang recorder")()


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
