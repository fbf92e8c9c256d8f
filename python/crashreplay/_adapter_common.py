"""Pieces shared by the engine adapters (crashreplay.sglang, crashreplay.vllm).

Version gates, environment switches as toggles, weight hashing of a module's
parameters, and method wrapping that records a step before the original runs
and records a failure if it raises. Nothing here imports an engine.

The rule every adapter follows: recording must never stop a serving engine.
A failure to attach (an unsupported version, a layout the adapter does not
know, a capture file that cannot be created) and a failure while recording
are logged as warnings and the engine goes on, unrecorded where it must be.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import re
import sys
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

logger = logging.getLogger("crashreplay")

# Environment variables that change kernels and so belong in the manifest.
_ENV_PATTERN = re.compile(r"^(SGLANG_|SGL_|VLLM_|DG_|TORCH_|NCCL_|CUDA_|FLASHINFER_).*"
                          r"(DEEPGEMM|DEEP_GEMM|UE8M0|E8M0|JIT|ATTENTION|ATTN|BACKEND|FP8|FP4|GRAPH|DETERMINISTIC|"
                          r"LAUNCH_BLOCKING|ALGO|PROTO|DSA|NSA|MLA|MOE|FLASHINFER|CUTLASS|TRITON|KV_CACHE)")
# Beside the kernel switches, the engines' own NaN checks: whether a NaN
# raises or is sanitised decides whether the same step fails at all.
_ENV_EXACT = {"CUDA_LAUNCH_BLOCKING", "CUBLAS_WORKSPACE_CONFIG", "TORCH_CUDA_ARCH_LIST", "NCCL_ALGO", "NCCL_PROTO",
              "SGLANG_ENABLE_NAN_LOGITS_CHECK", "SGLANG_SANITIZE_NAN_LOGITS", "SGLANG_ENABLE_ASYNC_ASSERT"}
# A setting is a secret when one of its name's words is one of these (api_key,
# ssl_keyfile_password), or when its last word is "token" (HF_TOKEN,
# hf_token, auth_token) unless that names a vocabulary token (eos_token).
# Word by word, so that max_total_tokens, max_prefill_tokens or
# tokenizer_path are kept.
_SECRET_WORDS = frozenset(("key", "apikey", "secret", "password", "passwd", "credential", "credentials"))
_VOCAB_TOKEN_WORDS = frozenset(("eos", "bos", "pad", "unk", "sep", "cls", "mask", "image", "video", "audio",
                                "start", "end", "special"))


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


def is_secret(name: str) -> bool:
    """Whether a setting's name says it holds a secret (see _SECRET_WORDS)."""
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]
    if any(w in _SECRET_WORDS for w in words):
        return True
    return bool(words) and words[-1] == "token" and (len(words) < 2 or words[-2] not in _VOCAB_TOKEN_WORDS)


def is_kernel_env(name: str) -> bool:
    """Whether an environment variable is a kernel-relevant switch."""
    return not is_secret(name) and (name in _ENV_EXACT or bool(_ENV_PATTERN.match(name)))


def env_toggles(environ: Optional[Dict[str, str]] = None) -> List[Tuple[str, Any]]:
    """Kernel-relevant environment switches as ("env.NAME", value) toggles, sorted."""
    env = os.environ if environ is None else environ
    out = [(f"env.{k}", v) for k, v in env.items() if is_kernel_env(k)]
    out.sort()
    return out


def drop_secrets(toggles: List[Tuple[str, Any]]) -> List[Tuple[str, Any]]:
    return [(k, v) for k, v in toggles if not is_secret(k)]


def merge_toggles(*groups: Iterable[Tuple[str, Any]]) -> List[Tuple[str, Any]]:
    """Toggles of several sources, sorted by name; a later group wins a name."""
    out: Dict[str, Any] = {}
    for g in groups:
        for k, v in g:
            out[k] = v
    return sorted(out.items())


def named_parameters(model: Any) -> Dict[str, Any]:
    """What a rank loaded: a torch module's parameters and persistent buffers.

    Non-persistent buffers (sglang's and vLLM's rotary cos_sin_cache) are
    computed at construction, not loaded from the checkpoint, so they are
    left out: the load-time hashes are for verifying the checkpoint.
    """
    out = dict(model.named_parameters())
    persistent = set(model.state_dict(keep_vars=True).keys())
    for name, b in model.named_buffers():
        if name in persistent:
            out.setdefault(name, b)
    return out


def rng_state(tensor: Any = None) -> Tuple[int, int]:
    """(seed, offset) of the default torch generator of the device `tensor`
    lives on: CUDA's Philox generator (its offset advances with every random
    kernel; read on the host, no device sync) or the CPU one (no offset).
    (0, 0) without torch."""
    torch = sys.modules.get("torch")
    if torch is None:
        return 0, 0
    try:
        dev = getattr(tensor, "device", None)
        if dev is not None and dev.type == "cuda":
            g = torch.cuda.default_generators[dev.index if dev.index is not None else torch.cuda.current_device()]
            return int(g.initial_seed()), int(g.get_offset())
        return int(torch.default_generator.initial_seed()), 0
    except Exception:  # an old torch without get_offset, a broken context
        return 0, 0


def hf_model_info(hf: Any) -> Dict[str, Any]:
    """ModelConfigInfo fields from a transformers config (an engine's hf_config)."""
    info: Dict[str, Any] = {}
    if hf is None:
        return info
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
        if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
            info[key] = v
    q = getattr(hf, "quantization_config", None)
    if isinstance(q, dict) and q.get("quant_method"):
        info["quantization"] = str(q["quant_method"])
    return info


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
    """Recording must never take the server down: log and carry on.

    An UnsupportedVersion (a layout the adapter cannot read) is a warning
    too: the engine serves on, unrecorded."""

    @functools.wraps(fn)
    def inner(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UnsupportedVersion as e:
            logger.warning("crashreplay: %s: %s; this process is not recorded", what, e)
            return None
        except Exception as e:  # a recording bug must not kill serving
            logger.warning("crashreplay: %s failed (%s: %s); serving goes on", what, type(e).__name__, e,
                           exc_info=True)
            return None

    return inner


def coredumps_from_env() -> bool:
    """CRASHREPLAY_COREDUMPS=1: the adapters' install() arms lightweight GPU
    core dumps (crashreplay.Recorder's coredumps=; off by default until its
    cost is measured on a GPU, docs/capture.md "GPU core dumps")."""
    return os.environ.get("CRASHREPLAY_COREDUMPS") == "1"
