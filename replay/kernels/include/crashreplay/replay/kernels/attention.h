// KV-cache write and attention kernel bodies over a paged KV cache.
//
// Cache layout per layer and rank: K and V pools of [pages, page_size,
// kv_heads, head_dim] elements (bf16 or fp8 e4m3 with scale 1). A request's
// page-table row maps its logical page p (positions p*page_size ...) to a pool
// page. Every page id read from a table is checked against the pool.
//
// Attention for one query row (one token, one head) over positions [0, len):
//   AttendReference   scores, max, exp-sum and weighted sum in position order;
//   AttendFlashDecode split-KV: chunks of kFlashChunk positions, each with its
//                     own max/sum/accumulator, merged in chunk order;
//   AttendPaged64     one tile per page with an online (running max) softmax,
//                     FlashMLA-style; precondition page_size == 64.
// Scratch is provided by the launcher (see the *ScratchFloats functions).
//
// Two gpt-oss features, in every variant: `begin` > 0 attends positions
// [begin, len) only (a sliding window; pages before it are never read), and
// a finite `sink` is one more logit in the softmax (an attention sink): it
// joins the maximum and adds exp(sink - max) to the denominator after the
// positions' terms, with no value row. The defaults (0, -inf) leave every
// bit as without them: the maximum is unchanged and exp(-inf) adds 0.
#pragma once

#include <cmath>
#include <cstdint>

#include "crashreplay/base/hd.h"
#include "crashreplay/formats/numeric.h"
#include "crashreplay/replay/kernels/check.h"

namespace crashreplay::replay {

inline constexpr int kFlashChunk = 32;
inline constexpr int kPaged64Tile = 64;

struct KvPoolView {
  void* k = nullptr;
  void* v = nullptr;
  bool fp8 = false;  // elements are e4m3 bytes; otherwise bf16
  int64_t pages = 0;
  int32_t page_size = 0;
  int32_t kv_heads = 0;
  int32_t head_dim = 0;
};

struct PageTableRow {
  const int32_t* pages = nullptr;
  int64_t width = 0;  // entries in this row
};

CR_HD int64_t KvOffset(const KvPoolView& kv, int64_t page, int64_t slot, int64_t head) {
  return ((page * kv.page_size + slot) * kv.kv_heads + head) * kv.head_dim;
}

CR_HD float KvLoad(const KvPoolView& kv, const void* base, int64_t i) {
  return kv.fp8 ? E4m3ToFloat(static_cast<const uint8_t*>(base)[i])
                : Bf16ToFloat(static_cast<const uint16_t*>(base)[i]);
}

CR_HD void KvStore(const KvPoolView& kv, void* base, int64_t i, float x) {
  if (kv.fp8) {
    static_cast<uint8_t*>(base)[i] = FloatToE4m3(x);
  } else {
    static_cast<uint16_t*>(base)[i] = FloatToBf16(x);
  }
}

// Resolves logical page -> pool page through the table with both checks
// (position within the table, page within a pool of `pool_pages`); -1 on failure.
CR_HD int64_t ResolvePoolPage(int64_t pool_pages, PageTableRow row, int64_t logical, int64_t item, KernelStatus* st) {
  if (logical < 0 || logical >= row.width) {
    Fail(st, Check::kPositionInTable, item, logical, static_cast<double>(row.width));
    return -1;
  }
  const int32_t page = row.pages[logical];
  if (page < 0 || page >= pool_pages) {
    Fail(st, Check::kPageInPool, item, page, static_cast<double>(pool_pages));
    return -1;
  }
  return page;
}

CR_HD int64_t ResolvePage(const KvPoolView& kv, PageTableRow row, int64_t logical, int64_t item, KernelStatus* st) {
  return ResolvePoolPage(kv.pages, row, logical, item, st);
}

// Writes one token's K and V ([kv_heads * head_dim] each) at position `pos`.
CR_HD void KvWriteToken(const KvPoolView& kv, PageTableRow row, int64_t pos, const float* k, const float* v,
                        int64_t item, KernelStatus* st) {
  const int64_t page = ResolvePage(kv, row, pos / kv.page_size, item, st);
  if (page < 0) return;
  const int64_t base = KvOffset(kv, page, pos % kv.page_size, 0);
  const int64_t n = static_cast<int64_t>(kv.kv_heads) * kv.head_dim;
  for (int64_t i = 0; i < n; ++i) {
    KvStore(kv, kv.k, base + i, k[i]);
    KvStore(kv, kv.v, base + i, v[i]);
  }
}

CR_HD float QkDot(const KvPoolView& kv, const float* q, int64_t off) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  // lane = d % 8, each lane in increasing d: whole groups of 8, then the tail.
  int64_t d = 0;
  for (; d + 8 <= kv.head_dim; d += 8) {
    for (int l = 0; l < 8; ++l) lane[l] = MulAdd(lane[l], q[d + l], KvLoad(kv, kv.k, off + d + l));
  }
  for (int l = 0; d + l < kv.head_dim; ++l) lane[l] = MulAdd(lane[l], q[d + l], KvLoad(kv, kv.k, off + d + l));
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

CR_HD int64_t ReferenceScratchFloats(int64_t max_len) { return max_len; }

// The sink's term of the softmax denominator at maximum m (0 without a sink,
// whatever m is).
CR_HD float SinkTerm(float sink, float m) { return sink > -INFINITY ? expf(sink - m) : 0.0f; }

// The first position a query at position len - 1 attends under a window of
// `window` positions (0: none), as transformers' sliding-window mask keeps
// key positions > query - window.
CR_HD int64_t WindowBegin(int64_t len, int64_t window) { return window > 0 && len > window ? len - window : 0; }

// out[head_dim] = softmax(q . K[begin..len) * scale, sink) V. `kv_head` is the GQA group.
CR_HD void AttendReference(const KvPoolView& kv, PageTableRow row, const float* q, int64_t kv_head, int64_t len,
                           float scale, float* out, float* scratch, int64_t item, KernelStatus* st, int64_t begin = 0,
                           float sink = -INFINITY) {
  for (int64_t d = 0; d < kv.head_dim; ++d) out[d] = 0.0f;
  float m = sink;
  for (int64_t j = begin; j < len; ++j) {
    const int64_t page = ResolvePage(kv, row, j / kv.page_size, item, st);
    if (page < 0) return;
    const float s = QkDot(kv, q, KvOffset(kv, page, j % kv.page_size, kv_head)) * scale;
    scratch[j] = s;
    m = s > m ? s : m;
  }
  float sum = 0.0f;
  for (int64_t j = begin; j < len; ++j) {
    scratch[j] = expf(scratch[j] - m);
    sum += scratch[j];
  }
  sum += SinkTerm(sink, m);
  for (int64_t j = begin; j < len; ++j) {
    const int64_t page = row.pages[j / kv.page_size];
    const int64_t off = KvOffset(kv, page, j % kv.page_size, kv_head);
    for (int64_t d = 0; d < kv.head_dim; ++d) out[d] = MulAdd(out[d], scratch[j], KvLoad(kv, kv.v, off + d));
  }
  const float inv = 1.0f / sum;
  for (int64_t d = 0; d < kv.head_dim; ++d) out[d] *= inv;
}

// AttendReference spread over the n threads of a block (thread i), with the
// same bits: its steps as phases 0 .. kAttendPhases - 1, a barrier after
// each. 0: thread 0 resolves every page in order (the body's first failing
// page is the first failing one; on a fault every thread zeroes its share of
// `out` in phase 1 and the item is done: the call returns false, on every
// thread alike). 2: the scores of positions i, i + n, ... 3: thread 0 takes
// their maximum in order. 4: the exponentials, position-parallel. 5: thread
// 0 sums them in order. 6: output dimensions i, i + n, ..., each summing the
// positions in order, times 1 / sum. scratch: len + 3 floats (the scores,
// then max, sum and the fault flag).
inline constexpr int kAttendPhases = 7;
CR_HD bool AttendReferencePhase(int phase, int64_t i, int64_t n, const KvPoolView& kv, PageTableRow row, const float* q,
                                int64_t kv_head, int64_t len, float scale, float* out, float* scratch, int64_t item,
                                KernelStatus* st, int64_t begin = 0, float sink = -INFINITY) {
  float* const stat = scratch + len;  // [max, sum, failed]
  switch (phase) {
    case 0:
      if (i == 0) {
        stat[2] = 0.0f;
        const int64_t pages = (len + kv.page_size - 1) / kv.page_size;
        for (int64_t p = begin < len ? begin / kv.page_size : pages; p < pages; ++p) {
          if (ResolvePage(kv, row, p, item, st) < 0) {
            stat[2] = 1.0f;
            break;
          }
        }
      }
      return true;
    case 1:
      if (stat[2] == 0.0f) return true;
      for (int64_t d = i; d < kv.head_dim; d += n) out[d] = 0.0f;
      return false;
    case 2:
      for (int64_t j = begin + i; j < len; j += n) {
        const int64_t page = row.pages[j / kv.page_size];
        scratch[j] = QkDot(kv, q, KvOffset(kv, page, j % kv.page_size, kv_head)) * scale;
      }
      return true;
    case 3:
      if (i == 0) {
        float m = sink;
        for (int64_t j = begin; j < len; ++j) m = scratch[j] > m ? scratch[j] : m;
        stat[0] = m;
      }
      return true;
    case 4:
      for (int64_t j = begin + i; j < len; j += n) scratch[j] = expf(scratch[j] - stat[0]);
      return true;
    case 5:
      if (i == 0) {
        float sum = 0.0f;
        for (int64_t j = begin; j < len; ++j) sum += scratch[j];
        stat[1] = sum + SinkTerm(sink, stat[0]);
      }
      return true;
    default: {
      const float inv = 1.0f / stat[1];
      for (int64_t d = i; d < kv.head_dim; d += n) {
        float acc = 0.0f;
        for (int64_t j = begin; j < len; ++j) {
          const int64_t off = KvOffset(kv, row.pages[j / kv.page_size], j % kv.page_size, kv_head);
          acc = MulAdd(acc, scratch[j], KvLoad(kv, kv.v, off + d));
        }
        out[d] = acc * inv;
      }
      return true;
    }
  }
}

CR_HD int64_t FlashScratchFloats(int64_t max_len, int64_t head_dim) {
  const int64_t chunks = (max_len + kFlashChunk - 1) / kFlashChunk;
  return chunks * (head_dim + 2) + kFlashChunk;
}

CR_HD void AttendFlashDecode(const KvPoolView& kv, PageTableRow row, const float* q, int64_t kv_head, int64_t len,
                             float scale, float* out, float* scratch, int64_t item, KernelStatus* st, int64_t begin = 0,
                             float sink = -INFINITY) {
  const int64_t hd = kv.head_dim;
  const int64_t chunks = len > begin ? (len - begin + kFlashChunk - 1) / kFlashChunk : 0;
  float* p = scratch + chunks * (hd + 2);  // kFlashChunk scores of the current chunk
  for (int64_t c = 0; c < chunks; ++c) {
    float* part = scratch + c * (hd + 2);  // [m, l, acc[hd]]
    const int64_t j0 = begin + c * kFlashChunk;
    const int64_t j1 = j0 + kFlashChunk < len ? j0 + kFlashChunk : len;
    float m = -INFINITY;
    for (int64_t j = j0; j < j1; ++j) {
      const int64_t page = ResolvePage(kv, row, j / kv.page_size, item, st);
      if (page < 0) return;
      p[j - j0] = QkDot(kv, q, KvOffset(kv, page, j % kv.page_size, kv_head)) * scale;
      m = p[j - j0] > m ? p[j - j0] : m;
    }
    float l = 0.0f;
    for (int64_t d = 0; d < hd; ++d) part[2 + d] = 0.0f;
    for (int64_t j = j0; j < j1; ++j) {
      const float e = expf(p[j - j0] - m);
      l += e;
      const int64_t off = KvOffset(kv, row.pages[j / kv.page_size], j % kv.page_size, kv_head);
      for (int64_t d = 0; d < hd; ++d) part[2 + d] = MulAdd(part[2 + d], e, KvLoad(kv, kv.v, off + d));
    }
    part[0] = m;
    part[1] = l;
  }
  float gm = sink;
  for (int64_t c = 0; c < chunks; ++c) gm = scratch[c * (hd + 2)] > gm ? scratch[c * (hd + 2)] : gm;
  float gl = 0.0f;
  for (int64_t d = 0; d < hd; ++d) out[d] = 0.0f;
  for (int64_t c = 0; c < chunks; ++c) {
    const float* part = scratch + c * (hd + 2);
    const float w = expf(part[0] - gm);
    gl = MulAdd(gl, part[1], w);
    for (int64_t d = 0; d < hd; ++d) out[d] = MulAdd(out[d], part[2 + d], w);
  }
  gl += SinkTerm(sink, gm);
  const float inv = 1.0f / gl;
  for (int64_t d = 0; d < hd; ++d) out[d] *= inv;
}

CR_HD int64_t Paged64ScratchFloats() { return kPaged64Tile; }

CR_HD void AttendPaged64(const KvPoolView& kv, PageTableRow row, const float* q, int64_t kv_head, int64_t len,
                         float scale, float* out, float* scratch, int64_t item, KernelStatus* st, int64_t begin = 0,
                         float sink = -INFINITY) {
  const int64_t hd = kv.head_dim;
  for (int64_t d = 0; d < hd; ++d) out[d] = 0.0f;
  // The kernel's tile is one page: it addresses slot j % 64 of page j / 64.
  if (kv.page_size != kPaged64Tile) {
    Fail(st, Check::kPageSizeIs64, item, kv.page_size, static_cast<double>(kv.page_size));
    return;
  }
  float m = -INFINITY;
  float l = 0.0f;
  for (int64_t t0 = begin < len ? begin / kPaged64Tile * kPaged64Tile : len; t0 < len; t0 += kPaged64Tile) {
    const int64_t t1 = t0 + kPaged64Tile < len ? t0 + kPaged64Tile : len;
    const int64_t js = t0 > begin ? t0 : begin;  // the window's first position in this tile
    const int64_t page = ResolvePage(kv, row, t0 / kPaged64Tile, item, st);
    if (page < 0) return;
    float tm = m;
    for (int64_t j = js; j < t1; ++j) {
      scratch[j - t0] = QkDot(kv, q, KvOffset(kv, page, j - t0, kv_head)) * scale;
      tm = scratch[j - t0] > tm ? scratch[j - t0] : tm;
    }
    const float rescale = expf(m - tm);  // 0 on the first tile (m = -inf)
    l *= rescale;
    for (int64_t d = 0; d < hd; ++d) out[d] *= rescale;
    for (int64_t j = js; j < t1; ++j) {
      const float e = expf(scratch[j - t0] - tm);
      l += e;
      const int64_t off = KvOffset(kv, page, j - t0, kv_head);
      for (int64_t d = 0; d < hd; ++d) out[d] = MulAdd(out[d], e, KvLoad(kv, kv.v, off + d));
    }
    m = tm;
  }
  if (sink > m) {  // the sink joins the running maximum last
    const float rescale = expf(m - sink);
    l *= rescale;
    for (int64_t d = 0; d < hd; ++d) out[d] *= rescale;
    m = sink;
  }
  l += SinkTerm(sink, m);
  const float inv = 1.0f / l;
  for (int64_t d = 0; d < hd; ++d) out[d] *= inv;
}

}  // namespace crashreplay::replay
