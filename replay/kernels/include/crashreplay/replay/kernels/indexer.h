// Kernel bodies of DeepSeek Sparse Attention's lightning indexer (DeepSeek-V3.2,
// GLM-5): the key LayerNorm, the paged index-key cache and the per-query
// score + top-k selection.
//
// Scores (transformers' DeepseekV32Indexer, DeepSeek's reference inference):
//   score(t) = sum_h w_h * relu(q_h . k_t * softmax_scale),
//   w_h = weights_proj(x)_h / sqrt(index_n_heads), softmax_scale =
//   1 / sqrt(index_head_dim), over positions t in [0, pos] of the row; heads
//   summed in order, 8 lanes in each dot.
// Two key formats (index_cache_dtype):
//   bf16      keys stored bf16, queries fp32: the arithmetic transformers
//             runs (it skips the Hadamard rotation and FP8, which leave
//             exact dot products unchanged);
//   fp8_e4m3  DeepSeek's reference and sglang's: q and k are Hadamard-
//             rotated (scaled by 1/sqrt(dim), rounded to bf16, as
//             rotate_activation), then act_quant'ed to e4m3 with one
//             power-of-two (ue8m0) fp32 scale per vector, amax floored at
//             1e-4; score(t) = k_scale(t) * sum_h relu(q8_h . k8_t) *
//             (w_h * q_scale_h * softmax_scale), as fp8_index computes it.
//             Precondition: index_head_dim a power of two <= 128 (check
//             index_head_dim_supported).
// Index-key pages (IndexPoolView): bf16: [page_size][dim] bf16; fp8:
// [page_size][dim] e4m3 then [page_size] fp32 scales (sglang's layout: a
// page's values, then its scales).
//
// Top-k: k = min(index_topk, pos + 1) positions with the highest scores, in
// descending score order, ties to the lower position; NaN ranks above every
// number (as torch.topk orders it); the rest of the index_topk slots are -1.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "crashreplay/base/hd.h"
#include "crashreplay/formats/block_quant.h"
#include "crashreplay/formats/numeric.h"
#include "crashreplay/replay/kernels/attention.h"
#include "crashreplay/replay/kernels/check.h"
#include "crashreplay/replay/kernels/linear.h"

namespace crashreplay::replay {

inline constexpr float kIndexAmaxFloor = 1e-4f;

struct IndexPoolView {
  uint8_t* data = nullptr;
  bool fp8 = false;
  int64_t pages = 0;
  int32_t page_size = 0;
  int32_t dim = 0;
};

CR_HD int64_t IndexPageBytes(bool fp8, int64_t page_size, int64_t dim) {
  return fp8 ? page_size * (dim + 4) : page_size * dim * 2;
}

CR_HD bool IsPow2(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

CR_HD bool IndexDimSupported(const IndexPoolView& v) { return !v.fp8 || (IsPow2(v.dim) && v.dim <= 128); }

// out = LayerNorm(x) * w + b over n elements, fp32 (mean and variance in 8
// lanes); out may alias x.
CR_HD void LayerNormRow(const float* x, const float* w, const float* b, int64_t n, float eps, float* out) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < n; ++i) lane[i & 7] += x[i];
  const float mean = LaneSum8(lane) / static_cast<float>(n);
  for (int j = 0; j < 8; ++j) lane[j] = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float d = x[i] - mean;
    lane[i & 7] = MulAdd(lane[i & 7], d, d);
  }
  const float inv = 1.0f / sqrtf(LaneSum8(lane) / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = MulAdd(b[i], (x[i] - mean) * inv, w[i]);
}

// In-place fast Walsh-Hadamard transform of n (a power of two) values, the
// butterfly order of DeepSeek's reference; then x * n^-1/2 rounded to bf16
// (rotate_activation returns bf16).
CR_HD void HadamardBf16(float* x, int64_t n) {
  for (int64_t h = 1; h < n; h *= 2) {
    for (int64_t i = 0; i < n; i += 2 * h) {
      for (int64_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
  const float s = 1.0f / sqrtf(static_cast<float>(n));
  for (int64_t i = 0; i < n; ++i) x[i] = Bf16ToFloat(FloatToBf16(x[i] * s));
}

// act_quant of one vector: ue8m0 scale of its amax (floored at 1e-4); q8
// receives the e4m3 values decoded to float. Returns the scale.
CR_HD float IndexActQuant(const float* x, int64_t n, float* q8) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = AbsMaxAccumulate(amax, x[i]);
  const float s = Fp8BlockScale(amax, kIndexAmaxFloor, true);
  for (int64_t i = 0; i < n; ++i) q8[i] = E4m3ToFloat(QuantFp8(x[i], s));
  return s;
}

// Stores one token's index key k[dim] into its slot; tmp: dim floats.
CR_HD void IndexKStore(const IndexPoolView& v, int64_t page, int64_t slot, const float* k, float* tmp) {
  uint8_t* base = v.data + page * IndexPageBytes(v.fp8, v.page_size, v.dim);
  if (!v.fp8) {
    for (int32_t i = 0; i < v.dim; ++i) {
      const uint16_t h = FloatToBf16(k[i]);
      memcpy(base + (slot * v.dim + i) * 2, &h, 2);
    }
    return;
  }
  for (int32_t i = 0; i < v.dim; ++i) tmp[i] = k[i];
  HadamardBf16(tmp, v.dim);
  float amax = 0.0f;
  for (int32_t i = 0; i < v.dim; ++i) amax = AbsMaxAccumulate(amax, tmp[i]);
  const float s = Fp8BlockScale(amax, kIndexAmaxFloor, true);
  for (int32_t i = 0; i < v.dim; ++i) base[slot * v.dim + i] = QuantFp8(tmp[i], s);
  memcpy(base + static_cast<int64_t>(v.page_size) * v.dim + slot * 4, &s, 4);
}

// Reads one token's key: k[dim] (bf16 values, or e4m3 values unscaled) and
// its scale (1 for bf16).
CR_HD float IndexKLoad(const IndexPoolView& v, int64_t page, int64_t slot, float* k) {
  const uint8_t* base = v.data + page * IndexPageBytes(v.fp8, v.page_size, v.dim);
  if (!v.fp8) {
    for (int32_t i = 0; i < v.dim; ++i) {
      uint16_t h;
      memcpy(&h, base + (slot * v.dim + i) * 2, 2);
      k[i] = Bf16ToFloat(h);
    }
    return 1.0f;
  }
  for (int32_t i = 0; i < v.dim; ++i) k[i] = E4m3ToFloat(base[slot * v.dim + i]);
  float s;
  memcpy(&s, base + static_cast<int64_t>(v.page_size) * v.dim + slot * 4, 4);
  return s;
}

CR_HD void IndexKWriteToken(const IndexPoolView& v, PageTableRow row, int64_t pos, const float* k, float* tmp,
                            int64_t item, KernelStatus* st) {
  if (!IndexDimSupported(v)) {
    Fail(st, Check::kIndexHeadDim, item, v.dim, static_cast<double>(v.dim));
    return;
  }
  const int64_t page = ResolvePoolPage(v.pages, row, pos / v.page_size, item, st);
  if (page < 0) return;
  IndexKStore(v, page, pos % v.page_size, k, tmp);
}

// Whether (sa, pa) ranks before (sb, pb): higher score first, NaN above every
// number, ties to the lower position.
CR_HD bool IndexBetter(float sa, int32_t pa, float sb, int32_t pb) {
  const bool na = sa != sa, nb = sb != sb;
  if (na != nb) return na;
  if (!na && sa != sb) return sa > sb;
  return pa < pb;
}

CR_HD void IndexSiftDown(int32_t* heap, int64_t n, int64_t i, const float* score) {
  // A min-heap on "better": heap[0] is the worst kept entry.
  for (;;) {
    const int64_t a = 2 * i + 1, b = a + 1;
    int64_t w = i;
    if (a < n && IndexBetter(score[heap[w]], heap[w], score[heap[a]], heap[a])) w = a;
    if (b < n && IndexBetter(score[heap[w]], heap[w], score[heap[b]], heap[b])) w = b;
    if (w == i) return;
    const int32_t t = heap[i];
    heap[i] = heap[w];
    heap[w] = t;
    i = w;
  }
}

CR_HD int64_t IndexerScratchFloats(int64_t max_len, int64_t heads, int64_t dim, int64_t topk) {
  return max_len + heads * dim + 2 * heads + dim + topk;
}

// One query's preparation, before any key: qp [heads * dim] the queries as
// the dots read them (bf16 keys: q as is; fp8 keys: each head Hadamard-
// rotated and act_quant'ed, its e4m3 values), wh [heads] each head's weight
// in the score (w_h / sqrt(heads); fp8: times q_scale_h * softmax_scale).
// tmp: dim floats.
CR_HD void IndexerPrepareQuery(bool fp8, int64_t dim, const float* q, const float* w, int64_t heads, float* qp,
                               float* wh, float* tmp) {
  const float softmax_scale = 1.0f / sqrtf(static_cast<float>(dim));
  const float head_scale = 1.0f / sqrtf(static_cast<float>(heads));
  for (int64_t h = 0; h < heads; ++h) {
    wh[h] = w[h] * head_scale;
    if (!fp8) {
      for (int64_t d = 0; d < dim; ++d) qp[h * dim + d] = q[h * dim + d];
      continue;
    }
    for (int64_t d = 0; d < dim; ++d) tmp[d] = q[h * dim + d];
    HadamardBf16(tmp, dim);
    const float qs = IndexActQuant(tmp, dim, qp + h * dim);
    wh[h] = wh[h] * qs * softmax_scale;
  }
}

// A head's term of a key's score from its dot `logit` (LaneSum8 of the
// head's 8 lanes): bf16 keys scale it by softmax_scale first; relu (NaN
// kept); acc + logit * wh. The CPU launcher runs the same operations lane by
// lane.
CR_HD float IndexerHeadTerm(bool fp8, float logit, float softmax_scale, float acc, float wh) {
  if (!fp8) logit = logit * softmax_scale;
  logit = logit > 0.0f ? logit : (logit != logit ? logit : 0.0f);  // relu, NaN kept
  return MulAdd(acc, logit, wh);
}

// The top-k of score[0, len): k = min(topk, len) positions, best first
// (IndexBetter), into ids[0, k); the rest of ids is left as it is. heap:
// topk ints.
CR_HD void IndexerSelectTopK(const float* score, int64_t len, int64_t topk, int32_t* ids, int32_t* heap) {
  const int64_t k = topk < len ? topk : len;
  if (k <= 0) return;
  int64_t n = 0;
  for (int64_t j = 0; j < len; ++j) {
    const int32_t p = static_cast<int32_t>(j);
    if (n < k) {
      heap[n] = p;
      for (int64_t i = n++; i > 0;) {  // sift up
        const int64_t parent = (i - 1) / 2;
        if (!IndexBetter(score[heap[parent]], heap[parent], score[heap[i]], heap[i])) break;
        const int32_t t = heap[i];
        heap[i] = heap[parent];
        heap[parent] = t;
        i = parent;
      }
    } else if (IndexBetter(score[p], p, score[heap[0]], heap[0])) {
      heap[0] = p;
      IndexSiftDown(heap, n, 0, score);
    }
  }
  // Pop the worst to the back: best first.
  for (int64_t m = n; m > 0; --m) {
    ids[m - 1] = heap[0];
    heap[0] = heap[m - 1];
    IndexSiftDown(heap, m - 1, 0, score);
  }
}

// Scores of one query (row position `pos`) against positions [0, pos] and
// its top-k. q: [heads * dim] index queries; w: [heads] weights_proj
// output; ids: [topk] out. scratch: IndexerScratchFloats(pos + 1, ...).
CR_HD void IndexerTopK(const IndexPoolView& v, PageTableRow row, int64_t pos, const float* q, const float* w,
                       int64_t heads, int64_t topk, int32_t* ids, float* scratch, int64_t item, KernelStatus* st) {
  for (int64_t i = 0; i < topk; ++i) ids[i] = -1;
  if (!IndexDimSupported(v)) {
    Fail(st, Check::kIndexHeadDim, item, v.dim, static_cast<double>(v.dim));
    return;
  }
  const int64_t dim = v.dim, len = pos + 1;
  float* score = scratch;              // [len]
  float* qp = score + len;             // [heads * dim] prepared queries
  float* wh = qp + heads * dim;        // [heads] effective head weights
  float* tmp = wh + heads;             // [heads] (unused), then the key [dim]
  float* key = tmp + heads;
  int32_t* heap = reinterpret_cast<int32_t*>(key + dim);  // [topk]
  const float softmax_scale = 1.0f / sqrtf(static_cast<float>(dim));
  IndexerPrepareQuery(v.fp8, dim, q, w, heads, qp, wh, key);
  for (int64_t j = 0; j < len; ++j) {
    const int64_t page = ResolvePoolPage(v.pages, row, j / v.page_size, item, st);
    if (page < 0) return;
    const float ks = IndexKLoad(v, page, j % v.page_size, key);
    float acc = 0.0f;
    for (int64_t h = 0; h < heads; ++h) {
      float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      const float* qh = qp + h * dim;
      // lane = d % 8, each lane in increasing d; whole groups of 8 first
      // (the same order, in a form compilers vectorize), then the tail.
      int64_t d = 0;
      for (; d + 8 <= dim; d += 8) {
        for (int l = 0; l < 8; ++l) lane[l] = MulAdd(lane[l], qh[d + l], key[d + l]);
      }
      for (; d < dim; ++d) lane[d & 7] = MulAdd(lane[d & 7], qh[d], key[d]);
      acc = IndexerHeadTerm(v.fp8, LaneSum8(lane), softmax_scale, acc, wh[h]);
    }
    score[j] = v.fp8 ? acc * ks : acc;
  }
  IndexerSelectTopK(score, len, topk, ids, heap);
}

}  // namespace crashreplay::replay
