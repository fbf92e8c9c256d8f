"""Hugging Face transformers as a recorded engine.

    import crashreplay.transformers as crt
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float16)
    with crt.record(model, "/data/session", checkpoint_path=ckpt) as rec:
        model.generate(**inputs, do_sample=True, max_new_tokens=8)

Every forward pass of the model is one step: its batch (token ids,
positions, one page-table row of token slots per sequence), the sampling
parameters generate() was given, the weight hashes under transformers'
parameter names, and, with `fingerprints=True` (the default), the summary of
each decoder layer's tensors at the replay's boundaries (docs/replay.md
"Boundaries"): embedding, L{n}.attention (o_proj's input), L{n}.o_proj (the
attention block's output), L{n}.experts, L{n}.mlp, L{n}.layer, final_norm
and lm_head (each sequence's last token). An exception that escapes
generate() (torch's "probability tensor contains either `inf`, `nan` or
element < 0") is written as the failure record, after the failing step's
fingerprints, and re-raised. `crashreplay replay SESSION` replays the
capture against the checkpoint; activations are stored in the model's dtype
(activation_dtype, recorded from model.dtype).

The cache maps onto the replay's paged cache as token slots: sequence b of
the batch holds slots b * stride + position, stride a multiple of 64 that
covers the longest sequence generate() can make. A step that continues the
rows given at the step before (same stride) gives only its new slots (page-
table deltas, docs/capture.md), so the recorder's cost stays flat as the
context grows. Left padding is not modelled: a batch whose attention mask
holds zeros is refused (ValueError). Runs where the model runs (CPU or
GPU); fingerprints of CUDA tensors take the device path of the engine hooks
(crashreplay.DeviceFingerprints) where the extension was built with CUDA,
host copies otherwise.
"""
from __future__ import annotations

import contextlib
import json
from typing import Any, Dict, Iterator, List, Optional

import numpy as np

from crashreplay._fingerprint_hooks import FingerprintHooks
from crashreplay._recorder import Recorder

__all__ = ["record", "TransformersRecorder", "BOUNDARIES"]

# The replay's boundary -> where it is read in a transformers decoder model.
BOUNDARIES = {
    "embedding": "model.embed_tokens output",
    "L{n}.attention": "model.layers.n.self_attn.o_proj input",
    "L{n}.o_proj": "model.layers.n.self_attn output[0]",
    "L{n}.experts": "model.layers.n.mlp.experts output",
    "L{n}.mlp": "model.layers.n.mlp output",
    "L{n}.layer": "model.layers.n output",
    "final_norm": "model.norm output, each sequence's last token",
    "lm_head": "lm_head output, each sequence's last token",
}


def _last_token(t: Any) -> Any:
    """[batch, seq, width] -> each sequence's last token [batch, width]."""
    return t[:, -1, :] if t.dim() == 3 and t.shape[1] != 1 else t


class TransformersRecorder:
    """Hooks on one transformers causal LM, writing into a crashreplay Recorder."""

    def __init__(self, model: Any, session_dir: str, *, checkpoint_path: Optional[str] = None,
                 fingerprints: bool = True, max_length: Optional[int] = None, **recorder_options: Any) -> None:
        import torch
        import transformers

        self.model = model
        self._generate = model.generate  # the model's own, before record() puts ours in its place
        self.fingerprints = fingerprints
        self.max_length = max_length
        self.step = -1
        self.mode = "prefill"
        self._sampling: Dict[str, Any] = {}
        self._handles: List[Any] = []
        self._stride = 0  # the page-table stride of the rows given last
        self._rows_end = 0  # and the columns they covered
        cfg = model.config
        dtype = str(model.dtype).replace("torch.", "")
        path = checkpoint_path or getattr(cfg, "_name_or_path", "") or ""
        self.rec = Recorder(
            session_dir, engine="transformers", engine_version=transformers.__version__,
            toggles=[("transformers.page_table_unit", "token"), ("torch_version", torch.__version__),
                     # What a replay in transformers itself loads the model with.
                     ("transformers.attn_implementation", getattr(cfg, "_attn_implementation", None) or ""),
                     ("transformers.experts_implementation", getattr(cfg, "_experts_implementation", None) or "")],
            model={"checkpoint_path": path, "dtype": dtype, "config_json": cfg.to_json_string(),
                   "model_type": getattr(cfg, "model_type", ""),
                   "architecture": (getattr(cfg, "architectures", None) or [type(model).__name__])[0]},
            device={"name": str(next(model.parameters()).device)}, **recorder_options)
        weights = {k: v.detach() for k, v in model.state_dict().items()}
        if all(t.device.type == "cpu" for t in weights.values()):
            self.rec.record_weight_hashes(weights)
        self.hooks = FingerprintHooks(self.rec, wrap_forward=True)
        self._install()

    # -- hooks -----------------------------------------------------------
    def _install(self) -> None:
        m = self.model
        self._handles.append(m.register_forward_pre_hook(self._before_forward, with_kwargs=True))
        if not self.fingerprints:
            return
        h = self.hooks
        inner = m.model
        h.output(inner.embed_tokens, "embedding")
        for n, layer in enumerate(inner.layers):
            attn = layer.self_attn
            if hasattr(attn, "o_proj"):
                h.input(attn.o_proj, f"L{n}.attention")
            h.output(attn, f"L{n}.o_proj")
            mlp = getattr(layer, "mlp", None)
            if mlp is not None:
                if hasattr(mlp, "experts"):
                    h.output(mlp.experts, f"L{n}.experts")
                h.output(mlp, f"L{n}.mlp")
            h.output(layer, f"L{n}.layer")
        h.output(inner.norm, "final_norm", rows=_last_token)
        # The step's last boundary: its hook summarises the step in one call.
        h.output(m.lm_head, "lm_head", rows=_last_token, flush=True)

    def _before_forward(self, module: Any, args: tuple, kwargs: dict) -> None:
        import torch

        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            raise ValueError("crashreplay.transformers records forward passes over input_ids (not inputs_embeds)")
        mask = kwargs.get("attention_mask")
        if mask is not None and not bool(torch.all(mask != 0)):
            raise ValueError("crashreplay.transformers: a padded batch (attention_mask with zeros) is not modelled")
        batch, tokens = ids.shape
        # Where the tokens start: position_ids (transformers 5), else
        # cache_position (4.x), else the cache's length (`cache` in 5.x,
        # `past_key_values` in 4.x).
        start = 0
        position_ids, cache_position = kwargs.get("position_ids"), kwargs.get("cache_position")
        past = kwargs.get("cache", kwargs.get("past_key_values"))
        if position_ids is not None:
            start = int(position_ids.reshape(-1)[0])
        elif cache_position is not None:
            start = int(cache_position.reshape(-1)[0])
        elif past is not None and hasattr(past, "get_seq_length"):
            start = int(past.get_seq_length())
        self.hooks.flush()
        self.step += 1
        self.hooks.step = self.step
        self.mode = "prefill" if start == 0 else ("decode" if tokens == 1 else "extend")
        total = self.max_length or (start + tokens)
        stride = max(self._stride, ((max(total, start + tokens) + 63) // 64) * 64)
        b = np.arange(batch, dtype=np.int64)
        pos = np.arange(start, start + tokens, dtype=np.int64)
        base = (b * stride)[:, None]
        if start > 0 and start == self._rows_end and stride == self._stride:
            # The rows given last hold columns [0, start): only the new ones.
            page_table = {"rows": base + pos[None, :], "lengths": np.full(batch, tokens, np.int64),
                          "starts": np.full(batch, start, np.int64)}
        else:
            page_table = {"rows": base + np.arange(start + tokens, dtype=np.int64)[None, :],
                          "lengths": np.full(batch, start + tokens, np.int64)}
        self._stride, self._rows_end = stride, start + tokens
        s = self._sampling
        sampling = {"temperatures": np.full(batch, s.get("temperature", 0.0), np.float32),
                    "top_ps": np.full(batch, s.get("top_p", 1.0), np.float32),
                    "top_ks": np.full(batch, s.get("top_k", -1), np.int64),
                    "min_ps": np.full(batch, s.get("min_p", 0.0), np.float32)}  # no seeds: unseeded
        self.rec.record_step(
            self.step, mode=self.mode, request_ids=[str(i) for i in range(batch)],
            token_ids=ids.detach().reshape(-1).cpu().numpy().astype(np.int64, copy=False),
            positions=np.tile(pos, batch), seq_lens=np.full(batch, start + tokens, np.int64),
            extend_lens=np.full(batch, tokens, np.int64), req_pool_indices=b, page_table=page_table,
            out_cache_loc=(base + pos[None, :]).reshape(-1),
            sampling=sampling, rng_seed=int(torch.initial_seed()))

    # -- generate --------------------------------------------------------
    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """model.generate(...), recorded; an exception is written as the failure and re-raised."""
        gc = kwargs.get("generation_config") or self.model.generation_config
        get = lambda k: kwargs.get(k, getattr(gc, k, None))  # noqa: E731
        do_sample = bool(get("do_sample"))
        temperature = get("temperature")
        top_k = get("top_k")
        self._sampling = {"temperature": float(temperature if temperature is not None else 1.0) if do_sample else 0.0,
                          "top_p": float(get("top_p") or 1.0) if do_sample else 1.0,
                          "top_k": int(top_k) if do_sample and top_k else -1,
                          "min_p": float(get("min_p") or 0.0) if do_sample else 0.0}
        ids = kwargs.get("input_ids", args[0] if args else None)
        if self.max_length is None and ids is not None:
            new = get("max_new_tokens")
            self.max_length = int(ids.shape[-1]) + int(new) if new else get("max_length")
        with self.failures():
            return self._generate(*args, **kwargs)

    @contextlib.contextmanager
    def failures(self) -> Iterator[None]:
        """Writes an exception escaping the block as the failure record, then re-raises it."""
        try:
            yield
        except Exception as e:  # noqa: BLE001 - recorded and re-raised
            kind = type(e)
            self.hooks.flush()  # the boundaries that ran before the exception
            self.rec.on_failure(str(e), stage=self.mode, step=self.step if self.step >= 0 else None,
                                failure_class="exception", exception_type=f"{kind.__module__}.{kind.__qualname__}")
            raise

    def close(self) -> None:
        if self._handles:
            self.hooks.flush()
        self.hooks.remove()
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.rec.close()

    def __enter__(self) -> "TransformersRecorder":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.close()
        return False


@contextlib.contextmanager
def record(model: Any, session_dir: str, **options: Any) -> Iterator[TransformersRecorder]:
    """Records `model`'s forward passes into SESSION_DIR until the block ends.

    model.generate() inside the block is recorded through the returned
    recorder's generate() (the same call, with the failure path); a plain
    forward loop is recorded too (pass max_length= so the page table's
    stride covers it). Options: checkpoint_path, fingerprints (default
    True), max_length, and any crashreplay.Recorder option.
    """
    rec = TransformersRecorder(model, session_dir, **options)
    original = model.generate
    model.generate = rec.generate  # so model.generate(...) in the block takes the failure path
    try:
        yield rec
    finally:
        model.generate = original
        rec.close()
