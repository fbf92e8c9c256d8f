// The CPU fast launcher of the reference attention kernel (AttentionOp with
// backend 0: prefill always, decode by default): the bits of AttendReference
// for every (rank, token, head) item, with the work laid out for SIMD.
//
// AttendReference for one query row is three passes over positions 0 ..
// len - 1: the scores q . k_j * scale (QkDot: 8 lanes, lane = dimension mod
// 8, each lane in dimension order, then LaneSum8's tree), their maximum in
// position order and the exponentials summed in position order, and the
// weighted sum of the V rows in position order, times 1 / sum. Here:
//   - scores: eight positions at a time, one 8-float vector of lanes each,
//     summed by one LaneSums8 (the same tree) and times `scale`;
//   - maximum, expf and the running sum: the same scalar loop (glibc's expf,
//     called as the work item calls it: no vector exp);
//   - output: each 8-float vector of dimensions accumulates acc + p_j * v_j
//     for j in order (MulAdd per lane), times 1 / sum.
// So every output element is the work item's; cpu_kernels_test compares
// them bit for bit on every ISA, KV dtype, GQA group and page size.
//
// A task is the `group` query heads of one (rank, token, KV head): they read
// the same K and V rows. Causal lengths grow with the token index, so tasks
// take tokens in zigzag order (first, last, second, second last, ...): the
// pool's contiguous ranges then carry about the same number of positions.
//
// LaunchMlaAttentionFast does the same for the expanded MLA attention
// (MlaAttendExpanded: MLA prefill, naive decode, DSA prefill over the top-k),
// LaunchMlaQAbsorbFast for the absorbed query of MLA decode (MlaQAbsorb), and
// LaunchLatentAttentionFast for DSA decode's sparse reference attention over
// the latent cache (MlaAttendLatent, kSparseReference).
//
// gpt_oss's window and sinks: only the window's positions are entries (a
// task's offsets start at its first), and the sink seeds the maximum and
// adds its term after the sum, as in AttendReference.
//
// Not covered (false, nothing written; the executor runs the work items):
// another backend, head_dim not a multiple of 8 or not the pool's, a page
// size < 1, and any page a row's attended length needs that the work item
// would reject (outside the row's table or the pool): the work items report
// that fault as before.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu_simd.h"
#include "crashreplay/replay/cpu/cpu_kernels.h"

namespace crashreplay::replay {
namespace cpu {
namespace {

template <bool kFp8>
CR_SIMD_INLINE f32x8 DecodeKv(const void* base, int64_t i) {
  if constexpr (kFp8) {
    return DecodeE4m3(static_cast<const uint8_t*>(base) + i);
  } else {
    return DecodeBf16(static_cast<const uint16_t*>(base) + i);
  }
}

struct TaskScratch {
  std::vector<int64_t> offs;  // [len] element offset of position j's row
  std::vector<float> p;       // [len] scores, then exponentials
  void Reserve(int64_t n) {
    if (static_cast<int64_t>(p.size()) >= n + 8) return;
    offs.resize(static_cast<size_t>(n + 8));
    p.resize(static_cast<size_t>(n + 8));
  }
};

TaskScratch& Scratch() {
  thread_local TaskScratch s;
  return s;
}

// The three passes every launcher here shares, over n entries (positions
// or top-k slots); `valid(i)` false marks padding. Callers pass lambdas
// marked always_inline (CR_LAMBDA_INLINE), so they are built with the
// caller's ISA.

// p[i] = LaneSums8 of entry i's lane vector (`lanes(i)`: its 8-lane dot,
// each lane in dimension order) times scale, eight entries per LaneSums8;
// -inf where !valid(i).
template <class Valid, class Lanes>
CR_SIMD_INLINE void Scores(int64_t n, float scale, float* p, const Valid& valid, const Lanes& lanes) {
  for (int64_t i0 = 0; i0 < n; i0 += 8) {
    const int64_t m = n - i0 < 8 ? n - i0 : 8;
    f32x8 lane[8];
    for (int k = 0; k < 8; ++k) lane[k] = k < m && valid(i0 + k) ? lanes(i0 + k) : Zero8();
    alignas(32) float s8[8];
    Store8(s8, LaneSums8(lane) * Splat(scale));
    for (int64_t k = 0; k < m; ++k) p[i0 + k] = valid(i0 + k) ? s8[k] : -INFINITY;
  }
}

// The work items' softmax loop: the maximum (from `sink`, -inf without
// one), p[i] = expf(p[i] - max) and their sum, all in entry order, then the
// sink's term (attention.h, SinkTerm); returns 1 / sum.
CR_SIMD_INLINE float ExpInPlace(float* p, int64_t n, float sink = -INFINITY) {
  float m = sink;
  for (int64_t i = 0; i < n; ++i) m = p[i] > m ? p[i] : m;
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    p[i] = expf(p[i] - m);
    sum += p[i];
  }
  sum += SinkTerm(sink, m);
  return 1.0f / sum;
}

// out[8c, 8c + 8) for c < groups: (acc + p[j] * row(j, c) over the valid
// entries j in order, from 0) * inv; 64 columns at a time.
template <class Valid, class Row>
CR_SIMD_INLINE void WeightedSum(const float* p, int64_t n, int64_t groups, float inv, float* out, const Valid& valid,
                                const Row& row) {
  for (int64_t d0 = 0; d0 < groups; d0 += 8) {
    const int64_t nv = groups - d0 < 8 ? groups - d0 : 8;
    f32x8 acc[8];
    for (int k = 0; k < 8; ++k) acc[k] = Zero8();
    for (int64_t j = 0; j < n; ++j) {
      if (!valid(j)) continue;
      const f32x8 pj = Splat(p[j]);
      for (int k = 0; k < 8; ++k) {
        if (k < nv) acc[k] = acc[k] + pj * row(j, d0 + k);
      }
    }
    for (int k = 0; k < 8; ++k) {
      if (k < nv) Store8(out + 8 * (d0 + k), acc[k] * Splat(inv));
    }
  }
}

// The `group` heads of (rank r, token t, KV head kvh).
template <bool kFp8>
CR_SIMD_INLINE void AttendTask(const AttentionOp& o, int64_t r, int64_t t, int64_t kvh) {
  const KvPoolView& kv = o.views[r];
  const int64_t hd = kv.head_dim, qd = o.heads * hd, rt = r * o.batch.tokens + t;
  const int64_t len = static_cast<int64_t>(o.batch.positions[t]) + 1;
  // gpt_oss: the window's first position and each head's sink.
  const int64_t begin = WindowBegin(len, o.window);
  auto sink_of = [&](int64_t h) { return o.sinks != nullptr ? o.sinks[r * o.heads + h] : -INFINITY; };
  const PageTableRow pt = RowTable(o.batch, t);
  if (len <= begin) {  // no position: the work item's own body (it reads no page)
    for (int64_t g = 0; g < o.group; ++g) {
      const int64_t h = kvh * o.group + g;
      KernelStatus unused;
      AttendReference(kv, pt, o.q + rt * qd + h * hd, kvh, len, o.scale, o.out + rt * qd + h * hd, nullptr, rt, &unused,
                      begin, sink_of(h));
    }
    return;
  }
  // Entry i is position begin + i.
  const int64_t n = len - begin;
  TaskScratch& s = Scratch();
  s.Reserve(n);
  int64_t* offs = s.offs.data();
  float* p = s.p.data();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t j = begin + i;
    offs[i] = KvOffset(kv, pt.pages[j / kv.page_size], j % kv.page_size, kvh);
  }
  const int64_t groups = hd / 8;
  auto all = [](int64_t) CR_LAMBDA_INLINE { return true; };
  for (int64_t g = 0; g < o.group; ++g) {
    const int64_t h = kvh * o.group + g;
    const float* q = o.q + rt * qd + h * hd;
    Scores(n, o.scale, p, all, [&](int64_t j) CR_LAMBDA_INLINE {
      f32x8 lane = Zero8();
      for (int64_t d = 0; d < groups; ++d) lane = lane + Load8(q + 8 * d) * DecodeKv<kFp8>(kv.k, offs[j] + 8 * d);
      return lane;
    });
    const float inv = ExpInPlace(p, n, sink_of(h));
    WeightedSum(p, n, groups, inv, o.out + rt * qd + h * hd, all,
                [&](int64_t j, int64_t c) CR_LAMBDA_INLINE { return DecodeKv<kFp8>(kv.v, offs[j] + 8 * c); });
  }
}

// ---- expanded MLA attention (MlaAttentionOp: prefill, naive decode) --------
// MlaAttendExpanded per (rank, token, head): the score of position j is the
// 8-lane dot of q with [K_nope_j | k_rot_j] (lane = dimension mod 8 across
// both parts, which nope % 8 == 0 keeps as whole vectors), then the scalar
// max / expf / sum, then V rows in order. Sparse (top-k ids): padding (-1)
// scores -inf and is skipped in the output, as there.

// One (rank, token, head) item.
CR_SIMD_INLINE void MlaTask(const MlaAttentionOp& o, int64_t r, int64_t t, int64_t h) {
  const int64_t rt = r * o.batch.tokens + t;
  const int64_t qk = o.nope + o.rope, kvw = o.heads * (o.nope + o.v_dim);
  const int64_t begin = o.row_begin[o.batch.token_row[t]];
  const int64_t len = static_cast<int64_t>(o.batch.positions[t]) + 1;
  const int32_t* ids = o.topk != nullptr ? o.topk + rt * o.topk_width : nullptr;
  const int64_t n = ids != nullptr ? o.topk_width : len;
  const float* q = o.q + (rt * o.heads + h) * qk;
  const float* kv = o.kv + (r * o.n + begin) * kvw + h * (o.nope + o.v_dim);
  const float* rot = o.rot + (r * o.n + begin) * o.rope;
  float* out = o.out + (rt * o.heads + h) * o.v_dim;
  if (n <= 0) {  // nothing attended: the item's own body
    KernelStatus unused;
    MlaAttendExpanded(q, kv - h * (o.nope + o.v_dim), rot, kvw, h, o.nope, o.rope, o.v_dim, len, ids, o.topk_width,
                      o.scale, out, nullptr, rt, &unused);
    return;
  }
  TaskScratch& s = Scratch();
  s.Reserve(n);
  int64_t* pos = s.offs.data();  // position of entry i, -1: padding
  float* p = s.p.data();
  for (int64_t i = 0; i < n; ++i) pos[i] = ids != nullptr ? ids[i] : i;
  const int64_t gn = o.nope / 8, gr = o.rope / 8;
  auto valid = [pos](int64_t i) CR_LAMBDA_INLINE { return pos[i] >= 0; };
  Scores(n, o.scale, p, valid, [&](int64_t i) CR_LAMBDA_INLINE {
    const float* kr = kv + pos[i] * kvw;
    const float* rr = rot + pos[i] * o.rope;
    f32x8 lane = Zero8();
    for (int64_t d = 0; d < gn; ++d) lane = lane + Load8(q + 8 * d) * Load8(kr + 8 * d);
    for (int64_t d = 0; d < gr; ++d) lane = lane + Load8(q + o.nope + 8 * d) * Load8(rr + 8 * d);
    return lane;
  });
  const float inv = ExpInPlace(p, n);
  WeightedSum(p, n, o.v_dim / 8, inv, out, valid,
              [&](int64_t i, int64_t c) CR_LAMBDA_INLINE { return Load8(kv + pos[i] * kvw + o.nope + 8 * c); });
}

// ---- the absorbed query (MlaQAbsorbOp) ----------------------------------------
// MlaQAbsorb per (rank, token, head): q576[c] = LaneSum8 over the nope dims d
// (lane d mod 8) of q[d] * DequantAt(kv_b, row0 + d, c). Eight columns at a
// time: lane l of column c is element c - c0 of vector l, so the eight lane
// vectors summed in LaneSum8's tree give the eight columns' values. A
// weight's 8 columns share a scale block (block_cols % 8 == 0), so
// DequantAt is bf16(raw * ScaleAt) with one ScaleAt per row and 8 columns.

template <WFormat F>
CR_SIMD_INLINE void AbsorbItem(const MlaQAbsorbOp& o, int64_t i) {
  const int64_t rt = i / o.heads, h = i % o.heads;
  const QWeight& w = o.kv_b[rt / o.tokens].w;
  const float* q = o.q + (rt * o.heads + h) * (o.nope + o.rope);
  float* q576 = o.q576 + i * (o.kv_lora + o.rope);
  const int64_t row0 = h * (o.nope + o.v_dim), stride = RowStride(w);
  const bool scaled = w.scale_format != SFormat::kNone;
  for (int64_t c0 = 0; c0 < o.kv_lora; c0 += 8) {
    f32x8 lane[8];
    for (int l = 0; l < 8; ++l) lane[l] = Zero8();
    for (int64_t d = 0; d < o.nope; ++d) {
      f32x8 wv = DecodeGroup<F>(w.data, (row0 + d) * stride + c0);
      if (scaled) wv = RoundBf16(wv * Splat(ScaleAt(w, row0 + d, c0)));
      lane[d & 7] = lane[d & 7] + Splat(q[d]) * wv;
    }
    Store8(q576 + c0, ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7])));
  }
  for (int64_t d = 0; d < o.rope; ++d) q576[o.kv_lora + d] = q[o.nope + d];
}

CR_SIMD_INLINE void AbsorbAnyFormat(const MlaQAbsorbOp& o, int64_t i) {
  switch (o.kv_b[i / o.heads / o.tokens].w.format) {
    case WFormat::kF32: return AbsorbItem<WFormat::kF32>(o, i);
    case WFormat::kBF16: return AbsorbItem<WFormat::kBF16>(o, i);
    case WFormat::kF16: return AbsorbItem<WFormat::kF16>(o, i);
    case WFormat::kE4m3: return AbsorbItem<WFormat::kE4m3>(o, i);
    case WFormat::kE2m1: return AbsorbItem<WFormat::kE2m1>(o, i);
  }
}

// ---- sparse latent attention (LatentAttentionOp, kSparseReference) ----------
// MlaAttendLatent's sparse reference per (rank, token, head) loads each
// top-k latent twice (scores, then P.V) for every head. Here each token's
// latents are loaded once (LatentLoad, the same values) for all its heads;
// then per head the scores are eight entries per LaneSums8 (LatentDot's
// lanes), the max / expf / sum are the scalar loop, and the output is
// 8-column vectors over the entries in order.

CR_SIMD_INLINE void LatentHead(const LatentAttentionOp& o, const float* lat, int64_t rt, int64_t h) {
  const int64_t qd = o.kv_lora + o.rope, W = o.topk_width;
  const int64_t i = rt * o.heads + h;
  const float* q = o.q576 + i * qd;
  const int32_t* ids = o.topk + rt * W;
  float* out = o.out + i * o.kv_lora;
  TaskScratch& sc = Scratch();
  sc.Reserve(W);
  float* p = sc.p.data();
  const int64_t groups = qd / 8;
  auto valid = [ids](int64_t j) CR_LAMBDA_INLINE { return ids[j] != -1; };
  Scores(W, o.scale, p, valid, [&](int64_t j) CR_LAMBDA_INLINE {
    const float* kr = lat + j * qd;
    f32x8 lane = Zero8();
    for (int64_t d = 0; d < groups; ++d) lane = lane + Load8(q + 8 * d) * Load8(kr + 8 * d);
    return lane;
  });
  const float inv = ExpInPlace(p, W);
  WeightedSum(p, W, o.kv_lora / 8, inv, out, valid,
              [&](int64_t j, int64_t c) CR_LAMBDA_INLINE { return Load8(lat + j * qd + 8 * c); });
}

// Causal rows grow with the token index: z-th task -> token first, last,
// second, second last, ..., so contiguous task ranges carry about the same
// number of positions.
}  // namespace
}  // namespace cpu

bool LaunchAttentionFast(const AttentionOp& o, CpuPool& pool, CpuIsa isa, KernelStatus* status) {
  *status = KernelStatus{};
  if (isa == CpuIsa::kReference || o.backend != 0 || o.ranks <= 0 || o.heads <= 0 || o.group <= 0 ||
      o.heads % o.group != 0 || o.batch.tokens <= 0) {
    return false;
  }
  const int64_t T = o.batch.tokens;
  for (int64_t r = 0; r < o.ranks; ++r) {
    const KvPoolView& kv = o.views[r];
    if (kv.head_dim != o.head_dim || kv.head_dim <= 0 || kv.head_dim % 8 != 0 || kv.page_size < 1 ||
        kv.kv_heads < o.heads / o.group || kv.fp8 != o.views[0].fp8) {
      return false;
    }
    // Every page each token attends (from its window's first) must
    // resolve, or the work items report it.
    for (int64_t t = 0; t < T; ++t) {
      const int64_t len = static_cast<int64_t>(o.batch.positions[t]) + 1;
      const PageTableRow pt = RowTable(o.batch, t);
      KernelStatus probe;
      for (int64_t pg = WindowBegin(len, o.window) / kv.page_size; pg * kv.page_size < len; ++pg) {
        if (ResolvePage(kv, pt, pg, 0, &probe) < 0) return false;
      }
    }
  }
  const bool fp8 = o.views[0].fp8;
  const int64_t kvheads = o.heads / o.group;
  pool.Launch(o.ranks * kvheads * T, [&](int64_t i, KernelStatus*) {
    const int64_t t = cpu::Zigzag(i % T, T), rk = i / T, r = rk / kvheads, kvh = rk % kvheads;
    cpu::OnIsa(isa, [&]() CR_LAMBDA_INLINE {
      if (fp8) return cpu::AttendTask<true>(o, r, t, kvh);
      cpu::AttendTask<false>(o, r, t, kvh);
    });
  });
  return true;
}

bool LaunchMlaAttentionFast(const MlaAttentionOp& o, CpuPool& pool, CpuIsa isa, KernelStatus* status) {
  *status = KernelStatus{};
  if (isa == CpuIsa::kReference || o.ranks <= 0 || o.heads <= 0 || o.batch.tokens <= 0 || o.nope < 0 ||
      o.nope % 8 != 0 || o.rope < 0 || o.rope % 8 != 0 || o.v_dim <= 0 || o.v_dim % 8 != 0) {
    return false;
  }
  // Every top-k index must be padding or a position of its sequence, or the
  // work items report the first that is not.
  if (o.topk != nullptr) {
    for (int64_t rt = 0; rt < o.ranks * o.batch.tokens; ++rt) {
      const int64_t len = static_cast<int64_t>(o.batch.positions[rt % o.batch.tokens]) + 1;
      const int32_t* ids = o.topk + rt * o.topk_width;
      for (int64_t i = 0; i < o.topk_width; ++i) {
        if (ids[i] != -1 && (ids[i] < 0 || ids[i] >= len)) return false;
      }
    }
  }
  const int64_t T = o.batch.tokens;
  pool.Launch(o.ranks * o.heads * T, [&](int64_t i, KernelStatus*) {
    const int64_t t = cpu::Zigzag(i % T, T), rh = i / T;
    cpu::OnIsa(isa, [&]() CR_LAMBDA_INLINE { cpu::MlaTask(o, rh / o.heads, t, rh % o.heads); });
  });
  return true;
}

bool LaunchMlaQAbsorbFast(const MlaQAbsorbOp& o, CpuPool& pool, CpuIsa isa, KernelStatus* status) {
  *status = KernelStatus{};
  if (isa == CpuIsa::kReference || o.ranks <= 0 || o.tokens <= 0 || o.heads <= 0 || o.kv_lora <= 0 ||
      o.kv_lora % 8 != 0 || o.nope < 0 || o.rope < 0) {
    return false;
  }
  for (int64_t r = 0; r < o.ranks; ++r) {
    const QWeight& w = o.kv_b[r].w;
    if (w.cols != o.kv_lora || w.rows < o.heads * (o.nope + o.v_dim)) return false;
    if (w.scale_format != SFormat::kNone && (w.block_cols % 8 != 0 || w.block_cols <= 0 || w.block_rows <= 0)) {
      return false;
    }
    if (w.format == WFormat::kE2m1 && RowStride(w) % 2 != 0) return false;
  }
  pool.Launch(o.ranks * o.tokens * o.heads, [&](int64_t i, KernelStatus*) {
    cpu::OnIsa(isa, [&]() CR_LAMBDA_INLINE { cpu::AbsorbAnyFormat(o, i); });
  });
  return true;
}

bool LaunchLatentAttentionFast(const LatentAttentionOp& o, CpuPool& pool, CpuIsa isa, KernelStatus* status) {
  *status = KernelStatus{};
  const int64_t T = o.batch.tokens, W = o.topk_width, qd = o.kv_lora + o.rope;
  if (isa == CpuIsa::kReference || o.variant != static_cast<int32_t>(LatentAttention::kSparseReference) ||
      o.topk == nullptr || o.ranks <= 0 || o.heads <= 0 || T <= 0 || W <= 0 || o.kv_lora <= 0 || o.kv_lora % 8 != 0 ||
      o.rope < 0 || qd % 8 != 0) {
    return false;
  }
  // Every index must be padding or a position of its sequence whose page
  // resolves, or the work items report the first that is not.
  for (int64_t r = 0; r < o.ranks; ++r) {
    const LatentPoolView& v = o.views[r];
    if (v.kv_lora != o.kv_lora || v.rope != o.rope || v.page_size < 1) return false;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t len = static_cast<int64_t>(o.batch.positions[t]) + 1;
      const int32_t* ids = o.topk + (r * T + t) * W;
      const PageTableRow row = RowTable(o.batch, t);
      for (int64_t i = 0; i < W; ++i) {
        if (ids[i] == -1) continue;
        KernelStatus probe;
        if (ids[i] < 0 || ids[i] >= len || ResolvePoolPage(v.pages, row, ids[i] / v.page_size, 0, &probe) < 0) {
          return false;
        }
      }
    }
  }
  // Tokens in chunks whose latents take at most 2^24 floats.
  const int64_t per_rt = W * qd, chunk = std::max<int64_t>(1, (int64_t{1} << 24) / per_rt);
  thread_local std::vector<float> lat;
  for (int64_t rt0 = 0; rt0 < o.ranks * T; rt0 += chunk) {
    const int64_t rt1 = std::min(o.ranks * T, rt0 + chunk);
    lat.resize(static_cast<size_t>((rt1 - rt0) * per_rt));
    float* base = lat.data();
    pool.Launch((rt1 - rt0) * W, [&](int64_t k, KernelStatus*) {
      const int64_t rt = rt0 + k / W, t = rt % T;
      const int32_t id = o.topk[rt * W + k % W];
      if (id == -1) return;
      const LatentPoolView& v = o.views[rt / T];
      const int64_t page = RowTable(o.batch, t).pages[id / v.page_size];
      LatentLoad(v, LatentSlot(v, page, id % v.page_size), base + k * qd);
    });
    pool.Launch((rt1 - rt0) * o.heads, [&](int64_t k, KernelStatus*) {
      const int64_t rt = rt0 + k / o.heads, h = k % o.heads;
      const float* l = base + (rt - rt0) * per_rt;
      cpu::OnIsa(isa, [&]() CR_LAMBDA_INLINE { cpu::LatentHead(o, l, rt, h); });
    });
  }
  return true;
}

}  // namespace crashreplay::replay
