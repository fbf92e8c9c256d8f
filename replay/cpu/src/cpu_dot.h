// The blocked dot-product engine under the fast CPU launchers
// (cpu_kernels.h): rows of one weight against a set of token rows, each
// element with the arithmetic of LinearElement (or LinearElementQ for a
// quantized activation), the rows x tokens work laid out for SIMD and cache.
//
// The element functions reduce to two shapes:
//   lanes   one set of 8 lanes over the whole row, LaneSum8 at the end
//           (DotDequant, DotDequantQ, and any dot of an unscaled weight);
//           a scaled DotDequant term is bf16(raw * block scale).
//   blocks  8 lanes per scale block, LaneSum8 per block, acc = acc + sum * m
//           in block order (DotFused, DotUe8m0, DotFusedQ), where m is the
//           block's weight scale (times the activation block scale under
//           w4a4), then acc * alpha for DotFusedQ.
// An activation row quantized to NVFP4 enters as floats: dequantized for
// DotDequantQ (DequantAt of every column), raw e2m1 values plus block scales
// for DotFusedQ (PrepareQRow).
//
// Layout: up to 2 tokens, each weight group of 8 columns is decoded in
// registers and used at once (decode steps: one pass over the weight bytes);
// more tokens, the rows are decoded into a packed panel of terms per chunk
// of 512 columns and reused by every token (prefill).
// Fused multiply-add: where every product w * x of a dot is exact in fp32
// (ProductsExact: both operands of few enough significant bits, magnitudes
// inside the range where no product underflows or overflows), fma(w, x, acc)
// rounds once to exactly what acc + w * x rounds to, so the lane sums use
// it there and the bits are those of the separate multiply and add. The
// packed path decides per chunk of columns from the terms it has packed
// (ScanRange) and the job's x_range; the direct path only for raw e2m1 and
// e4m3 terms, whose range the format fixes. An x_range left at its default
// never fuses.
// Thread safety: RunRows may run on many threads at once (thread-local
// scratch); the job is read-only.
#pragma once

#include <cstdint>

#include "crashreplay/replay/cpu/cpu_kernels.h"
#include "crashreplay/replay/kernels/linear.h"

namespace crashreplay::replay::cpu {

// What is known of a set of float values: each has at most `bits`
// significant bits (8: a bf16; 24 says nothing), every nonzero |v| lies in
// [lo, hi], and (finite) none is NaN or Inf. The default knows nothing.
struct ValueRange {
  int bits = 24;
  float lo = 0.0f;
  float hi = 0.0f;
  bool finite = false;
};

// The range of n floats (no nonzero value: lo = +Inf, hi = 0), scanned
// with `isa`'s vectors (the same result on every ISA).
ValueRange ScanRange(const float* v, int64_t n, CpuIsa isa = CpuIsa::kGeneric);
// The union of two ranges.
ValueRange Merge(const ValueRange& a, const ValueRange& b);
// Whether every product of a value in `a` with one in `b` is exact in fp32:
// its significand fits 24 bits (a.bits + b.bits <= 24), it is not below
// 2^-125 in magnitude unless zero (then its lowest bit is at or above
// 2^-149, the spacing of the subnormals) and it is below 2^127.
bool ProductsExact(const ValueRange& a, const ValueRange& b);

// How many packed chunks and direct row ranges have run fused so far in
// this process (the tests see that the fused path is taken).
uint64_t FusedRunsForTest();

struct DotJob {
  const QWeight* w = nullptr;
  DotKind kind = DotKind::kDequant;
  bool q = false;                     // LinearElementQ: x rows from PrepareQRow
  int64_t tokens = 0;
  const float* const* x = nullptr;    // [tokens] rows: cols floats, zeros up to PaddedCols
  const float* const* xs = nullptr;   // q, kind != kDequant: [tokens] activation block scales
  float x_global = 0.0f;              // q: the activation's global scale (input_scale)
  float* const* y = nullptr;          // [tokens] output rows: y[t][r]
  const float* bias = nullptr;        // [rows] or null: y = element + bias[r]
  ValueRange x_range;                 // of every x row read (see ProductsExact)
};

inline int64_t PaddedCols(int64_t cols) { return (cols + 7) / 8 * 8; }

// Whether RunRows covers (w, kind, q): scale blocks of a multiple of 8
// columns, e2m1 rows of an even number of columns.
bool DotCovered(const QWeight& w, DotKind kind, bool q);
// Whether some element of w would fire a check under (kind, q) (the UE8M0
// layout of a scale it reads). Conservative: true if any stored scale would.
bool DotMayFail(const QWeight& w, DotKind kind, bool q);

// Rows [r0, r1) of job.w for every token of the job. Requires DotCovered
// and !DotMayFail.
void RunRows(const DotJob& job, int64_t r0, int64_t r1, CpuIsa isa);

// One NVFP4 activation row (Nvfp4ActRow layout, xq.cols columns) as RunRows
// reads it: x gets PaddedCols(cols) floats (DequantAt of each column for
// kDequant, the raw e2m1 values otherwise, zeros past cols); scales gets the
// StoredScaleAt of each 16-column block (otherwise kinds only).
void PrepareQRow(const QWeight& xq, DotKind kind, float* x, float* scales);
// The vector primitives, built for `isa`, for the tests: out[0..8) = the
// decoder of format f over 8 elements from flat index i0 (even for e2m1),
// out[8..16) = RoundBf16(round_in[0..8)), out[16..24) = LaneSums8 of the
// eight vectors lanes_in[0..64), out[24..40) = the two-group decoder
// (DecodePairIsa) over 16 elements from i0.
void VectorPrimitivesForTest(WFormat f, const void* data, int64_t i0, const float* round_in, const float* lanes_in,
                             float* out, CpuIsa isa);
// Copies a float row into PaddedCols(cols) floats, zero past cols.
void PadRow(const float* src, int64_t cols, float* dst);

}  // namespace crashreplay::replay::cpu
