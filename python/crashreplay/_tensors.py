"""Host-side tensor intake: any DLPack tensor to what the extension accepts.

The extension reads host memory through DLPack without copying. This module
covers what DLPack alone cannot say:

* numpy arrays of ml_dtypes types (bfloat16, float8_*): numpy's DLPack export
  refuses them, so they travel as an unsigned view of the same width plus
  the dtype's capture name ("BF16", "F8_E4M3");
* torch float8 tensors, for the same reason on torch versions whose DLPack
  export lacks float8;
* non-contiguous tensors: made contiguous here (one copy, on the caller's
  thread: pass contiguous tensors to avoid it).

CUDA tensors are not handled here: crashreplay.cuda_staging copies them into
pinned host memory first (see Recorder.snapshot).
"""
from __future__ import annotations

from typing import Any, Tuple

from crashreplay import _crashreplay

# numpy dtype name (ml_dtypes) -> (capture dtype name, unsigned view width)
_NUMPY_EXTENDED = {
    "bfloat16": ("BF16", "uint16"),
    "float8_e4m3fn": ("F8_E4M3", "uint8"),
    "float8_e5m2": ("F8_E5M2", "uint8"),
    "float8_e8m0fnu": ("F8_E8M0", "uint8"),
}
# torch dtype name -> capture dtype name, for dtypes passed as uint8 views
_TORCH_VIEWED = {
    "torch.float8_e4m3fn": "F8_E4M3",
    "torch.float8_e5m2": "F8_E5M2",
    "torch.float8_e8m0fnu": "F8_E8M0",
}


def is_torch_tensor(obj: Any) -> bool:
    """True for torch.Tensor without importing torch (it may be absent)."""
    t = type(obj)
    return t.__module__.startswith("torch") and hasattr(obj, "data_ptr") and hasattr(obj, "is_cuda")


def is_device_tensor(obj: Any) -> bool:
    """True when the tensor lives in accelerator memory (needs staging)."""
    if is_torch_tensor(obj):
        return obj.device.type not in ("cpu",)
    dev = getattr(obj, "__dlpack_device__", None)
    if dev is None:
        return False
    device_type, _ = dev()
    return int(device_type) not in (1, 3, 11, 13)  # cpu, cuda_host, rocm_host, cuda_managed


def host_view(tensor: Any) -> Tuple[Any, str]:
    """Returns (array, dtype_override) the extension can read without a copy.

    dtype_override is "" when the array's own DLPack dtype is right.
    """
    if is_torch_tensor(tensor):
        if tensor.device.type != "cpu":
            raise ValueError(
                f"tensor on {tensor.device} is not host memory; Recorder.snapshot stages CUDA "
                "tensors through pinned memory (crashreplay.cuda_staging)")
        t = tensor.detach()
        if not t.is_contiguous():
            t = t.contiguous()
        name = str(t.dtype)
        if name in _TORCH_VIEWED:
            import torch

            return t.view(torch.uint8), _TORCH_VIEWED[name]
        return t, ""
    np = _numpy()
    if np is not None and isinstance(tensor, np.ndarray):
        a = tensor
        if not a.flags.c_contiguous:
            a = np.ascontiguousarray(a)
        ext = _NUMPY_EXTENDED.get(a.dtype.name)
        if ext is not None:
            return a.view(ext[1]), ext[0]
        return a, ""
    return tensor, ""


def hash_tensor(tensor: Any, name: str = "tensor") -> str:
    """XXH3-128 of a host tensor's bytes, 32 canonical hex digits."""
    arr, dtype = host_view(tensor)
    return _crashreplay.hash_tensor(arr, name, dtype)


def _numpy():
    try:
        import numpy

        return numpy
    except ImportError:  # numpy is optional for callers that only pass torch
        return None
