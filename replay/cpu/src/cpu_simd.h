// Eight-float vectors for the CPU fast kernels (cpu_dot.cc), written with GCC
// vector extensions so that one source compiles to AVX2 (inside functions
// built with CR_TARGET_AVX2: AVX2, FMA and F16C), to SSE2 pairs on any x86-64,
// and to NEON pairs on aarch64.
//
// Everything here reproduces, lane by lane, a scalar function of
// formats/numeric.h or kernels/linear.h with the same IEEE operations in the
// same order: the storage decoders are the integer bit manipulations of
// Bf16ToFloat/Fp16ToFloat/E4m3ToFloat/E2m1ToFloat (the subnormal cases use
// the same exact int->float conversion and power-of-two multiply), RoundBf16
// is Bf16ToFloat(FloatToBf16(v)), and LaneSums8 is LaneSum8's tree. An
// addition a + b keeps a as the first operand, so even NaN payloads follow
// the scalar code. cpu_dot_test checks every decoder over all its codes.
//
// Every function is forced inline and lives in an anonymous namespace: the
// code is compiled into each caller with the caller's instruction set, and
// no out-of-line copy built for AVX2 can be picked by the linker for a
// caller that runs on a CPU without it.
#pragma once

#include <cstdint>
#include <cstring>
#if defined(__x86_64__)
#include <immintrin.h>  // declares the F16C builtins (called directly: see Fp16BitsToFloat)
#endif

#include "crashreplay/formats/numeric.h"
#include "crashreplay/replay/cpu/cpu_kernels.h"
#include "crashreplay/replay/kernels/linear.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "cpu_simd.h decodes packed e2m1 nibbles as little-endian words"
#endif

#define CR_SIMD_INLINE inline __attribute__((always_inline))

// The x86 targets the kernels are compiled for. CpuIsaSupported checks the
// same features at run time.
#define CR_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define CR_TARGET_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,fma,f16c")))

namespace crashreplay::replay::cpu {
namespace {

// The instruction sets the kernels are built for (one source, picked at run
// time): kGeneric is the baseline target (SSE2 pairs, NEON pairs).
constexpr int kIsaGeneric = 0;
constexpr int kIsaAvx2 = 1;
constexpr int kIsaAvx512 = 2;

typedef float f32x8 __attribute__((vector_size(32)));
typedef uint32_t u32x8 __attribute__((vector_size(32)));
typedef int32_t i32x8 __attribute__((vector_size(32)));
typedef uint16_t u16x8 __attribute__((vector_size(16)));
typedef uint8_t u8x16 __attribute__((vector_size(16)));
typedef uint64_t u64x2 __attribute__((vector_size(16)));
typedef int16_t i16x8 __attribute__((vector_size(16)));
typedef int8_t i8x8 __attribute__((vector_size(8)));
typedef float f32x16 __attribute__((vector_size(64)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));
typedef int32_t i32x16 __attribute__((vector_size(64)));
typedef uint64_t u64x8 __attribute__((vector_size(64)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));
typedef int16_t i16x16 __attribute__((vector_size(32)));
typedef int8_t i8x16 __attribute__((vector_size(16)));
typedef int8_t i8x32 __attribute__((vector_size(32)));
typedef uint16_t u16x32 __attribute__((vector_size(64)));

CR_SIMD_INLINE f32x8 Load8(const float* p) {
  f32x8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
CR_SIMD_INLINE void Store8(float* p, f32x8 v) { std::memcpy(p, &v, sizeof v); }
CR_SIMD_INLINE f32x8 Splat(float s) { return f32x8{} + s; }
CR_SIMD_INLINE f32x8 Zero8() { return f32x8{}; }

// Bf16ToFloat(FloatToBf16(v)) per lane: NaN -> sign | 0x7fc0, else round to
// nearest even on the low 16 bits.
// FV: a float vector, UV: the uint32 vector of its width.
template <class FV, class UV>
CR_SIMD_INLINE FV RoundBf16V(FV v) {
  const UV u = (UV)v;
  const UV rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  const UV nan = (u & 0x80000000u) | 0x7fc00000u;
  return (FV)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}
CR_SIMD_INLINE f32x8 RoundBf16(f32x8 v) { return RoundBf16V<f32x8, u32x8>(v); }
#if defined(__x86_64__)
// RoundBf16V where every NaN among v has its low 22 bits zero (sign |
// 0x7fc00000 or the default NaN): the add then leaves it as it is, which is
// RoundBf16V's NaN case, so that case is not needed.
CR_SIMD_INLINE f32x16 RoundBf16Finite(f32x16 v) {
  const u32x16 u = (u32x16)v;
  return (f32x16)((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
}
#endif

// ---- storage decoders: 8 consecutive elements from flat index i0 ---------
// E2m1 needs i0 even (the group starts on a byte).

CR_SIMD_INLINE f32x8 DecodeBf16(const uint16_t* p) {
  u16x8 h;
  std::memcpy(&h, p, sizeof h);
  return (f32x8)(__builtin_convertvector(h, u32x8) << 16);
}

CR_SIMD_INLINE f32x8 DecodeF16(const uint16_t* p) {
  u16x8 h16;
  std::memcpy(&h16, p, sizeof h16);
  const u32x8 h = __builtin_convertvector(h16, u32x8);
  const u32x8 sign = (h & 0x8000u) << 16;
  const u32x8 mag = h & 0x7fffu;
  const u32x8 normal = (mag << 13) + ((127u - 15u) << 23);
  const u32x8 payload = (mag & 0x3ffu) << 13;
  const u32x8 special = 0x7f800000u | payload | ((u32x8)(payload != 0u) & 0x400000u);
  // Subnormal: mant * 2^-24, an exact conversion and an exact multiply.
  const u32x8 sub = (u32x8)(__builtin_convertvector((i32x8)mag, f32x8) * 0x1p-24f);
  const u32x8 mag_bits = mag >= 0x7c00u ? special : (mag >= 0x400u ? normal : sub);
  return (f32x8)(sign | mag_bits);
}

// 8 bytes zero-extended to 32 bits. Through 16-bit lanes: GCC 12 lowers a
// direct u8x8 -> u32x8 conversion to a scalar load per byte, this form to
// vpmovzxbw + vpmovzxwd under AVX2 (fp8 weights ran ~6x slower than bf16).
CR_SIMD_INLINE u32x8 WidenBytes8(const uint8_t* p) {
  uint64_t q;
  std::memcpy(&q, p, sizeof q);
  const u8x16 b = (u8x16)(u64x2{q, 0});
  const u8x16 z = {};
  const u8x16 w = __builtin_shufflevector(b, z, 0, 16, 1, 16, 2, 16, 3, 16, 4, 16, 5, 16, 6, 16, 7, 16);
  return __builtin_convertvector((u16x8)w, u32x8);
}

CR_SIMD_INLINE f32x8 DecodeE4m3(const uint8_t* p) {
  const u32x8 b = WidenBytes8(p);
  const u32x8 sign = (b & 0x80u) << 24;
  const u32x8 mag = b & 0x7fu;
  const u32x8 normal = (mag << 20) + (120u << 23);
  const u32x8 sub = (u32x8)(__builtin_convertvector((i32x8)(mag & 7u), f32x8) * 0x1p-9f);
  const u32x8 mag_bits = mag == 0x7fu ? u32x8{} + 0x7fc00000u : ((mag >> 3) != 0u ? normal : sub);
  return (f32x8)(sign | mag_bits);
}

CR_SIMD_INLINE f32x8 DecodeE2m1(const uint8_t* packed, int64_t i0) {
  uint32_t word;
  std::memcpy(&word, packed + (i0 >> 1), sizeof word);
  const u32x8 n = ((u32x8{} + word) >> u32x8{0, 4, 8, 12, 16, 20, 24, 28}) & 0xfu;
  const u32x8 sign = (n & 8u) << 28;
  const u32x8 e = (n >> 1) & 3u;
  const u32x8 m = n & 1u;
  const u32x8 mag = e != 0u ? (((e + 126u) << 23) | (m << 22)) : m * 0x3f000000u;
  return (f32x8)(sign | mag);
}

template <WFormat F>
CR_SIMD_INLINE f32x8 DecodeGroup(const void* data, int64_t i0) {
  if constexpr (F == WFormat::kF32) {
    return Load8(static_cast<const float*>(data) + i0);
  } else if constexpr (F == WFormat::kBF16) {
    return DecodeBf16(static_cast<const uint16_t*>(data) + i0);
  } else if constexpr (F == WFormat::kF16) {
    return DecodeF16(static_cast<const uint16_t*>(data) + i0);
  } else if constexpr (F == WFormat::kE4m3) {
    return DecodeE4m3(static_cast<const uint8_t*>(data) + i0);
  } else {
    return DecodeE2m1(static_cast<const uint8_t*>(data), i0);
  }
}

#if defined(__x86_64__)
// Eight fp16 codes to floats with one vcvtph2ps (F16C): exact, and for NaN
// codes the quiet NaN with the payload moved up, as Fp16ToFloat gives.
CR_SIMD_INLINE f32x8 Fp16BitsToFloat(u16x8 h) { return __builtin_ia32_vcvtph2ps256((i16x8)h); }

// E4m3ToFloat through fp16: the sign-extended byte s.eeee.mmm shifted left
// by 7 is s.s.eeee.mmm.0000000; clearing bit 14 leaves the fp16 code
// s.0eeee.mmm0000000 of the same value times 2^-8 (the exponent biases are
// 7 and 15), subnormals included. The NaN codes (s.1111.111, which would
// read as 1.875) become the fp16 quiet NaN s.11111.1000000000, whose float is
// sign | 0x7fc00000 as E4m3ToFloat's. V: 16-bit lanes.
template <class V>
CR_SIMD_INLINE V E4m3Fp16Codes(V sign_extended) {
  V h = (sign_extended << 7) & 0xbf80u;
  const V nan = (V)((h & 0x7fffu) == 0x3f80u);
  return h ^ (nan & 0x4180u);  // 0x3f80 ^ 0x4180 = 0x7e00
}

// The fp16 value times 2^8 is exact (|x| <= 448 and >= 2^-9 after it); a
// NaN goes through the multiply unchanged.
CR_SIMD_INLINE f32x8 DecodeE4m3F16c(const uint8_t* p) {
  i8x8 b;
  std::memcpy(&b, p, sizeof b);
  const u16x8 h = E4m3Fp16Codes((u16x8) __builtin_convertvector(b, i16x8));
  return Fp16BitsToFloat(h) * Splat(256.0f);
}
#endif

// DecodeGroup in the kernels' instruction set: on AVX2 and AVX-512 the fp16
// and e4m3 codes go through F16C's conversion (same values, same NaNs:
// cpu_kernels_test checks every code on every ISA).
template <WFormat F, int kIsa>
CR_SIMD_INLINE f32x8 DecodeGroupIsa(const void* data, int64_t i0) {
#if defined(__x86_64__)
  if constexpr (kIsa >= kIsaAvx2 && F == WFormat::kF16) {
    u16x8 h;
    std::memcpy(&h, static_cast<const uint16_t*>(data) + i0, sizeof h);
    return Fp16BitsToFloat(h);
  } else if constexpr (kIsa >= kIsaAvx2 && F == WFormat::kE4m3) {
    return DecodeE4m3F16c(static_cast<const uint8_t*>(data) + i0);
  }
#endif
  return DecodeGroup<F>(data, i0);
}

#if defined(__x86_64__)
// 16 e4m3 codes as DecodeE4m3F16c gives them, for AVX-512 callers:
// E4m3Fp16Codes over one register of 16-bit lanes, one 16-lane conversion
// and multiply.
CR_SIMD_INLINE f32x16 DecodeE4m3x16(const uint8_t* p) {
  i8x16 b;
  std::memcpy(&b, p, sizeof b);
  // The sign extension as one instruction (GCC 12 splits a converted
  // vector of 16 bytes into halves).
  const u16x16 h = E4m3Fp16Codes((u16x16)__builtin_ia32_pmovsxbw256((__v16qi)b));
  return __builtin_ia32_vcvtph2ps512_mask((i16x16)h, f32x16{}, static_cast<uint16_t>(0xffff), 4) * (f32x16{} + 256.0f);
}

// 32 e4m3 codes as DecodeE4m3F16c gives them: codes 0-15 into *lo, 16-31
// into *hi (one sign extension and one E4m3Fp16Codes for all 32). Without
// kTimes256, the fp16 values: each e4m3 value times 2^-8, exactly.
template <bool kTimes256 = true>
CR_SIMD_INLINE void DecodeE4m3x32(i8x32 codes, f32x16* lo, f32x16* hi) {
  const u16x32 h =
      E4m3Fp16Codes((u16x32)__builtin_ia32_pmovsxbw512_mask((__v32qi)codes, (__v32hi){}, static_cast<__mmask32>(-1)));
  const i16x16 h0 = (i16x16)__builtin_shufflevector(h, h, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const i16x16 h1 =
      (i16x16)__builtin_shufflevector(h, h, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31);
  *lo = __builtin_ia32_vcvtph2ps512_mask(h0, f32x16{}, static_cast<uint16_t>(0xffff), 4);
  *hi = __builtin_ia32_vcvtph2ps512_mask(h1, f32x16{}, static_cast<uint16_t>(0xffff), 4);
  if constexpr (kTimes256) {
    *lo = *lo * (f32x16{} + 256.0f);
    *hi = *hi * (f32x16{} + 256.0f);
  }
}
#endif

CR_SIMD_INLINE void Halves(f32x16 f, f32x8* lo, f32x8* hi) {
  *lo = __builtin_shufflevector(f, f, 0, 1, 2, 3, 4, 5, 6, 7);
  *hi = __builtin_shufflevector(f, f, 8, 9, 10, 11, 12, 13, 14, 15);
}

// Two consecutive groups (16 elements from i0) as DecodeGroupIsa gives them;
// times s and rounded to bf16 (RoundBf16) when kRound. AVX-512 e4m3: all
// 16 at once (DecodeE4m3x16), which is what makes pairs pay.
template <WFormat F, int kIsa, bool kRound = false>
CR_SIMD_INLINE void DecodePairIsa(const void* data, int64_t i0, float s, f32x8* lo, f32x8* hi) {
#if defined(__x86_64__)
  if constexpr (kIsa == kIsaAvx512 && F == WFormat::kE4m3) {
    f32x16 f = DecodeE4m3x16(static_cast<const uint8_t*>(data) + i0);
    if constexpr (kRound) f = RoundBf16V<f32x16, u32x16>(f * (f32x16{} + s));
    return Halves(f, lo, hi);
  }
#endif
  *lo = DecodeGroupIsa<F, kIsa>(data, i0);
  *hi = DecodeGroupIsa<F, kIsa>(data, i0 + 8);
  if constexpr (kRound) {
    *lo = RoundBf16(*lo * Splat(s));
    *hi = RoundBf16(*hi * Splat(s));
  }
}

// ---- LaneSum8 of eight vectors at once ------------------------------------
// Lane k of the result is ((v_k[0] + v_k[1]) + (v_k[2] + v_k[3])) +
// ((v_k[4] + v_k[5]) + (v_k[6] + v_k[7])): the pairs of each level are
// gathered into an even and an odd vector and added even + odd.

CR_SIMD_INLINE f32x8 PairSums(f32x8 a, f32x8 b) {
  const f32x8 even = __builtin_shuffle(a, b, i32x8{0, 2, 8, 10, 4, 6, 12, 14});
  const f32x8 odd = __builtin_shuffle(a, b, i32x8{1, 3, 9, 11, 5, 7, 13, 15});
  return even + odd;
}

CR_SIMD_INLINE f32x8 LaneSums8(const f32x8* v) {
  // Level 1: [a01 a23 b01 b23 | a45 a67 b45 b67]; level 2: [a0123 b0123
  // c0123 d0123 | a4567 b4567 c4567 d4567]; level 3 adds the halves.
  const f32x8 abcd = PairSums(PairSums(v[0], v[1]), PairSums(v[2], v[3]));
  const f32x8 efgh = PairSums(PairSums(v[4], v[5]), PairSums(v[6], v[7]));
  const f32x8 lo = __builtin_shuffle(abcd, efgh, i32x8{0, 1, 2, 3, 8, 9, 10, 11});
  const f32x8 hi = __builtin_shuffle(abcd, efgh, i32x8{4, 5, 6, 7, 12, 13, 14, 15});
  return lo + hi;
}

// ---- one body for each instruction set ---------------------------------------
// A lambda marked CR_LAMBDA_INLINE is inlined into OnIsa's instantiation for
// the ISA picked at run time, so the CR_SIMD_INLINE kernels it calls are
// built with that ISA.
#define CR_LAMBDA_INLINE __attribute__((always_inline))

// Causal lengths grow with the token index: tasks take tokens in zigzag
// order (first, last, second, second last, ...), so the pool's contiguous
// ranges carry about the same number of positions.
CR_SIMD_INLINE int64_t Zigzag(int64_t z, int64_t tokens) { return (z & 1) == 0 ? z / 2 : tokens - 1 - z / 2; }

// body() compiled for each instruction set: `body` is an always-inline
// lambda over CR_SIMD_INLINE kernels, so each of these three
// instantiations builds them with its own ISA.
template <class Body>
__attribute__((noinline)) void OnGeneric(const Body& body) {
  body();
}
#if defined(__x86_64__)
template <class Body>
CR_TARGET_AVX2 __attribute__((noinline)) void OnAvx2(const Body& body) {
  body();
}
template <class Body>
CR_TARGET_AVX512 __attribute__((noinline)) void OnAvx512(const Body& body) {
  body();
}
#endif

template <class Body>
void OnIsa(CpuIsa isa, const Body& body) {
  switch (isa) {
#if defined(__x86_64__)
    case CpuIsa::kAvx512: return OnAvx512(body);
    case CpuIsa::kAvx2: return OnAvx2(body);
#endif
    default: return OnGeneric(body);
  }
}

}  // namespace
}  // namespace crashreplay::replay::cpu
