// LaunchIndexerFast (cpu_kernels.h): DSA's lightning indexer (IndexerOp),
// the bits of the work items' IndexerTopK with the scores laid out for SIMD.
//
// IndexerTopK for one query: the query's preparation (IndexerPrepareQuery),
// then for each position j of [0, pos] the key's dot with every head (8
// lanes, lane = dimension mod 8, each lane in dimension order, LaneSum8's
// tree), each head's term (IndexerHeadTerm: scale, relu, acc + logit * w_h
// in head order), times the key's scale; then the top-k (IndexerSelectTopK).
// Here the preparation and the selection are those same functions, and the
// scores are computed for eight positions at a time: their keys decoded
// once into floats, one 8-float vector of lanes per position and head,
// summed by one LaneSums8 (the same tree), and the head terms as the same
// IEEE operations lane by lane. cpu_kernels_test compares the ids with the
// work items' on every ISA, for bf16 and fp8 keys.
//
// Ranks: every rank holds the whole index-key cache (the indexer is not
// split over ranks), written by the same kernel from the same keys, and
// every rank's query reads the same queries, weights, positions and page
// tables. So a rank whose pages hold rank 0's bytes computes rank 0's
// top-k: rank 0 runs, each other rank's pages are compared with rank 0's
// (the pages the step reads), its ids copied where they agree and computed
// where they differ. At tp 8 that is an eighth of the work.
//
// Not covered (false, nothing written; the executor runs the work items): a
// check that would fire (head dim, a page a query reads outside its table or
// the pool), ranks whose caches differ in format or shape, a head dim that
// is not a multiple of 8 (then the work items run, rank 0's copied as above).
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu_simd.h"
#include "crashreplay/replay/cpu/cpu_kernels.h"

namespace crashreplay::replay {
namespace cpu {
namespace {

struct IndexerScratch {
  std::vector<float> score, qp, wh, tmp, keys, ks;
  std::vector<int32_t> heap;
};

IndexerScratch& ThreadIndexerScratch() {
  thread_local IndexerScratch s;
  return s;
}

template <class T>
T* Sized(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

// Query t of rank r (its pages checked by the caller).
template <bool kFp8>
CR_SIMD_INLINE void IndexerQuery(const IndexerOp& o, int64_t r, int64_t t) {
  const IndexPoolView& v = o.views[r];
  const int64_t dim = v.dim, heads = o.heads, topk = o.topk, len = static_cast<int64_t>(o.batch.positions[t]) + 1;
  int32_t* ids = o.ids + (r * o.batch.tokens + t) * topk;
  for (int64_t i = 0; i < topk; ++i) ids[i] = -1;
  if (len <= 0) return;
  IndexerScratch& s = ThreadIndexerScratch();
  float* score = Sized(s.score, len + 8);
  float* qp = Sized(s.qp, heads * dim);
  float* wh = Sized(s.wh, heads);
  float* keys = Sized(s.keys, 8 * dim);
  float* ks = Sized(s.ks, 8);
  IndexerPrepareQuery(kFp8, dim, o.q + t * heads * dim, o.w + t * heads, heads, qp, wh, Sized(s.tmp, dim));
  const f32x8 softmax_scale = Splat(1.0f / sqrtf(static_cast<float>(dim)));
  const PageTableRow row = RowTable(o.batch, t);
  const int64_t page_bytes = IndexPageBytes(kFp8, v.page_size, dim);
  for (int64_t j0 = 0; j0 < len; j0 += 8) {
    const int64_t m = len - j0 < 8 ? len - j0 : 8;
    for (int64_t k = 0; k < 8; ++k) {
      float* key = keys + k * dim;
      if (k >= m) {  // padding: scored, never read
        for (int64_t d = 0; d < dim; d += 8) Store8(key + d, Zero8());
        ks[k] = 0.0f;
        continue;
      }
      const int64_t j = j0 + k;
      KernelStatus unused;
      const int64_t page = ResolvePoolPage(v.pages, row, j / v.page_size, 0, &unused);
      const uint8_t* base = v.data + page * page_bytes;
      const int64_t slot = j % v.page_size;
      if constexpr (kFp8) {
        for (int64_t d = 0; d < dim; d += 8) Store8(key + d, DecodeE4m3(base + slot * dim + d));
        std::memcpy(&ks[k], base + static_cast<int64_t>(v.page_size) * dim + slot * 4, 4);
      } else {
        const auto* h = reinterpret_cast<const uint16_t*>(base) + slot * dim;
        for (int64_t d = 0; d < dim; d += 8) Store8(key + d, DecodeBf16(h + d));
      }
    }
    f32x8 acc = Zero8();
    for (int64_t h = 0; h < heads; ++h) {
      const float* qh = qp + h * dim;
      f32x8 lane[8];
      for (int k = 0; k < 8; ++k) lane[k] = Zero8();
      for (int64_t d = 0; d < dim; d += 8) {
        const f32x8 qv = Load8(qh + d);
        for (int k = 0; k < 8; ++k) lane[k] = lane[k] + qv * Load8(keys + k * dim + d);
      }
      f32x8 logit = LaneSums8(lane);
      if constexpr (!kFp8) logit = logit * softmax_scale;
      // relu, NaN kept: logit where logit > 0 or NaN, else +0.
      const i32x8 keep = (logit > 0.0f) | (logit != logit);
      logit = (f32x8)((i32x8)logit & keep);
      acc = acc + logit * Splat(wh[h]);
    }
    alignas(32) float s8[8];
    if constexpr (kFp8) {
      Store8(s8, acc * Load8(ks));
    } else {
      Store8(s8, acc);
    }
    for (int64_t k = 0; k < m; ++k) score[j0 + k] = s8[k];
  }
  IndexerSelectTopK(score, len, topk, ids, Sized(s.heap, topk));
}

// Every query of rank r.
void RunRank(const IndexerOp& o, int64_t r, CpuPool& pool, CpuIsa isa, bool simd) {
  const int64_t T = o.batch.tokens;
  if (!simd) {
    const int64_t scratch = ScratchFloats(o);
    pool.Launch(T, [&o, r, T, scratch](int64_t t, KernelStatus* st) {
      RunItem(o, r * T + t, Sized(ThreadIndexerScratch().score, scratch), st);
    });
    return;
  }
  const bool fp8 = o.views[r].fp8;
  pool.Launch(T, [&](int64_t i, KernelStatus*) {
    const int64_t t = Zigzag(i, T);
    OnIsa(isa, [&]() CR_LAMBDA_INLINE {
      if (fp8) return IndexerQuery<true>(o, r, t);
      IndexerQuery<false>(o, r, t);
    });
  });
}

}  // namespace
}  // namespace cpu

bool LaunchIndexerFast(const IndexerOp& o, CpuPool& pool, CpuIsa isa, KernelStatus* status) {
  *status = KernelStatus{};
  const int64_t T = o.batch.tokens;
  if (isa == CpuIsa::kReference || o.ranks <= 0 || T <= 0 || o.topk <= 0) return false;
  // The items' checks (head dim, every page a query reads), looked at first:
  // where one would fire, the work items run and report it.
  const IndexPoolView& v0 = o.views[0];
  for (int64_t r = 0; r < o.ranks; ++r) {
    const IndexPoolView& v = o.views[r];
    if (!IndexDimSupported(v) || v.fp8 != v0.fp8 || v.dim != v0.dim || v.page_size != v0.page_size ||
        v.pages != v0.pages || v.page_size < 1 || v.dim != o.dim) {
      return false;
    }
  }
  std::vector<char> read(static_cast<size_t>(v0.pages), 0);
  for (int64_t t = 0; t < T; ++t) {
    const PageTableRow row = RowTable(o.batch, t);
    const int64_t last = static_cast<int64_t>(o.batch.positions[t]) / v0.page_size;
    for (int64_t logical = 0; logical <= last; ++logical) {
      KernelStatus probe;
      const int64_t page = ResolvePoolPage(v0.pages, row, logical, 0, &probe);
      if (page < 0) return false;
      read[page] = 1;
    }
  }
  const bool simd = v0.dim > 0 && v0.dim % 8 == 0;
  if (!simd && o.ranks <= 1) return false;  // nothing gained over the work items
  cpu::RunRank(o, 0, pool, isa, simd);
  const size_t page_bytes = static_cast<size_t>(IndexPageBytes(v0.fp8, v0.page_size, v0.dim));
  const size_t ids_bytes = static_cast<size_t>(T * o.topk) * sizeof(int32_t);
  for (int64_t r = 1; r < o.ranks; ++r) {
    bool same = true;
    for (int64_t p = 0; p < v0.pages && same; ++p) {
      if (read[p]) same = std::memcmp(o.views[r].data + p * page_bytes, v0.data + p * page_bytes, page_bytes) == 0;
    }
    if (same) {
      std::memcpy(o.ids + r * T * o.topk, o.ids, ids_bytes);
    } else {
      cpu::RunRank(o, r, pool, isa, simd);
    }
  }
  return true;
}

}  // namespace crashreplay::replay
