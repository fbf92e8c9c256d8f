"""Forward hooks that fingerprint a torch model's modules at named boundaries.

Shared by crashreplay.transformers, crashreplay.sglang and crashreplay.vllm.
A hook only notes the module's output and the tensor's version counter
(each torch call in a hook costs microseconds: the module's kernels have
just pushed the interpreter out of the caches); flush() summarises the
noted tensors of a step in one Recorder.fingerprints() call. An output a
later module changed in place (its version moved) is dropped for that step
and summarised at once, inside its hook, from then on: a stale value is
never recorded. Device tensors are copied to the host at flush (one
synchronisation a step): the zero-copy device path (DeviceFingerprints) has
no Python binding yet.

Boundary names are the replay's (docs/replay.md "Boundaries"). Nothing here
imports an engine; torch is imported by whoever builds the model.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, List, Optional, Tuple

logger = logging.getLogger("crashreplay")


def first_tensor(x: Any) -> Any:
    """The first tensor of a module's output (a tensor, a tuple, a ModelOutput)."""
    if hasattr(x, "_version") and hasattr(x, "shape"):
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

    def __init__(self, recorder: Any) -> None:
        self.rec = recorder
        self.step: Optional[int] = None
        self.mode = ""
        self.names: List[str] = []  # boundaries hooked, in install order
        self._handles: List[Any] = []
        self._pending: List[Tuple[str, Any, int, Optional[Callable], int]] = []
        self._now: set = set()
        self._dropped: set = set()

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

    def _drop(self, name: str, e: Exception) -> None:
        """A boundary whose hook failed is not fingerprinted again (warned once)."""
        self._dropped.add(name)
        logger.warning("crashreplay: fingerprint %s failed (%s: %s); that boundary is no longer recorded",
                       name, type(e).__name__, e)

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    # -- recording -------------------------------------------------------
    def _note(self, name: str, t: Any, rows: Optional[Callable]) -> None:
        if t is None or self.step is None:
            return
        if name in self._now:
            self.rec.fingerprint(name, self._host(t, rows), step=self.step)
            return
        self._pending.append((name, t, t._version, rows, self.step))

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
        pending, self._pending = self._pending, []
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
                continue
            h = self._host(t, rows)
            dtype = names.get(h.dtype)
            if dtype is None:
                self.rec.fingerprints([(name, h)], step=s)
                continue
            held.append(h)
            batch.append((name, h.data_ptr(), h.numel(), dtype, h.shape[-1] if h.dim() and h.shape[-1] else 1))
        if batch:
            self._send(batch, step)

    def _send(self, batch: List[Tuple[str, int, int, str, int]], step: Optional[int]) -> None:
        self.rec._impl._fingerprints_at(step, batch)


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


class _Unset:
    """remove() for a capture callback: the router's callback set back to none."""

    def __init__(self, router: Any) -> None:
        self.router = router

    def remove(self) -> None:
        self.router.set_capture_fn(None)


def _topk_ids(out: Any) -> Any:
    """sglang's TopK module output (TopKOutput: topk_weights, topk_ids, ...) -> the ids."""
    ids = getattr(out, "topk_ids", None)
    if ids is None and isinstance(out, (tuple, list)) and len(out) > 1:
        ids = out[1]
    return ids if hasattr(ids, "_version") else None


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
        gathered logits of each row's last token);
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
