// Scalar conversions between float32 and the narrow formats of quantized
// checkpoints: bf16, fp16, fp8 e4m3fn, fp8 e5m2, e8m0 ("ue8m0") and fp4 e2m1.
//
// Every function is CR_HD: the CPU reference backend and the CUDA kernels call
// the same code (DESIGN decision 8), so a dequantized weight has the same bits
// on both. The code is integer bit manipulation only: no libm, no tables in
// memory, no allocation, no exceptions. Pure functions, thread-safe.
//
// Rules (docs/formats/numerics.md has the bit layouts and tables):
// - float -> narrow rounds to nearest, ties to even (RNE), on the exact float
//   value; a result that rounds to zero keeps the input's sign (-0 stays -0).
//   Subnormals of the target are produced; float inputs below half the
//   smallest target subnormal become +-0.
// - Overflow: bf16, fp16 and e5m2 (FloatToE5m2) are IEEE-like: a value that
//   rounds past the largest finite becomes +-Inf, as ml_dtypes/numpy do.
//   e4m3fn and e2m1 have no Inf and saturate: anything (Inf included) beyond
//   the largest finite becomes +-448 / +-6. ml_dtypes 0.7 turns e4m3fn overflow
//   into NaN instead; we saturate like PTX cvt.rn.satfinite and ModelOpt's
//   clamp-then-cast. FloatToE5m2Saturate is the e5m2 saturating variant.
// - NaN: bf16 -> sign|0x7fc0, fp16 -> sign|0x7e00, e5m2 -> sign|0x7e,
//   e4m3fn -> sign|0x7f (quiet, payload dropped). e2m1 has no NaN: NaN -> 0x7
//   (+6), deliberately loud. e8m0 -> 0xff.
// - narrow -> float is exact (every narrow value is a float). NaN codes decode
//   to a quiet float NaN with the code's sign. e8m0 code 0 decodes to 2^-127,
//   a float subnormal (device code built with -ftz flushes it in arithmetic).
// - e8m0 is unsigned and has no zero: FloatToE8m0Floor / FloatToUe8m0Ceil take
//   a positive scale or amax; +-0 (and floor of anything below 2^-127) gives
//   code 0 (2^-127, the smallest scale); a negative, NaN or Inf input gives
//   0xff (NaN), as does a ceil that would need 2^128.
#pragma once

#include <cstdint>

#include "crashreplay/base/hd.h"

namespace crashreplay {

// ---------------------------------------------------------------- bit casts

CR_HD uint32_t FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  return __builtin_bit_cast(uint32_t, f);
#endif
}

CR_HD float BitsToFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  return __builtin_bit_cast(float, u);
#endif
}

namespace numeric_internal {

inline constexpr uint32_t kSignBit = 0x80000000u;
inline constexpr uint32_t kAbsMask = 0x7fffffffu;
inline constexpr uint32_t kFloatInf = 0x7f800000u;
inline constexpr uint32_t kFloatQuietNaN = 0x7fc00000u;

// Rounds |x| (bits `a`: sign clear, not NaN; Inf allowed) to nearest-even in
// a format with kMant stored mantissa bits and exponent bias kBias whose
// normal range starts above float's subnormals (fp16, e5m2, e4m3, e2m1).
// Returns the magnitude code (exponent << kMant | mantissa); it exceeds the
// format's largest code on overflow, and the caller saturates or makes Inf.
template <int kMant, int kBias>
CR_HD uint32_t RoundMagnitude(uint32_t a) {
  constexpr int kShift = 23 - kMant;
  constexpr uint32_t kMinNormalBits = static_cast<uint32_t>(127 + 1 - kBias) << 23;
  if (a >= kMinNormalBits) {
    // Adding half an ulp minus one, plus the lowest kept bit, rounds to
    // nearest with ties to even; a carry moves into the exponent correctly.
    const uint32_t rounded = a + ((1u << (kShift - 1)) - 1u) + ((a >> kShift) & 1u);
    return (rounded >> kShift) - (static_cast<uint32_t>(127 - kBias) << kMant);
  }
  // Target subnormal: value = m * 2^(e - 150); the target's unit is
  // 2^(1 - kBias - kMant), so the code is m >> s, rounded.
  const int exp_field = static_cast<int>(a >> 23);
  const uint32_t m = (a & 0x7fffffu) | (exp_field != 0 ? 0x800000u : 0u);
  const int e = exp_field != 0 ? exp_field : 1;
  int s = 151 - kBias - kMant - e;  // >= 24 - kMant >= 1
  if (s > 25) s = 25;               // m < 2^24: below half the unit -> 0
  const uint32_t q = m >> s;
  const uint32_t rem = m & ((1u << s) - 1u);
  const uint32_t half = 1u << (s - 1);
  return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}

// Decodes a finite magnitude code (exponent << kMant | mantissa) exactly.
template <int kMant, int kBias>
CR_HD uint32_t DecodeMagnitudeBits(uint32_t mag) {
  const uint32_t exp = mag >> kMant;
  const uint32_t mant = mag & ((1u << kMant) - 1u);
  if (exp != 0) {
    return ((exp + 127u - kBias) << 23) | (mant << (23 - kMant));
  }
  // Subnormal: mant * 2^(1 - kBias - kMant); the int -> float conversion and
  // the multiply by a power of two are exact.
  constexpr uint32_t kUnitBits = static_cast<uint32_t>(127 + 1 - kBias - kMant) << 23;
  return FloatBits(static_cast<float>(mant) * BitsToFloat(kUnitBits));
}

}  // namespace numeric_internal

// --------------------------------------------------------------------- bf16

CR_HD float Bf16ToFloat(uint16_t h) { return BitsToFloat(static_cast<uint32_t>(h) << 16); }

CR_HD uint16_t FloatToBf16(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & numeric_internal::kAbsMask) > numeric_internal::kFloatInf) {
    return static_cast<uint16_t>(((u >> 16) & 0x8000u) | 0x7fc0u);
  }
  // bf16 shares float's exponent: rounding the low 16 bits covers subnormals,
  // and a carry out of the largest finite gives Inf, as RNE requires.
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// --------------------------------------------------------------------- fp16

CR_HD float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t mag = h & 0x7fffu;
  if (mag >= 0x7c00u) {  // Inf, or NaN made quiet with its payload kept
    const uint32_t payload = (mag & 0x3ffu) << 13;
    return BitsToFloat(sign | numeric_internal::kFloatInf | (payload != 0 ? (payload | 0x400000u) : 0u));
  }
  return BitsToFloat(sign | numeric_internal::DecodeMagnitudeBits<10, 15>(mag));
}

CR_HD uint16_t FloatToFp16(float f) {
  const uint32_t u = FloatBits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & numeric_internal::kAbsMask;
  if (a > numeric_internal::kFloatInf) return static_cast<uint16_t>(sign | 0x7e00u);
  uint32_t mag = numeric_internal::RoundMagnitude<10, 15>(a);
  if (mag > 0x7c00u) mag = 0x7c00u;  // overflow -> Inf
  return static_cast<uint16_t>(sign | mag);
}

// ------------------------------------------------------------- fp8 e4m3fn
// OCP e4m3fn: bias 7, no Inf, only 0x7f/0xff are NaN; max +-448.

CR_HD float E4m3ToFloat(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t mag = b & 0x7fu;
  if (mag == 0x7fu) return BitsToFloat(sign | numeric_internal::kFloatQuietNaN);
  return BitsToFloat(sign | numeric_internal::DecodeMagnitudeBits<3, 7>(mag));
}

CR_HD uint8_t FloatToE4m3(float f) {
  const uint32_t u = FloatBits(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & numeric_internal::kAbsMask;
  if (a > numeric_internal::kFloatInf) return static_cast<uint8_t>(sign | 0x7fu);
  uint32_t mag = numeric_internal::RoundMagnitude<3, 7>(a);
  if (mag > 0x7eu) mag = 0x7eu;  // saturate (Inf included) to 448
  return static_cast<uint8_t>(sign | mag);
}

// --------------------------------------------------------------- fp8 e5m2
// OCP e5m2: bias 15, IEEE-like (Inf 0x7c, NaN 0x7d..0x7f); max +-57344.

CR_HD float E5m2ToFloat(uint8_t b) { return Fp16ToFloat(static_cast<uint16_t>(static_cast<uint16_t>(b) << 8)); }

// Non-saturating, as ml_dtypes: values from 61440 (the tie above 57344) up
// become +-Inf.
CR_HD uint8_t FloatToE5m2(float f) {
  const uint32_t u = FloatBits(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & numeric_internal::kAbsMask;
  if (a > numeric_internal::kFloatInf) return static_cast<uint8_t>(sign | 0x7eu);
  uint32_t mag = numeric_internal::RoundMagnitude<2, 15>(a);
  if (mag > 0x7cu) mag = 0x7cu;
  return static_cast<uint8_t>(sign | mag);
}

// Saturating variant (PTX cvt.rn.satfinite.e5m2x2 semantics): finite
// overflow and Inf become +-57344; NaN stays NaN.
CR_HD uint8_t FloatToE5m2Saturate(float f) {
  const uint8_t b = FloatToE5m2(f);
  return (b & 0x7fu) == 0x7cu ? static_cast<uint8_t>((b & 0x80u) | 0x7bu) : b;
}

// --------------------------------------------------------------------- e8m0
// OCP e8m0 / "ue8m0": unsigned, 8 exponent bits, bias 127, value 2^(e-127);
// 0xff is NaN; there is no zero and no sign.

CR_HD float E8m0ToFloat(uint8_t e) {
  if (e == 0xffu) return BitsToFloat(numeric_internal::kFloatQuietNaN);
  if (e == 0u) return BitsToFloat(0x00400000u);  // 2^-127, a float subnormal
  return BitsToFloat(static_cast<uint32_t>(e) << 23);
}

// 2^k as a float for k in [-127, 127] (2^-127 is subnormal), exact, no libm:
// the reciprocal of an e8m0 scale is ExactPow2(127 - code).
CR_HD float ExactPow2(int k) {
  return k >= -126 ? BitsToFloat(static_cast<uint32_t>(k + 127) << 23) : BitsToFloat(0x00400000u);
}

// OCP MX: floor(log2(x)) + 127, i.e. the float's exponent field. x below
// 2^-127 (and +-0) gives 0; negative, NaN or Inf gives 0xff.
CR_HD uint8_t FloatToE8m0Floor(float x) {
  const uint32_t u = FloatBits(x);
  const uint32_t a = u & numeric_internal::kAbsMask;
  if (a == 0u) return 0u;
  if ((u & numeric_internal::kSignBit) != 0u || a >= numeric_internal::kFloatInf) return 0xffu;
  return static_cast<uint8_t>(a >> 23);  // a float subnormal has field 0: clamps to 2^-127
}

// DeepGEMM UE8M0: the smallest power of two >= x (round the scale UP, so a
// block scaled by it never overflows). Exact powers of two are kept. +-0 and
// x <= 2^-127 give 0; negative, NaN, Inf or x > 2^127 give 0xff.
CR_HD uint8_t FloatToUe8m0Ceil(float x) {
  const uint32_t u = FloatBits(x);
  const uint32_t a = u & numeric_internal::kAbsMask;
  if (a == 0u) return 0u;
  if ((u & numeric_internal::kSignBit) != 0u || a >= numeric_internal::kFloatInf) return 0xffu;
  const uint32_t exp = a >> 23;
  if (exp == 0u) return a <= 0x00400000u ? 0u : 1u;  // float subnormal
  const uint32_t code = exp + ((a & 0x7fffffu) != 0u ? 1u : 0u);
  return static_cast<uint8_t>(code);  // 255 (NaN) when x > 2^127
}

// True when fp32 `bits` is in the layout UE8M0 kernels expect: only exponent
// bits set, i.e. a positive power of two (2^-126 .. 2^127), +0 or +Inf.
CR_HD bool IsUe8m0Layout(uint32_t fp32_bits) { return (fp32_bits & 0x807fffffu) == 0u; }

// The four UE8M0 bytes of one int32 in DeepGEMM's packed scale layout:
// element 0 in the low byte.
CR_HD uint32_t PackUe8m0x4(uint8_t e0, uint8_t e1, uint8_t e2, uint8_t e3) {
  return static_cast<uint32_t>(e0) | (static_cast<uint32_t>(e1) << 8) | (static_cast<uint32_t>(e2) << 16) |
         (static_cast<uint32_t>(e3) << 24);
}

CR_HD uint8_t UnpackUe8m0(uint32_t word, int i) { return static_cast<uint8_t>(word >> (8 * i)); }

// --------------------------------------------------------------------- e2m1
// OCP fp4 e2m1: sign, 2 exponent bits (bias 1), 1 mantissa bit; values
// 0, 0.5, 1, 1.5, 2, 3, 4, 6 (codes 0..7) and their negatives (8..15).

CR_HD float E2m1ToFloat(uint8_t nibble) {
  const uint32_t sign = static_cast<uint32_t>(nibble & 0x8u) << 28;
  const uint32_t exp = (nibble >> 1) & 0x3u;
  const uint32_t mant = nibble & 0x1u;
  // exp 0: subnormal 0 or 0.5 (0x3f000000); else (1 + mant/2) * 2^(exp-1).
  const uint32_t mag = exp != 0u ? (((exp + 126u) << 23) | (mant << 22)) : (mant * 0x3f000000u);
  return BitsToFloat(sign | mag);
}

// Saturates to +-6 (Inf included); NaN -> 0x7 (+6). Returns a nibble (0..15).
CR_HD uint8_t FloatToE2m1(float f) {
  const uint32_t u = FloatBits(f);
  const uint32_t a = u & numeric_internal::kAbsMask;
  if (a > numeric_internal::kFloatInf) return 0x7u;
  const uint32_t sign = (u >> 28) & 0x8u;
  uint32_t mag = numeric_internal::RoundMagnitude<1, 1>(a);
  if (mag > 0x7u) mag = 0x7u;
  return static_cast<uint8_t>(sign | mag);
}

// Packed fp4 buffers: element i lives in byte i/2, the even element in the
// low nibble. `i` indexes elements, not bytes.
CR_HD uint8_t GetNibble(const uint8_t* packed, uint64_t i) {
  return static_cast<uint8_t>((packed[i >> 1] >> ((i & 1u) * 4u)) & 0xfu);
}

CR_HD void SetNibble(uint8_t* packed, uint64_t i, uint8_t nibble) {
  const unsigned shift = static_cast<unsigned>(i & 1u) * 4u;
  uint8_t& byte = packed[i >> 1];
  byte = static_cast<uint8_t>((byte & ~(0xfu << shift)) | ((nibble & 0xfu) << shift));
}

CR_HD uint8_t PackE2m1x2(uint8_t even, uint8_t odd) {
  return static_cast<uint8_t>((even & 0xfu) | ((odd & 0xfu) << 4));
}

}  // namespace crashreplay
