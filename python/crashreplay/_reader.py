"""Reading captures from Python: summaries for tests and tools, tensors back.

read_capture(path) opens one capture file (or every rank file of a session
directory) with the C++ reader, which treats the file as hostile input, and
returns plain Python values. A torn or corrupt tail is reported in the
summary ("truncated", "corrupt", "problem"), never raised: the complete
records before it are returned.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List

from crashreplay._crashreplay import CaptureFile, list_capture_files

# capture dtype name -> numpy dtype name (ml_dtypes names where numpy lacks one)
_NUMPY_DTYPES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "I32": "int32",
    "I64": "int64", "U16": "uint16", "U32": "uint32", "U64": "uint64",
    "F16": "float16", "F32": "float32", "F64": "float64",
    "BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu",
}
_RAW_FALLBACK = {"BF16": "uint16", "F8_E4M3": "uint8", "F8_E5M2": "uint8", "F8_E8M0": "uint8"}


def _read_one(path: str) -> Dict[str, Any]:
    f = CaptureFile(path)
    out = f.summary()
    out["manifest"] = f.manifest()
    out["step_records"] = f.steps()
    out["snapshot_records"] = f.snapshots()
    out["failure_records"] = f.failures()
    out["weight_hashes"] = f.weight_hashes()
    out["weight_check_records"] = f.weight_checks()
    out["fingerprints"] = f.fingerprints()
    out["verify"] = f.verify()
    return out


def read_capture(path: str) -> Dict[str, Any]:
    """Summary and records of one capture file.

    For a session directory, returns {"path": dir, "files": [one dict per
    rank file, in rank order]}. Keys of a file's dict: the summary fields
    (ok, truncated, corrupt, problem, records, steps, first_step, last_step,
    ranks, snapshots, failures, ...), plus manifest, step_records,
    snapshot_records, failure_records, weight_hashes, weight_check_records,
    fingerprints (format 2.1: [{step, rank, complete, source, fingerprints: [...]}])
    and verify ({ok, error, bad_record, ...}).
    """
    if os.path.isdir(path):
        return {"path": path, "files": [_read_one(p) for p in list_capture_files(path)]}
    return _read_one(path)


def load_tensor(capture: "CaptureFile | str", descriptor: Dict[str, Any]):
    """A stored tensor (a descriptor from a snapshot or step record) as numpy.

    bf16/fp8 come back as ml_dtypes arrays when ml_dtypes is importable, else
    as unsigned views of the same width. F4_E2M1 comes back as packed uint8.
    """
    import numpy as np

    f = CaptureFile(capture) if isinstance(capture, str) else capture
    if not descriptor.get("stored"):
        raise ValueError(f"tensor '{descriptor.get('name')}' was not stored in this capture (hash only)")
    raw = f.read_blob(descriptor["hash"])
    dtype_name = descriptor["dtype"]
    if dtype_name == "F4_E2M1":
        return np.frombuffer(raw, dtype=np.uint8).copy()
    np_name = _NUMPY_DTYPES.get(dtype_name)
    if np_name is None:
        raise ValueError(f"tensor '{descriptor.get('name')}': unknown dtype {dtype_name}")
    try:
        dt = np.dtype(np_name)
    except TypeError:
        try:
            import ml_dtypes  # noqa: F401  (registers the names with numpy)

            dt = np.dtype(np_name)
        except (ImportError, TypeError):
            dt = np.dtype(_RAW_FALLBACK[dtype_name])
    arr = np.frombuffer(raw, dtype=dt).copy()
    return arr.reshape(descriptor["shape"])


def session_files(path: str) -> List[str]:
    """The capture files of a file or session directory, in rank order."""
    return list(list_capture_files(path))
