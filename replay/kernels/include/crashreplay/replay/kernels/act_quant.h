// NVFP4 activation quantization: the kernel a W4A4 serving engine runs before
// every NVFP4 GEMM (nvfp4_activation=w4a4).
//
// A ModelOpt NVFP4 checkpoint stores, per linear layer, a scalar fp32
// `input_scale` = calibrated amax(input) / (6 * 448). Engines quantize the
// layer's input on the fly with the *global scale* g = 1 / input_scale, in
// blocks of 16 consecutive elements along K:
//
//   block scale  s8 = e4m3(g * (amax_block * (1/6)))      RNE, saturating at 448
//   element      q  = e2m1(x * (1 / (s * (1/g))))          RNE, saturating at 6
//                     (s = e4m3 value of s8; a zero scale gives q = +-0)
//   dequantized  x' = (e2m1(q) * s) * input_scale
//
// so the block scale is 448 * amax_block / amax_calibrated: a block whose amax
// exceeds the calibrated amax saturates its scale at 448 and its largest
// elements clip at 6 * 448 * input_scale, silently, as the hardware's
// satfinite conversions do. The formula is the one the engines' reference
// quantizer (and their CUDA kernels, with approximate reciprocals) use; here
// every division is an IEEE division, so host and device give the same bits.
//
// Non-finite inputs: a NaN in a block makes its amax NaN (AbsMaxAccumulate),
// its scale the e4m3 NaN 0x7f and, after the GEMM, NaN outputs, so the
// watcher's first non-finite kernel is the GEMM that read the block. An Inf
// saturates the scale at 448 and itself at 6.
//
// Precondition checked (Check::kNvfp4InputScale, "nvfp4_input_scale_valid"):
// input_scale is finite and > 0 (and 1 / input_scale finite). Real kernels compute 1 / input_scale without
// looking and produce Inf/NaN activations downstream; a zero, negative or NaN
// input_scale is a broken checkpoint, and the fault names the quantization
// kernel and layer that consumed it.
//
// Layout of one quantized row of `cols` elements (cols even): packed e2m1
// values, two per byte with the even element in the low nibble, cols / 2
// bytes; e4m3 block scales, BlockCount(cols, 16) bytes.
//
// Kernel bodies: CR_HD, no allocation, no exceptions (DESIGN decision 8).
#pragma once

#include <cstdint>

#include "crashreplay/base/hd.h"
#include "crashreplay/formats/block_quant.h"
#include "crashreplay/formats/numeric.h"
#include "crashreplay/replay/kernels/check.h"
#include "crashreplay/replay/kernels/linear.h"

namespace crashreplay::replay {

inline constexpr int64_t kActBlock = 16;  // NVFP4 block along K

CR_HD int64_t Nvfp4ActValueBytes(int64_t cols) { return cols / 2; }
CR_HD int64_t Nvfp4ActScaleBytes(int64_t cols) { return BlockCount(cols, kActBlock); }
// Scratch floats that hold one quantized row (values then scales).
CR_HD int64_t Nvfp4ActScratchFloats(int64_t cols) {
  return (Nvfp4ActValueBytes(cols) + Nvfp4ActScaleBytes(cols) + 3) / 4;
}

// Finite, > 0, and with a finite global scale 1 / input_scale.
CR_HD bool Nvfp4InputScaleValid(float input_scale) {
  return IsFinite(input_scale) && input_scale > 0.0f && IsFinite(1.0f / input_scale);
}

// e4m3 block scale of a block with amax `block_amax`, for global scale g.
CR_HD uint8_t Nvfp4ActBlockScale(float block_amax, float global) {
  return FloatToE4m3(global * (block_amax * (1.0f / kE2m1Max)));
}

// The factor elements are multiplied by before the e2m1 conversion:
// 1 / (s * (1/g)), 0 for a zero scale.
CR_HD float Nvfp4ActElementFactor(uint8_t scale8, float global) {
  const float s = E4m3ToFloat(scale8);
  if (s == 0.0f) return 0.0f;
  return 1.0f / (s * (1.0f / global));
}

// Quantizes one row. `item` names the work item for a failed check; on a
// failed check nothing is written and false is returned.
CR_HD bool QuantizeNvfp4ActRow(const float* x, int64_t cols, float input_scale, uint8_t* values, uint8_t* scales,
                               int64_t item, KernelStatus* st) {
  if (!Nvfp4InputScaleValid(input_scale)) {
    Fail(st, Check::kNvfp4InputScale, item, 0, static_cast<double>(input_scale));
    return false;
  }
  const float global = 1.0f / input_scale;
  for (int64_t c0 = 0; c0 < cols; c0 += kActBlock) {
    const int64_t c1 = c0 + kActBlock < cols ? c0 + kActBlock : cols;
    float amax = 0.0f;
    for (int64_t c = c0; c < c1; ++c) amax = AbsMaxAccumulate(amax, x[c]);
    const uint8_t s8 = Nvfp4ActBlockScale(amax, global);
    scales[c0 / kActBlock] = s8;
    const float f = Nvfp4ActElementFactor(s8, global);
    for (int64_t c = c0; c < c1; c += 2) {
      const uint8_t lo = FloatToE2m1(x[c] * f);
      const uint8_t hi = c + 1 < c1 ? FloatToE2m1(x[c + 1] * f) : static_cast<uint8_t>(0);
      values[c / 2] = PackE2m1x2(lo, hi);
    }
  }
  return true;
}

// A quantized row as the linear kernels read it: a [1, cols] e2m1 weight with
// e4m3 scales per 16 columns and global scale input_scale.
CR_HD QWeight Nvfp4ActRow(const uint8_t* values, const uint8_t* scales, int64_t cols, float input_scale) {
  QWeight q;
  q.format = WFormat::kE2m1;
  q.scale_format = SFormat::kE4m3;
  q.data = values;
  q.rows = 1;
  q.cols = cols;
  q.scales = scales;
  q.block_rows = 1;
  q.block_cols = static_cast<int32_t>(kActBlock);
  q.scale_cols = Nvfp4ActScaleBytes(cols);
  q.global_scale = input_scale;
  return q;
}

}  // namespace crashreplay::replay
