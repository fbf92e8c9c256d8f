#include "cpu_dot.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdlib>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu_simd.h"
#include "crashreplay/replay/kernels/act_quant.h"

namespace crashreplay::replay::cpu {
namespace {

// ScanRange (cpu_dot.h) built into its caller, on the bit patterns: |v|
// orders as its bits do, |v| - 1 as unsigned puts the zeros last, and the
// lowest set bit of the significands' union bounds their significant bits.
CR_SIMD_INLINE ValueRange ScanRangeV(const float* v, int64_t n) {
  u32x8 lo[2] = {u32x8{} + 0xffffffffu, u32x8{} + 0xffffffffu}, hi[2] = {}, mant[2] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _Pragma("GCC unroll 2") for (int k = 0; k < 2; ++k) {
      u32x8 u;
      std::memcpy(&u, v + i + 8 * k, sizeof u);
      const u32x8 a = u & 0x7fffffffu, key = a - 1u;
      mant[k] |= u;
      hi[k] = a > hi[k] ? a : hi[k];
      lo[k] = key < lo[k] ? key : lo[k];
    }
  }
  uint32_t l = 0xffffffffu, h = 0, m = 0;
  for (int k = 0; k < 8; ++k) {
    _Pragma("GCC unroll 2") for (int j = 0; j < 2; ++j) {
      l = std::min(l, lo[j][k]);
      h = std::max(h, hi[j][k]);
      m |= mant[j][k];
    }
  }
  for (; i < n; ++i) {
    const uint32_t u = FloatBits(v[i]), a = u & 0x7fffffffu;
    m |= u;
    h = std::max(h, a);
    l = std::min(l, a - 1u);
  }
  ValueRange r;
  r.bits = 24 - std::countr_zero((m & 0x7fffffu) | 0x800000u);
  r.finite = h < 0x7f800000u;
  r.lo = l == 0xffffffffu ? std::numeric_limits<float>::infinity() : BitsToFloat(l + 1u);
  r.hi = BitsToFloat(h);
  return r;
}

std::atomic<uint64_t> fused_runs{0};

// lane + w * x: one fused multiply-add where kFused (every product of the
// dot is exact: ProductsExact) and the ISA has one, else the multiply and
// the add. The two give the same bits wherever kFused may be set.
template <int kIsa, bool kFused>
CR_SIMD_INLINE f32x8 MulAdd8(f32x8 lane, f32x8 w, f32x8 x) {
#if defined(__x86_64__)
  // The builtin, not _mm256_fmadd_ps: an intrinsic cannot be inlined into
  // this helper, which has no target of its own (the caller's applies).
  if constexpr (kFused && kIsa >= kIsaAvx2) return __builtin_ia32_vfmaddps256(w, x, lane);
#endif
  return lane + w * x;
}

// Up to this many tokens the weight is decoded in registers and used at once.
constexpr int64_t kDirectTokens = 2;
// How far ahead of the next tile the direct path asks for rows into L2.
constexpr uintptr_t kFarTiles = 3;
// Rows per direct tile: 8 (row, token) pairs, i.e. 8 independent
// accumulator chains, and for the blocks shape one LaneSums8 of 8 lane sets
// per scale block. Below AVX-512, the e2m1 tiles of the lanes shape with
// bf16-rounded scaled terms take 2 rows (their 16-entry tables are not
// sign-symmetric: two permutes and a blend per group, two table registers
// per row); AVX-512 looks them up with one two-table permute.
template <class W, int NR>
constexpr int DirectRowsFor() {
  return W::kE2m1 && !W::kSym && W::kIsa < kIsaAvx512 ? 2 : 8 / NR;
}
// Packed path: micro-tile of rows x tokens held in registers. AVX2's 16:
// 2 x 6 lane accumulators, 2 weight vectors, one input vector and a
// product. AVX-512's 32 of 16 floats (PackedGroupsWide: two rows' lanes a
// register): 3 x 8 accumulators for 6 rows x 8 tokens, 3 weight registers
// and the input.
template <int kIsa>
struct PackTile {
  static constexpr int kMR = kIsa == kIsaAvx512 ? 6 : 2;
  static constexpr int kNR = kIsa == kIsaAvx512 ? 8 : 6;
};
// Columns per packed chunk (a chunk of a few rows' terms stays in L1/L2) and
// tokens per pass (bounds the lane state kept across chunks).
constexpr int64_t kChunkGroups = 64;
constexpr int64_t kTokenChunk = 132;

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
void RowScalesT(const QWeight& w, const Plan& p, int64_t r, int64_t b0, int64_t nb, float* out) {
  const int64_t base = S == SFormat::kNone ? 0 : (r / w.block_rows) * w.scale_cols;
  const bool same_blocks = p.block == w.block_cols;
  for (int64_t b = b0; b < nb; ++b) {
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

// Blocks [b0, nb) of row r into out[b0, nb).
void RowScalesFrom(const QWeight& w, const Plan& p, int64_t r, int64_t b0, int64_t nb, float* out) {
  switch (w.scale_format) {
    case SFormat::kNone: return RowScalesT<SFormat::kNone>(w, p, r, b0, nb, out);
    case SFormat::kF32: return RowScalesT<SFormat::kF32>(w, p, r, b0, nb, out);
    case SFormat::kE4m3: return RowScalesT<SFormat::kE4m3>(w, p, r, b0, nb, out);
    case SFormat::kE8m0: return RowScalesT<SFormat::kE8m0>(w, p, r, b0, nb, out);
  }
}

void RowScales(const QWeight& w, const Plan& p, int64_t r, int64_t nb, float* out) {
  RowScalesFrom(w, p, r, 0, nb, out);
}

// RowScales with 8 blocks at a time where the stored scales of a row are
// contiguous (plan blocks = scale blocks) and decode in a vector: e4m3 codes
// (DecodeGroupIsa: E4m3ToFloat lane by lane), e8m0 codes, or floats; the
// same multiplies as RowScalesT. The rest of the row, and other layouts,
// scalar.
template <int kIsa>
CR_SIMD_INLINE void RowScalesV(const QWeight& w, const Plan& p, int64_t r, int64_t nb, float* out) {
  const SFormat f = w.scale_format;
  int64_t b = 0;
  if (p.block == w.block_cols && (f == SFormat::kE4m3 || f == SFormat::kE8m0 || f == SFormat::kF32)) {
    const int64_t base = (r / w.block_rows) * w.scale_cols;
    const f32x8 global = Splat(w.global_scale);
#if defined(__x86_64__)
    // AVX-512, e4m3 (NVFP4's scales, one a 16 columns of every row): 16 at
    // a time, DecodeE4m3x16 giving DecodeGroupIsa's values.
    if constexpr (kIsa == kIsaAvx512) {
      if (f == SFormat::kE4m3 && (p.rscale == RowScale::kScaleAt || p.rscale == RowScale::kStored)) {
        const f32x16 g16 = f32x16{} + w.global_scale;
        for (; b + 16 <= nb; b += 16) {
          f32x16 v = DecodeE4m3x16(static_cast<const uint8_t*>(w.scales) + base + b);
          if (p.rscale == RowScale::kScaleAt) v = v * g16;
          std::memcpy(out + b, &v, sizeof v);
        }
      }
    }
#endif
    for (; b + 8 <= nb; b += 8) {
      f32x8 stored;
      if (f == SFormat::kF32) {
        stored = Load8(static_cast<const float*>(w.scales) + base + b);
      } else if (f == SFormat::kE4m3) {
        stored = DecodeGroupIsa<WFormat::kE4m3, kIsa>(w.scales, base + b);
      } else {
        const u32x8 e = WidenBytes8(static_cast<const uint8_t*>(w.scales) + base + b);
        const u32x8 bits = e == 0xffu ? u32x8{} + 0x7fc00000u : (e == 0u ? u32x8{} + 0x00400000u : e << 23);
        stored = (f32x8)bits;
      }
      f32x8 v = stored;  // kStored
      switch (p.rscale) {
        case RowScale::kScaleAt: v = stored * global; break;
        case RowScale::kPow2ScaleAt:
        case RowScale::kPow2Stored: v = (f32x8)((u32x8)(stored * global) & 0x7f800000u); break;
        case RowScale::kStored: break;
      }
      Store8(out + b, v);
    }
  }
  RowScalesFrom(w, p, r, b, nb, out);
}

// Whether rows a and b read the same scales (RowScalesT's base): the same
// row of scale blocks, or no scales at all.
bool SameScaleRow(const QWeight& w, int64_t a, int64_t b) {
  return w.scale_format == SFormat::kNone || (w.block_rows > 0 && a / w.block_rows == b / w.block_rows);
}

// 64-byte aligned thread-local scratch; `slot` keeps simultaneous uses apart.
float* Scratch(int slot, int64_t floats) {
  thread_local std::vector<float> buf[6];
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
// permutes (codes 0-7, 8-15) and a blend on each code's sign bit, or, for a
// sign-symmetric table (t[n | 8] == -t[n] bit for bit: the raw values), one
// permute and the code's sign bit moved into the float's; AVX-512: one
// two-table permute (vpermt2ps, the index read modulo 16) for any table;
// generic: a scalar lookup per code.
template <int kIsa, bool kSym>
CR_SIMD_INLINE f32x8 LookupE2m1(const uint8_t* group, const float* t16) {
  uint32_t word;
  std::memcpy(&word, group, sizeof word);
  if constexpr (kIsa == kIsaAvx512) {
    const u32x8 w = u32x8{} + word;
    const i32x8 code = (i32x8)(w >> u32x8{0, 4, 8, 12, 16, 20, 24, 28});  // bits 0-3: the code
    return __builtin_shuffle(Load8(t16), Load8(t16 + 8), code);
  } else if constexpr (kIsa >= kIsaAvx2) {
    const u32x8 w = u32x8{} + word;
    const i32x8 index = (i32x8)(w >> u32x8{0, 4, 8, 12, 16, 20, 24, 28});  // the shuffle reads bits 0-2
    const u32x8 high = w << u32x8{28, 24, 20, 16, 12, 8, 4, 0};          // code bit 3 in the sign bit
    const f32x8 pos = __builtin_shuffle(Load8(t16), index);
    if constexpr (kSym) {
      return (f32x8)((u32x8)pos ^ (high & 0x80000000u));
    } else {
      const f32x8 neg = __builtin_shuffle(Load8(t16 + 8), index);
      return (i32x8)high < 0 ? neg : pos;
    }
  } else {
    alignas(32) float v[8];
    _Pragma("GCC unroll 16") for (int j = 0; j < 8; ++j) v[j] = t16[(word >> (4 * j)) & 0xfu];
    return Load8(v);
  }
}

// Every raw e2m1 value: 0, +-0.5 to +-6, at most 2 significant bits.
constexpr ValueRange E2m1Range() { return ValueRange{2, 0.5f, 6.0f, true}; }

template <WFormat F>
using StorageT = std::conditional_t<F == WFormat::kF32, float,
                                    std::conditional_t<F == WFormat::kBF16 || F == WFormat::kF16, uint16_t, uint8_t>>;

// The terms of one weight as DotLanes forms them: raw values, or (kRound)
// bf16(raw * s) with the block's scale s. Begin() prepares a scale block of
// a row; At() gives the 8 terms of group g of row r. Groups past the last
// full one are filled element by element with the scalar code, zeros past
// cols. e2m1 terms come from a 16-entry table per block (LookupE2m1).
template <WFormat F, bool kRound, bool kBlocked, int kIsaLevel, bool kFusedLanes = false>
struct Terms {
  static_assert(!(kRound && kBlocked), "the rounded terms belong to the lanes shape");
  const QWeight* w;
  int64_t full;                    // groups of 8 columns all inside the row
  const ScaleTable* st = nullptr;  // see ScaleTableFor

  static constexpr bool kE2m1 = F == WFormat::kE2m1;
  static constexpr bool kBlocks = kBlocked;
  // Unrounded e2m1 terms come from the raw table, which is sign-symmetric.
  static constexpr bool kSym = !kRound;
  // Bytes of one group of 8 elements of a row.
  static constexpr int64_t kGroupBytes = F == WFormat::kE2m1 ? 4 : 8 * static_cast<int64_t>(sizeof(StorageT<F>));
  static constexpr int kIsa = kIsaLevel;
  // The direct path's lanes use MulAdd8's fused form (RunRowsF sets it only
  // where ProductsExact holds for FixedRange and the job's x_range).
  static constexpr bool kFused = kFusedLanes;
  // Raw e2m1 terms: the format fixes their range (E2m1Range). e4m3 can
  // store NaN, so its terms are known only from a scan (the packed path's).
  static constexpr bool kFixedRange = !kRound && F == WFormat::kE2m1;

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
    const int64_t i = r * RowStride(*w);
    if constexpr (kE2m1) return static_cast<const uint8_t*>(w->data) + i / 2;
    return static_cast<const uint8_t*>(w->data) + i * static_cast<int64_t>(sizeof(StorageT<F>));
  }

  // Group g of the row at `base`, g < full.
  CR_SIMD_INLINE f32x8 AtFull(const void* base, int64_t g, const Block& b) const {
    if constexpr (kE2m1) {
      return LookupE2m1<kIsa, kSym>(static_cast<const uint8_t*>(base) + 4 * g, b.t16);
    } else {
      f32x8 v = DecodeGroupIsa<F, kIsa>(base, 8 * g);
      if constexpr (kRound) v = RoundBf16(v * Splat(b.s));
      return v;
    }
  }

  // Groups g and g + 1 (both < full) at once, where the decoder is faster
  // two at a time (DecodePairIsa); the values AtFull gives.
  static constexpr bool kPairs = kIsa == kIsaAvx512 && F == WFormat::kE4m3;
  // e4m3 terms on AVX-512, raw or rounded: two rows a register
  // (E4m3WideGroups).
  static constexpr bool kWide = kPairs;
  static constexpr bool kRounded = kRound;
  CR_SIMD_INLINE void AtFull2(const void* base, int64_t g, const Block& b, f32x8* w0, f32x8* w1) const {
    DecodePairIsa<F, kIsa, kRound>(base, 8 * g, kRound ? b.s : 1.0f, w0, w1);
  }

  CR_SIMD_INLINE f32x8 At(int64_t r, int64_t g, const Block& b) const {
    if (g < full) return AtFull(RowBase(r), g, b);
    const int64_t i0 = r * RowStride(*w) + 8 * g;
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
// eight at a time, as DotFused's MulAdd per block. The multiplier m[k] is
// Multiplier's: row i's block scale rv[i], times token t's activation block
// scale tv[t] under w4a4; both come packed 8 wide (PackedChunkBody), and
// the eight k of a vector pick theirs with one permute each.
template <int MR, int NR>
CR_SIMD_INLINE void BlockUpdate(bool token_scales, const f32x8 (&lane)[MR][NR], f32x8 rv, f32x8 tv,
                                float (&acc)[MR * NR]) {
  constexpr int kN = MR * NR;
  _Pragma("GCC unroll 16") for (int k0 = 0; k0 < kN; k0 += 8) {
    f32x8 v[8];
    i32x8 ri, ti;
    _Pragma("GCC unroll 16") for (int j = 0; j < 8; ++j) {
      const int k = k0 + j < kN ? k0 + j : 0;
      v[j] = k0 + j < kN ? lane[k / NR][k % NR] : Zero8();
      ri[j] = k / NR;
      ti[j] = k % NR;
    }
    const f32x8 r = __builtin_shuffle(rv, ri);
    const f32x8 m = token_scales ? r * __builtin_shuffle(tv, ti) : r;
    const f32x8 sums = LaneSums8(v);
    alignas(32) float a[8];
    _Pragma("GCC unroll 16") for (int j = 0; j < 8; ++j) a[j] = k0 + j < kN ? acc[k0 + j] : 0.0f;
    Store8(a, Load8(a) + sums * m);
    for (int j = 0; j < 8 && k0 + j < kN; ++j) acc[k0 + j] = a[j];
  }
}

// LaneSum8 of the MR x NR lane sets into out[k], k = i * NR + t.
template <int MR, int NR>
CR_SIMD_INLINE void FinalSums(const f32x8 (&lane)[MR][NR], float (&out)[MR * NR]) {
  constexpr int kN = MR * NR;
  for (int k0 = 0; k0 < kN; k0 += 8) {
    f32x8 v[8];
    _Pragma("GCC unroll 16") for (int j = 0; j < 8; ++j) v[j] =
        k0 + j < kN ? lane[(k0 + j) / NR][(k0 + j) % NR] : Zero8();
    alignas(32) float s[8];
    Store8(s, LaneSums8(v));
    for (int j = 0; j < 8 && k0 + j < kN; ++j) out[k0 + j] = s[j];
  }
}

template <int MR, int NR>
CR_SIMD_INLINE void ZeroLanes(f32x8 (&lane)[MR][NR]) {
  _Pragma("GCC unroll 16") for (int i = 0; i < MR; ++i) _Pragma("GCC unroll 16") for (int t = 0; t < NR; ++t)
      lane[i][t] = Zero8();
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

#if defined(__x86_64__)
// The blocks shape's NVFP4 blocks (16 columns: groups 2b and 2b + 1) on
// AVX-512, one register per (row, token) pair: element 2j holds group 2b's
// product of lane j, element 2j + 1 group 2b + 1's. The 8 bytes of the
// block's nibbles, broadcast and shifted as 64-bit words by 0, 4, ... 28,
// leave lane j's two codes in dwords 2j and 2j + 1, and one 16-entry
// permute decodes all 16 (against two 8-entry lookups a block); the
// inputs are interleaved the same way once a job. BlockSums16 then adds
// each even element to its odd one, which is the lane j that DirectSpan
// forms (group 2b's product stored, group 2b + 1's added: the same
// operands in the same order, and fused only where the product is exact,
// so the same bits), and sums the 8 lanes in LaneSums8's tree.
CR_SIMD_INLINE f32x16 Load16(const float* p) {
  f32x16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

CR_SIMD_INLINE f32x16 InterleaveGroups(const float* x16) {
  return __builtin_shuffle(Load16(x16), i32x16{0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15});
}

CR_SIMD_INLINE f32x16 DecodeE2m1Block(const uint8_t* block, f32x16 table) {
  uint64_t word;
  std::memcpy(&word, block, sizeof word);
  const u64x8 codes = (u64x8{} + word) >> u64x8{0, 4, 8, 12, 16, 20, 24, 28};  // dword bits 0-3: the code
  return __builtin_shuffle(table, (i32x16)codes);
}

// Per 128-bit lane q: [a's 4q + 4q+1, a's 4q+2 + 4q+3, b's ..., b's ...]:
// LaneSums8's PairSums on two registers of 16.
CR_SIMD_INLINE f32x16 PairSums16(f32x16 a, f32x16 b) {
  const f32x16 even = __builtin_shuffle(a, b, i32x16{0, 2, 16, 18, 4, 6, 20, 22, 8, 10, 24, 26, 12, 14, 28, 30});
  const f32x16 odd = __builtin_shuffle(a, b, i32x16{1, 3, 17, 19, 5, 7, 21, 23, 9, 11, 25, 27, 13, 15, 29, 31});
  return even + odd;
}

// The 8 block sums of p[k] (k = i * NR + t), as LaneSums8 of the lanes
// lane_k[j] = p[k][2j] + p[k][2j + 1].
CR_SIMD_INLINE f32x8 BlockSums16(const f32x16 (&p)[8]) {
  // q01's 128-bit lane q: lanes 2q and 2q + 1 of p[0], then of p[1].
  const f32x16 q01 = PairSums16(p[0], p[1]), q23 = PairSums16(p[2], p[3]);
  const f32x16 q45 = PairSums16(p[4], p[5]), q67 = PairSums16(p[6], p[7]);
  // r0123's lane q: l(2q) + l(2q + 1) of p[0..3].
  const f32x16 r0123 = PairSums16(q01, q23), r4567 = PairSums16(q45, q67);
  // (l0 + l1) + (l2 + l3) and (l4 + l5) + (l6 + l7): lanes 0 + 1, 2 + 3.
  const f32x16 t = __builtin_shuffle(r0123, r4567, i32x16{0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27}) +
                   __builtin_shuffle(r0123, r4567, i32x16{4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31});
  // The two halves of each sum, p[0..3] then p[4..7].
  const f32x8 lo = __builtin_shufflevector(t, t, 0, 1, 2, 3, 8, 9, 10, 11);
  const f32x8 hi = __builtin_shufflevector(t, t, 4, 5, 6, 7, 12, 13, 14, 15);
  return lo + hi;
}
#endif

// lane[i][t] += w[i] * x[t][group g] for the tile's rows and tokens; with
// kStore, lane[i][t] = w[i] * x[t][group g] (the first group of a block in
// the blocks shape, see DirectTile).
template <int kIsa, bool kFused, int MR, int NR, bool kStore = false>
CR_SIMD_INLINE void AccumulateGroup(const f32x8 (&w)[MR], const float* const* x, int64_t g, f32x8 (&lane)[MR][NR]) {
  _Pragma("GCC unroll 16") for (int t = 0; t < NR; ++t) {
    const f32x8 xv = Load8(x[t] + 8 * g);
    _Pragma("GCC unroll 16") for (int i = 0; i < MR; ++i) {
      if constexpr (kStore) {
        lane[i][t] = w[i] * xv;
      } else {
        lane[i][t] = MulAdd8<kIsa, kFused>(lane[i][t], w[i], xv);
      }
    }
  }
}

// The prefetches of DirectGroup for group g: the tile ahead's bytes of the
// group into L1, those kFarTiles tiles further into L2. Groups smaller than
// a line ask only where a new line starts.
template <int64_t kAheadBytes>
CR_SIMD_INLINE void PrefetchGroup(int64_t g, uintptr_t ahead, uintptr_t far) {
  if constexpr (kAheadBytes < 64) {
    if ((g * kAheadBytes) % 64 >= kAheadBytes) return;
  }
  for (int64_t off = 0; off < kAheadBytes; off += 64) {
    __builtin_prefetch(reinterpret_cast<const void*>(ahead + static_cast<uintptr_t>(g * kAheadBytes + off)));
    __builtin_prefetch(reinterpret_cast<const void*>(far + static_cast<uintptr_t>(g * kAheadBytes + off)), 0, 1);
  }
}

// One whole group g of MR rows against NR tokens. `ahead`: the next tile's
// rows (the MR rows after these, contiguous), prefetched into L1 at the pace
// this tile reads its own: group g asks for bytes [g, g + 1) * MR *
// kGroupBytes. `far`: the rows kFarTiles tiles after those, at the same
// pace into L2 (a decode step streams the weights once; without the L2 hint
// a llama decode step ran 14% slower, 2 and 6 tiles measured no better).
template <class W, int MR, int NR, bool kStore = false>
CR_SIMD_INLINE void DirectGroup(const W& terms, const void* const (&base)[MR], const typename W::Block (&blk)[MR],
                                const float* const* x, int64_t g, uintptr_t ahead, uintptr_t far,
                                f32x8 (&lane)[MR][NR]) {
  PrefetchGroup<MR * W::kGroupBytes>(g, ahead, far);
  f32x8 w[MR];
  _Pragma("GCC unroll 16") for (int i = 0; i < MR; ++i) w[i] = terms.AtFull(base[i], g, blk[i]);
  AccumulateGroup<W::kIsa, W::kFused, MR, NR, kStore>(w, x, g, lane);
}

// Groups g and g + 1 as two DirectGroup calls, their terms decoded together
// (W::kPairs): the lanes take group g's products, then group g + 1's.
template <class W, int MR, int NR, bool kStore = false>
CR_SIMD_INLINE void DirectGroupPair(const W& terms, const void* const (&base)[MR], const typename W::Block (&blk)[MR],
                                    const float* const* x, int64_t g, uintptr_t ahead, uintptr_t far,
                                    f32x8 (&lane)[MR][NR]) {
  PrefetchGroup<MR * W::kGroupBytes>(g, ahead, far);
  PrefetchGroup<MR * W::kGroupBytes>(g + 1, ahead, far);
  f32x8 w0[MR], w1[MR];
  _Pragma("GCC unroll 16") for (int i = 0; i < MR; ++i) terms.AtFull2(base[i], g, blk[i], &w0[i], &w1[i]);
  AccumulateGroup<W::kIsa, W::kFused, MR, NR, kStore>(w0, x, g, lane);
  AccumulateGroup<W::kIsa, W::kFused, MR, NR>(w1, x, g + 1, lane);
}

// The whole groups [g0, g1) (g1 <= full), in pairs where W::kPairs.
template <class W, int MR, int NR>
CR_SIMD_INLINE void DirectGroups(const W& terms, const void* const (&base)[MR], const typename W::Block (&blk)[MR],
                                 const float* const* x, int64_t g0, int64_t g1, uintptr_t ahead, uintptr_t far,
                                 f32x8 (&lane)[MR][NR]) {
  int64_t g = g0;
  if constexpr (W::kPairs) {
    for (; g + 1 < g1; g += 2) DirectGroupPair<W, MR, NR>(terms, base, blk, x, g, ahead, far, lane);
  }
  for (; g < g1; ++g) DirectGroup<W, MR, NR>(terms, base, blk, x, g, ahead, far, lane);
}

#if defined(__x86_64__)
// The lane sets of rows 2i and 2i + 1 (each NR tokens' 8 lanes) in one
// register of 16: concatenated (row 2i's lanes in elements 0-7, as the
// packed micro-kernel and the FP8 decode tiles hold them) or interleaved
// (element 2k row 2i's lane k, 2k + 1 row 2i + 1's: E2m1RoundedPairBlocks).
template <bool kInterleaved, int MR, int NR>
CR_SIMD_INLINE void PairLanes(const f32x8 (&lane)[MR][NR], f32x16 (&wide)[MR / 2][NR]) {
  static_assert(MR % 2 == 0, "rows go in pairs");
  _Pragma("GCC unroll 16") for (int i = 0; i < MR / 2; ++i) _Pragma("GCC unroll 16") for (int t = 0; t < NR; ++t) {
    const f32x8 a = lane[2 * i][t], b = lane[2 * i + 1][t];
    if constexpr (kInterleaved) {
      wide[i][t] = __builtin_shufflevector(a, b, 0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
    } else {
      wide[i][t] = __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    }
  }
}

// PairLanes undone.
template <bool kInterleaved, int MR, int NR>
CR_SIMD_INLINE void UnpairLanes(const f32x16 (&wide)[MR / 2][NR], f32x8 (&lane)[MR][NR]) {
  _Pragma("GCC unroll 16") for (int i = 0; i < MR / 2; ++i) _Pragma("GCC unroll 16") for (int t = 0; t < NR; ++t) {
    const f32x16 v = wide[i][t];
    if constexpr (kInterleaved) {
      lane[2 * i][t] = __builtin_shufflevector(v, v, 0, 2, 4, 6, 8, 10, 12, 14);
      lane[2 * i + 1][t] = __builtin_shufflevector(v, v, 1, 3, 5, 7, 9, 11, 13, 15);
    } else {
      lane[2 * i][t] = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
      lane[2 * i + 1][t] = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    }
  }
}

// Whole groups [g0, g1) (an even count, g1 <= full) of e4m3 terms (raw, or
// rounded with each row's block scale as AtFull's), MR rows (even) against
// NR tokens, with rows i and i + 1 in one register of
// 16 (lanes of row i in elements 0-7, of row i + 1 in 8-15), as
// PackedGroupsWide: each lane adds the same products in the same order as
// DirectGroup's (group g's, then g + 1's), so the same bits. The 16 bytes
// of groups g and g + 1 of the two rows are arranged [i's g, i + 1's g,
// i's g + 1, i + 1's g + 1] and decoded together (DecodeE4m3x32): one sign
// extension, one E4m3Fp16Codes and one product a group for two rows,
// against two of each on the pair path, and no half to extract.
// kPlain (rounded terms only): every block scale of the tile is finite,
// not NaN and below 2^120 in magnitude. Then 2^8 moves from the decode
// into the scale (the fp16 value times 2^8 * s is the same real product as
// the e4m3 value times s, so it rounds to the same float), and the bf16
// rounding needs no NaN case: a product is NaN only where the code is,
// sign | 0x7fc00000 (E4m3ToFloat's), whose low 22 bits are zero, so the
// rounding's add leaves it as RoundBf16V's NaN case gives it.
template <class W, int MR, int NR, bool kPlain>
CR_SIMD_INLINE void E4m3WideLoop(const void* const (&base)[MR], const typename W::Block (&blk)[MR],
                                 const float* const* x, int64_t g0, int64_t g1, uintptr_t ahead, uintptr_t far,
                                 f32x16 (&wide)[MR / 2][NR]) {
  f32x16 scale[MR / 2];
  _Pragma("GCC unroll 16") for (int i = 0; i < MR / 2; ++i) {
    const float k = kPlain ? 256.0f : 1.0f;
    const f32x8 a = Splat(blk[2 * i].s * k), b = Splat(blk[2 * i + 1].s * k);
    scale[i] = __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  }
  for (int64_t g = g0; g < g1; g += 2) {
    PrefetchGroup<MR * W::kGroupBytes>(g, ahead, far);
    PrefetchGroup<MR * W::kGroupBytes>(g + 1, ahead, far);
    f32x16 x0[NR], x1[NR];
    _Pragma("GCC unroll 16") for (int t = 0; t < NR; ++t) {
      const f32x8 a = Load8(x[t] + 8 * g), b = Load8(x[t] + 8 * g + 8);
      x0[t] = __builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7);
      x1[t] = __builtin_shufflevector(b, b, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7);
    }
    _Pragma("GCC unroll 16") for (int i = 0; i < MR / 2; ++i) {
      u64x2 r0, r1;
      std::memcpy(&r0, static_cast<const uint8_t*>(base[2 * i]) + 8 * g, sizeof r0);
      std::memcpy(&r1, static_cast<const uint8_t*>(base[2 * i + 1]) + 8 * g, sizeof r1);
      f32x16 w0, w1;
      DecodeE4m3x32<!kPlain>((i8x32)__builtin_shufflevector(r0, r1, 0, 2, 1, 3), &w0, &w1);
      if constexpr (W::kRounded && kPlain) {
        w0 = RoundBf16Finite(w0 * scale[i]);
        w1 = RoundBf16Finite(w1 * scale[i]);
      } else if constexpr (W::kRounded) {
        w0 = RoundBf16V<f32x16, u32x16>(w0 * scale[i]);
        w1 = RoundBf16V<f32x16, u32x16>(w1 * scale[i]);
      }
      _Pragma("GCC unroll 16") for (int t = 0; t < NR; ++t) wide[i][t] = wide[i][t] + w0 * x0[t];
      _Pragma("GCC unroll 16") for (int t = 0; t < NR; ++t) wide[i][t] = wide[i][t] + w1 * x1[t];
    }
  }
}

template <class W, int MR, int NR>
CR_SIMD_INLINE void E4m3WideGroups(const void* const (&base)[MR], const typename W::Block (&blk)[MR],
                                   const float* const* x, int64_t g0, int64_t g1, uintptr_t ahead, uintptr_t far,
                                   f32x8 (&lane)[MR][NR]) {
  static_assert(MR % 2 == 0, "rows go in pairs");
  f32x16 wide[MR / 2][NR];
  PairLanes<false>(lane, wide);
  bool plain = W::kRounded;
  if constexpr (W::kRounded) {
    _Pragma("GCC unroll 16") for (int i = 0; i < MR; ++i) plain = plain && std::fabs(blk[i].s) < 0x1p120f;
  }
  if (plain) {
    E4m3WideLoop<W, MR, NR, true>(base, blk, x, g0, g1, ahead, far, wide);
  } else {
    E4m3WideLoop<W, MR, NR, false>(base, blk, x, g0, g1, ahead, far, wide);
  }
  UnpairLanes<false>(wide, lane);
}
#endif

// The groups [g0, g1) of a tile's rows into its lane sets: whole groups
// from the row bases (unrolled when kGpb of them make the span), the rest
// element by element. kFresh: the lanes hold nothing yet (a new block of the
// blocks shape); the unrolled span then stores its first group's products
// instead of adding them to zeros. Only a zero's sign can differ (0 + -0 is
// +0), and a block whose lanes are all zeros sums to a zero whose sign
// cannot reach the output: the accumulator it is added to starts at +0 and
// in round-to-nearest never becomes -0, so acc + (+-0) * m is acc (or the
// NaN of m). Elsewhere the lanes are zeroed first, as before.
template <class W, int MR, int NR, int kGpb, bool kFresh = false>
CR_SIMD_INLINE void DirectSpan(const W& terms, const void* const (&base)[MR], const int64_t (&row)[MR],
                               const typename W::Block (&blk)[MR], const float* const* x, int64_t g0, int64_t g1,
                               uintptr_t ahead, uintptr_t far, f32x8 (&lane)[MR][NR]) {
  const int64_t gf = std::min(g1, terms.full);
  if constexpr (kGpb > 0) {
    if (gf - g0 == kGpb) {
      if constexpr (W::kPairs && kGpb % 2 == 0) {
        DirectGroupPair<W, MR, NR, kFresh>(terms, base, blk, x, g0, ahead, far, lane);
        _Pragma("GCC unroll 16") for (int k = 2; k < kGpb; k += 2)
            DirectGroupPair<W, MR, NR>(terms, base, blk, x, g0 + k, ahead, far, lane);
      } else {
        DirectGroup<W, MR, NR, kFresh>(terms, base, blk, x, g0, ahead, far, lane);
        _Pragma("GCC unroll 16") for (int k = 1; k < kGpb; ++k)
            DirectGroup<W, MR, NR>(terms, base, blk, x, g0 + k, ahead, far, lane);
      }
      return;
    }
  }
  if constexpr (kFresh) ZeroLanes(lane);
  int64_t gw = g0;  // groups before gw taken two rows a register
#if defined(__x86_64__)
  if constexpr (W::kWide && !W::kFused && MR % 2 == 0) {
    gw = g0 + std::max<int64_t>(0, (gf - g0) & ~int64_t{1});
    E4m3WideGroups<W, MR, NR>(base, blk, x, g0, gw, ahead, far, lane);
  }
#endif
  DirectGroups<W, MR, NR>(terms, base, blk, x, gw, gf, ahead, far, lane);
  for (int64_t g = std::max(g0, gf); g < g1; ++g) {
    f32x8 w[MR];
    _Pragma("GCC unroll 16") for (int i = 0; i < MR; ++i) w[i] = terms.At(row[i], g, blk[i]);
    AccumulateGroup<W::kIsa, W::kFused, MR, NR>(w, x, g, lane);
  }
}

#if defined(__x86_64__)
// The lanes shape's rounded e2m1 terms (the dequant dot of NVFP4 and
// MXFP4) over the whole blocks [0, whole) on AVX-512, rows i and i + 1 in
// one register of 16: element 2k holds row i's lane k, element 2k + 1 row
// i + 1's. The two rows' 8 codes of a group are one 64-bit word broadcast
// and shifted so that element 2k (2k + 1) reads row i's (i + 1's) code k,
// and one two-table permute looks each up in its own row's table (odd
// elements in the second: index bit 4). Each element then adds the
// products of its lane in the order DirectSpan's lanes add them (group by
// group from +0, multiply then add), so the same bits; the lanes come back
// deinterleaved for the blocks after `whole` and FinalSums. Returns whole.
// Against a lookup of 8 a row it halves the multiplies, adds and permutes,
// and the 8 rows' lanes and tables fit the 32 registers (they spilled).
template <class W, int MR, int NR, int kGpb>
CR_SIMD_INLINE int64_t E2m1RoundedPairBlocks(const W& terms, const RowRef (&rows)[MR], const void* const (&base)[MR],
                                             const float* const* x, int64_t whole, uintptr_t ahead, uintptr_t far,
                                             f32x8 (&lane)[MR][NR]) {
  static_assert(MR % 2 == 0, "rows go in pairs");
  f32x16 wide[MR / 2][NR];
  PairLanes<true>(lane, wide);
  const u32x16 shift = {0, 0, 4, 4, 8, 8, 12, 12, 16, 16, 20, 20, 24, 24, 28, 28};
  const u32x16 second = {0, 16, 0, 16, 0, 16, 0, 16, 0, 16, 0, 16, 0, 16, 0, 16};
  const f32x16 raw = Load16(RawE2m1Table().t);
  for (int64_t b = 0; b < whole; ++b) {
    // Each row's table of the block, as Begin gives it: from the scale
    // codes' tables, or ScaledE2m1Table's products rounded 16 at a time.
    // Written out in registers on purpose: calling ScaledE2m1Table into a
    // local table here (its address taken) spilled the lanes again and
    // took NVFP4 dequant from 48% to 35% of the read stream.
    f32x16 table[MR];
    _Pragma("GCC unroll 16") for (int i = 0; i < MR; ++i) {
      table[i] = terms.st != nullptr ? Load16(terms.st->t[rows[i].codes[b]].t)
                                     : RoundBf16V<f32x16, u32x16>(raw * (f32x16{} + rows[i].rs[b]));
    }
    _Pragma("GCC unroll 16") for (int k = 0; k < kGpb; ++k) {
      const int64_t g = b * kGpb + k;
      PrefetchGroup<MR * W::kGroupBytes>(g, ahead, far);
      f32x16 xv[NR];
      _Pragma("GCC unroll 16") for (int t = 0; t < NR; ++t) {
        const f32x8 a = Load8(x[t] + 8 * g);
        xv[t] = __builtin_shufflevector(a, a, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
      }
      _Pragma("GCC unroll 16") for (int i = 0; i < MR / 2; ++i) {
        uint32_t c0, c1;
        std::memcpy(&c0, static_cast<const uint8_t*>(base[2 * i]) + 4 * g, sizeof c0);
        std::memcpy(&c1, static_cast<const uint8_t*>(base[2 * i + 1]) + 4 * g, sizeof c1);
        const u32x16 words = (u32x16)(u64x8{} + (uint64_t{c0} | uint64_t{c1} << 32));
        const i32x16 index = (i32x16)(((words >> shift) & 0xfu) | second);
        const f32x16 w = __builtin_shuffle(table[2 * i], table[2 * i + 1], index);
        _Pragma("GCC unroll 16") for (int t = 0; t < NR; ++t) wide[i][t] = wide[i][t] + w * xv[t];
      }
    }
  }
  UnpairLanes<true>(wide, lane);
  return whole;
}
#endif

// MR rows from row0 against NR tokens from t0, the whole row at once.
// Lanes shape: rs holds the rows' block scales ([MR][nb]) when the plan has
// any. Blocks shape (MR * NR == 8): mv holds, per scale block b, the 8
// multipliers of the tile's (row i, token t) pairs at mv[8 * b + i * NR + t];
// the lane sets of a block are summed by one LaneSums8 and the accumulators
// stay in one register: acc = acc + sums * m, DotFused's MulAdd per block.
// kGpb > 0: the plan's blocks are kGpb groups (NVFP4 16 columns: 2, MXFP4
// 32: 4).
template <class W, int MR, int NR, int kGpb>
CR_SIMD_INLINE void DirectTile(const DotJob& j, const Plan& p, const W& terms, int64_t row0, int valid, const float* rs,
                               const float* mv, int64_t nb, int64_t t0, const float* xi = nullptr) {
  const int64_t groups = (terms.w->cols + 7) / 8;
  const float* const* x = j.x + t0;
  f32x8 lane[MR][NR];
  const int64_t gpb = p.block > 0 ? p.block / 8 : groups;
  const int64_t blocks = p.block > 0 ? nb : 1;
  RowRef rows[MR];
  const void* base[MR];
  int64_t row[MR];
  _Pragma("GCC unroll 16") for (int i = 0; i < MR; ++i) {
    row[i] = row0 + std::min(i, valid - 1);
    rows[i] = terms.Row(row[i], rs != nullptr ? rs + i * nb : nullptr);
    base[i] = terms.RowBase(row[i]);
  }
  const uintptr_t first = reinterpret_cast<uintptr_t>(terms.RowBase(row0));
  const uintptr_t ahead = first + MR * (reinterpret_cast<uintptr_t>(terms.RowBase(row0 + 1)) - first);
  const uintptr_t far = first + (1 + kFarTiles) * MR * (reinterpret_cast<uintptr_t>(terms.RowBase(row0 + 1)) - first);
  alignas(32) float out[MR * NR];
  if constexpr (W::kBlocks) {
    static_assert(MR * NR == 8, "a blocks tile is one vector of (row, token) pairs");
    f32x8 acc = Zero8();
    int64_t b = 0;
#if defined(__x86_64__)
    if constexpr (W::kIsa == kIsaAvx512 && W::kE2m1 && kGpb == 2) {
      const f32x16 table = Load16(RawE2m1Table().t);  // the blocks shape's terms are raw
      for (const int64_t whole = std::min(blocks, terms.full / 2); b < whole; ++b) {
        PrefetchGroup<MR * W::kGroupBytes>(2 * b, ahead, far);
        PrefetchGroup<MR * W::kGroupBytes>(2 * b + 1, ahead, far);
        f32x16 xv[NR];
        _Pragma("GCC unroll 16") for (int t = 0; t < NR; ++t) xv[t] = Load16(xi + 16 * (b * NR + t));
        f32x16 prod[8];
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; ++i) {
          const f32x16 w = DecodeE2m1Block(static_cast<const uint8_t*>(base[i]) + 8 * b, table);
          _Pragma("GCC unroll 16") for (int t = 0; t < NR; ++t) prod[i * NR + t] = w * xv[t];
        }
        acc = acc + BlockSums16(prod) * Load8(mv + 8 * b);
      }
    }
#endif
    for (; b < blocks; ++b) {
      typename W::Block blk[MR];
      _Pragma("GCC unroll 16") for (int i = 0; i < MR; ++i) terms.Begin(rows[i], b, &blk[i]);
      DirectSpan<W, MR, NR, kGpb, /*kFresh=*/true>(terms, base, row, blk, x, b * gpb, std::min(groups, (b + 1) * gpb),
                                                   ahead, far, lane);
      acc = acc + LaneSums8(&lane[0][0]) * Load8(mv + 8 * b);
    }
    Store8(out, acc);
  } else {
    ZeroLanes(lane);
    int64_t b = 0;
#if defined(__x86_64__)
    if constexpr (W::kIsa == kIsaAvx512 && W::kE2m1 && W::kRounded && kGpb > 0 && MR % 2 == 0) {
      b = E2m1RoundedPairBlocks<W, MR, NR, kGpb>(terms, rows, base, x, std::min(blocks, terms.full / kGpb), ahead, far,
                                                 lane);
    }
#endif
    for (; b < blocks; ++b) {
      typename W::Block blk[MR];
      _Pragma("GCC unroll 16") for (int i = 0; i < MR; ++i) terms.Begin(rows[i], b, &blk[i]);
      DirectSpan<W, MR, NR, kGpb>(terms, base, row, blk, x, b * gpb, std::min(groups, (b + 1) * gpb), ahead, far, lane);
    }
    FinalSums<MR, NR>(lane, out);
  }
  WriteTile<MR, NR>(j, p, row0, valid, t0, NR, out);
}

// v[k][i] = v[i][k] (the columns of 8 rows become the rows).
CR_SIMD_INLINE void Transpose8x8(f32x8 (&v)[8]) {
  const i32x8 lo = {0, 8, 1, 9, 4, 12, 5, 13}, hi = {2, 10, 3, 11, 6, 14, 7, 15};
  const i32x8 even = {0, 1, 8, 9, 4, 5, 12, 13}, odd = {2, 3, 10, 11, 6, 7, 14, 15};
  const i32x8 low128 = {0, 1, 2, 3, 8, 9, 10, 11}, high128 = {4, 5, 6, 7, 12, 13, 14, 15};
  f32x8 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = __builtin_shuffle(v[i], v[i + 1], lo);
    t[i + 1] = __builtin_shuffle(v[i], v[i + 1], hi);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = __builtin_shuffle(t[i], t[i + 2], even);
    u[i + 1] = __builtin_shuffle(t[i], t[i + 2], odd);
    u[i + 2] = __builtin_shuffle(t[i + 1], t[i + 3], even);
    u[i + 3] = __builtin_shuffle(t[i + 1], t[i + 3], odd);
  }
  for (int k = 0; k < 4; ++k) {
    v[k] = __builtin_shuffle(u[k], u[k + 4], low128);
    v[k + 4] = __builtin_shuffle(u[k], u[k + 4], high128);
  }
}

// Rows [r0, r1) in tiles of DirectRowsFor rows; the last tile repeats its
// last row where rows run out (computed, not written).
template <class W, int NR>
CR_SIMD_INLINE void DirectRows(const DotJob& j, const Plan& p, const W& terms, int64_t r0, int64_t r1, int64_t nb,
                               int64_t t0) {
  const bool need_rs = terms.NeedsRowScales(p);
  constexpr int kRows = DirectRowsFor<W, NR>();
  float* rs = need_rs ? Scratch(0, kRows * nb) : nullptr;
  float* mv = W::kBlocks ? Scratch(1, 8 * nb) : nullptr;
  const float* const* xs = p.token_scales ? j.xs + t0 : nullptr;
  // The tokens' NVFP4 blocks interleaved once for every tile (BlockSums16).
  float* xi = nullptr;
#if defined(__x86_64__)
  if constexpr (W::kIsa == kIsaAvx512 && W::kE2m1 && W::kBlocks) {
    if (p.block == 16) {
      const int64_t whole = std::min(nb, terms.full / 2);
      xi = Scratch(2, 16 * NR * whole);
      for (int64_t b = 0; b < whole; ++b) {
        _Pragma("GCC unroll 16") for (int t = 0; t < NR; ++t) {
          const f32x16 v = InterleaveGroups(j.x[t0 + t] + 16 * b);
          std::memcpy(xi + 16 * (b * NR + t), &v, sizeof v);
        }
      }
    }
  }
#endif
  for (int64_t r = r0; r < r1; r += kRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kRows, r1 - r));
    if (need_rs) {
      // A row's scales depend only on its row of scale blocks: rows that
      // share it (an FP8 block's 128 rows) copy the row before's.
      for (int i = 0; i < kRows; ++i) {
        const int64_t ri = r + std::min(i, rows - 1);
        if (i > 0 && SameScaleRow(*j.w, ri - 1, ri)) {
          std::memcpy(rs + i * nb, rs + (i - 1) * nb, static_cast<size_t>(nb) * sizeof(float));
        } else {
          RowScalesV<W::kIsa>(*j.w, p, ri, nb, rs + i * nb);
        }
      }
    }
    if constexpr (W::kBlocks) {
      int64_t b = 0;
      if constexpr (NR == 1) {  // 8 rows: transpose 8 x 8 blocks of the row scales
        for (; b + 8 <= nb; b += 8) {
          f32x8 v[8];
          _Pragma("GCC unroll 8") for (int i = 0; i < 8; ++i) v[i] = Load8(rs + i * nb + b);
          Transpose8x8(v);
          _Pragma("GCC unroll 8") for (int k = 0; k < 8; ++k) {
            Store8(mv + 8 * (b + k), p.token_scales ? v[k] * Splat(xs[0][b + k]) : v[k]);
          }
        }
      }
      for (; b < nb; ++b) {
        _Pragma("GCC unroll 16") for (int i = 0; i < kRows; ++i) {
          _Pragma("GCC unroll 16") for (int t = 0; t < NR; ++t) mv[8 * b + i * NR + t] =
              Multiplier(p, rs + i * nb, xs, t, b);
        }
      }
    }
    if (W::kE2m1 && p.block == 16) {
      DirectTile<W, kRows, NR, W::kE2m1 ? 2 : 0>(j, p, terms, r, rows, rs, mv, nb, t0, xi);
    } else if (W::kE2m1 && p.block == 32) {
      DirectTile<W, kRows, NR, W::kE2m1 ? 4 : 0>(j, p, terms, r, rows, rs, mv, nb, t0);
    } else {
      DirectTile<W, kRows, NR, 0>(j, p, terms, r, rows, rs, mv, nb, t0);
    }
  }
}

// ---- packed path: many tokens, terms decoded once per chunk --------------------
// Per work item (a block of rows) and chunk of columns: the rows' terms are
// packed as [tile of MR rows][group][MR][8], each token tile's inputs as
// [group][NR][8], and the micro-kernel keeps MR x NR lane sets in registers
// (PackTile: the sizes per instruction set).

// Packs the terms of rows [row0, row0 + rows) (rows <= MR; missing rows are
// zero) for groups [g0, g1).
template <class W, int MR>
CR_SIMD_INLINE void PackA(const W& terms, const Plan& p, int64_t row0, int rows, const float* rs, int64_t nb,
                          int64_t g0, int64_t g1, float* ap) {
  const int64_t gpb = p.round ? p.block / 8 : g1 - g0;
  for (int64_t b0 = g0; b0 < g1; b0 += gpb) {
    const int64_t b1 = std::min(g1, b0 + gpb);
    typename W::Block blk[MR];
    for (int i = 0; i < MR; ++i) {
      if (i < rows) terms.Begin(terms.Row(row0 + i, rs != nullptr ? rs + i * nb : nullptr), b0 / gpb, &blk[i]);
    }
    for (int64_t g = b0; g < b1; ++g) {
      float* dst = ap + (g - g0) * MR * 8;
      for (int i = 0; i < MR; ++i) Store8(dst + i * 8, i < rows ? terms.At(row0 + i, g, blk[i]) : Zero8());
    }
  }
}

// The inputs of NR tokens (zero rows past the job's tokens) for groups
// [g0, g1).
template <int NR>
CR_SIMD_INLINE void PackB(const float* const* x, int tokens, int64_t g0, int64_t g1, float* bp) {
  for (int64_t g = g0; g < g1; ++g) {
    float* dst = bp + (g - g0) * NR * 8;
    _Pragma("GCC unroll 16") for (int t = 0; t < NR; ++t)
        Store8(dst + t * 8, t < tokens ? Load8(x[t] + 8 * g) : Zero8());
  }
}

#if defined(__x86_64__)
typedef float f32x16 __attribute__((vector_size(64)));

// The micro-kernel in 16-float registers (AVX-512): each register holds
// the 8 lanes of rows i and i + 1 (adjacent in the packed panel), so one
// instruction does two rows' multiply-adds (fused where kFused), every lane
// the same operations on the same operands as the 8-float form.
template <bool kFused, int MR, int NR>
CR_SIMD_INLINE void PackedGroupsWide(const float* ap, const float* bp, int64_t groups, f32x8 (&lane)[MR][NR]) {
  static_assert(MR % 2 == 0, "rows go in pairs");
  f32x16 wide[MR / 2][NR];
  PairLanes<false>(lane, wide);
  for (int64_t g = 0; g < groups; ++g, ap += MR * 8, bp += NR * 8) {
    f32x16 w[MR / 2];
    _Pragma("GCC unroll 16") for (int i = 0; i < MR / 2; ++i) std::memcpy(&w[i], ap + 16 * i, sizeof w[i]);
    _Pragma("GCC unroll 16") for (int t = 0; t < NR; ++t) {
      const f32x8 x8 = Load8(bp + t * 8);
      const f32x16 xv = __builtin_shufflevector(x8, x8, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7);
      _Pragma("GCC unroll 16") for (int i = 0; i < MR / 2; ++i) {
        if constexpr (kFused) {
          wide[i][t] = __builtin_ia32_vfmaddps512_mask(w[i], xv, wide[i][t], static_cast<uint16_t>(0xffff), 4);
        } else {
          wide[i][t] = wide[i][t] + w[i] * xv;
        }
      }
    }
  }
  UnpairLanes<false>(wide, lane);
}

#endif

// The micro-kernel over `groups` packed groups.
template <int kIsa, bool kFused, int MR, int NR>
CR_SIMD_INLINE void PackedGroups(const float* ap, const float* bp, int64_t groups, f32x8 (&lane)[MR][NR]) {
#if defined(__x86_64__)
  if constexpr (kIsa == kIsaAvx512 && MR % 2 == 0) return PackedGroupsWide<kFused, MR, NR>(ap, bp, groups, lane);
#endif
  for (int64_t g = 0; g < groups; ++g, ap += MR * 8, bp += NR * 8) {
    f32x8 w[MR];
    for (int i = 0; i < MR; ++i) w[i] = Load8(ap + i * 8);
    _Pragma("GCC unroll 16") for (int t = 0; t < NR; ++t) {
      const f32x8 xv = Load8(bp + t * 8);
      for (int i = 0; i < MR; ++i) lane[i][t] = MulAdd8<kIsa, kFused>(lane[i][t], w[i], xv);
    }
  }
}

// One micro-tile over one chunk [g0, g1): continues from the state (lanes or
// block accumulators) of the previous chunk, and writes the outputs after
// the last.
template <int kIsa, bool kFused, bool kBlocked, int MR, int NR>
CR_SIMD_INLINE void PackedTile(const DotJob& j, const Plan& p, const float* ap, const float* bp, const float* rsp,
                               const float* tsp, int64_t g0, int64_t g1, bool first, bool last, float* state,
                               int64_t row0, int rows, int64_t t0, int tokens) {
  f32x8 lane[MR][NR];
  float acc[MR * NR];
  ZeroLanes(lane);
  if constexpr (!kBlocked) {
    if (!first) {
      for (int i = 0; i < MR; ++i)
        _Pragma("GCC unroll 16") for (int t = 0; t < NR; ++t) lane[i][t] = Load8(state + (i * NR + t) * 8);
    }
    PackedGroups<kIsa, kFused, MR, NR>(ap, bp, g1 - g0, lane);
    if (!last) {
      for (int i = 0; i < MR; ++i)
        _Pragma("GCC unroll 16") for (int t = 0; t < NR; ++t) Store8(state + (i * NR + t) * 8, lane[i][t]);
      return;
    }
    FinalSums<MR, NR>(lane, acc);
  } else {
    for (int k = 0; k < MR * NR; ++k) acc[k] = first ? 0.0f : state[k];
    const int64_t gpb = p.block / 8;
    for (int64_t b0 = g0; b0 < g1; b0 += gpb) {
      ZeroLanes(lane);
      const int64_t b1 = std::min(g1, b0 + gpb);
      PackedGroups<kIsa, kFused, MR, NR>(ap + (b0 - g0) * MR * 8, bp + (b0 - g0) * NR * 8, b1 - b0, lane);
      const int64_t bi = (b0 - g0) / gpb;
      BlockUpdate<MR, NR>(p.token_scales, lane, Load8(rsp + 8 * bi), p.token_scales ? Load8(tsp + 8 * bi) : Zero8(),
                          acc);
    }
    if (!last) {
      for (int k = 0; k < MR * NR; ++k) state[k] = acc[k];
      return;
    }
  }
  WriteTile<MR, NR>(j, p, row0, rows, t0, tokens, acc);
}

// One chunk of columns of a block of rows, packed, against tokens [tc, tc1):
// the part of the packed path that does not depend on the weight's format,
// so it is built once per instruction set and shape, not once per format.
struct ChunkArgs {
  const DotJob* j;
  const Plan* p;
  const float* ap;  // [tiles][g1 - g0][MR][8]
  const float* rs;  // row scales [r1 - r0][nb] or null
  float* bp;        // [g1 - g0][NR][8] scratch
  float* state;     // lanes or accumulators kept between chunks, or null
  int64_t nb, cg, g0, g1, r0, r1, tiles, ttiles, tc, tc1;
  bool first, last;
  bool fused;  // the chunk's products are exact (ProductsExact): MulAdd8 fuses
};

template <int kIsa, bool kFused, bool kBlocked, int MR, int NR>
CR_SIMD_INLINE void PackedChunkBody(const ChunkArgs& a) {
  const DotJob& j = *a.j;
  const Plan& p = *a.p;
  static_assert(MR <= 8 && NR <= 8, "the block scales of a tile are packed 8 wide");
  constexpr int64_t kStatePerTile = MR * NR * 8;
  // Blocked: the chunk's block scales packed 8 wide, rows' per tile and
  // block (rsp[m][block][i], zero past the rows), tokens' per token tile
  // and block (tsp[block][t], the last token repeated past the tokens).
  const int64_t gpb = kBlocked ? p.block / 8 : 1, nbc = (a.g1 - a.g0 + gpb - 1) / gpb, b_first = a.g0 / gpb;
  float* rsp = kBlocked ? Scratch(4, a.tiles * nbc * 8) : nullptr;
  float* tsp = kBlocked && p.token_scales ? Scratch(5, nbc * 8) : nullptr;
  if constexpr (kBlocked) {
    for (int64_t m = 0; m < a.tiles; ++m) {
      const int64_t rows = std::min<int64_t>(MR, a.r1 - (a.r0 + m * MR));
      for (int64_t bi = 0; bi < nbc; ++bi) {
        float* dst = rsp + (m * nbc + bi) * 8;
        for (int i = 0; i < 8; ++i) dst[i] = i < rows ? a.rs[(m * MR + i) * a.nb + b_first + bi] : 0.0f;
      }
    }
  }
  for (int64_t t0 = a.tc, tt = 0; t0 < a.tc1; t0 += NR, ++tt) {
    const int tokens = static_cast<int>(std::min<int64_t>(NR, a.tc1 - t0));
    PackB<NR>(j.x + t0, tokens, a.g0, a.g1, a.bp);
    if (tsp != nullptr) {
      for (int64_t bi = 0; bi < nbc; ++bi) {
        for (int t = 0; t < 8; ++t) tsp[bi * 8 + t] = t < NR ? j.xs[t0 + std::min(t, tokens - 1)][b_first + bi] : 0.0f;
      }
    }
    for (int64_t m = 0; m < a.tiles; ++m) {
      const int64_t row0 = a.r0 + m * MR;
      const int rows = static_cast<int>(std::min<int64_t>(MR, a.r1 - row0));
      float* st = a.state != nullptr ? a.state + (m * a.ttiles + tt) * kStatePerTile : nullptr;
      PackedTile<kIsa, kFused, kBlocked, MR, NR>(j, p, a.ap + m * a.cg * MR * 8, a.bp,
                                                 rsp != nullptr ? rsp + m * nbc * 8 : nullptr, tsp, a.g0, a.g1, a.first,
                                                 a.last, st, row0, rows, t0, tokens);
    }
  }
}

template <int kIsa>
CR_SIMD_INLINE void PackedChunkIsa(const ChunkArgs& a, bool blocked) {
  constexpr int MR = PackTile<kIsa>::kMR, NR = PackTile<kIsa>::kNR;
  if constexpr (kIsa >= kIsaAvx2) {
    if (a.fused) {
      if (blocked) return PackedChunkBody<kIsa, true, true, MR, NR>(a);
      return PackedChunkBody<kIsa, true, false, MR, NR>(a);
    }
  }
  if (blocked) return PackedChunkBody<kIsa, false, true, MR, NR>(a);
  PackedChunkBody<kIsa, false, false, MR, NR>(a);
}

__attribute__((noinline)) void PackedChunkGeneric(const ChunkArgs& a, bool blocked) {
  PackedChunkIsa<kIsaGeneric>(a, blocked);
}

#if defined(__x86_64__)
CR_TARGET_AVX2 __attribute__((noinline)) void PackedChunkAvx2(const ChunkArgs& a, bool blocked) {
  PackedChunkIsa<kIsaAvx2>(a, blocked);
}
CR_TARGET_AVX512 __attribute__((noinline)) void PackedChunkAvx512(const ChunkArgs& a, bool blocked) {
  PackedChunkIsa<kIsaAvx512>(a, blocked);
}
#endif

template <class W>
CR_SIMD_INLINE void PackedRows(const DotJob& j, const Plan& p, const W& terms, int64_t r0, int64_t r1, int64_t nb) {
  constexpr int kMR = PackTile<W::kIsa>::kMR, kNR = PackTile<W::kIsa>::kNR;
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
      ValueRange terms_range{1, std::numeric_limits<float>::infinity(), 0.0f, true};
      for (int64_t m = 0; m < tiles; ++m) {
        const int64_t row0 = r0 + m * kMR;
        const int rows = static_cast<int>(std::min<int64_t>(kMR, r1 - row0));
        float* tile = ap + m * cg * kMR * 8;
        PackA<W, kMR>(terms, p, row0, rows, need_rs ? rs + (row0 - r0) * nb : nullptr, nb, a.g0, a.g1, tile);
        // (No term has fewer than 2 significant bits: wider inputs never fuse.)
        if (W::kIsa >= kIsaAvx2 && j.x_range.finite && j.x_range.bits <= 22) {
          terms_range = Merge(terms_range, ScanRangeV(tile, (a.g1 - a.g0) * kMR * 8));
        }
      }
      a.fused = W::kIsa >= kIsaAvx2 && ProductsExact(terms_range, j.x_range);
      if (a.fused) fused_runs.fetch_add(1, std::memory_order_relaxed);
#if defined(__x86_64__)
      if constexpr (W::kIsa == kIsaAvx512) {
        PackedChunkAvx512(a, W::kBlocks);
        continue;
      } else if constexpr (W::kIsa == kIsaAvx2) {
        PackedChunkAvx2(a, W::kBlocks);
        continue;
      }
#endif
      PackedChunkGeneric(a, W::kBlocks);
    }
  }
}

// The direct path over the job's tokens, two at a time.
template <class W>
CR_SIMD_INLINE void DirectTokens(const DotJob& j, const Plan& p, const W& terms, int64_t r0, int64_t r1, int64_t nb) {
  for (int64_t t0 = 0; t0 < j.tokens; t0 += 2) {
    if (W::kIsa >= kIsaAvx2 && j.tokens - t0 >= 2) {
      DirectRows<W, W::kIsa >= kIsaAvx2 ? 2 : 1>(j, p, terms, r0, r1, nb, t0);
    } else {
      // The generic build takes one token at a time (fewer instantiations).
      for (int64_t t = t0; t < std::min(j.tokens, t0 + 2); ++t) DirectRows<W, 1>(j, p, terms, r0, r1, nb, t);
    }
  }
}

template <WFormat F, bool kRound, bool kBlocked, int kIsa>
CR_SIMD_INLINE void RunRowsF(const DotJob& j, const Plan& p, int64_t r0, int64_t r1) {
  using W = Terms<F, kRound, kBlocked, kIsa>;
  const int64_t nb = p.block > 0 ? (j.w->cols + p.block - 1) / p.block : 0;
  const W terms{j.w, j.w->cols / 8, ScaleTableFor(*j.w, p)};
  if (j.tokens > kDirectTokens) return PackedRows(j, p, terms, r0, r1, nb);
  if constexpr (W::kFixedRange && kIsa >= kIsaAvx2) {
    if (ProductsExact(E2m1Range(), j.x_range)) {
      using WF = Terms<F, kRound, kBlocked, kIsa, true>;
      fused_runs.fetch_add(1, std::memory_order_relaxed);
      return DirectTokens(j, p, WF{j.w, j.w->cols / 8, terms.st}, r0, r1, nb);
    }
  }
  DirectTokens(j, p, terms, r0, r1, nb);
}

// Scales exist only on fp8 and fp4 storage (DotCovered leaves the others'
// scaled shapes to the work items), so only those get the scaled shapes.
template <bool kRound, bool kBlocked, int kIsa>
CR_SIMD_INLINE void RunRowsR(const DotJob& j, const Plan& p, int64_t r0, int64_t r1) {
  switch (j.w->format) {
    case WFormat::kE4m3: return RunRowsF<WFormat::kE4m3, kRound, kBlocked, kIsa>(j, p, r0, r1);
    case WFormat::kE2m1: return RunRowsF<WFormat::kE2m1, kRound, kBlocked, kIsa>(j, p, r0, r1);
    default: break;
  }
  if constexpr (kRound || kBlocked) {
    std::abort();  // DotCovered refused this shape
  } else {
    switch (j.w->format) {
      case WFormat::kF32: return RunRowsF<WFormat::kF32, false, false, kIsa>(j, p, r0, r1);
      case WFormat::kBF16: return RunRowsF<WFormat::kBF16, false, false, kIsa>(j, p, r0, r1);
      case WFormat::kF16: return RunRowsF<WFormat::kF16, false, false, kIsa>(j, p, r0, r1);
      default: break;
    }
  }
}

template <int kIsa>
CR_SIMD_INLINE void RunRowsBody(const DotJob& j, int64_t r0, int64_t r1) {
  const Plan p = MakePlan(*j.w, j.kind, j.q, j.x_global);
  if (p.round) return RunRowsR<true, false, kIsa>(j, p, r0, r1);
  if (p.blocked) return RunRowsR<false, true, kIsa>(j, p, r0, r1);
  return RunRowsR<false, false, kIsa>(j, p, r0, r1);
}

// The vector primitives alone, for the tests.
template <int kIsa>
CR_SIMD_INLINE void PrimitivesBody(WFormat f, const void* data, int64_t i0, const float* round_in,
                                   const float* lanes_in, float* out) {
  f32x8 v = Zero8(), lo = Zero8(), hi = Zero8();
  auto decode = [&](auto format) CR_LAMBDA_INLINE {
    constexpr WFormat F = decltype(format)::value;
    v = DecodeGroupIsa<F, kIsa>(data, i0);
    DecodePairIsa<F, kIsa>(data, i0, 1.0f, &lo, &hi);
  };
  switch (f) {
    case WFormat::kF32: decode(std::integral_constant<WFormat, WFormat::kF32>{}); break;
    case WFormat::kBF16: decode(std::integral_constant<WFormat, WFormat::kBF16>{}); break;
    case WFormat::kF16: decode(std::integral_constant<WFormat, WFormat::kF16>{}); break;
    case WFormat::kE4m3: decode(std::integral_constant<WFormat, WFormat::kE4m3>{}); break;
    case WFormat::kE2m1: decode(std::integral_constant<WFormat, WFormat::kE2m1>{}); break;
  }
  Store8(out, v);
  Store8(out + 24, lo);
  Store8(out + 32, hi);
  Store8(out + 8, RoundBf16(Load8(round_in)));
  f32x8 l[8];
  _Pragma("GCC unroll 16") for (int k = 0; k < 8; ++k) l[k] = Load8(lanes_in + 8 * k);
  Store8(out + 16, LaneSums8(l));
}

void RunRowsGeneric(const DotJob& j, int64_t r0, int64_t r1) { RunRowsBody<kIsaGeneric>(j, r0, r1); }
void PrimitivesGeneric(WFormat f, const void* data, int64_t i0, const float* round_in, const float* lanes_in,
                       float* out) {
  PrimitivesBody<kIsaGeneric>(f, data, i0, round_in, lanes_in, out);
}

#if defined(__x86_64__)
CR_TARGET_AVX2 void RunRowsAvx2(const DotJob& j, int64_t r0, int64_t r1) { RunRowsBody<kIsaAvx2>(j, r0, r1); }
CR_TARGET_AVX512 void RunRowsAvx512(const DotJob& j, int64_t r0, int64_t r1) { RunRowsBody<kIsaAvx512>(j, r0, r1); }
CR_TARGET_AVX2 void PrimitivesAvx2(WFormat f, const void* data, int64_t i0, const float* round_in,
                                   const float* lanes_in, float* out) {
  PrimitivesBody<kIsaAvx2>(f, data, i0, round_in, lanes_in, out);
}
CR_TARGET_AVX512 void PrimitivesAvx512(WFormat f, const void* data, int64_t i0, const float* round_in,
                                       const float* lanes_in, float* out) {
  PrimitivesBody<kIsaAvx512>(f, data, i0, round_in, lanes_in, out);
}
#endif

}  // namespace

uint64_t FusedRunsForTest() { return fused_runs.load(); }

ValueRange ScanRange(const float* v, int64_t n, CpuIsa isa) {
  ValueRange r;
  OnIsa(isa, [&]() CR_LAMBDA_INLINE { r = ScanRangeV(v, n); });
  return r;
}

ValueRange Merge(const ValueRange& a, const ValueRange& b) {
  ValueRange r;
  r.bits = std::max(a.bits, b.bits);
  r.lo = std::min(a.lo, b.lo);
  r.hi = std::max(a.hi, b.hi);
  r.finite = a.finite && b.finite;
  return r;
}

bool ProductsExact(const ValueRange& a, const ValueRange& b) {
  if (!a.finite || !b.finite || a.bits + b.bits > 24) return false;
  // In double: lo may be +Inf (no nonzero value), and no product of two
  // floats overflows or underflows there.
  const double lo = static_cast<double>(a.lo) * static_cast<double>(b.lo);
  const double hi = static_cast<double>(a.hi) * static_cast<double>(b.hi);
  return lo >= 0x1p-125 && hi < 0x1p127;
}

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
  if (isa == CpuIsa::kAvx512) return RunRowsAvx512(job, r0, r1);
  if (isa == CpuIsa::kAvx2) return RunRowsAvx2(job, r0, r1);
#else
  (void)isa;
#endif
  RunRowsGeneric(job, r0, r1);
}

void VectorPrimitivesForTest(WFormat f, const void* data, int64_t i0, const float* round_in, const float* lanes_in,
                             float* out, CpuIsa isa) {
#if defined(__x86_64__)
  if (isa == CpuIsa::kAvx512) return PrimitivesAvx512(f, data, i0, round_in, lanes_in, out);
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
