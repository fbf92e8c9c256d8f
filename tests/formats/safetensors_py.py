#!/usr/bin/env python3
"""Drives the real Python `safetensors` package for formats_test.

  safetensors_py.py write OUT SPEC      write tensors described by SPEC (JSON)
  safetensors_py.py write-numpy OUT SPEC  same through safetensors.numpy.save_file
  safetensors_py.py dump PATH           print what the package reads from PATH

SPEC: {"tensors": [{"name", "dtype" (safetensors spelling), "shape" (logical),
"seed"}], "metadata": {..} or null}. Tensor bytes follow Pattern() below, which
the C++ test recomputes independently. `dump` prints JSON: {"metadata": ..,
"tensors": [{"name", "dtype", "shape", "hex"}]} sorted by name.
"""
import json
import sys

import numpy as np
from safetensors import TensorSpec, deserialize, safe_open, serialize_file

# safetensors header dtype -> the dtype string TensorSpec takes.
SPEC_DTYPE = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16",
    "I32": "int32", "U32": "uint32", "I64": "int64", "U64": "uint64",
    "F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu",
    "F4": "float4_e2m1fn_x2",
    # Valid safetensors that crashreplay refuses as unsupported (not corrupt).
    "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz",
}
BITS = {"BOOL": 8, "U8": 8, "I8": 8, "I16": 16, "U16": 16, "I32": 32, "U32": 32,
        "I64": 64, "U64": 64, "F16": 16, "BF16": 16, "F32": 32, "F64": 64,
        "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8, "F4": 4, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8}
NUMPY_DTYPE = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16,
               "U16": np.uint16, "I32": np.int32, "U32": np.uint32, "I64": np.int64,
               "U64": np.uint64, "F16": np.float16, "F32": np.float32, "F64": np.float64}


def pattern(seed, n, dtype):
    """Byte i of a tensor: (seed * 131 + i * 31 + 7) mod 256; BOOL keeps bit 0."""
    out = bytearray(((seed * 131 + i * 31 + 7) & 0xFF) for i in range(n))
    if dtype == "BOOL":
        out = bytearray(b & 1 for b in out)
    return bytes(out)


def nbytes(t):
    n = 1
    for d in t["shape"]:
        n *= d
    return n * BITS[t["dtype"]] // 8


def write(out, spec):
    keep = []
    specs = {}
    for t in spec["tensors"]:
        buf = np.frombuffer(pattern(t["seed"], nbytes(t), t["dtype"]), dtype=np.uint8).copy()
        keep.append(buf)
        shape = list(t["shape"])
        if t["dtype"] == "F4":  # TensorSpec takes the packed storage shape
            shape[-1] //= 2
        specs[t["name"]] = TensorSpec(dtype=SPEC_DTYPE[t["dtype"]], shape=tuple(shape),
                                      data_ptr=buf.ctypes.data, data_len=buf.nbytes)
    serialize_file(specs, out, metadata=spec.get("metadata"))


def write_numpy(out, spec):
    from safetensors.numpy import save_file
    arrays = {}
    for t in spec["tensors"]:
        raw = pattern(t["seed"], nbytes(t), t["dtype"])
        arrays[t["name"]] = np.frombuffer(raw, dtype=NUMPY_DTYPE[t["dtype"]]).reshape(t["shape"])
    save_file(arrays, out, metadata=spec.get("metadata"))


def dump(path):
    with open(path, "rb") as f:
        blob = f.read()
    with safe_open(path, framework="np") as f:
        metadata = f.metadata()
    tensors = [{"name": name, "dtype": v["dtype"], "shape": list(v["shape"]),
                "hex": bytes(v["data"]).hex()} for name, v in deserialize(blob)]
    tensors.sort(key=lambda t: t["name"])
    print(json.dumps({"metadata": metadata, "tensors": tensors}, sort_keys=True))


def main():
    cmd = sys.argv[1]
    if cmd == "dump":
        dump(sys.argv[2])
        return
    with open(sys.argv[3]) as f:
        spec = json.load(f)
    if cmd == "write":
        write(sys.argv[2], spec)
    elif cmd == "write-numpy":
        write_numpy(sys.argv[2], spec)
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
