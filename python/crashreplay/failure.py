"""The failure hook: record an exception escaping a step, then re-raise it.

    with recorder.failure_hook(step=n, stage="decode"):
        run_step()

    @recorder.failure_hook(stage="decode")
    def run_step(...): ...

When an exception escapes, the hook classifies it from its type and text,
asks the recorder to write a FailureRecord and the snapshot ring, flushes to
disk, and lets the exception continue unchanged: the process fails as it
would have, with the evidence on disk. A failure while recording is reported
as a warning and never replaces the original exception.
"""
from __future__ import annotations

import functools
import traceback
import warnings
from typing import Any, Callable, Optional

# Substrings (lower case) of the texts engines and torch raise.
_DEVICE_ASSERT = ("device-side assert", "cudaerrorassert", "device side assert")
_OOM = ("out of memory", "outofmemoryerror", "cudaerrormemoryallocation", "cuda_error_out_of_memory")


def exception_type_name(exc: BaseException) -> str:
    t = type(exc)
    mod = t.__module__
    return t.__qualname__ if mod in ("builtins", "__main__") else f"{mod}.{t.__qualname__}"


def classify_failure(exc_or_text: Any) -> str:
    """'device-assert', 'out-of-memory' or 'exception', from type and message.

    torch raises torch.AcceleratorError (older: RuntimeError) with "CUDA
    error: device-side assert triggered", and torch.OutOfMemoryError (older:
    torch.cuda.OutOfMemoryError) with "CUDA out of memory"; engines re-raise
    them wrapped, so the whole text is searched, chained causes included.
    """
    parts = []
    if isinstance(exc_or_text, BaseException):
        e: Optional[BaseException] = exc_or_text
        seen = 0
        while e is not None and seen < 8:
            parts.append(exception_type_name(e))
            parts.append(str(e))
            e = e.__cause__ or e.__context__
            seen += 1
    else:
        parts.append(str(exc_or_text))
    text = " ".join(parts).lower()
    if any(s in text for s in _DEVICE_ASSERT):
        return "device-assert"
    if any(s in text for s in _OOM):
        return "out-of-memory"
    return "exception"


class FailureHook:
    """Context manager and decorator; see the module docstring."""

    def __init__(self, recorder: Any, step: Optional[int] = None, stage: str = "", flush: bool = True):
        self._recorder = recorder
        self._step = step
        self._stage = stage
        self._flush = flush

    def __enter__(self) -> "FailureHook":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is not None and isinstance(exc, Exception):
            self.record(exc, tb)
        return False  # never swallow

    def __call__(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                self.record(exc, exc.__traceback__)
                raise

        return wrapped

    def record(self, exc: BaseException, tb: Any = None) -> None:
        # Nested hooks (an adapter's forward hook inside its event-loop hook)
        # see the same exception: record it once, at the innermost level.
        if getattr(exc, "_crashreplay_recorded", False):
            return
        try:
            exc._crashreplay_recorded = True  # type: ignore[attr-defined]
        except Exception:  # exceptions with __slots__: record anyway
            pass
        rec = self._recorder
        step = self._step if self._step is not None else rec.current_step
        stage = self._stage or rec.current_stage or "step"
        try:
            rec.on_failure(
                reason=f"{exception_type_name(exc)}: {exc}",
                stage=stage,
                step=step,
                failure_class=classify_failure(exc),
                exception_type=exception_type_name(exc),
                backtrace="".join(traceback.format_exception(type(exc), exc, tb)),
            )
        except Exception as e:  # the original exception matters more
            warnings.warn(f"crashreplay: could not record the failure: {type(e).__name__}: {e}", RuntimeWarning)
