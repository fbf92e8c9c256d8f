// Projection kernel bodies: one output element y[t, r] = sum_c W[r, c] x[t, c]
// of a weight in any supported storage (fp32/bf16/fp16, FP8 e4m3 with fp32
// block scales, e2m1 with e4m3 (NVFP4) or e8m0 (MXFP4) block scales).
//
// Three variants, selected by gemm_backend/moe_backend/scale_format:
//   DotDequant  dequantize each weight (value * block scale) to bf16 first,
//               then a fp32 dot product (the dequantize-then-matmul path);
//   DotFused    dot product of raw values per scale block, the block's scale
//               applied once per block (the fused block-scaled path);
//   DotUe8m0    as DotFused, but reads each fp32 scale as a power of two
//               (only its exponent), after checking the UE8M0 layout, as
//               DeepGEMM's UE8M0 path does.
// Under nvfp4_activation=w4a4 an NVFP4 layer's input arrives quantized
// (kernels/act_quant.h) and the same three variants take it as a second
// QWeight of one row (LinearElementQ): DotDequantQ dequantizes both operands
// to bf16, DotFusedQ multiplies raw e2m1 values per 16-column block, scales
// the exact block sum by weight scale x activation scale and applies
// alpha = weight_scale_2 * input_scale once at the end, as the CUTLASS/
// FlashInfer fp4 GEMMs do.
// Every dot product sums in 8 interleaved lanes (lane = c % 8) combined in a
// fixed tree, so the result is the same on any thread count and device.
#pragma once

#include <cstdint>

#include "crashreplay/base/hd.h"
#include "crashreplay/formats/numeric.h"
#include "crashreplay/replay/kernels/check.h"

namespace crashreplay::replay {

enum class WFormat : uint8_t { kF32, kBF16, kF16, kE4m3, kE2m1 };
enum class SFormat : uint8_t { kNone, kF32, kE4m3, kE8m0 };

// A read-only view of one (rank's shard of a) weight matrix [rows, cols].
struct QWeight {
  WFormat format = WFormat::kF32;
  SFormat scale_format = SFormat::kNone;
  const void* data = nullptr;    // row-major; e2m1 packs two per byte, even column low
  int64_t rows = 0;
  int64_t cols = 0;
  const void* scales = nullptr;  // [ceil(rows/block_rows), scale_cols]
  int32_t block_rows = 1;
  int32_t block_cols = 1;
  int64_t scale_cols = 0;
  float global_scale = 1.0f;     // NVFP4 weight_scale_2; 1 otherwise
  // w4a4: this layer's input is quantized to NVFP4 with `act_scale` (the
  // checkpoint's input_scale; the max over layers that share the input, as
  // engines fuse q/k/v and gate/up). False: the input stays fp32/bf16.
  bool act_fp4 = false;
  float act_scale = 0.0f;
  // Elements from one row's start to the next; 0 means cols (dense). A
  // column-split rank shard viewing the checkpoint's full rows in place sets
  // it to the full tensor's width (even for e2m1: rows start on a byte).
  int64_t row_stride = 0;
};

CR_HD int64_t RowStride(const QWeight& w) { return w.row_stride > 0 ? w.row_stride : w.cols; }

CR_HD float RawAt(const QWeight& w, int64_t r, int64_t c) {
  const int64_t i = r * RowStride(w) + c;
  switch (w.format) {
    case WFormat::kF32: return static_cast<const float*>(w.data)[i];
    case WFormat::kBF16: return Bf16ToFloat(static_cast<const uint16_t*>(w.data)[i]);
    case WFormat::kF16: return Fp16ToFloat(static_cast<const uint16_t*>(w.data)[i]);
    case WFormat::kE4m3: return E4m3ToFloat(static_cast<const uint8_t*>(w.data)[i]);
    case WFormat::kE2m1: return E2m1ToFloat(GetNibble(static_cast<const uint8_t*>(w.data), static_cast<uint64_t>(i)));
  }
  return 0.0f;
}

CR_HD int64_t ScaleIndex(const QWeight& w, int64_t r, int64_t c) {
  return (r / w.block_rows) * w.scale_cols + c / w.block_cols;
}

// The stored scale of the block holding (r, c), decoded, times the global scale.
CR_HD float ScaleAt(const QWeight& w, int64_t r, int64_t c) {
  const int64_t s = ScaleIndex(w, r, c);
  switch (w.scale_format) {
    case SFormat::kNone: return 1.0f;
    case SFormat::kF32: return static_cast<const float*>(w.scales)[s] * w.global_scale;
    case SFormat::kE4m3: return E4m3ToFloat(static_cast<const uint8_t*>(w.scales)[s]) * w.global_scale;
    case SFormat::kE8m0: return E8m0ToFloat(static_cast<const uint8_t*>(w.scales)[s]) * w.global_scale;
  }
  return 1.0f;
}

// The weight as the dequantize-then-matmul path sees it.
CR_HD float DequantAt(const QWeight& w, int64_t r, int64_t c) {
  if (w.scale_format == SFormat::kNone) return RawAt(w, r, c);
  return Bf16ToFloat(FloatToBf16(RawAt(w, r, c) * ScaleAt(w, r, c)));
}

CR_HD float LaneSum8(const float* l) { return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7])); }

// Storage decoders with the format fixed at compile time, so the dot-product
// loops below carry no per-element switch and the compiler can vectorize them.
template <WFormat F>
CR_HD float RawAtF(const void* data, int64_t i) {
  if constexpr (F == WFormat::kF32) {
    return static_cast<const float*>(data)[i];
  } else if constexpr (F == WFormat::kBF16) {
    return Bf16ToFloat(static_cast<const uint16_t*>(data)[i]);
  } else if constexpr (F == WFormat::kF16) {
    return Fp16ToFloat(static_cast<const uint16_t*>(data)[i]);
  } else if constexpr (F == WFormat::kE4m3) {
    return E4m3ToFloat(static_cast<const uint8_t*>(data)[i]);
  } else {
    return E2m1ToFloat(GetNibble(static_cast<const uint8_t*>(data), static_cast<uint64_t>(i)));
  }
}

// sum over c in [c0, c1) of W[r, c] * s * x[c] into 8 lanes (lane = c % 8, each
// lane in increasing c), where W[r, c] * s is rounded to bf16 when kRound (the
// dequantize-then-matmul path) and s is not applied at all when !kScale. The
// middle loop handles whole groups of 8 columns; per lane the order of the
// additions is exactly the element-by-element order.
template <WFormat F, bool kScale, bool kRound>
CR_HD void DotLanes(const QWeight& w, const float* x, int64_t r, int64_t c0, int64_t c1, float s, float* lane) {
  const int64_t base = r * RowStride(w);
  auto term = [&](int64_t c) {
    float v = RawAtF<F>(w.data, base + c);
    if constexpr (kScale) v = v * s;
    if constexpr (kRound) v = Bf16ToFloat(FloatToBf16(v));
    return v;
  };
  int64_t c = c0;
  for (; c < c1 && (c & 7) != 0; ++c) lane[c & 7] = MulAdd(lane[c & 7], term(c), x[c]);
  for (; c + 8 <= c1; c += 8) {
    for (int j = 0; j < 8; ++j) lane[j] = MulAdd(lane[j], term(c + j), x[c + j]);
  }
  for (; c < c1; ++c) lane[c & 7] = MulAdd(lane[c & 7], term(c), x[c]);
}

template <WFormat F>
CR_HD float DotDequantF(const QWeight& w, const float* x, int64_t r) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (w.scale_format == SFormat::kNone) {
    DotLanes<F, false, false>(w, x, r, 0, w.cols, 1.0f, lane);
  } else {
    // The scale is constant over a block's columns: decode it once per block.
    for (int64_t c0 = 0; c0 < w.cols; c0 += w.block_cols) {
      const int64_t c1 = c0 + w.block_cols < w.cols ? c0 + w.block_cols : w.cols;
      DotLanes<F, true, true>(w, x, r, c0, c1, ScaleAt(w, r, c0), lane);
    }
  }
  return LaneSum8(lane);
}

// Raw-value dot product over columns [c0, c1).
template <WFormat F>
CR_HD float DotRawF(const QWeight& w, const float* x, int64_t r, int64_t c0, int64_t c1) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  DotLanes<F, false, false>(w, x, r, c0, c1, 1.0f, lane);
  return LaneSum8(lane);
}

// `fn<F>(args...)` for the weight's storage format.
#define CR_DISPATCH_WFORMAT(w, fn, ...)                          \
  switch ((w).format) {                                          \
    case WFormat::kF32: return fn<WFormat::kF32>(__VA_ARGS__);   \
    case WFormat::kBF16: return fn<WFormat::kBF16>(__VA_ARGS__); \
    case WFormat::kF16: return fn<WFormat::kF16>(__VA_ARGS__);   \
    case WFormat::kE4m3: return fn<WFormat::kE4m3>(__VA_ARGS__); \
    case WFormat::kE2m1: return fn<WFormat::kE2m1>(__VA_ARGS__); \
  }                                                              \
  return 0.0f

CR_HD float DotDequant(const QWeight& w, const float* x, int64_t r) { CR_DISPATCH_WFORMAT(w, DotDequantF, w, x, r); }

CR_HD float DotRaw(const QWeight& w, const float* x, int64_t r, int64_t c0, int64_t c1) {
  CR_DISPATCH_WFORMAT(w, DotRawF, w, x, r, c0, c1);
}

#undef CR_DISPATCH_WFORMAT

CR_HD float DotFused(const QWeight& w, const float* x, int64_t r) {
  if (w.scale_format == SFormat::kNone) return DotRaw(w, x, r, 0, w.cols);
  float acc = 0.0f;
  for (int64_t c0 = 0; c0 < w.cols; c0 += w.block_cols) {
    const int64_t c1 = c0 + w.block_cols < w.cols ? c0 + w.block_cols : w.cols;
    acc = MulAdd(acc, DotRaw(w, x, r, c0, c1), ScaleAt(w, r, c0));
  }
  return acc;
}

// The UE8M0 kernel takes fp32 scales (global scale already folded in) and uses
// only their exponent; a scale with sign or mantissa bits set would be silently
// misread, so the kernel checks the layout first. `item` names the work item.
CR_HD float DotUe8m0(const QWeight& w, const float* x, int64_t r, int64_t item, KernelStatus* st) {
  if (w.scale_format == SFormat::kNone) return DotRaw(w, x, r, 0, w.cols);
  float acc = 0.0f;
  for (int64_t c0 = 0; c0 < w.cols; c0 += w.block_cols) {
    const int64_t c1 = c0 + w.block_cols < w.cols ? c0 + w.block_cols : w.cols;
    const float s = ScaleAt(w, r, c0);
    const uint32_t bits = FloatBits(s);
    if (!IsUe8m0Layout(bits)) {
      Fail(st, Check::kUe8m0ScaleLayout, item, ScaleIndex(w, r, c0), static_cast<double>(s));
      return 0.0f;
    }
    const float pow2 = BitsToFloat(bits & 0x7f800000u);
    acc = MulAdd(acc, DotRaw(w, x, r, c0, c1), pow2);
  }
  return acc;
}

// ---- w4a4: weight row against a quantized activation row ------------------
// `xq` is one row [1, cols] of e2m1 values with e4m3 scales per 16 columns and
// global_scale = input_scale (Nvfp4ActRow in act_quant.h).

// The stored scale of the block holding (r, c), decoded, without the global
// scale (which the w4a4 kernels apply once, in alpha).
CR_HD float StoredScaleAt(const QWeight& w, int64_t r, int64_t c) {
  const int64_t s = ScaleIndex(w, r, c);
  switch (w.scale_format) {
    case SFormat::kNone: return 1.0f;
    case SFormat::kF32: return static_cast<const float*>(w.scales)[s];
    case SFormat::kE4m3: return E4m3ToFloat(static_cast<const uint8_t*>(w.scales)[s]);
    case SFormat::kE8m0: return E8m0ToFloat(static_cast<const uint8_t*>(w.scales)[s]);
  }
  return 1.0f;
}

// Dequantize-then-matmul: both operands dequantized to bf16 (value * scale *
// global, one rounding each), then the 8-lane fp32 dot.
CR_HD float DotDequantQ(const QWeight& w, const QWeight& xq, int64_t r) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t c = 0; c < w.cols; ++c) lane[c & 7] = MulAdd(lane[c & 7], DequantAt(w, r, c), DequantAt(xq, 0, c));
  return LaneSum8(lane);
}

// The block-scaled fp4 GEMM: per activation block (16 columns) the dot of raw
// e2m1 values, which is exact in fp32 (products are multiples of 1/4 up to
// 36), times weight block scale * activation block scale (exact for two e4m3
// scales), accumulated over blocks in column order; then alpha = weight
// global scale * activation global scale, rounded once, as engines
// precompute it. ue8m0: the weight scales are fp32 powers of two read by
// exponent, after the layout check (DotUe8m0's contract).
CR_HD float DotFusedQ(const QWeight& w, const QWeight& xq, int64_t r, bool ue8m0, int64_t item, KernelStatus* st) {
  float acc = 0.0f;
  for (int64_t c0 = 0; c0 < w.cols; c0 += xq.block_cols) {
    const int64_t c1 = c0 + xq.block_cols < w.cols ? c0 + xq.block_cols : w.cols;
    float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t c = c0; c < c1; ++c) lane[c & 7] = MulAdd(lane[c & 7], RawAt(w, r, c), RawAt(xq, 0, c));
    float sw = StoredScaleAt(w, r, c0);
    if (ue8m0) {
      const uint32_t bits = FloatBits(sw * w.global_scale);
      if (!IsUe8m0Layout(bits)) {
        Fail(st, Check::kUe8m0ScaleLayout, item, ScaleIndex(w, r, c0), static_cast<double>(sw * w.global_scale));
        return 0.0f;
      }
      sw = BitsToFloat(bits & 0x7f800000u);
    }
    acc = MulAdd(acc, LaneSum8(lane), sw * StoredScaleAt(xq, 0, c0));
  }
  const float alpha = (ue8m0 ? 1.0f : w.global_scale) * xq.global_scale;
  return acc * alpha;
}

enum class DotKind : uint8_t { kDequant, kFused, kUe8m0 };

CR_HD float LinearElement(DotKind kind, const QWeight& w, const float* x, int64_t r, int64_t item, KernelStatus* st) {
  switch (kind) {
    case DotKind::kDequant: return DotDequant(w, x, r);
    case DotKind::kFused: return DotFused(w, x, r);
    case DotKind::kUe8m0: return DotUe8m0(w, x, r, item, st);
  }
  return 0.0f;
}

// ---- one row on eight lanes -------------------------------------------------
// The elements of weight row r for up to kT tokens (rows x[t] of the input),
// as LinearElement computes each, by eight cooperating lanes (on a GPU,
// eight threads): lane j sums the terms of the columns c with c % 8 == j in
// increasing c, exactly lane j of DotLanes, for every token at once (the
// weight term is decoded once and used nt times; each token's own order of
// operations is unchanged). `lanes.Sum(v)` must return LaneSum8 of the eight
// lanes' v to every lane (a GPU does it with three xor shuffles, 1, 2, 4:
// each step adds a pair of LaneSum8's tree, in the other operand order on
// half the lanes, and IEEE addition is commutative). The loops run the same
// trip counts on every lane, so the lanes stay in step; a failing ue8m0
// scale fails on all eight at once (all tokens: `item` names the first).

// Lane j's terms over columns [c0, c1), added to acc[t] for t < nt.
template <WFormat F, bool kScale, bool kRound, int kT>
CR_HD void LaneTerms(const QWeight& w, const float* const* x, int nt, int64_t r, int64_t c0, int64_t c1, float s, int j,
                     float* acc) {
  const int64_t base = r * RowStride(w);
  for (int64_t c = c0 + ((j - c0) & 7); c < c1; c += 8) {
    float v = RawAtF<F>(w.data, base + c);
    if constexpr (kScale) v = v * s;
    if constexpr (kRound) v = Bf16ToFloat(FloatToBf16(v));
    for (int t = 0; t < kT; ++t) {
      if (t < nt) acc[t] = MulAdd(acc[t], v, x[t][c]);
    }
  }
}

template <WFormat F, int kT, class Lanes>
CR_HD void LinearElementsLaneF(DotKind kind, const QWeight& w, const float* const* x, int nt, int64_t r, int j,
                               int64_t item, KernelStatus* st, const Lanes& lanes, float* out) {
  float lane[kT];
  for (int t = 0; t < kT; ++t) lane[t] = 0.0f;
  if (w.scale_format == SFormat::kNone || kind == DotKind::kDequant) {
    if (w.scale_format == SFormat::kNone) {
      LaneTerms<F, false, false, kT>(w, x, nt, r, 0, w.cols, 1.0f, j, lane);
    } else {
      for (int64_t c0 = 0; c0 < w.cols; c0 += w.block_cols) {
        const int64_t c1 = c0 + w.block_cols < w.cols ? c0 + w.block_cols : w.cols;
        LaneTerms<F, true, true, kT>(w, x, nt, r, c0, c1, ScaleAt(w, r, c0), j, lane);
      }
    }
    for (int t = 0; t < kT; ++t) {
      if (t < nt) out[t] = lanes.Sum(lane[t]);
    }
    return;
  }
  float acc[kT];
  for (int t = 0; t < kT; ++t) acc[t] = 0.0f;
  for (int64_t c0 = 0; c0 < w.cols; c0 += w.block_cols) {
    const int64_t c1 = c0 + w.block_cols < w.cols ? c0 + w.block_cols : w.cols;
    float s = ScaleAt(w, r, c0);
    if (kind == DotKind::kUe8m0) {
      const uint32_t bits = FloatBits(s);
      if (!IsUe8m0Layout(bits)) {
        Fail(st, Check::kUe8m0ScaleLayout, item, ScaleIndex(w, r, c0), static_cast<double>(s));
        for (int t = 0; t < kT; ++t) out[t] = 0.0f;
        return;
      }
      s = BitsToFloat(bits & 0x7f800000u);
    }
    for (int t = 0; t < kT; ++t) lane[t] = 0.0f;
    LaneTerms<F, false, false, kT>(w, x, nt, r, c0, c1, 1.0f, j, lane);
    for (int t = 0; t < kT; ++t) {
      if (t < nt) acc[t] = MulAdd(acc[t], lanes.Sum(lane[t]), s);
    }
  }
  for (int t = 0; t < kT; ++t) out[t] = acc[t];
}

// out[t] = LinearElement(kind, w, x[t], r, item, st) for t < nt, on lane j of eight.
template <int kT, class Lanes>
CR_HD void LinearElementsLane(DotKind kind, const QWeight& w, const float* const* x, int nt, int64_t r, int j,
                              int64_t item, KernelStatus* st, const Lanes& lanes, float* out) {
  switch (w.format) {
    case WFormat::kF32: return LinearElementsLaneF<WFormat::kF32, kT>(kind, w, x, nt, r, j, item, st, lanes, out);
    case WFormat::kBF16: return LinearElementsLaneF<WFormat::kBF16, kT>(kind, w, x, nt, r, j, item, st, lanes, out);
    case WFormat::kF16: return LinearElementsLaneF<WFormat::kF16, kT>(kind, w, x, nt, r, j, item, st, lanes, out);
    case WFormat::kE4m3: return LinearElementsLaneF<WFormat::kE4m3, kT>(kind, w, x, nt, r, j, item, st, lanes, out);
    case WFormat::kE2m1: return LinearElementsLaneF<WFormat::kE2m1, kT>(kind, w, x, nt, r, j, item, st, lanes, out);
  }
}

// One output element of a w4a4 layer: weight row r against the quantized
// activation row xq, in the variant `kind` selects.
CR_HD float LinearElementQ(DotKind kind, const QWeight& w, const QWeight& xq, int64_t r, int64_t item,
                           KernelStatus* st) {
  switch (kind) {
    case DotKind::kDequant: return DotDequantQ(w, xq, r);
    case DotKind::kFused: return DotFusedQ(w, xq, r, false, item, st);
    case DotKind::kUe8m0: return DotFusedQ(w, xq, r, true, item, st);
  }
  return 0.0f;
}

// out[t] = LinearElementQ(kind, w, xq[t], r, item, st) for t < nt, on lane j
// of eight (the lanes of DotDequantQ's and DotFusedQ's 8-lane sums).
template <int kT, class Lanes>
CR_HD void LinearElementsLaneQ(DotKind kind, const QWeight& w, const QWeight* xq, int nt, int64_t r, int j,
                               int64_t item, KernelStatus* st, const Lanes& lanes, float* out) {
  float lane[kT];
  for (int t = 0; t < kT; ++t) lane[t] = 0.0f;
  if (kind == DotKind::kDequant) {
    for (int64_t c = j; c < w.cols; c += 8) {
      const float v = DequantAt(w, r, c);
      for (int t = 0; t < kT; ++t) {
        if (t < nt) lane[t] = MulAdd(lane[t], v, DequantAt(xq[t], 0, c));
      }
    }
    for (int t = 0; t < kT; ++t) {
      if (t < nt) out[t] = lanes.Sum(lane[t]);
    }
    return;
  }
  const bool ue8m0 = kind == DotKind::kUe8m0;
  float acc[kT];
  for (int t = 0; t < kT; ++t) acc[t] = 0.0f;
  const int64_t bc = xq[0].block_cols;
  for (int64_t c0 = 0; c0 < w.cols; c0 += bc) {
    const int64_t c1 = c0 + bc < w.cols ? c0 + bc : w.cols;
    for (int t = 0; t < kT; ++t) lane[t] = 0.0f;
    for (int64_t c = c0 + ((j - c0) & 7); c < c1; c += 8) {
      const float v = RawAt(w, r, c);
      for (int t = 0; t < kT; ++t) {
        if (t < nt) lane[t] = MulAdd(lane[t], v, RawAt(xq[t], 0, c));
      }
    }
    float sw = StoredScaleAt(w, r, c0);
    if (ue8m0) {
      const uint32_t bits = FloatBits(sw * w.global_scale);
      if (!IsUe8m0Layout(bits)) {
        Fail(st, Check::kUe8m0ScaleLayout, item, ScaleIndex(w, r, c0), static_cast<double>(sw * w.global_scale));
        for (int t = 0; t < kT; ++t) out[t] = 0.0f;
        return;
      }
      sw = BitsToFloat(bits & 0x7f800000u);
    }
    for (int t = 0; t < kT; ++t) {
      if (t < nt) acc[t] = MulAdd(acc[t], lanes.Sum(lane[t]), sw * StoredScaleAt(xq[t], 0, c0));
    }
  }
  for (int t = 0; t < kT; ++t) {
    if (t < nt) out[t] = acc[t] * ((ue8m0 ? 1.0f : w.global_scale) * xq[t].global_scale);
  }
}

}  // namespace crashreplay::replay
