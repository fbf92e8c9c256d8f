"""Asynchronous staging of CUDA tensors into pinned host memory.

Why: after a device fault (a device-side assert, an illegal address) the CUDA
context is unusable and device memory can no longer be read. So a step's
inputs are copied to host memory *before* the step's own kernels run, and
the crash path only writes what is already on the host (DESIGN decision 1).

How (CudaStager.stage, on the caller's thread, which never waits):
1. a side stream waits for the compute stream (so the inputs the step is
   about to read are complete) and copies every tensor into a pinned host
   buffer (non_blocking D2H);
2. on the same side stream a one-element "fence" is filled with the
   staging's sequence number and copied into pinned host memory; stream
   order makes the fence land after the data;
3. with order="before" (the default) the compute stream waits for the side
   stream's event, so the step's kernels start only after the copies: a
   fault in the step cannot race the copy of its inputs. order="concurrent"
   lets them overlap (cheaper, but a copy may then still be running when a
   kernel faults, and that snapshot is lost);
4. tensor.record_stream(side) keeps the caching allocator from reusing the
   source memory before the copy is done.
A background thread takes staged items in order, waits for each (event
synchronize; if that raises because the context is broken, it reads the
fence from pinned host memory, which needs no CUDA call), and hands the
pinned buffers to the recorder (the one memcpy into its ring) or, for step
records, calls record_step. Items whose fence never arrives are dropped and
counted (`dropped`).

This module needs torch with CUDA; it imports torch lazily. CI has no GPU:
python/tests/test_cuda_staging.py (staging order, a real device-side assert
in a child process) runs only on a GPU machine, from tests/gpu/run_all.sh,
and has not run yet.
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

_FENCE_WAIT_S = 2.0  # how long the failure path waits for a fence after a fault


class StagedItem:
    __slots__ = ("seq", "kind", "step", "payload", "event", "fence_slot")

    def __init__(self, seq, kind, step, payload, event, fence_slot):
        self.seq = seq
        self.kind = kind  # "snapshot" or "step"
        self.step = step
        self.payload = payload  # snapshot: {name: pinned tensor}; step: kwargs with pinned tensors
        self.event = event
        self.fence_slot = fence_slot


class CudaStager:
    """Copies CUDA tensors to pinned host memory off the caller's thread.

    deliver(kind, step, payload) is called on the stager's thread, in
    submission order, once the copies are complete.
    """

    def __init__(self, deliver: Callable[[str, int, Any], None], device: Any = None,
                 order: str = "before", fence_slots: int = 1024):
        import torch

        if order not in ("before", "concurrent"):
            raise ValueError("order must be 'before' or 'concurrent'")
        self._torch = torch
        self._device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        self._order = order
        self._deliver = deliver
        self._side = torch.cuda.Stream(device=self._device)
        # A ring of fence slots in pinned memory; slot i of sequence s holds s.
        self._fence_host = torch.full((fence_slots,), -1, dtype=torch.int64, pin_memory=True)
        self._fence_dev = torch.empty((fence_slots,), dtype=torch.int64, device=self._device)
        self._fence_slots = fence_slots
        self._seq = 0
        self._queue: "queue.Queue[Optional[StagedItem]]" = queue.Queue()
        self._pending = 0
        self._cv = threading.Condition()
        self.dropped = 0
        self.delivered = 0
        self.errors: List[str] = []
        self._thread = threading.Thread(target=self._run, name="crashreplay-cuda-staging", daemon=True)
        self._thread.start()

    # -- caller's thread -------------------------------------------------
    def _copy_on_side(self, tensors: Dict[str, Any]) -> Tuple[Dict[str, Any], Any, int]:
        torch = self._torch
        compute = torch.cuda.current_stream(self._device)
        side = self._side
        side.wait_stream(compute)
        pinned: Dict[str, Any] = {}
        with torch.cuda.stream(side):
            for name, t in tensors.items():
                src = t.detach()
                if not src.is_contiguous():
                    src = src.contiguous()  # allocated on the side stream, after the wait
                host = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
                host.copy_(src, non_blocking=True)
                t.record_stream(side)
                pinned[name] = host
            seq = self._seq
            self._seq += 1
            slot = seq % self._fence_slots
            self._fence_dev[slot].fill_(seq)
            self._fence_host[slot].copy_(self._fence_dev[slot], non_blocking=True)
            event = torch.cuda.Event()
            event.record(side)
        if self._order == "before":
            compute.wait_event(event)
        return pinned, event, seq

    def stage_snapshot(self, step: int, tensors: Dict[str, Any]) -> None:
        pinned, event, seq = self._copy_on_side(tensors)
        self._put(StagedItem(seq, "snapshot", step, pinned, event, seq % self._fence_slots))

    def stage_step(self, step: int, fields: Dict[str, Any]) -> None:
        """Stages the CUDA tensors among a record_step's keyword arguments."""
        device_fields = {k: v for k, v in fields.items() if _is_cuda(v)}
        pinned, event, seq = self._copy_on_side(device_fields) if device_fields else ({}, None, None)
        payload = dict(fields)
        payload.update(pinned)
        slot = None if seq is None else seq % self._fence_slots
        self._put(StagedItem(seq, "step", step, payload, event, slot))

    def pending(self) -> int:
        with self._cv:
            return self._pending

    def drain(self, timeout_s: float = 5.0) -> bool:
        """Waits until every staged item is delivered or dropped."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def close(self, timeout_s: float = 5.0) -> None:
        self.drain(timeout_s)
        self._queue.put(None)
        self._thread.join(timeout_s)

    def _put(self, item: StagedItem) -> None:
        with self._cv:
            self._pending += 1
        self._queue.put(item)

    # -- staging thread --------------------------------------------------
    def _complete(self, item: StagedItem) -> bool:
        if item.event is None:
            return True
        try:
            item.event.synchronize()
            return True
        except Exception as e:  # the context is broken: trust only the fence
            self.errors.append(f"{type(e).__name__}: {e}")
            deadline = time.monotonic() + _FENCE_WAIT_S
            while time.monotonic() < deadline:
                if int(self._fence_host[item.fence_slot]) >= item.seq:  # a reused slot holds a later seq
                    return True
                time.sleep(0.001)
            return False

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                if self._complete(item):
                    self._deliver(item.kind, item.step, item.payload)
                    self.delivered += 1
                else:
                    self.dropped += 1
            except Exception as e:  # never let the staging thread die
                self.errors.append(f"{type(e).__name__}: {e}")
                self.dropped += 1
            finally:
                with self._cv:
                    self._pending -= 1
                    self._cv.notify_all()


def _is_cuda(v: Any) -> bool:
    return getattr(v, "is_cuda", False) is True
