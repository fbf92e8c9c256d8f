"""crashreplay.Recorder: the Python face of the C++ flight recorder.

One Recorder per process (per rank) writes one capture file. Everything the
hot path receives is normalised here without copying where possible:
  * step-log vectors (lists, numpy arrays, torch CPU tensors) become
    contiguous int64/float32 numpy arrays (a conversion only when the dtype
    differs); the C++ side copies them into a queue slot;
  * snapshot tensors are borrowed through DLPack and copied once, by the
    recorder's memcpy into its ring, with the GIL released;
  * torch CUDA tensors (snapshots and step fields) go through
    crashreplay.cuda_staging: copied asynchronously into pinned host memory
    on a side stream queued before the step's own kernels; the staging
    thread hands them to the recorder when the copy is done.
Hashing, compression and disk I/O happen on the recorder's own threads.

Thread safety: like the C++ recorder, record_step/snapshot are meant for the
scheduler thread; on_failure, flush and stats may be called from any thread.
"""
from __future__ import annotations

import sys
import time
import warnings
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from crashreplay import _crashreplay
from crashreplay._manifest import build_manifest
from crashreplay._tensors import host_view, is_device_tensor, is_torch_tensor
from crashreplay.failure import FailureHook

_MODES = ("unknown", "prefill", "decode", "extend", "mixed", "idle")
_I64 = np.dtype(np.int64)
_F32 = np.dtype(np.float32)
_SAMPLING_KEYS = frozenset(("temperatures", "top_ps", "top_ks", "min_ps", "seeds"))


def _to_numpy(x: Any, dtype) -> Optional[np.ndarray]:
    """A contiguous 1-D numpy array of `dtype` for a host sequence, or None."""
    if x is None:
        return None
    if type(x) is np.ndarray and x.dtype is dtype and x.ndim == 1 and x.flags.c_contiguous:
        return x  # the common case, as it comes: nothing to do (dtype: _I64 or _F32)
    if is_torch_tensor(x):
        x = x.detach()
        if x.device.type != "cpu":
            raise ValueError("device tensors must be staged first (Recorder routes them through cuda_staging)")
        x = x.float().numpy() if str(x.dtype) == "torch.bfloat16" else x.numpy()
    a = np.asarray(x)
    if a.dtype != dtype:
        a = a.astype(dtype)
    return np.ascontiguousarray(a.reshape(-1))


def _page_table(page_table: Any) -> Tuple[Optional[np.ndarray], Optional[np.ndarray], Optional[np.ndarray]]:
    """CSR (offsets, slots, starts) from rows, an (offsets, slots[, starts])
    tuple, or a 2-D array; starts None: every row whole."""
    if page_table is None:
        return None, None, None
    if isinstance(page_table, tuple) and len(page_table) in (2, 3):
        starts = _to_numpy(page_table[2], _I64) if len(page_table) == 3 else None
        return _to_numpy(page_table[0], _I64), _to_numpy(page_table[1], _I64), starts
    if isinstance(page_table, np.ndarray) and page_table.ndim == 2:
        n, w = page_table.shape
        return (np.arange(0, (n + 1) * w, w, dtype=np.int64),
                np.ascontiguousarray(page_table, dtype=np.int64).reshape(-1), None)
    rows = [_to_numpy(r, _I64) for r in page_table]
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    if rows:
        offsets[1:] = np.cumsum([len(r) for r in rows])
        slots = np.concatenate(rows) if offsets[-1] else np.zeros(0, dtype=np.int64)
    else:
        slots = np.zeros(0, dtype=np.int64)
    return offsets, slots, None


def _trim_rows(rows: Any, lengths: Any) -> Tuple[np.ndarray, np.ndarray]:
    """CSR from a padded 2-D row block and each row's valid length."""
    r = _to_numpy_2d(rows)
    n = _to_numpy(lengths, _I64)
    if r.shape[0] != n.shape[0]:
        raise ValueError(f"page_table: {r.shape[0]} rows but {n.shape[0]} lengths")
    if n.size and int(n.max()) > r.shape[1]:
        raise ValueError(f"page_table: a length {int(n.max())} exceeds the row width {r.shape[1]}")
    offsets = np.zeros(n.shape[0] + 1, dtype=np.int64)
    np.cumsum(n, out=offsets[1:])
    mask = np.arange(r.shape[1])[None, :] < n[:, None]
    return offsets, np.ascontiguousarray(r[mask], dtype=np.int64)


def _to_numpy_2d(x: Any) -> np.ndarray:
    if is_torch_tensor(x):
        x = x.detach().numpy()
    a = np.asarray(x)
    if a.ndim != 2:
        raise ValueError(f"page_table rows must be 2-D, got shape {a.shape}")
    return a


def _sampling(sampling: Any) -> Tuple[Optional[np.ndarray], ...]:
    """(temperatures, top_ps, top_ks, min_ps, seeds, has_seed) arrays, each
    one entry per request or None, from a dict of sequences or a list of
    per-request dicts."""
    if sampling is None:
        return None, None, None, None, None, None
    if not isinstance(sampling, Mapping):  # list of per-request dicts
        rows = list(sampling)
        sampling = {"temperatures": [r.get("temperature", 1.0) for r in rows],
                    "top_ps": [r.get("top_p", 1.0) for r in rows], "top_ks": [r.get("top_k", -1) for r in rows],
                    "min_ps": [r.get("min_p", 0.0) for r in rows], "seeds": [r.get("seed") for r in rows]}
    if not _SAMPLING_KEYS.issuperset(sampling):
        unknown = sorted(set(sampling) - _SAMPLING_KEYS)
        raise ValueError(f"sampling: unknown keys {unknown}; use temperatures, top_ps, top_ks, min_ps, seeds")
    get = sampling.get
    seeds, has_seed = get("seeds"), None
    if seeds is not None:
        if is_torch_tensor(seeds) or isinstance(seeds, np.ndarray):
            seeds = _to_numpy(seeds, _I64)
            has_seed = np.ones(seeds.shape[0], dtype=np.uint8)
        else:
            seeds = list(seeds)
            has_seed = np.array([s is not None for s in seeds], dtype=np.uint8)
            seeds = np.array([0 if s is None else int(s) for s in seeds], dtype=np.int64)
    return (_to_numpy(get("temperatures"), _F32), _to_numpy(get("top_ps"), _F32), _to_numpy(get("top_ks"), _I64),
            _to_numpy(get("min_ps"), _F32), seeds, has_seed)


def _host_only(values: Iterable[Any]) -> bool:
    """True when no value (nor a dict's value) is a device tensor."""
    for v in values:
        if v is None or type(v) is np.ndarray:
            continue
        if isinstance(v, Mapping):
            if not _host_only(v.values()):
                return False
        elif is_device_tensor(v):
            return False
    return True


def _host_copy(name: str, t: Any) -> Any:
    """A device tensor's host copy (torch: .detach().cpu(), a synchronisation); host tensors as they are."""
    if not is_device_tensor(t):
        return t
    if not hasattr(t, "cpu"):
        raise ValueError(f"fingerprint {name}: a device tensor without .cpu(); pass a host copy")
    return t.detach().cpu() if hasattr(t, "detach") else t.cpu()


def _named(tensors: Mapping[str, Any]) -> List[Tuple[str, Any, str]]:
    out = []
    for name, t in tensors.items():
        arr, dtype = host_view(t)
        out.append((str(name), arr, dtype))
    return out


class Recorder:
    """Records one rank's session into SESSION_DIR/rank-NNNNN.crcap (or a file).

    target: a session directory, or a file path ending in ".crcap".
    engine, engine_version, config (dict/dataclass/Namespace -> typed
    toggles), toggles (extra (name, value) pairs), model (ModelConfigInfo
    fields), device ("auto", or DeviceInfo fields), parallel
    (ParallelLayout fields: tp_size, tp_rank, world_size, rank, ...).
    Options: snapshot_ring_bytes, max_snapshots, install_signal_handlers,
    write_snapshots_on_close, overwrite, weight_check_budget,
    weight_check_bytes_per_step, zstd_level, step_queue_slots, ...
    cuda_order: "before" (the step's kernels wait for the snapshot copies)
    or "concurrent" (see crashreplay.cuda_staging).
    coredumps: arm lightweight GPU core dumps for this process, written
    beside the capture and named by the failure record (docs/capture.md,
    "GPU core dumps"); the manifest says what was armed ("env" before CUDA
    is initialised, else "driver_api"; "failed" with the reason, e.g. no
    driver). Off by default: its cost on the serving path is not measured
    on a GPU yet. coredump_method ("auto", "env", "driver_api") forces one.
    """

    def __init__(self, target: str, *, engine: str, engine_version: str = "", config: Any = None,
                 toggles: Optional[Iterable[Tuple[str, Any]]] = None, model: Optional[Dict[str, Any]] = None,
                 device: Any = "auto", parallel: Optional[Dict[str, Any]] = None,
                 session_id: Optional[str] = None, features: Iterable[str] = (),
                 cuda_order: str = "before", coredumps: bool = False, **options: Any):
        manifest = build_manifest(engine=engine, engine_version=engine_version, config=config, toggles=toggles,
                                  model=model, device=device, parallel=parallel, session_id=session_id,
                                  features=features)
        opts = dict(options)
        opts["arm_coredumps"] = bool(coredumps)
        if str(target).endswith(".crcap"):
            opts["path"] = str(target)
        else:
            opts["session_dir"] = str(target)
        self._rank = int(manifest["parallel"].get("rank", 0))
        self._impl = _crashreplay.Recorder(manifest, opts)
        self._cuda_order = cuda_order
        self._stager = None
        self.current_step: Optional[int] = None
        self.current_stage: str = ""
        self._host_weights: List[Any] = []
        # Called by on_failure before the failure record, so that what is
        # held elsewhere (the device fingerprint tables) reaches the file
        # first; each is guarded: a failing callback never hides the failure.
        self._before_failure: List[Any] = []
        self._before_close: List[Any] = []  # the same for close()

    # -- properties ------------------------------------------------------
    @property
    def path(self) -> str:
        return self._impl.path

    @property
    def closed(self) -> bool:
        return self._impl.closed

    @property
    def rank(self) -> int:
        return self._rank

    def stats(self) -> Dict[str, int]:
        s = self._impl.stats()
        if self._stager is not None:
            s["cuda_staged_pending"] = self._stager.pending()
            s["cuda_staged_dropped"] = self._stager.dropped
        return s

    # -- hot path --------------------------------------------------------
    def record_step(self, step: int, *, mode: str = "unknown", request_ids: Sequence[str] = (),
                    token_ids: Any = None, positions: Any = None, seq_lens: Any = None, extend_lens: Any = None,
                    req_pool_indices: Any = None, page_table: Any = None, out_cache_loc: Any = None,
                    sampling: Any = None, rng_seed: int = 0, rng_offset: int = 0, output_token_ids: Any = None,
                    digests: Optional[Mapping[str, Union[int, str]]] = None, timestamp_nanos: int = 0) -> None:
        """Appends one step of this rank to the step log (never touches the disk).

        Per-token vectors: token_ids, positions, out_cache_loc. Per-request:
        request_ids, seq_lens, extend_lens, req_pool_indices, page_table
        (one row of KV slots per request: a list of rows, a 2-D array,
        CSR (offsets, slots), or {"rows": padded 2-D, "lengths": per row};
        with "starts" (or a third CSR array) a row holds its columns from
        starts[i] on, the columns before being those of the last row given
        for the same req_pool_index: a decode step passes one new slot a
        request, and the cost stays flat as context grows), sampling ({temperatures, top_ps, top_ks,
        min_ps, seeds} or a list of per-request dicts). digests: name ->
        uint64 or 32-hex hash. CUDA tensors are staged asynchronously.

        When the disk fails (full, a file-size limit, EIO) or stalls, this
        raises crashreplay.Error once, on the first step after it (the step
        itself is held in memory, not lost); every later call returns
        normally and the recorder counts what it holds or drops (stats():
        write_errors, steps_held, steps_dropped). docs/capture.md, "Disk
        full and slow disks".
        """
        if mode not in _MODES:
            raise ValueError(f"mode '{mode}' is not one of {', '.join(_MODES)}")
        self.current_step = step
        self.current_stage = mode
        unstaged = self._stager is None or not self._stager.pending()
        # Host buffers of the exact types (int64, float32), as numpy gives
        # them: taken as they are, in one call (no conversion here, no DLPack
        # capsule there). Anything else comes back False, nothing recorded.
        if unstaged and self._impl._record_step_fast(
                step, mode, request_ids, token_ids, positions, seq_lens, extend_lens, req_pool_indices,
                page_table, out_cache_loc, sampling, rng_seed, rng_offset, output_token_ids, digests,
                timestamp_nanos):
            return
        timestamp_nanos = int(timestamp_nanos) or time.time_ns()
        if unstaged and _host_only(
                (token_ids, positions, seq_lens, extend_lens, req_pool_indices, out_cache_loc, output_token_ids,
                 page_table if isinstance(page_table, Mapping) else None, sampling)):
            # Host memory only, nothing staged ahead of it: straight to the
            # C++ recorder (request ids are read there, str() where needed).
            self._record_host_step(
                step, mode=mode, request_ids=request_ids, token_ids=token_ids, positions=positions,
                seq_lens=seq_lens, extend_lens=extend_lens, req_pool_indices=req_pool_indices, page_table=page_table,
                out_cache_loc=out_cache_loc, sampling=sampling, rng_seed=int(rng_seed), rng_offset=int(rng_offset),
                output_token_ids=output_token_ids, digests=digests or {}, timestamp_nanos=timestamp_nanos)
            return
        fields = dict(token_ids=token_ids, positions=positions, seq_lens=seq_lens, extend_lens=extend_lens,
                      req_pool_indices=req_pool_indices, out_cache_loc=out_cache_loc,
                      output_token_ids=output_token_ids)
        # Tensor-valued parts of page_table/sampling become top-level fields,
        # so CUDA staging sees every device tensor; _record_host_step
        # reassembles them.
        if isinstance(page_table, Mapping):
            fields["_pt_rows"] = page_table["rows"]
            fields["_pt_lengths"] = page_table["lengths"]
            if page_table.get("starts") is not None:
                fields["_pt_starts"] = page_table["starts"]
            page_table = "padded"
        if isinstance(sampling, Mapping):
            for k, v in sampling.items():
                fields["_s_" + k] = v
            sampling = "fields"
        # Copied now: the step is recorded later, from the staging thread.
        common = dict(mode=mode, request_ids=[str(r) for r in request_ids], page_table=page_table,
                      sampling=sampling, rng_seed=int(rng_seed), rng_offset=int(rng_offset),
                      digests=dict(digests or {}), timestamp_nanos=timestamp_nanos)
        # Keep step order: once anything is staged, later steps queue behind it.
        self._ensure_stager().stage_step(step, {**fields, **common})

    def _record_host_step(self, step: int, *, mode, request_ids, token_ids, positions, seq_lens, extend_lens,
                          req_pool_indices, page_table, out_cache_loc, sampling, rng_seed, rng_offset,
                          output_token_ids, digests, timestamp_nanos, **parts) -> None:
        if isinstance(page_table, str):  # "padded": rows cut to their lengths
            starts = parts.pop("_pt_starts", None)
            page_table = _trim_rows(parts.pop("_pt_rows"), parts.pop("_pt_lengths")) + (starts,)
        elif isinstance(page_table, Mapping):
            page_table = _trim_rows(page_table["rows"], page_table["lengths"]) + (page_table.get("starts"),)
        if isinstance(sampling, str):  # "fields": the sampling dict, flattened
            sampling = {k[3:]: parts.pop(k) for k in list(parts) if k.startswith("_s_")}
        if parts:
            raise ValueError(f"record_step: unexpected fields {sorted(parts)}")
        offsets, slots, starts = _page_table(page_table)
        temperatures, top_ps, top_ks, min_ps, seeds, has_seed = _sampling(sampling)
        self._impl.record_step(
            step, mode, request_ids,
            _to_numpy(token_ids, _I64), _to_numpy(positions, _I64), _to_numpy(seq_lens, _I64),
            _to_numpy(extend_lens, _I64), _to_numpy(req_pool_indices, _I64), offsets, slots,
            _to_numpy(out_cache_loc, _I64), temperatures, top_ps, top_ks, min_ps, seeds, has_seed,
            rng_seed, rng_offset, _to_numpy(output_token_ids, _I64), sorted(digests.items()) if digests else [],
            timestamp_nanos, starts)

    def snapshot(self, step: int, tensors: Mapping[str, Any]) -> None:
        """Submits the step's input tensors to the snapshot ring.

        Host tensors (numpy, torch CPU, any DLPack host tensor) are copied
        into the ring now (one memcpy, GIL released). torch CUDA tensors are
        staged asynchronously (see crashreplay.cuda_staging) and reach the
        ring from the staging thread; call this before launching the step.
        """
        self.current_step = step
        host = {k: v for k, v in tensors.items() if not is_device_tensor(v)}
        device = {k: v for k, v in tensors.items() if is_device_tensor(v)}
        if host:
            self._impl.submit_snapshot(step, _named(host))
        if device:
            self._ensure_stager().stage_snapshot(step, device)

    def fingerprint(self, name: str, tensor: Any, step: Optional[int] = None) -> None:
        """Records the fixed-size summary of `tensor` at boundary `name`.

        name: a boundary name ("L3.attention", "L3.mlp", "lm_head"; see
        docs/replay.md "Boundaries") so the replay lines it up with its own.
        The summary (element count, NaN/+Inf/-Inf counts, min, max, max |x|,
        fp64 sum and sum of squares, the first non-finite element's (token,
        column) over the last dimension, an integer tensor's range and hash)
        is computed now, on this thread, from any host DLPack tensor (numpy,
        torch CPU; bf16, fp16, fp32, fp8, int32/int64), or a torch CUDA
        tensor through a host copy (a synchronisation; the engine hooks use
        the zero-copy device path, crashreplay.DeviceFingerprints). The step's
        fingerprints are written when the next step's first one arrives, at
        close(), or by on_failure() (then marked incomplete: the last one is
        the last boundary that ran). step defaults to the step last given to
        record_step()/snapshot(). A device tensor that cannot copy itself to
        the host (no .cpu()) is refused with ValueError.
        """
        step = self.current_step if step is None else step
        if step is None:
            raise ValueError("fingerprint: no step given and none recorded yet")
        (entry,) = _named({name: _host_copy(name, tensor)})
        self._impl.fingerprint(step, str(name), entry)

    def fingerprints(self, tensors: Any, step: Optional[int] = None) -> None:
        """fingerprint() for several boundaries of one step in one call.

        tensors: a mapping or a sequence of (name, tensor) pairs, in the
        order the boundaries ran. Costs one call into the recorder instead
        of one a boundary (a call, not the summary, is most of the cost of a
        decode step's small tensors: bench/fingerprint_bench.py).
        """
        step = self.current_step if step is None else step
        if step is None:
            raise ValueError("fingerprints: no step given and none recorded yet")
        items = list(tensors.items()) if isinstance(tensors, Mapping) else list(tensors)
        entries = []
        for name, t in items:
            arr, dtype = host_view(_host_copy(name, t))
            entries.append((str(name), arr, dtype))
        self._impl.fingerprints(step, entries)

    # -- weights ---------------------------------------------------------
    def record_weight_hashes(self, tensors: Mapping[str, Any], rank: Optional[int] = None,
                             threads: int = 0) -> Dict[str, Any]:
        """Hashes this rank's weights (XXH3-128 per tensor + root) and records them.

        Host tensors are hashed in parallel in C++. CUDA tensors are copied
        to host one at a time (a one-off cost at load) and hashed there.
        Returns {rank, root, tensors: {name: {hash, byte_size}}}.
        """
        rank = self._rank if rank is None else rank
        host = {k: v for k, v in tensors.items() if not is_device_tensor(v)}
        entries: List[Tuple[str, str, int]] = []
        if host:
            h = _crashreplay.hash_tensors(rank, _named(host), threads)
            entries += [(n, e["hash"], e["byte_size"]) for n, e in h["tensors"].items()]
        for name, t in tensors.items():
            if is_device_tensor(t):
                one = _crashreplay.hash_tensors(rank, _named({name: t.detach().cpu()}), 1)
                e = one["tensors"][name]
                entries.append((name, e["hash"], e["byte_size"]))
        return self._impl.record_weight_hashes(rank, entries)

    def register_weights(self, tensors: Mapping[str, Any]) -> None:
        """Registers weights for the per-step integrity check.

        The recorder re-hashes a rotating slice of them after every step, so
        the buffers stay referenced (and must not be freed or moved) until
        close(). Host tensors are hashed on the CPU with XXH3-128; CUDA
        tensors are handed to the C++ recorder's device path (chunked hash
        on the GPU; a build without CUDA, such as `pip install .`, refuses
        them with crashreplay.Error "Unimplemented").
        """
        host = {k: v for k, v in tensors.items() if not is_device_tensor(v)}
        device = {k: v for k, v in tensors.items() if is_device_tensor(v)}
        if host:
            named = _named(host)
            self._impl.register_weights(named)
            self._host_weights.extend(t for _, t, _ in named)
        if device:
            named = [(str(k), v.detach() if is_torch_tensor(v) else v, "") for k, v in device.items()]
            for name, t, _ in named:
                if is_torch_tensor(t) and not t.is_contiguous():
                    raise ValueError(f"device weight {name!r} is not contiguous; the recorder hashes it in place")
            self._impl.register_device_weights(named)
            self._host_weights.extend(t for _, t, _ in named)

    # -- failure and shutdown -------------------------------------------
    def failure_hook(self, step: Optional[int] = None, stage: str = "") -> FailureHook:
        """Context manager / decorator recording an escaping exception (re-raised)."""
        return FailureHook(self, step=step, stage=stage)

    def on_failure(self, reason: str, *, stage: str = "", step: Optional[int] = None,
                   failure_class: str = "exception", exception_type: str = "", backtrace: str = "",
                   staging_timeout_s: float = 5.0) -> None:
        """Writes the snapshot ring and a FailureRecord, and fsyncs.

        Staged CUDA copies that complete within staging_timeout_s are written
        first (after a device fault their completion is read from a pinned
        host fence, without CUDA calls).
        """
        if self._stager is not None:
            self._stager.drain(staging_timeout_s)
        for callback in list(self._before_failure):
            try:
                callback()
            except Exception as e:  # the failure record matters more
                warnings.warn(f"crashreplay: before the failure record: {type(e).__name__}: {e}", RuntimeWarning)
        self._impl.on_failure(reason, stage, step, failure_class, exception_type, backtrace)

    def flush(self) -> None:
        """Waits until every accepted step is in the file (staged ones too)."""
        if self._stager is not None:
            self._stager.drain()
        self._impl.flush()

    def close(self) -> Optional[str]:
        """Drains, writes the index and end record (ok=true). Idempotent.

        Returns None when everything reached the file. After a disk error
        (disk full, file-size limit, EIO) that never cleared, it warns once
        (RuntimeWarning) and returns the recorder's report of what could
        not be written (held steps, dropped steps, ring, failure record,
        end record) instead of raising: the file keeps its intact prefix,
        readable as a capture that was not closed cleanly.
        """
        if self._stager is not None:
            self._stager.close()
        for callback in list(self._before_close):
            try:
                callback()
            except Exception as e:  # what is held must not stop the close
                warnings.warn(f"crashreplay: before closing: {type(e).__name__}: {e}", RuntimeWarning)
        report = self._impl.close()
        self._host_weights.clear()
        if report:
            warnings.warn(f"crashreplay: {report}", RuntimeWarning, stacklevel=2)
        return report

    def __enter__(self) -> "Recorder":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is not None and isinstance(exc, Exception) and not self.closed:
            FailureHook(self).record(exc, tb)
        self.close()
        return False

    # -- CUDA staging ----------------------------------------------------
    def _ensure_stager(self):
        if self._stager is None:
            if "torch" not in sys.modules:
                raise ValueError("device tensors need torch (CUDA staging); import torch first")
            from crashreplay.cuda_staging import CudaStager

            self._stager = CudaStager(self._deliver_staged, order=self._cuda_order)
        return self._stager

    def _deliver_staged(self, kind: str, step: int, payload: Any) -> None:
        if kind == "snapshot":
            self._impl.submit_snapshot(step, _named(payload))
        else:
            self._record_host_step(step, **payload)
