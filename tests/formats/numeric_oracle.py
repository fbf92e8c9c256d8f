#!/usr/bin/env python3
"""Writes the oracle tables numeric_test.cc checks crashreplay's conversions
against. The oracle is ml_dtypes (and numpy for fp16), not our code.

Usage: numeric_oracle.py OUT_DIR

Files (little-endian raw arrays, no header; sizes are checked by the test):
  decode_<fmt>.f32   float32 value of every code (bf16/fp16: 65536 codes;
                     e4m3/e5m2/e8m0: 256; e2m1: 16)
  encode_<fmt>.in.f32  dense float32 inputs: every value of the format, every
                       midpoint (tie) between neighbours, the next float above
                       and below each, saturation edges, float subnormals,
                       zeros, Inf, NaN, and seeded random floats
  encode_<fmt>.out     the oracle's code for each input (uint16 for bf16 and
                       fp16, uint8 otherwise)
The saturating formats (e4m3, e5m2 saturating, e2m1) are encoded from the
input clipped to the format's finite range, which is the saturation rule;
ml_dtypes itself turns e4m3 overflow into NaN. The e8m0 floor/ceil tables
come from numpy's frexp (exact), turned into codes by ml_dtypes.
"""
import os
import sys

import numpy as np

try:
    import ml_dtypes
except ImportError:
    sys.exit("numeric_oracle.py: the Python package ml_dtypes is missing; "
             "run scripts/setup.sh (pip install ml_dtypes)")

F32 = np.float32


def codes_to_f32(dtype, nbits):
    # ml_dtypes stores one fp4 per byte, in the low nibble, so the 4-bit
    # codes view as uint8 like the 8-bit ones.
    codes = np.arange(1 << nbits, dtype=np.uint16 if nbits > 8 else np.uint8)
    return codes.view(dtype).astype(F32)


def neighbours(v):
    v = v[np.isfinite(v)].astype(F32)
    return np.concatenate([v, np.nextafter(v, F32(np.inf)), np.nextafter(v, F32(-np.inf))])


def midpoints(v):
    v = np.unique(v[np.isfinite(v)].astype(np.float64))
    mids = ((v[1:] + v[:-1]) / 2).astype(F32)  # exact: neighbours are close
    return neighbours(mids)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)

    formats = {
        "bf16": (ml_dtypes.bfloat16, 16),
        "fp16": (np.float16, 16),
        "e4m3": (ml_dtypes.float8_e4m3fn, 8),
        "e5m2": (ml_dtypes.float8_e5m2, 8),
        "e8m0": (ml_dtypes.float8_e8m0fnu, 8),
        "e2m1": (ml_dtypes.float4_e2m1fn, 4),
    }
    decoded = {}
    for name, (dt, nbits) in formats.items():
        with np.errstate(invalid="ignore"):
            decoded[name] = codes_to_f32(dt, nbits)
        decoded[name].tofile(os.path.join(out, f"decode_{name}.f32"))

    # Inputs every format sees: saturation and Inf edges of all formats,
    # float subnormals, zeros, Inf, NaN (several payloads), seeded randoms.
    common = [neighbours(np.array([448, 464, 480, 512, 57344, 61440, 65536, 6, 7, 8,
                                   65504, 65520, 2.0**-127, 2.0**-126, 2.0**127,
                                   2.0**-149, 2.0**-133, 1e-30, 1e30, 3.4e38], F32))]
    rng = np.random.default_rng(20261202)
    common.append(rng.integers(0, 0x7f800000, size=20000, dtype=np.uint32).view(F32))
    common.append(rng.standard_normal(10000).astype(F32) * F32(100))
    common.append(np.arange(1, 512, dtype=np.uint32).view(F32))  # float subnormals
    common.append(np.array([0.0, np.inf, np.nan], F32))
    common.append(np.array([0x7f800001, 0x7fbfffff, 0x7fffffff], np.uint32).view(F32))

    def inputs_for(*names):
        """The common inputs plus every value of the named formats, every
        midpoint (tie) between neighbours, and the floats just around them."""
        parts = list(common)
        for name in names:
            parts.append(neighbours(decoded[name]))
            parts.append(midpoints(decoded[name]))
        x = np.concatenate(parts).astype(F32)
        x = np.concatenate([x, -x])
        _, first = np.unique(x.view(np.uint32), return_index=True)  # each pattern once
        return x[np.sort(first)]

    def write(name, x, codes):
        x.tofile(os.path.join(out, f"encode_{name}.in.f32"))
        codes.tofile(os.path.join(out, f"encode_{name}.out"))

    sizes = []
    with np.errstate(over="ignore", invalid="ignore"):
        x = inputs_for("bf16")
        write("bf16", x, x.astype(ml_dtypes.bfloat16).view(np.uint16))
        sizes.append(x.size)
        x = inputs_for("fp16")
        write("fp16", x, x.astype(np.float16).view(np.uint16))
        sizes.append(x.size)
        x = inputs_for("e5m2")
        write("e5m2", x, x.astype(ml_dtypes.float8_e5m2).view(np.uint8))
        write("e5m2sat", x, np.clip(x, -57344, 57344).astype(ml_dtypes.float8_e5m2).view(np.uint8))
        x = inputs_for("e4m3")
        write("e4m3", x, np.clip(x, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8))
        x = inputs_for("e2m1")
        write("e2m1", x, np.clip(x, -6, 6).astype(ml_dtypes.float4_e2m1fn).view(np.uint8))

        # e8m0 floor/ceil of log2 for positive finite inputs; 0xff for
        # negative, Inf and NaN; 0 for +-0. frexp is exact (x = m * 2^k,
        # m in [0.5, 1)), float32 subnormals included.
        x = inputs_for("e8m0")
        xd = x.astype(np.float64)
        positive = np.isfinite(xd) & (xd > 0)
        m, k = np.frexp(np.where(positive, xd, 1.0))
        for name, e in (("e8m0floor", k - 1), ("e8m0ceil", np.where(m == 0.5, k - 1, k))):
            e = np.clip(e, -127, 128)  # 2^-127 is the smallest e8m0; 2^128 has none
            p = np.ldexp(1.0, np.minimum(e, 127))
            codes = p.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8)
            codes = np.where(positive & (e < 128), codes, 0xff)
            codes = np.where(xd == 0, 0, codes).astype(np.uint8)
            write(name, x, codes)

    with open(os.path.join(out, "stamp"), "w") as f:
        f.write(f"ml_dtypes {ml_dtypes.__version__} numpy {np.__version__} encode inputs bf16 {sizes[0]} fp16 {sizes[1]}\n")


if __name__ == "__main__":
    main()
