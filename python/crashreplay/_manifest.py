"""Building the session manifest from Python values.

config_to_toggles() turns an engine's configuration (a dict, a dataclass such
as sglang's ServerArgs, or an argparse Namespace) into typed toggles: one
(name, value) pair per setting, value None, bool, int, float or str, sorted
by name so the same configuration always gives the same manifest. Nested
dicts, dataclasses and msgspec structs (sglang's resolved
cuda_graph_config.decode.max_bs) become dotted names, down to
_MAX_DEPTH levels; enums their value; lists, tuples and other objects a
stable string form.

detect_device() describes the accelerator the process uses. It never imports
torch itself (that takes seconds and may initialise CUDA): it looks at torch
only if the caller already imported it.
"""
from __future__ import annotations

import dataclasses
import enum
import json
import os
import socket
import sys
from typing import Any, Dict, Iterable, List, Optional, Tuple

Toggle = Tuple[str, Any]


def _toggle_value(v: Any) -> Any:
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, enum.Enum):
        return _toggle_value(v.value)
    if isinstance(v, int):
        return int(v) if -(2**63) <= v < 2**63 else str(v)
    if isinstance(v, float):
        return float(v)
    if type(v).__module__ == "numpy" and hasattr(v, "item"):
        return _toggle_value(v.item())
    if isinstance(v, (list, tuple, set, frozenset)):
        items = sorted(v, key=repr) if isinstance(v, (set, frozenset)) else list(v)
        return json.dumps([_jsonable(x) for x in items], sort_keys=True)
    return str(v)


def _jsonable(v: Any) -> Any:
    v = _toggle_value(v) if not isinstance(v, (list, tuple, dict)) else v
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def _as_mapping(config: Any) -> Dict[str, Any]:
    if config is None:
        return {}
    if isinstance(config, dict):
        return config
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return {f.name: getattr(config, f.name, None) for f in dataclasses.fields(config) if not f.name.startswith("_")}
    # msgspec.Struct (sglang's ServerArgs since 0.5.2x): fields live in slots,
    # vars() is empty.
    struct_fields = getattr(type(config), "__struct_fields__", None)
    if isinstance(struct_fields, tuple):
        return {k: getattr(config, k) for k in struct_fields if not k.startswith("_")}
    if hasattr(config, "__dict__"):
        return {k: v for k, v in vars(config).items() if not k.startswith("_")}
    raise TypeError(f"config must be a dict, a dataclass or an object with attributes, not {type(config).__name__}")


_MAX_DEPTH = 4


def _is_record(v: Any) -> bool:
    """A value whose fields become dotted toggles (not a leaf)."""
    if isinstance(v, dict):
        return True
    if isinstance(v, type):
        return False
    return (dataclasses.is_dataclass(v) or isinstance(getattr(type(v), "__struct_fields__", None), tuple))


def config_to_toggles(config: Any, prefix: str = "", _depth: int = 0) -> List[Toggle]:
    """Flattens a configuration into sorted (name, typed value) toggles."""
    out: List[Toggle] = []
    for key, value in _as_mapping(config).items():
        name = f"{prefix}{key}"
        if _depth < _MAX_DEPTH and _is_record(value):
            out.extend(config_to_toggles(value, prefix=name + ".", _depth=_depth + 1))
        else:
            out.append((name, _toggle_value(value)))
    out.sort(key=lambda t: t[0])
    return out


def detect_device(index: Optional[int] = None) -> Dict[str, Any]:
    """The CUDA device the process uses, if torch (already imported) sees one."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available():
                idx = torch.cuda.current_device() if index is None else index
                p = torch.cuda.get_device_properties(idx)
                driver = ""
                try:
                    driver = str(torch.cuda.driver_version()) if hasattr(torch.cuda, "driver_version") else ""
                except Exception:  # older torch: no driver query
                    driver = ""
                return {
                    "name": p.name,
                    "sm_arch": int(p.major) * 10 + int(p.minor),
                    "memory_capacity_bytes": int(p.total_memory),
                    "driver_version": driver,
                    "runtime_version": str(torch.version.cuda or ""),
                    "index": int(idx),
                }
        except Exception:  # a broken CUDA setup must not stop recording
            pass
    return {"name": "cpu", "index": 0}


def build_manifest(
    *,
    engine: str,
    engine_version: str = "",
    config: Any = None,
    toggles: Optional[Iterable[Toggle]] = None,
    model: Optional[Dict[str, Any]] = None,
    device: Any = "auto",
    parallel: Optional[Dict[str, Any]] = None,
    session_id: Optional[str] = None,
    features: Iterable[str] = (),
) -> Dict[str, Any]:
    """The manifest dict the extension's Recorder takes."""
    all_toggles = config_to_toggles(config)
    if toggles:
        extra = dict(all_toggles)
        for name, value in toggles:
            extra[name] = _toggle_value(value)
        all_toggles = sorted(extra.items())
    dev = detect_device() if device == "auto" else dict(device or {})
    return {
        "session_id": session_id or os.environ.get("CRASHREPLAY_SESSION_ID", ""),
        "engine": engine,
        "engine_version": engine_version,
        "hostname": socket.gethostname(),
        "model": dict(model or {}),
        "toggles": all_toggles,
        "device": dev,
        "parallel": dict(parallel or {}),
        "features": list(features),
    }
