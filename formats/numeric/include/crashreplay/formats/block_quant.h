// Block-scaled quantization of checkpoint weights and activations: NVFP4
// (ModelOpt), MXFP4 (OCP MX), FP8 128x128 weight blocks and 1x128 activation
// groups (DeepSeek-V3 / DeepGEMM), and UE8M0 scale conversion and packing.
//
// Two layers:
// - CR_HD per-element and per-block pieces (Dequant*, *BlockScale, Quant*):
//   the arithmetic every dequantizing kernel runs, shared by the CPU reference
//   and CUDA kernels so both produce the same bits.
// - Host functions over whole row-major [rows, cols] matrices (leading dims
//   flattened into rows). The caller owns every buffer; sizes must match the
//   *Count helpers exactly. A shape or size mismatch returns InvalidArgument
//   naming the function and both sizes; nothing is written then. The outputs
//   are a pure function of the inputs (deterministic, thread-safe on disjoint
//   buffers).
//
// Layouts (docs/formats/numerics.md):
// - NVFP4: values e2m1 packed two per byte along cols (even element in the
//   low nibble), [rows, cols/2] bytes; one e4m3 scale per 16 consecutive
//   elements of a row, [rows, ceil(cols/16)]; one fp32 global scale
//   (ModelOpt `weight_scale_2`). x = e2m1 * e4m3_scale * global.
// - MXFP4: values as NVFP4; one e8m0 scale per 32 elements of a row,
//   [rows, ceil(cols/32)]. x = e2m1 * 2^(scale - 127).
// - FP8 block: e4m3 values [rows, cols]; fp32 scales [ceil(rows/br),
//   ceil(cols/bc)] (`weight_scale_inv`, br = bc = 128 for weights; br = 1,
//   bc = 128 for activation groups). x = fp8 * scale. Edge blocks are partial.
// Partial trailing blocks (cols not a multiple of the block) are allowed;
// fp4 formats need an even cols so rows start on a byte.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "crashreplay/base/hd.h"
#include "crashreplay/formats/numeric.h"

namespace crashreplay {

inline constexpr int64_t kNvfp4BlockSize = 16;
inline constexpr int64_t kMxfp4BlockSize = 32;
inline constexpr int64_t kFp8BlockSize = 128;

// e2m1's and e4m3's largest finite magnitudes.
inline constexpr float kE2m1Max = 6.0f;
inline constexpr float kE4m3Max = 448.0f;

// Number of blocks of `block` covering `n` (the last one may be partial).
CR_HD int64_t BlockCount(int64_t n, int64_t block) { return (n + block - 1) / block; }

// Running max of |v| that propagates NaN: once a NaN is seen the result is
// NaN, so a block holding a NaN gets a NaN scale rather than a silent one.
CR_HD float AbsMaxAccumulate(float acc, float v) {
  const float a = BitsToFloat(FloatBits(v) & 0x7fffffffu);
  return (a != a || a > acc) ? a : acc;
}

// ------------------------------------------------------------------ NVFP4

// Dequantizes one element. e2m1 * e4m3 is exact (at most 6 significant
// bits), so the only rounding is the final multiply by the global scale.
CR_HD float DequantNvfp4(uint8_t nibble, uint8_t e4m3_scale, float global_scale) {
  return (E2m1ToFloat(nibble) * E4m3ToFloat(e4m3_scale)) * global_scale;
}

// Same bits as DequantNvfp4, with the block scale decoded once per block
// (block_scale = E4m3ToFloat(e4m3_scale)).
CR_HD float DequantNvfp4Decoded(uint8_t nibble, float block_scale, float global_scale) {
  return (E2m1ToFloat(nibble) * block_scale) * global_scale;
}

// ModelOpt's block scale: block_amax / (6 * global), stored as e4m3
// (saturating); an all-zero block gets scale 1.0 as ModelOpt writes it.
CR_HD uint8_t Nvfp4BlockScale(float block_amax, float global_scale) {
  float s = block_amax / (kE2m1Max * global_scale);
  if (s == 0.0f) s = 1.0f;
  return FloatToE4m3(s);
}

// Quantizes one element given its block's stored scale: x / (scale * global),
// rounded to nearest-even e2m1, saturating at 6. A block whose stored scale
// decodes to zero (it underflowed e4m3) dequantizes to zero whatever the
// nibble; we write +-0 there rather than the saturated +-6 of x/0.
CR_HD uint8_t QuantNvfp4(float x, uint8_t e4m3_scale, float global_scale) {
  const float denom = E4m3ToFloat(e4m3_scale) * global_scale;
  if (denom == 0.0f) return static_cast<uint8_t>((FloatBits(x) >> 28) & 0x8u);
  return FloatToE2m1(x / denom);
}

// ------------------------------------------------------------------ MXFP4

CR_HD float DequantMxfp4(uint8_t nibble, uint8_t e8m0_scale) { return E2m1ToFloat(nibble) * E8m0ToFloat(e8m0_scale); }

// OCP MX v1.0: shared exponent = floor(log2(amax)) - emax(e2m1) where
// emax = 2, clamped below at -127 (an all-zero block gets 2^-127). An amax
// that is NaN or Inf gives the NaN scale 0xff.
CR_HD uint8_t Mxfp4BlockScale(float block_amax) {
  const uint8_t floor_code = FloatToE8m0Floor(block_amax);
  if (floor_code == 0xffu) return floor_code;
  return floor_code > 2u ? static_cast<uint8_t>(floor_code - 2u) : static_cast<uint8_t>(0u);
}

// x / 2^(scale-127) rounded to nearest-even e2m1, saturating at 6 (the OCP
// spec's element conversion). Multiplying by the exact reciprocal power of
// two gives the same bits as dividing.
CR_HD uint8_t QuantMxfp4(float x, uint8_t e8m0_scale) {
  if (e8m0_scale == 0xffu) return FloatToE2m1(BitsToFloat(0x7fc00000u));
  return FloatToE2m1(x * ExactPow2(127 - static_cast<int>(e8m0_scale)));
}

// -------------------------------------------------------------- FP8 block

CR_HD float DequantFp8(uint8_t e4m3, float scale) { return E4m3ToFloat(e4m3) * scale; }

// The scale of one FP8 block or group: max(amax, amax_floor) / 448, rounded
// up to a power of two when `ue8m0` (DeepGEMM's ceil_to_ue8m0).
CR_HD float Fp8BlockScale(float block_amax, float amax_floor, bool ue8m0) {
  // A NaN amax fails the comparison and stays NaN, so the scale shows it.
  const float amax = block_amax < amax_floor ? amax_floor : block_amax;
  const float s = amax / kE4m3Max;
  return ue8m0 ? E8m0ToFloat(FloatToUe8m0Ceil(s)) : s;
}

// x / scale to e4m3 with round-to-nearest-even, saturating at +-448.
CR_HD uint8_t QuantFp8(float x, float scale) { return FloatToE4m3(x / scale); }

// ------------------------------------------------------------ host: sizes

struct MatrixShape {
  int64_t rows = 0;
  int64_t cols = 0;
};

int64_t Nvfp4PackedBytes(MatrixShape shape);   // rows * cols / 2
int64_t Nvfp4ScaleCount(MatrixShape shape);    // rows * ceil(cols / 16)
int64_t Mxfp4PackedBytes(MatrixShape shape);   // rows * cols / 2
int64_t Mxfp4ScaleCount(MatrixShape shape);    // rows * ceil(cols / 32)

// ------------------------------------------------------------ host: NVFP4

// ModelOpt's per-tensor `weight_scale_2`: amax(|x|) / (6 * 448). An all-zero
// (or empty) tensor gets 1.0 instead of ModelOpt's 0, so block scales stay
// finite. A NaN element makes it NaN (and every scale after it).
float Nvfp4GlobalScale(std::span<const float> x);

// Quantizes x ([rows, cols], cols even) with ModelOpt's scale rule.
absl::Status QuantizeNvfp4(std::span<const float> x, MatrixShape shape, float global_scale, std::span<uint8_t> packed,
                           std::span<uint8_t> scales);

absl::Status DequantizeNvfp4(std::span<const uint8_t> packed, std::span<const uint8_t> scales, float global_scale,
                             MatrixShape shape, std::span<float> out);

// ------------------------------------------------------------ host: MXFP4

absl::Status QuantizeMxfp4(std::span<const float> x, MatrixShape shape, std::span<uint8_t> packed,
                           std::span<uint8_t> scales);

absl::Status DequantizeMxfp4(std::span<const uint8_t> packed, std::span<const uint8_t> scales, MatrixShape shape,
                             std::span<float> out);

// ------------------------------------------------------- host: FP8 blocks

struct Fp8BlockOptions {
  int64_t block_rows = kFp8BlockSize;  // 1 for activation groups
  int64_t block_cols = kFp8BlockSize;
  // DeepGEMM UE8M0 mode: every scale rounded up to a power of two.
  bool ue8m0_scales = false;
  // Block amax is clamped below to this before dividing by 448 (DeepGEMM
  // uses 1e-4; sglang's group quant kernel 1e-10), so a zero block has a
  // finite, non-zero scale.
  float amax_floor = 1e-4f;
};

inline constexpr Fp8BlockOptions kFp8WeightBlocks{};
inline constexpr Fp8BlockOptions kFp8ActivationGroups{1, kFp8BlockSize, false, 1e-4f};

int64_t Fp8ScaleCount(MatrixShape shape, const Fp8BlockOptions& opts);

// q = e4m3(x / scale) per block, scale = Fp8BlockScale(block amax).
absl::Status QuantizeFp8Blocks(std::span<const float> x, MatrixShape shape, const Fp8BlockOptions& opts,
                               std::span<uint8_t> q, std::span<float> scales);

// x = e4m3 * scale (DeepSeek-V3 `weight_scale_inv` semantics).
absl::Status DequantizeFp8Blocks(std::span<const uint8_t> q, std::span<const float> scales, MatrixShape shape,
                                 const Fp8BlockOptions& opts, std::span<float> out);

// Requantizes FP8 block weights so every scale is a power of two, as sglang
// does when it converts a checkpoint for DeepGEMM's UE8M0 kernels:
// dequantize (fp8 * scale, rounded to bf16 when `through_bf16`, as sglang's
// block_quant_dequant(..., torch.bfloat16) does), then requantize each block
// with scale ceil_pow2(max(amax, 1e-4) / 448). `opts.ue8m0_scales` and
// `opts.amax_floor` are ignored. q_out/scales_out may be q/scales (in place).
absl::Status RequantizeFp8BlocksToUe8m0(std::span<const uint8_t> q, std::span<const float> scales, MatrixShape shape,
                                        const Fp8BlockOptions& opts, bool through_bf16, std::span<uint8_t> q_out,
                                        std::span<float> scales_out);

// ------------------------------------------------------- host: UE8M0 scales

// fp32 scales -> e8m0 codes. Ceil is DeepGEMM's rule (round up to a power of
// two, so quantized values never overflow); Floor is OCP MX's. Sizes must
// match.
absl::Status Fp32ScalesToUe8m0Ceil(std::span<const float> scales, std::span<uint8_t> codes);
absl::Status Fp32ScalesToE8m0Floor(std::span<const float> scales, std::span<uint8_t> codes);

// Packs a row-major [rows, cols] matrix of e8m0 codes into int32 words along
// cols, four per word, element 0 in the low byte (DeepGEMM's packed UE8M0
// layout before its TMA alignment/transposition): [rows, ceil(cols/4)]. A
// row's padding bytes are 0.
int64_t Ue8m0PackedWords(MatrixShape shape);
absl::Status PackUe8m0(std::span<const uint8_t> codes, MatrixShape shape, std::span<uint32_t> packed);
absl::Status UnpackUe8m0(std::span<const uint32_t> packed, MatrixShape shape, std::span<uint8_t> codes);

}  // namespace crashreplay
