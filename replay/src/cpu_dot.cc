#include "cpu_dot.h"

#include <algorithm>
#include <cstdlib>
#include <type_traits>
#include <vector>

#include "cpu_simd.h"
#include "crashreplay/replay/kernels/act_quant.h"

namespace crashreplay::replay::cpu {
namespace {

// Up to this many tokens the weight is decoded in registers and used at once.
constexpr int64_t kDirectTokens = 2;
// Rows per direct tile: 4 independent accumulator chains; e2m1 tiles take 2
// rows, as each row's two table halves stay in registers too.
template <class W>
constexpr int DirectRowsFor() {
  return W::kE2m1 ? 2 : 4;
}
// Packed path: micro-tile of rows x tokens held in registers (12 lane
// accumulators, 2 weight vectors, one input vector and a product: AVX2's 16).
constexpr int kMR = 2;
constexpr int kNR = 6;
// Columns per packed chunk (a chunk of a few rows' terms stays in L1/L2) and
// tokens per pass (bounds the lane state kept across chunks).
constexpr int64_t kChunkGroups = 64;
constexpr int64_t kTokenChunk = 96;

// How the row scales of a plan are derived from the stored scales.
enum class RowScale : uint8_t { kScaleAt, kPow2ScaleAt, kStored, kPow2Stored };

// The element function's shape (cpu_dot.h): lanes (optionally with bf16-
// rounded scaled terms) or blocks.
struct Plan {
  bool blocked = false;
  bool round = false;
  int64_t block = 0;  // columns per scale block (round or blocked)
  RowScale rscale = RowScale::kScaleAt;
  bool token_scales = false;
  bool alpha_on = false;
  float alpha = 1.0f;
};

Plan MakePlan(const QWeight& w, DotKind kind, bool q, float x_global) {
  Plan p;
  const bool scaled = w.scale_format != SFormat::kNone;
  if (kind == DotKind::kDequant || (!q && !scaled)) {
    // DotDequant / DotDequantQ, and the fused kinds' unscaled DotRaw.
    p.round = scaled;
    p.block = scaled ? w.block_cols : 0;
    return p;
  }
  p.blocked = true;
  if (!q) {
    p.block = w.block_cols;
    p.rscale = kind == DotKind::kUe8m0 ? RowScale::kPow2ScaleAt : RowScale::kScaleAt;
    return p;
  }
  const bool ue8m0 = kind == DotKind::kUe8m0;
  p.block = kActBlock;
  p.rscale = ue8m0 ? RowScale::kPow2Stored : RowScale::kStored;
  p.token_scales = true;
  p.alpha_on = true;
  p.alpha = (ue8m0 ? 1.0f : w.global_scale) * x_global;
  return p;
}

template <SFormat S>
float DecodeScale(const void* scales, int64_t i) {
  if constexpr (S == SFormat::kF32) {
    return static_cast<const float*>(scales)[i];
  } else if constexpr (S == SFormat::kE4m3) {
    return E4m3ToFloat(static_cast<const uint8_t*>(scales)[i]);
  } else if constexpr (S == SFormat::kE8m0) {
    return E8m0ToFloat(static_cast<const uint8_t*>(scales)[i]);
  } else {
    return 1.0f;
  }
}

float Pow2Of(float s) { return BitsToFloat(FloatBits(s) & 0x7f800000u); }

// The plan's scale of each block of row r: ScaleAt / StoredScaleAt (and the
// UE8M0 exponent) of the block's first column, as linear.h computes them.
template <SFormat S>
void RowScalesT(const QWeight& w, const Plan& p, int64_t r, int64_t nb, float* out) {
  const int64_t base = S == SFormat::kNone ? 0 : (r / w.block_rows) * w.scale_cols;
  const bool same_blocks = p.block == w.block_cols;
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t idx = base + (same_blocks ? b : (b * p.block) / w.block_cols);
    const float stored = DecodeScale<S>(w.scales, idx);
    // kNone: ScaleAt and StoredScaleAt are 1 (no global scale).
    const float scale_at = S == SFormat::kNone ? 1.0f : stored * w.global_scale;
    switch (p.rscale) {
      case RowScale::kScaleAt: out[b] = scale_at; break;
      case RowScale::kPow2ScaleAt: out[b] = Pow2Of(scale_at); break;
      case RowScale::kStored: out[b] = stored; break;
      case RowScale::kPow2Stored: out[b] = Pow2Of(stored * w.global_scale); break;
    }
  }
}

void RowScales(const QWeight& w, const Plan& p, int64_t r, int64_t nb, float* out) {
  switch (w.scale_format) {
    case SFormat::kNone: return RowScalesT<SFormat::kNone>(w, p, r, nb, out);
    case SFormat::kF32: return RowScalesT<SFormat::kF32>(w, p, r, nb, out);
    case SFormat::kE4m3: return RowScalesT<SFormat::kE4m3>(w, p, r, nb, out);
    case SFormat::kE8m0: return RowScalesT<SFormat::kE8m0>(w, p, r, nb, out);
  }
}

// 64-byte aligned thread-local scratch; `slot` keeps simultaneous uses apart.
float* Scratch(int slot, int64_t floats) {
  thread_local std::vector<float> buf[4];
  std::vector<float>& b = buf[slot];
  if (static_cast<int64_t>(b.size()) < floats + 16) b.resize(static_cast<size_t>(floats + 16));
  const auto p = reinterpret_cast<uintptr_t>(b.data());
  return reinterpret_cast<float*>((p + 63) & ~uintptr_t{63});
}

// ---- weight terms ------------------------------------------------------------

// The 16 terms an e2m1 block can hold: t[n] = E2m1ToFloat(n), or for the
// dequantize path bf16(E2m1ToFloat(n) * s) (DotLanes' term, computed per
// code, so it is exact for any s: NaN, Inf and zero scales included).
struct alignas(32) E2m1Table {
  float t[16];
};

const E2m1Table& RawE2m1Table() {
  static const E2m1Table t = [] {
    E2m1Table r;
    for (int n = 0; n < 16; ++n) r.t[n] = E2m1ToFloat(static_cast<uint8_t>(n));
    return r;
  }();
  return t;
}

CR_SIMD_INLINE void ScaledE2m1Table(float s, E2m1Table* out) {
  const E2m1Table& raw = RawE2m1Table();
  Store8(out->t, RoundBf16(Load8(raw.t) * Splat(s)));
  Store8(out->t + 8, RoundBf16(Load8(raw.t + 8) * Splat(s)));
}

// ScaledE2m1Table for every 1-byte scale code c, s = the code decoded times
// the global scale (ScaleAt): the dequantize path of an e2m1 weight with
// e4m3 (NVFP4) or e8m0 (MXFP4) scales then needs no per-block arithmetic.
// One per thread, rebuilt when the scale format or global scale changes.
struct ScaleTable {
  SFormat format = SFormat::kNone;
  uint32_t global_bits = 0;
  bool built = false;
  E2m1Table t[256];
};

template <SFormat S>
CR_SIMD_INLINE void BuildScaleTable(float global, ScaleTable* st) {
  for (int c = 0; c < 256; ++c) {
    const uint8_t code = static_cast<uint8_t>(c);
    ScaledE2m1Table(DecodeScale<S>(&code, 0) * global, &st->t[c]);
  }
}

// The thread's table for w, or null when w's terms do not use one.
CR_SIMD_INLINE const ScaleTable* ScaleTableFor(const QWeight& w, const Plan& p) {
  if (!p.round || w.format != WFormat::kE2m1) return nullptr;
  if (w.scale_format != SFormat::kE4m3 && w.scale_format != SFormat::kE8m0) return nullptr;
  thread_local ScaleTable st;
  const uint32_t bits = FloatBits(w.global_scale);
  if (!st.built || st.format != w.scale_format || st.global_bits != bits) {
    if (w.scale_format == SFormat::kE4m3) {
      BuildScaleTable<SFormat::kE4m3>(w.global_scale, &st);
    } else {
      BuildScaleTable<SFormat::kE8m0>(w.global_scale, &st);
    }
    st.format = w.scale_format;
    st.global_bits = bits;
    st.built = true;
  }
  return &st;
}

// Where a row's block scales come from: the plan's row scales (RowScales),
// or the stored scale codes when the terms use a ScaleTable.
struct RowRef {
  const float* rs = nullptr;
  const uint8_t* codes = nullptr;
};

// e2m1 terms of group i0..i0+8 through a 16-entry table. AVX2: two
// permutes (codes 0-7, 8-15) and a blend on each code's sign bit; else a
// scalar lookup per code.
template <bool kPermute>
CR_SIMD_INLINE f32x8 LookupE2m1(const uint8_t* group, const float* t16) {
  uint32_t word;
  std::memcpy(&word, group, sizeof word);
  if constexpr (kPermute) {
    const u32x8 w = u32x8{} + word;
    const i32x8 index = (i32x8)(w >> u32x8{0, 4, 8, 12, 16, 20, 24, 28});
    const i32x8 high = (i32x8)(w << u32x8{28, 24, 20, 16, 12, 8, 4, 0});  // code bit 3 in the sign bit
    const f32x8 pos = __builtin_shuffle(Load8(t16), index);
    const f32x8 neg = __builtin_shuffle(Load8(t16 + 8), index);
    return high < 0 ? neg : pos;
  } else {
    alignas(32) float v[8];
    for (int j = 0; j < 8; ++j) v[j] = t16[(word >> (4 * j)) & 0xfu];
    return Load8(v);
  }
}

template <WFormat F>
using StorageT = std::conditional_t<F == WFormat::kF32, float,
                                    std::conditional_t<F == WFormat::kBF16 || F == WFormat::kF16, uint16_t, uint8_t>>;

// The terms of one weight as DotLanes forms them: raw values, or (kRound)
// bf16(raw * s) with the block's scale s. Begin() prepares a scale block of
// a row; At() gives the 8 terms of group g of row r. Groups past the last
// full one are filled element by element with the scalar code, zeros past
// cols. e2m1 terms come from a 16-entry table per block (LookupE2m1).
template <WFormat F, bool kRound, bool kBlocked, bool kPermute>
struct Terms {
  static_assert(!(kRound && kBlocked), "the rounded terms belong to the lanes shape");
  const QWeight* w;
  int64_t full;                    // groups of 8 columns all inside the row
  const ScaleTable* st = nullptr;  // see ScaleTableFor

  static constexpr bool kE2m1 = F == WFormat::kE2m1;
  static constexpr bool kBlocks = kBlocked;
  static constexpr bool kAvx2 = kPermute;

  struct Block {
    float s = 0.0f;
    const float* t16 = nullptr;  // e2m1: the block's table
    E2m1Table own;               // e2m1 dequantize path without a ScaleTable
  };

  // Whether the rows need RowScales (else RowRef::codes).
  bool NeedsRowScales(const Plan& p) const { return p.blocked || (p.round && st == nullptr); }

  RowRef Row(int64_t r, const float* rs) const {
    RowRef rr;
    rr.rs = rs;
    if (st != nullptr) rr.codes = static_cast<const uint8_t*>(w->scales) + (r / w->block_rows) * w->scale_cols;
    return rr;
  }

  CR_SIMD_INLINE void Begin(const RowRef& rr, int64_t b, Block* blk) const {
    if constexpr (kE2m1) {
      if constexpr (!kRound) {
        blk->t16 = RawE2m1Table().t;
      } else if (st != nullptr) {
        blk->t16 = st->t[rr.codes[b]].t;
      } else {
        ScaledE2m1Table(rr.rs[b], &blk->own);
        blk->t16 = blk->own.t;
      }
    } else if constexpr (kRound) {
      blk->s = rr.rs[b];
    }
  }

  // Row r's storage: its first element (e2m1 rows start on a byte: even cols).
  const void* RowBase(int64_t r) const {
    const int64_t i = r * w->cols;
    if constexpr (kE2m1) return static_cast<const uint8_t*>(w->data) + i / 2;
    return static_cast<const uint8_t*>(w->data) + i * static_cast<int64_t>(sizeof(StorageT<F>));
  }

  // Group g of the row at `base`, g < full.
  CR_SIMD_INLINE f32x8 AtFull(const void* base, int64_t g, const Block& b) const {
    if constexpr (kE2m1) {
      return LookupE2m1<kPermute>(static_cast<const uint8_t*>(base) + 4 * g, b.t16);
    } else {
      f32x8 v = DecodeGroup<F>(base, 8 * g);
      if constexpr (kRound) v = RoundBf16(v * Splat(b.s));
      return v;
    }
  }

  CR_SIMD_INLINE f32x8 At(int64_t r, int64_t g, const Block& b) const {
    if (g < full) return AtFull(RowBase(r), g, b);
    const int64_t i0 = r * w->cols + 8 * g;
    alignas(32) float t[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t j = 0; j < w->cols - 8 * g; ++j) {
      if constexpr (kE2m1) {
        t[j] = b.t16[GetNibble(static_cast<const uint8_t*>(w->data), static_cast<uint64_t>(i0 + j))];
      } else {
        float e = RawAtF<F>(w->data, i0 + j);
        if constexpr (kRound) e = Bf16ToFloat(FloatToBf16(e * b.s));
        t[j] = e;
      }
    }
    return Load8(t);
  }
};

// Block b's multiplier of element (row i, token t): the row scale, times the
// token's activation block scale under w4a4.
CR_SIMD_INLINE float Multiplier(const Plan& p, const float* rs_row, const float* const* xs, int t, int64_t b) {
  return p.token_scales ? rs_row[b] * xs[t][b] : rs_row[b];
}

// acc[k] = acc[k] + sums[k] * m[k] for the MR x NR elements (k = i * NR + t),
// eight at a time, as DotFused's MulAdd per block.
template <int MR, int NR>
CR_SIMD_INLINE void BlockUpdate(const Plan& p, const f32x8 (&lane)[MR][NR], const float* rs, int64_t rs_stride,
                                const float* const* xs, int64_t b, float (&acc)[MR * NR]) {
  constexpr int kN = MR * NR;
  for (int k0 = 0; k0 < kN; k0 += 8) {
    f32x8 v[8];
    alignas(32) float m[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int j = 0; j < 8; ++j) {
      const int k = k0 + j;
      if (k < kN) {
        v[j] = lane[k / NR][k % NR];
        m[j] = Multiplier(p, rs + (k / NR) * rs_stride, xs, k % NR, b);
      } else {
        v[j] = Zero8();
      }
    }
    const f32x8 sums = LaneSums8(v);
    alignas(32) float a[8];
    for (int j = 0; j < 8; ++j) a[j] = k0 + j < kN ? acc[k0 + j] : 0.0f;
    Store8(a, Load8(a) + sums * Load8(m));
    for (int j = 0; j < 8 && k0 + j < kN; ++j) acc[k0 + j] = a[j];
  }
}

// LaneSum8 of the MR x NR lane sets into out[k], k = i * NR + t.
template <int MR, int NR>
CR_SIMD_INLINE void FinalSums(const f32x8 (&lane)[MR][NR], float (&out)[MR * NR]) {
  constexpr int kN = MR * NR;
  for (int k0 = 0; k0 < kN; k0 += 8) {
    f32x8 v[8];
    for (int j = 0; j < 8; ++j) v[j] = k0 + j < kN ? lane[(k0 + j) / NR][(k0 + j) % NR] : Zero8();
    alignas(32) float s[8];
    Store8(s, LaneSums8(v));
    for (int j = 0; j < 8 && k0 + j < kN; ++j) out[k0 + j] = s[j];
  }
}

template <int MR, int NR>
CR_SIMD_INLINE void ZeroLanes(f32x8 (&lane)[MR][NR]) {
  for (int i = 0; i < MR; ++i)
    for (int t = 0; t < NR; ++t) lane[i][t] = Zero8();
}

// y[t][row] = v (* alpha) (+ bias[row]) for the tile's valid rows and tokens.
template <int MR, int NR>
CR_SIMD_INLINE void WriteTile(const DotJob& j, const Plan& p, int64_t row0, int rows, int64_t t0, int tokens,
                              float (&v)[MR * NR]) {
  for (int i = 0; i < rows; ++i) {
    for (int t = 0; t < tokens; ++t) {
      float e = v[i * NR + t];
      if (p.alpha_on) e = e * p.alpha;
      if (j.bias != nullptr) e += j.bias[row0 + i];
      j.y[t0 + t][row0 + i] = e;
    }
  }
}

// ---- direct path: few tokens, terms decoded in registers ----------------------

// One whole group g of MR rows against NR tokens.
template <class W, int MR, int NR>
CR_SIMD_INLINE void DirectGroup(const W& terms, const void* const (&base)[MR], const typename W::Block (&blk)[MR],
                                const float* const* x, int64_t g, f32x8 (&lane)[MR][NR]) {
  f32x8 w[MR];
  for (int i = 0; i < MR; ++i) w[i] = terms.AtFull(base[i], g, blk[i]);
  for (int t = 0; t < NR; ++t) {
    const f32x8 xv = Load8(x[t] + 8 * g);
    for (int i = 0; i < MR; ++i) lane[i][t] += w[i] * xv;
  }
}

// MR rows from row0 against NR tokens from t0, the whole row at once. rs:
// the rows' block scales ([MR][nb]) when the plan has any. kGpb > 0: the
// plan's blocks are kGpb groups (NVFP4 16 columns: 2, MXFP4 32: 4).
template <class W, int MR, int NR, int kGpb>
CR_SIMD_INLINE void DirectTile(const DotJob& j, const Plan& p, const W& terms, int64_t row0, int valid,
                               const float* rs, int64_t nb, int64_t t0) {
  const int64_t groups = (terms.w->cols + 7) / 8;
  const float* const* x = j.x + t0;
  const float* const* xs = p.token_scales ? j.xs + t0 : nullptr;
  f32x8 lane[MR][NR];
  float acc[MR * NR] = {};
  const int64_t gpb = p.block > 0 ? p.block / 8 : groups;
  const int64_t blocks = p.block > 0 ? nb : 1;
  RowRef rows[MR];
  const void* base[MR];
  int64_t row[MR];
  for (int i = 0; i < MR; ++i) {
    row[i] = row0 + std::min(i, valid - 1);
    rows[i] = terms.Row(row[i], rs != nullptr ? rs + i * nb : nullptr);
    base[i] = terms.RowBase(row[i]);
  }
  ZeroLanes(lane);
  for (int64_t b = 0; b < blocks; ++b) {
    if constexpr (W::kBlocks) ZeroLanes(lane);
    typename W::Block blk[MR];
    for (int i = 0; i < MR; ++i) terms.Begin(rows[i], b, &blk[i]);
    const int64_t g0 = b * gpb, g1 = std::min(groups, g0 + gpb), gf = std::min(g1, terms.full);
    if constexpr (kGpb > 0) {
      if (gf - g0 == kGpb) {  // a whole block of whole groups: unrolled
        for (int k = 0; k < kGpb; ++k) DirectGroup<W, MR, NR>(terms, base, blk, x, g0 + k, lane);
        if constexpr (W::kBlocks) BlockUpdate<MR, NR>(p, lane, rs, nb, xs, b, acc);
        continue;
      }
    }
    for (int64_t g = g0; g < gf; ++g) DirectGroup<W, MR, NR>(terms, base, blk, x, g, lane);
    for (int64_t g = gf; g < g1; ++g) {
      f32x8 w[MR];
      for (int i = 0; i < MR; ++i) w[i] = terms.At(row[i], g, blk[i]);
      for (int t = 0; t < NR; ++t) {
        const f32x8 xv = Load8(x[t] + 8 * g);
        for (int i = 0; i < MR; ++i) lane[i][t] += w[i] * xv;
      }
    }
    if constexpr (W::kBlocks) BlockUpdate<MR, NR>(p, lane, rs, nb, xs, b, acc);
  }
  if constexpr (!W::kBlocks) FinalSums<MR, NR>(lane, acc);
  WriteTile<MR, NR>(j, p, row0, valid, t0, NR, acc);
}

// Rows [r0, r1) in tiles of DirectRowsFor<W>() rows; the last tile repeats
// its last row where rows run out (computed, not written).
template <class W, int NR>
CR_SIMD_INLINE void DirectRows(const DotJob& j, const Plan& p, const W& terms, int64_t r0, int64_t r1, int64_t nb,
                               int64_t t0) {
  const bool need_rs = terms.NeedsRowScales(p);
  constexpr int kRows = DirectRowsFor<W>();
  float* rs = need_rs ? Scratch(0, kRows * nb) : nullptr;
  for (int64_t r = r0; r < r1; r += kRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kRows, r1 - r));
    if (need_rs) {
      for (int i = 0; i < kRows; ++i) RowScales(*j.w, p, r + std::min(i, rows - 1), nb, rs + i * nb);
    }
    if (W::kE2m1 && p.block == 16) {
      DirectTile<W, kRows, NR, W::kE2m1 ? 2 : 0>(j, p, terms, r, rows, rs, nb, t0);
    } else if (W::kE2m1 && p.block == 32) {
      DirectTile<W, kRows, NR, W::kE2m1 ? 4 : 0>(j, p, terms, r, rows, rs, nb, t0);
    } else {
      DirectTile<W, kRows, NR, 0>(j, p, terms, r, rows, rs, nb, t0);
    }
  }
}

// ---- packed path: many tokens, terms decoded once per chunk --------------------
// Per work item (a block of rows) and chunk of columns: the rows' terms are
// packed as [tile of kMR rows][group][kMR][8], each token tile's inputs as
// [group][kNR][8], and the micro-kernel keeps kMR x kNR lane sets in
// registers (12 accumulators, 2 weight vectors, one input vector).

// Packs the terms of rows [row0, row0 + rows) (rows <= kMR; missing rows are
// zero) for groups [g0, g1).
template <class W>
CR_SIMD_INLINE void PackA(const W& terms, const Plan& p, int64_t row0, int rows, const float* rs, int64_t nb,
                          int64_t g0, int64_t g1, float* ap) {
  const int64_t gpb = p.round ? p.block / 8 : g1 - g0;
  for (int64_t b0 = g0; b0 < g1; b0 += gpb) {
    const int64_t b1 = std::min(g1, b0 + gpb);
    typename W::Block blk[kMR];
    for (int i = 0; i < kMR; ++i) {
      if (i < rows) terms.Begin(terms.Row(row0 + i, rs != nullptr ? rs + i * nb : nullptr), b0 / gpb, &blk[i]);
    }
    for (int64_t g = b0; g < b1; ++g) {
      float* dst = ap + (g - g0) * kMR * 8;
      for (int i = 0; i < kMR; ++i) Store8(dst + i * 8, i < rows ? terms.At(row0 + i, g, blk[i]) : Zero8());
    }
  }
}

// The inputs of kNR tokens (zero rows past the job's tokens) for groups
// [g0, g1).
CR_SIMD_INLINE void PackB(const float* const* x, int tokens, int64_t g0, int64_t g1, float* bp) {
  for (int64_t g = g0; g < g1; ++g) {
    float* dst = bp + (g - g0) * kNR * 8;
    for (int t = 0; t < kNR; ++t) Store8(dst + t * 8, t < tokens ? Load8(x[t] + 8 * g) : Zero8());
  }
}

// The micro-kernel over `groups` packed groups.
CR_SIMD_INLINE void PackedGroups(const float* ap, const float* bp, int64_t groups, f32x8 (&lane)[kMR][kNR]) {
  for (int64_t g = 0; g < groups; ++g, ap += kMR * 8, bp += kNR * 8) {
    f32x8 w[kMR];
    for (int i = 0; i < kMR; ++i) w[i] = Load8(ap + i * 8);
    for (int t = 0; t < kNR; ++t) {
      const f32x8 xv = Load8(bp + t * 8);
      for (int i = 0; i < kMR; ++i) lane[i][t] += w[i] * xv;
    }
  }
}

// One micro-tile over one chunk [g0, g1): continues from the state (lanes or
// block accumulators) of the previous chunk, and writes the outputs after
// the last.
template <bool kBlocked>
CR_SIMD_INLINE void PackedTile(const DotJob& j, const Plan& p, const float* ap, const float* bp, const float* rs,
                               int64_t nb, const float* const* xs, int64_t g0, int64_t g1, bool first, bool last,
                               float* state, int64_t row0, int rows, int64_t t0, int tokens) {
  f32x8 lane[kMR][kNR];
  float acc[kMR * kNR];
  ZeroLanes(lane);
  if constexpr (!kBlocked) {
    if (!first) {
      for (int i = 0; i < kMR; ++i)
        for (int t = 0; t < kNR; ++t) lane[i][t] = Load8(state + (i * kNR + t) * 8);
    }
    PackedGroups(ap, bp, g1 - g0, lane);
    if (!last) {
      for (int i = 0; i < kMR; ++i)
        for (int t = 0; t < kNR; ++t) Store8(state + (i * kNR + t) * 8, lane[i][t]);
      return;
    }
    FinalSums<kMR, kNR>(lane, acc);
  } else {
    for (int k = 0; k < kMR * kNR; ++k) acc[k] = first ? 0.0f : state[k];
    const int64_t gpb = p.block / 8;
    for (int64_t b0 = g0; b0 < g1; b0 += gpb) {
      ZeroLanes(lane);
      const int64_t b1 = std::min(g1, b0 + gpb);
      PackedGroups(ap + (b0 - g0) * kMR * 8, bp + (b0 - g0) * kNR * 8, b1 - b0, lane);
      BlockUpdate<kMR, kNR>(p, lane, rs, nb, xs, b0 / gpb, acc);
    }
    if (!last) {
      for (int k = 0; k < kMR * kNR; ++k) state[k] = acc[k];
      return;
    }
  }
  WriteTile<kMR, kNR>(j, p, row0, rows, t0, tokens, acc);
}

// One chunk of columns of a block of rows, packed, against tokens [tc, tc1):
// the part of the packed path that does not depend on the weight's format,
// so it is built once per instruction set and shape, not once per format.
struct ChunkArgs {
  const DotJob* j;
  const Plan* p;
  const float* ap;  // [tiles][g1 - g0][kMR][8]
  const float* rs;  // row scales [r1 - r0][nb] or null
  float* bp;        // [g1 - g0][kNR][8] scratch
  float* state;     // lanes or accumulators kept between chunks, or null
  int64_t nb, cg, g0, g1, r0, r1, tiles, ttiles, tc, tc1;
  bool first, last;
};

template <bool kBlocked>
CR_SIMD_INLINE void PackedChunkBody(const ChunkArgs& a) {
  const DotJob& j = *a.j;
  const Plan& p = *a.p;
  constexpr int64_t kStatePerTile = kMR * kNR * 8;
  for (int64_t t0 = a.tc, tt = 0; t0 < a.tc1; t0 += kNR, ++tt) {
    const int tokens = static_cast<int>(std::min<int64_t>(kNR, a.tc1 - t0));
    PackB(j.x + t0, tokens, a.g0, a.g1, a.bp);
    const float* xs[kNR];
    for (int t = 0; t < kNR; ++t) xs[t] = p.token_scales ? j.xs[t0 + std::min(t, tokens - 1)] : nullptr;
    for (int64_t m = 0; m < a.tiles; ++m) {
      const int64_t row0 = a.r0 + m * kMR;
      const int rows = static_cast<int>(std::min<int64_t>(kMR, a.r1 - row0));
      float* st = a.state != nullptr ? a.state + (m * a.ttiles + tt) * kStatePerTile : nullptr;
      PackedTile<kBlocked>(j, p, a.ap + m * a.cg * kMR * 8, a.bp, a.rs != nullptr ? a.rs + (row0 - a.r0) * a.nb : nullptr,
                           a.nb, xs, a.g0, a.g1, a.first, a.last, st, row0, rows, t0, tokens);
    }
  }
}

__attribute__((noinline)) void PackedChunkGeneric(const ChunkArgs& a, bool blocked) {
  if (blocked) return PackedChunkBody<true>(a);
  PackedChunkBody<false>(a);
}

#if defined(__x86_64__)
__attribute__((target("avx2"), noinline)) void PackedChunkAvx2(const ChunkArgs& a, bool blocked) {
  if (blocked) return PackedChunkBody<true>(a);
  PackedChunkBody<false>(a);
}
#endif

template <class W>
CR_SIMD_INLINE void PackedRows(const DotJob& j, const Plan& p, const W& terms, int64_t r0, int64_t r1, int64_t nb) {
  const QWeight& w = *j.w;
  const int64_t groups = (w.cols + 7) / 8;
  const int64_t gpb = p.block > 0 ? p.block / 8 : 1;
  // Chunks hold whole scale blocks.
  const int64_t cg = gpb >= kChunkGroups ? gpb : kChunkGroups / gpb * gpb;
  const int64_t tiles = (r1 - r0 + kMR - 1) / kMR;
  const bool need_rs = terms.NeedsRowScales(p);
  float* rs = need_rs ? Scratch(0, (tiles * kMR) * nb) : nullptr;
  if (need_rs) {
    for (int64_t r = r0; r < r1; ++r) RowScales(w, p, r, nb, rs + (r - r0) * nb);
  }
  ChunkArgs a;
  a.j = &j;
  a.p = &p;
  a.rs = rs;
  a.nb = nb;
  a.cg = cg;
  a.r0 = r0;
  a.r1 = r1;
  a.tiles = tiles;
  float* ap = Scratch(1, tiles * cg * kMR * 8);
  a.ap = ap;
  a.bp = Scratch(3, cg * kNR * 8);
  const int64_t tchunk = std::min<int64_t>(j.tokens, kTokenChunk);
  a.ttiles = (tchunk + kNR - 1) / kNR;
  a.state = groups > cg ? Scratch(2, tiles * a.ttiles * kMR * kNR * 8) : nullptr;
  for (a.tc = 0; a.tc < j.tokens; a.tc += kTokenChunk) {
    a.tc1 = std::min(j.tokens, a.tc + kTokenChunk);
    for (a.g0 = 0; a.g0 < groups; a.g0 += cg) {
      a.g1 = std::min(groups, a.g0 + cg);
      a.first = a.g0 == 0;
      a.last = a.g1 == groups;
      for (int64_t m = 0; m < tiles; ++m) {
        const int64_t row0 = r0 + m * kMR;
        const int rows = static_cast<int>(std::min<int64_t>(kMR, r1 - row0));
        PackA<W>(terms, p, row0, rows, need_rs ? rs + (row0 - r0) * nb : nullptr, nb, a.g0, a.g1,
                 ap + m * cg * kMR * 8);
      }
#if defined(__x86_64__)
      if constexpr (W::kAvx2) {
        PackedChunkAvx2(a, W::kBlocks);
        continue;
      }
#endif
      PackedChunkGeneric(a, W::kBlocks);
    }
  }
}

template <WFormat F, bool kRound, bool kBlocked, bool kPermute>
CR_SIMD_INLINE void RunRowsF(const DotJob& j, const Plan& p, int64_t r0, int64_t r1) {
  using W = Terms<F, kRound, kBlocked, kPermute>;
  const int64_t nb = p.block > 0 ? (j.w->cols + p.block - 1) / p.block : 0;
  const W terms{j.w, j.w->cols / 8, ScaleTableFor(*j.w, p)};
  if (j.tokens > kDirectTokens) return PackedRows(j, p, terms, r0, r1, nb);
  for (int64_t t0 = 0; t0 < j.tokens; t0 += 2) {
    if (W::kAvx2 && j.tokens - t0 >= 2) {
      DirectRows<W, W::kAvx2 ? 2 : 1>(j, p, terms, r0, r1, nb, t0);
    } else {
      // The generic build takes one token at a time (fewer instantiations).
      for (int64_t t = t0; t < std::min(j.tokens, t0 + 2); ++t) DirectRows<W, 1>(j, p, terms, r0, r1, nb, t);
    }
  }
}

// Scales exist only on fp8 and fp4 storage (DotCovered leaves the others'
// scaled shapes to the work items), so only those get the scaled shapes.
template <bool kRound, bool kBlocked, bool kPermute>
CR_SIMD_INLINE void RunRowsR(const DotJob& j, const Plan& p, int64_t r0, int64_t r1) {
  switch (j.w->format) {
    case WFormat::kE4m3: return RunRowsF<WFormat::kE4m3, kRound, kBlocked, kPermute>(j, p, r0, r1);
    case WFormat::kE2m1: return RunRowsF<WFormat::kE2m1, kRound, kBlocked, kPermute>(j, p, r0, r1);
    default: break;
  }
  if constexpr (kRound || kBlocked) {
    std::abort();  // DotCovered refused this shape
  } else {
    switch (j.w->format) {
      case WFormat::kF32: return RunRowsF<WFormat::kF32, false, false, kPermute>(j, p, r0, r1);
      case WFormat::kBF16: return RunRowsF<WFormat::kBF16, false, false, kPermute>(j, p, r0, r1);
      case WFormat::kF16: return RunRowsF<WFormat::kF16, false, false, kPermute>(j, p, r0, r1);
      default: break;
    }
  }
}

template <bool kPermute>
CR_SIMD_INLINE void RunRowsBody(const DotJob& j, int64_t r0, int64_t r1) {
  const Plan p = MakePlan(*j.w, j.kind, j.q, j.x_global);
  if (p.round) return RunRowsR<true, false, kPermute>(j, p, r0, r1);
  if (p.blocked) return RunRowsR<false, true, kPermute>(j, p, r0, r1);
  return RunRowsR<false, false, kPermute>(j, p, r0, r1);
}

// The vector primitives alone, for the tests.
CR_SIMD_INLINE void PrimitivesBody(WFormat f, const void* data, int64_t i0, const float* round_in,
                                   const float* lanes_in, float* out) {
  f32x8 v = Zero8();
  switch (f) {
    case WFormat::kF32: v = DecodeGroup<WFormat::kF32>(data, i0); break;
    case WFormat::kBF16: v = DecodeGroup<WFormat::kBF16>(data, i0); break;
    case WFormat::kF16: v = DecodeGroup<WFormat::kF16>(data, i0); break;
    case WFormat::kE4m3: v = DecodeGroup<WFormat::kE4m3>(data, i0); break;
    case WFormat::kE2m1: v = DecodeGroup<WFormat::kE2m1>(data, i0); break;
  }
  Store8(out, v);
  Store8(out + 8, RoundBf16(Load8(round_in)));
  f32x8 l[8];
  for (int k = 0; k < 8; ++k) l[k] = Load8(lanes_in + 8 * k);
  Store8(out + 16, LaneSums8(l));
}

void RunRowsGeneric(const DotJob& j, int64_t r0, int64_t r1) { RunRowsBody<false>(j, r0, r1); }
void PrimitivesGeneric(WFormat f, const void* data, int64_t i0, const float* round_in, const float* lanes_in,
                       float* out) {
  PrimitivesBody(f, data, i0, round_in, lanes_in, out);
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) void RunRowsAvx2(const DotJob& j, int64_t r0, int64_t r1) {
  RunRowsBody<true>(j, r0, r1);
}
__attribute__((target("avx2"))) void PrimitivesAvx2(WFormat f, const void* data, int64_t i0, const float* round_in,
                                                    const float* lanes_in, float* out) {
  PrimitivesBody(f, data, i0, round_in, lanes_in, out);
}
#endif

}  // namespace

bool DotCovered(const QWeight& w, DotKind kind, bool q) {
  if (w.rows < 0 || w.cols <= 0) return false;
  if (w.format == WFormat::kE2m1 && w.cols % 2 != 0) return false;
  if (q && w.cols % 2 != 0) return false;
  const Plan p = MakePlan(w, kind, q, 1.0f);
  if (p.block > 0 && p.block % 8 != 0) return false;
  const bool narrow = w.format == WFormat::kE4m3 || w.format == WFormat::kE2m1;
  if ((p.round || p.blocked) && !narrow) return false;  // no scaled shapes for float storage
  if ((p.round || p.blocked) && w.scale_format != SFormat::kNone && (w.block_rows < 1 || w.block_cols < 1)) {
    return false;
  }
  return true;
}

bool DotMayFail(const QWeight& w, DotKind kind, bool q) {
  if (kind != DotKind::kUe8m0) return false;
  if (!q && w.scale_format == SFormat::kNone) return false;  // DotUe8m0 reads no scale
  const Plan p = MakePlan(w, kind, q, 1.0f);
  if (p.block <= 0) return true;
  const int64_t nb = (w.cols + p.block - 1) / p.block;
  std::vector<float> s(static_cast<size_t>(nb));
  // The check reads the value before the exponent is taken: recompute it.
  Plan value = p;
  value.rscale = q ? RowScale::kStored : RowScale::kScaleAt;
  const int64_t step = w.scale_format == SFormat::kNone ? w.rows : std::max<int64_t>(1, w.block_rows);
  for (int64_t r = 0; r < w.rows; r += step) {
    RowScales(w, value, r, nb, s.data());
    for (float v : s) {
      if (!IsUe8m0Layout(FloatBits(q ? v * w.global_scale : v))) return true;
    }
  }
  return false;
}

void RunRows(const DotJob& job, int64_t r0, int64_t r1, CpuIsa isa) {
  if (r1 <= r0 || job.tokens <= 0) return;
#if defined(__x86_64__)
  if (isa == CpuIsa::kAvx2) return RunRowsAvx2(job, r0, r1);
#else
  (void)isa;
#endif
  RunRowsGeneric(job, r0, r1);
}

void VectorPrimitivesForTest(WFormat f, const void* data, int64_t i0, const float* round_in, const float* lanes_in,
                             float* out, CpuIsa isa) {
#if defined(__x86_64__)
  if (isa == CpuIsa::kAvx2) return PrimitivesAvx2(f, data, i0, round_in, lanes_in, out);
#else
  (void)isa;
#endif
  PrimitivesGeneric(f, data, i0, round_in, lanes_in, out);
}

void PrepareQRow(const QWeight& xq, DotKind kind, float* x, float* scales) {
  const int64_t cols = xq.cols;
  for (int64_t c = 0; c < cols; ++c) x[c] = kind == DotKind::kDequant ? DequantAt(xq, 0, c) : RawAt(xq, 0, c);
  for (int64_t c = cols; c < PaddedCols(cols); ++c) x[c] = 0.0f;
  if (kind != DotKind::kDequant) {
    for (int64_t c0 = 0, b = 0; c0 < cols; c0 += kActBlock, ++b) scales[b] = StoredScaleAt(xq, 0, c0);
  }
}

void PadRow(const float* src, int64_t cols, float* dst) {
  std::copy(src, src + cols, dst);
  std::fill(dst + cols, dst + PaddedCols(cols), 0.0f);
}

}  // namespace crashreplay::replay::cpu
