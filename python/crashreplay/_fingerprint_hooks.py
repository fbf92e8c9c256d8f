"""Forward hooks that fingerprint a torch model's modules at named boundaries.

Shared by crashreplay.transformers, crashreplay.sglang and crashreplay.vllm.
A hook only notes the module's output and the tensor's version counter
(each torch call in a hook costs microseconds: the module's kernels have
just pushed the interpreter out of the caches); flush() summarises the
noted tensors of a step in one Recorder.fingerprints() call. An output a
later module changed in place (its version moved) is dropped for that step
and summarised at once, inside its hook, from then on: a stale value is
never recorded.

CUDA tensors take the device path (DeviceSteps): inside the hook, our
summary kernel is queued on the module's stream behind its kernels and
writes the record into pinned host memory mapped into the device - no copy,
no synchronisation, and the records survive a sticky CUDA error (a
device-side assert, an illegal address): Recorder.on_failure writes the
failing step's boundaries that ran, marked incomplete, before the failure
record. Where no table can be made (no device, a build without the CUDA
backend) or for a dtype our kernel does not decode, device tensors are
copied to the host at flush (one synchronisation a step), as before.

Boundary names are the replay's (docs/replay.md "Boundaries"). Nothing here
imports an engine; torch is imported by whoever builds the model.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, List, Optional, Tuple

logger = logging.getLogger("crashreplay")


def first_tensor(x: Any) -> Any:
    """The first tensor of a module's output (a tensor, a tuple, a ModelOutput)."""
    if isinstance(x, _tensor_type()):  # not hasattr(x, "_version"): an inference tensor raises there
        return x
    if isinstance(x, (tuple, list)):
        for v in x:
            t = first_tensor(v)
            if t is not None:
                return t
        return None
    if hasattr(x, "to_tuple"):
        return first_tensor(x.to_tuple())
    return None


class FingerprintHooks:
    """The hooks on one model. Set `step` (and `mode`) before each forward."""

    def __init__(self, recorder: Any, device: str = "auto", max_boundaries: int = 4096,
                 wrap_forward: bool = False) -> None:
        """device: "auto" (CUDA tensors take the device path when a table
        can be made, else host copies), "host" (always host copies).

        wrap_forward: put a wrapper of the module's forward on the instance
        instead of registering torch hooks. torch's module call leaves its
        fast path for a module with any hook (~0.9 us a call in a tight
        loop, several in a model whose kernels have just run); a wrapped
        forward keeps it (~0.1 us). For plain torch modules (transformers);
        not for the engines, whose CustomOp dispatch and torch.compile look
        at a module's forward."""
        if device not in ("auto", "host"):
            raise ValueError("device must be 'auto' or 'host'")
        self.rec = recorder
        self._wrap_forward = wrap_forward
        self._device_mode = device
        self._max_boundaries = max_boundaries
        self.device: Optional[DeviceSteps] = None  # made at the first CUDA tensor
        self.step: Optional[int] = None
        self.mode = ""
        self.names: List[str] = []  # boundaries hooked, in install order
        self._handles: List[Any] = []
        self._pending: List[Tuple[str, Any, int, Optional[Callable], int]] = []
        self._now: set = set()
        self._dropped: set = set()
        self._slow: set = set()  # _now | _dropped: boundaries the wrappers' fast path leaves to the hook

    # -- installing ------------------------------------------------------
    def output(self, module: Any, name: str, pick: Optional[Callable[[Any], Any]] = None,
               rows: Optional[Callable[[Any], Any]] = None, when: Optional[Callable[[], bool]] = None,
               flush: bool = False) -> None:
        """Fingerprints module's output (pick(output), else its first tensor) at `name`.

        rows: maps the tensor to the boundary's rows (e.g. each sequence's
        last token), applied at flush; when: a condition checked in the hook;
        flush: summarise the step right after this boundary (the step's last).
        """
        def hook(mod: Any, args: tuple, out: Any) -> None:
            if name in self._dropped or not (when is None or when()):
                return
            try:
                self._note(name, pick(out) if pick is not None else first_tensor(out), rows)
                if flush:
                    self.flush()
            except Exception as e:  # noqa: BLE001 - a recording bug must not stop the model
                self._drop(name, e)
        if self._wrap_forward:
            inner = module.forward
            tensor = _tensor_type()
            note = self._fast_note(name, rows)

            if when is None and pick is None and not flush:
                def forward(*args: Any, **kwargs: Any) -> Any:
                    out = inner(*args, **kwargs)
                    # The common case in this frame: a host tensor (or a tuple's
                    # first) noted for the step's summary; anything else, the hook.
                    t = out if type(out) is tensor else (
                        out[0] if type(out) is tuple and out and type(out[0]) is tensor else None)
                    if t is None or not note(t):
                        hook(module, args, out)
                    return out
            else:
                def forward(*args: Any, **kwargs: Any) -> Any:
                    out = inner(*args, **kwargs)
                    hook(module, args, out)
                    return out
            self._handles.append(_Wrapped(module, inner, forward))
        else:
            self._handles.append(module.register_forward_hook(hook))
        self.names.append(name)

    def input(self, module: Any, name: str) -> None:
        """Fingerprints module's first positional input at `name`."""
        def hook(mod: Any, args: tuple) -> None:
            if name in self._dropped:
                return
            try:
                self._note(name, args[0] if args else None, None)
            except Exception as e:  # noqa: BLE001 - a recording bug must not stop the model
                self._drop(name, e)
        if self._wrap_forward:
            inner = module.forward
            tensor = _tensor_type()
            note = self._fast_note(name, None)

            def forward(*args: Any, **kwargs: Any) -> Any:
                if not (args and type(args[0]) is tensor and note(args[0])):
                    hook(module, args)
                return inner(*args, **kwargs)
            self._handles.append(_Wrapped(module, inner, forward))
        else:
            self._handles.append(module.register_forward_pre_hook(hook))
        self.names.append(name)

    def capture(self, router: Any, name: str) -> None:
        """Fingerprints the tensor an engine hands its capture callback at
        `name`: vLLM's MoE routers call `set_capture_fn`'s function with the
        logical top-k ids (before EPLB's mapping) inside the forward. Guarded
        as the hooks are; remove() unsets it."""
        def note(ids: Any) -> None:
            if name in self._dropped:
                return
            try:
                self._note(name, ids, None)
            except Exception as e:  # noqa: BLE001 - a recording bug must not stop the model
                self._drop(name, e)
        router.set_capture_fn(note)
        self._handles.append(_Unset(router))
        self.names.append(name)

    def _fast_note(self, name: str, rows: Optional[Callable]) -> Callable[[Any], bool]:
        """What a wrapped forward calls with its tensor: notes a host tensor
        of a step for the step's summary, as _note does, and says True; False
        (nothing done) for what _note decides otherwise - no step, a CUDA
        tensor, a boundary summarised at once or dropped, a tensor without a
        version counter (inference mode) - so that the hook takes it. One
        call a boundary: in a model whose kernels have just evicted the
        interpreter's data, each Python call costs microseconds
        (bench/fingerprint_bench.py; docs/replay.md)."""
        pending, slow = self._pending, self._slow

        def note(t: Any) -> bool:
            step = self.step
            if step is None or t.is_cuda or name in slow:
                return False
            try:
                version = t._version
            except RuntimeError:  # an inference tensor: the hook's path says so
                return False
            pending.append((name, t, version, rows, step))
            return True
        return note

    def _drop(self, name: str, e: Exception) -> None:
        """A boundary whose hook failed is not fingerprinted again (warned once)."""
        self._dropped.add(name)
        self._slow.add(name)
        logger.warning("crashreplay: fingerprint %s failed (%s: %s); that boundary is no longer recorded",
                       name, type(e).__name__, e)

    def remove(self) -> None:
        for h in reversed(self._handles):  # wrappers of one module unwind in order
            h.remove()
        self._handles.clear()
        if self.device is not None:
            self.device.detach()

    # -- recording -------------------------------------------------------
    def _note(self, name: str, t: Any, rows: Optional[Callable]) -> None:
        if t is None or self.step is None:
            return
        if t.is_cuda and self._device_mode == "auto" and self._on_device(name, t, rows):
            return
        if name in self._now:
            self._summarise_now(name, t, rows)
            return
        try:
            version = t._version
        except RuntimeError:
            # An inference tensor (torch.inference_mode: vLLM's workers, sglang
            # with SGLANG_ENABLE_TORCH_INFERENCE_MODE) has no version counter,
            # so a later in-place change could not be told: summarised now.
            self._summarise_now(name, t, rows)
            return
        self._pending.append((name, t, version, rows, self.step))

    def _summarise_now(self, name: str, t: Any, rows: Optional[Callable]) -> None:
        """t's summary now, after those noted before it (the step's records
        stay in the engine's order, which the replay's comparison follows)."""
        if self._pending:
            self._summarise_pending()
        self.rec.fingerprint(name, self._host(t, rows), step=self.step)

    def _on_device(self, name: str, t: Any, rows: Optional[Callable]) -> bool:
        """Queues t's summary on the device; False: take the host path."""
        if self.device is None:
            self.device = DeviceSteps.make(self.rec, self._max_boundaries)
            if self.device is None:
                self._device_mode = "host"
                return False
        return self.device.enqueue(self.step, name, t, rows)

    @staticmethod
    def _host(t: Any, rows: Optional[Callable]) -> Any:
        if rows is not None:
            t = rows(t)
        if t.requires_grad:
            t = t.detach()
        if t.device.type != "cpu":
            return t.contiguous().cpu()
        return t if t.is_contiguous() else t.contiguous()

    def flush(self) -> None:
        """Summarises the noted boundaries (of the steps they were noted in).

        Tensors go to the recorder by address (Recorder._impl._fingerprints_at,
        this module's own call: no DLPack round trip, ~4 us a tensor), held
        here until the call returns; a dtype it has no name for goes through
        Recorder.fingerprints, which says what is wrong with it.
        """
        if self.device is not None:
            self.device.end_step()
        self._summarise_pending()

    def _summarise_pending(self) -> None:
        pending = self._pending[:]  # the wrappers hold this list: emptied in place
        del self._pending[:]
        batch: List[Tuple[str, int, int, str, int]] = []
        held: List[Any] = []
        step = None
        names = _dtype_names()
        for name, t, version, rows, s in pending:
            if s != step and batch:
                self._send(batch, step)
                batch, held = [], []
            step = s
            if t._version != version:
                self._now.add(name)
                self._slow.add(name)
                continue
            h = self._host(t, rows)
            dtype = names.get(h.dtype)
            if dtype is None:  # named (or refused) by Recorder.fingerprints, after those before it
                if batch:
                    self._send(batch, step)
                    batch, held = [], []
                self.rec.fingerprints([(name, h)], step=s)
                continue
            held.append(h)
            batch.append((name, h.data_ptr(), h.numel(), dtype, h.shape[-1] if h.dim() and h.shape[-1] else 1))
        if batch:
            self._send(batch, step)

    def _send(self, batch: List[Tuple[str, int, int, str, int]], step: Optional[int]) -> None:
        self.rec._impl._fingerprints_at(step, batch)


class DeviceSteps:
    """The device path: two DeviceFingerprints tables used on alternate steps.

    A step's records are read when the step after next begins (its table is
    needed again), once the event recorded at its end has completed - by
    then it long has, so the engine's stream is never waited on in practice,
    and a record is never read while its step's kernels may still write it.
    After a fault, Recorder.on_failure calls failed(): both tables are read
    without a CUDA call (the failing step's record is incomplete; the step
    before it is complete if all its boundaries' kernels ran).

    Not under CUDA-graph capture: a hook that runs while its stream is being
    captured queues nothing (a graph-replayed step has no hooks either).
    """

    def __init__(self, recorder: Any, tables: List[Any], torch: Any) -> None:
        self.rec = recorder
        self.tables = tables
        self.torch = torch
        self.steps: List[Optional[int]] = [None, None]  # the step each table holds, until written
        self.noted = [0, 0]  # summaries queued into each table's step
        self.events: List[Any] = [None, None]
        self.cur = 1
        self.writes = 0  # records written (tests, stats)
        recorder._before_failure.append(self.failed)
        recorder._before_close.append(self.flush)

    @staticmethod
    def make(recorder: Any, max_boundaries: int) -> Optional["DeviceSteps"]:
        """Two tables, or None (logged once) where none can be made."""
        try:
            import torch

            from crashreplay._crashreplay import DeviceFingerprints

            tables = [DeviceFingerprints(max_boundaries), DeviceFingerprints(max_boundaries)]
        except Exception as e:  # noqa: BLE001 - no device, no CUDA backend: host copies
            logger.info("crashreplay: device fingerprints unavailable (%s); CUDA tensors are copied to the host", e)
            return None
        return DeviceSteps(recorder, tables, torch)

    def enqueue(self, step: int, name: str, t: Any, rows: Optional[Callable]) -> bool:
        dtype = _DEVICE_DTYPES.get(_dtype_names().get(t.dtype))
        if dtype is None:
            return False  # fp8 e8m0, int8, fp64 ...: the host path
        cuda = self.torch.cuda
        if cuda.is_current_stream_capturing():
            return True  # a graph being captured: nothing queued (see the class)
        stream = cuda.current_stream(t.device)
        if self.steps[self.cur] != step:
            self._begin(step, stream)
        if rows is not None:
            t = rows(t)
        if not t.is_contiguous():
            t = t.contiguous()
        cols = t.shape[-1] if t.dim() and t.shape[-1] else 1
        self.tables[self.cur].enqueue(name, t.data_ptr(), t.numel(), dtype, cols, stream.cuda_stream)
        self.noted[self.cur] += 1
        return True

    def _begin(self, step: int, stream: Any) -> None:
        nxt = self.cur ^ 1
        self._write(nxt, wait=True)
        self.tables[nxt].begin_step(step, stream.cuda_stream)
        self.cur = nxt
        self.steps[nxt], self.noted[nxt], self.events[nxt] = step, 0, None

    def end_step(self) -> None:
        """Marks the end of the current step's work on its stream."""
        if self.steps[self.cur] is not None and self.events[self.cur] is None:
            ev = self.torch.cuda.Event()
            ev.record()
            self.events[self.cur] = ev

    def _write(self, i: int, wait: bool) -> None:
        if self.steps[i] is None:
            return
        if wait and self.events[i] is not None:
            self.events[i].synchronize()
        noted = self.noted[i] if (not wait or self.events[i] is not None) else -1
        step, self.steps[i] = self.steps[i], None
        if self.tables[i].write(self.rec._impl, noted, step):
            self.writes += 1

    def flush(self) -> None:
        """Writes every step held (synchronises: close, tests)."""
        self.end_step()
        for i in (self.cur ^ 1, self.cur):
            self._write(i, wait=True)

    def failed(self) -> None:
        """The failure path: both tables read from host memory, no CUDA call;
        the step before the failing one first."""
        older = self.cur ^ 1
        self._write(older, wait=False)
        step, self.steps[self.cur] = self.steps[self.cur], None
        if step is not None and self.tables[self.cur].write(self.rec._impl, -1, step):
            self.writes += 1

    def detach(self) -> None:
        """Writes what is held and leaves the recorder's failure and close paths."""
        try:
            self.flush()
        finally:
            if self.failed in self.rec._before_failure:
                self.rec._before_failure.remove(self.failed)
            if self.flush in self.rec._before_close:
                self.rec._before_close.remove(self.flush)


# The dtypes our summary kernel decodes (capture/src/device_fingerprints.cu).
_DEVICE_DTYPES = {n: n for n in ("F32", "BF16", "F16", "F8_E4M3", "F8_E5M2", "I32", "I64", "U8")}

_DTYPE_NAMES: Optional[dict] = None


def _dtype_names() -> dict:
    """torch dtype -> the recorder's (safetensors) dtype name; torch is imported by the model's owner."""
    global _DTYPE_NAMES
    if _DTYPE_NAMES is None:
        import torch

        pairs = [("float32", "F32"), ("bfloat16", "BF16"), ("float16", "F16"), ("float64", "F64"),
                 ("int64", "I64"), ("int32", "I32"), ("int16", "I16"), ("int8", "I8"), ("uint8", "U8"),
                 ("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2"), ("float8_e8m0fnu", "F8_E8M0")]
        _DTYPE_NAMES = {getattr(torch, a): b for a, b in pairs if hasattr(torch, a)}
    return _DTYPE_NAMES


class _Wrapped:
    """remove() for a wrapped forward: the module's own forward back."""

    def __init__(self, module: Any, inner: Any, wrapper: Any) -> None:
        self.module, self.inner = module, inner
        module.forward = wrapper

    def remove(self) -> None:
        if getattr(self.inner, "__self__", None) is self.module and "forward" in vars(self.module):
            del self.module.forward  # the class's forward again
        else:
            self.module.forward = self.inner  # an earlier wrapper (ours or anyone's)


class _Unset:
    """remove() for a capture callback: the router's callback set back to none."""

    def __init__(self, router: Any) -> None:
        self.router = router

    def remove(self) -> None:
        self.router.set_capture_fn(None)


def _tensor_type() -> type:
    """torch.Tensor (imported by the model's owner already)."""
    import torch

    return torch.Tensor


def _has_own_forward(module: Any) -> bool:
    """A torch module whose class defines (or inherits) a forward of its own."""
    return class_has_own_forward(type(module))


def class_has_own_forward(cls: type) -> bool:
    """A torch module class with a forward other than nn.Module's (which raises)."""
    for c in cls.__mro__:
        if "forward" in vars(c):
            return c.__module__ != "torch.nn.modules.module"
    return False


def _topk_ids(out: Any) -> Any:
    """sglang's TopK module output (TopKOutput: topk_weights, topk_ids, ...) -> the ids."""
    ids = getattr(out, "topk_ids", None)
    if ids is None and isinstance(out, (tuple, list)) and len(out) > 1:
        ids = out[1]
    return ids if isinstance(ids, _tensor_type()) else None  # not hasattr(ids, "_version"): see first_tensor


def _next_token_logits(out: Any) -> Any:
    """A logits processor's output: sglang's LogitsProcessorOutput, or vLLM's tensor."""
    logits = getattr(out, "next_token_logits", None)
    return logits if logits is not None else first_tensor(out)


def install_engine_boundaries(hooks: FingerprintHooks, model: Any, tp_size: int) -> List[str]:
    """Hooks an sglang or vLLM decoder model (docs/replay.md "Boundaries").

    Module names are those of the engines' model classes (LlamaForCausalLM,
    Qwen2/3, DeepseekV2/V3, GLM-4.5/5 ...: `model.embed_tokens`,
    `model.layers[n].self_attn.o_proj`, `model.layers[n].mlp` with
    `.topk` for sglang's MoE, `model.norm`, `logits_processor`). Only points
    whose tensor is the replay's on every rank are hooked:
      * always: embedding (VocabParallelEmbedding all-reduces), L{n}.topk
        (the router's ids, the same on every rank: sglang's `mlp.topk`
        output, vLLM's `mlp.experts.router` capture callback), final_norm (decode steps
        only: there each row is one token, as in the replay), lm_head (the
        gathered logits of each row's last token), L{n}.indexer_slots
        (sglang's DSA indexer's top-k in its backend's transform: KV-pool
        slots by default, -1 for none; the engine's alone, not compared);
      * at tp_size 1 only: L{n}.attention (o_proj's input: head-sharded
        under tp), L{n}.o_proj and L{n}.mlp (both engines may defer the
        all-reduce past these modules, leaving a rank's partial sum).
    Not hooked: L{n}.layer (the engines return the residual apart and add
    it in the next layer's fused norm) and L{n}.experts (sglang scales by
    routed_scaling_factor outside the experts module in some paths).
    Returns the names hooked.
    """
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None) if inner is not None else None
    if layers is None:
        return []
    before = len(hooks.names)
    embed = getattr(inner, "embed_tokens", None)
    if embed is not None:
        hooks.output(embed, "embedding")
    for n, layer in enumerate(layers):
        attn = getattr(layer, "self_attn", None)
        o_proj = getattr(attn, "o_proj", None) if attn is not None else None
        if tp_size == 1 and o_proj is not None:
            hooks.input(o_proj, f"L{n}.attention")
            hooks.output(o_proj, f"L{n}.o_proj")
        # The DSA indexer's top-k as sglang's Indexer returns it: int32
        # [tokens, index_topk], -1 for no entry, in its backend's transform
        # (KV-pool slots by default; flattened KV positions or request
        # positions in other modes), so not the replay's L{n}.indexer
        # (sequence positions): its own name, which replay passes over, and
        # its range shows an index past the pool before the sparse attention
        # kernel asserts on it. Same on every rank (sglang replicates the
        # indexer). vLLM's DeepseekV32Indexer is never called (its layer
        # calls a function with the indexer's tensors): a module whose
        # forward is nn.Module's own is not hooked.
        indexer = getattr(attn, "indexer", None) if attn is not None else None
        if indexer is not None and _has_own_forward(indexer):
            hooks.output(indexer, f"L{n}.indexer_slots")
        mlp = getattr(layer, "mlp", None)
        if mlp is None:
            continue
        topk = getattr(mlp, "topk", None)
        router = getattr(getattr(mlp, "experts", None), "router", None)
        if topk is not None and hasattr(topk, "register_forward_hook"):
            hooks.output(topk, f"L{n}.topk", pick=_topk_ids)
        elif hasattr(router, "set_capture_fn") and getattr(router, "capture_fn", None) is None:
            # vLLM: the ids never leave FusedMoE's forward; its router hands
            # them to a capture callback (left alone when vLLM's own
            # routed-experts capture holds it).
            hooks.capture(router, f"L{n}.topk")
        if tp_size == 1:
            hooks.output(mlp, f"L{n}.mlp")
    norm = getattr(inner, "norm", None)
    if norm is not None:
        hooks.output(norm, "final_norm", when=lambda: hooks.mode == "decode")
    lp = getattr(model, "logits_processor", None)
    if lp is not None:
        hooks.output(lp, "lm_head", pick=_next_token_logits)
    return hooks.names[before:]
