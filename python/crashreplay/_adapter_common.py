"""Pieces shared by the engine adapters (crashreplay.sglang, crashreplay.vllm).

Version gates, environment switches as toggles, weight hashing of a module's
parameters, and method wrapping that records a step before the original runs
and records a failure if it raises. Nothing here imports an engine.
"""
from __future__ import annotations

import functools
import logging
import os
import re
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

logger = logging.getLogger("crashreplay")

# Environment variables that change kernels and so belong in the manifest.
_ENV_PATTERN = re.compile(r"^(SGLANG_|SGL_|VLLM_|DG_|TORCH_|NCCL_|CUDA_|FLASHINFER_).*"
                          r"(DEEPGEMM|DEEP_GEMM|UE8M0|JIT|ATTENTION|BACKEND|FP8|FP4|GRAPH|DETERMINISTIC|"
                          r"LAUNCH_BLOCKING|ALGO|PROTO|DSA|MOE|FLASHINFER|CUTLASS|TRITON)")
_ENV_EXACT = {"CUDA_LAUNCH_BLOCKING", "CUBLAS_WORKSPACE_CONFIG", "TORCH_CUDA_ARCH_LIST", "NCCL_ALGO", "NCCL_PROTO"}
_SECRET = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL)", re.IGNORECASE)


class UnsupportedVersion(RuntimeError):
    """The engine version is outside the range the adapter was checked against."""


def parse_version(v: str) -> Tuple[int, ...]:
    nums = []
    for part in re.split(r"[.+-]", v):
        m = re.match(r"^(\d+)", part)
        if not m:
            break
        nums.append(int(m.group(1)))
    return tuple(nums) or (0,)


def check_version(engine: str, version: str, low: Tuple[int, ...], high: Tuple[int, ...], checked: str) -> None:
    """Raises UnsupportedVersion unless low <= version < high.

    CRASHREPLAY_FORCE_VERSION=1 turns the refusal into a warning (the
    adapter then relies on its structural checks alone).
    """
    v = parse_version(version)
    if low <= v < high:
        return
    msg = (f"crashreplay.{engine}: {engine} {version} is not supported: the adapter reads {engine}'s "
           f"internal batch fields, which were checked for {engine} >= {'.'.join(map(str, low))}, "
           f"< {'.'.join(map(str, high))} ({checked}). Use a supported version, or set "
           f"CRASHREPLAY_FORCE_VERSION=1 to try anyway (missing fields are then reported by name).")
    if os.environ.get("CRASHREPLAY_FORCE_VERSION") == "1":
        logger.warning("%s", msg)
        return
    raise UnsupportedVersion(msg)


def require_fields(obj: Any, names: Iterable[str], what: str, engine: str) -> None:
    """Structural check: fails naming the first missing attribute."""
    for n in names:
        if not hasattr(obj, n):
            raise UnsupportedVersion(
                f"crashreplay.{engine}: {what} has no field '{n}'; this {engine} version changed its batch "
                f"layout and the adapter cannot record it faithfully")


def env_toggles(environ: Optional[Dict[str, str]] = None) -> List[Tuple[str, Any]]:
    """Kernel-relevant environment switches as ("env.NAME", value) toggles, sorted."""
    env = os.environ if environ is None else environ
    out = []
    for k, v in env.items():
        if _SECRET.search(k):
            continue
        if k in _ENV_EXACT or _ENV_PATTERN.match(k):
            out.append((f"env.{k}", v))
    out.sort()
    return out


def drop_secrets(toggles: List[Tuple[str, Any]]) -> List[Tuple[str, Any]]:
    return [(k, v) for k, v in toggles if not _SECRET.search(k)]


def named_parameters(model: Any) -> Dict[str, Any]:
    """A torch module's parameters and buffers by name (what a rank holds)."""
    out = dict(model.named_parameters())
    for name, b in model.named_buffers():
        out.setdefault(name, b)
    return out


def wrap_method(owner: Any, name: str, before: Optional[Callable] = None, after: Optional[Callable] = None,
                marker: str = "_crashreplay_wrapped") -> bool:
    """Replaces owner.name with a wrapper calling before(self, args, kwargs)
    and after(self, result, args, kwargs). Idempotent (a wrapped method is
    not wrapped again). Returns False when the method does not exist."""
    orig = getattr(owner, name, None)
    if orig is None:
        return False
    if getattr(orig, marker, False):
        return True

    @functools.wraps(orig)
    def wrapper(self, *args, **kwargs):
        if before is not None:
            before(self, args, kwargs)
        result = orig(self, *args, **kwargs)
        if after is not None:
            after(self, result, args, kwargs)
        return result

    setattr(wrapper, marker, True)
    setattr(owner, name, wrapper)
    return True


def guarded(fn: Callable, what: str) -> Callable:
    """Recording must never take the server down: log and carry on."""

    @functools.wraps(fn)
    def inner(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UnsupportedVersion:
            raise
        except Exception as e:  # a recording bug must not kill serving
            logger.exception("crashreplay: %s failed: %s", what, e)
            return None

    return inner
