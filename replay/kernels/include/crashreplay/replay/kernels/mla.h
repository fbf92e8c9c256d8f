// Kernel bodies of multi-head latent attention (MLA, DeepSeek-V2/V3) over a
// paged latent cache, in the two arithmetic forms serving engines have:
//
//   expanded ("naive", what engines run for prefill/extend): the cached
//     latents c_j are gathered (LatentGatherRow) and expanded by kv_b_proj
//     (an ordinary linear) into K_nope and V per head; MlaAttendExpanded is
//     then plain attention, score_j = q_nope . K_nope_j + q_rot . k_rot_j,
//     two-pass softmax in position (or top-k) order, fp32 throughout;
//   absorbed (FlashMLA and the other MLA decode kernels): W_UK is folded into
//     the query, q_lat = W_UK^T q_nope (MlaQAbsorb), so attention runs over
//     the latent [c | k_rot] itself (MlaAttendLatent), and W_UV maps its
//     output back to v_head_dim per head (MlaVUp, a row dot of kv_b_proj).
//
// MlaAttendLatent variants (LatentAttention):
//   kPaged64          FlashMLA's dense decode (flash_mla_with_kvcache): one
//                     64-token page per tile, online softmax; bf16 q and K,
//                     probabilities rounded to bf16 for P.V, bf16 output.
//                     Preconditions, named as checks: kv_lora + rope == 576,
//                     kv_lora == 512, page_size == 64.
//   kSparseReference  attention over the indexer's top-k positions in their
//                     order, two-pass softmax, fp32 (the reference form).
//   kSparseTiled64    FlashMLA's sparse decode: the top-k list in tiles of
//                     64 indices, online softmax, bf16 operands as kPaged64.
//                     Preconditions: 576 / 512 as above, heads per rank
//                     padded to 64 is 64 or 128, index_topk a multiple of 64.
// A top-k entry of -1 is padding (skipped); any other index outside
// [0, position] fires topk_index_in_sequence; pages are resolved through the
// row's page table with the usual checks.
//
// Latent cache (LatentPoolView), one token per slot:
//   bf16: kv_lora + rope bf16 values ([c | k_rot]);
//   fp8 (kv_cache_dtype=fp8_e4m3): FlashMLA's V3.2 FP8 layout,
//     [kv_lora e4m3 | ceil(kv_lora/128) fp32 scales | rope bf16]: 656 bytes
//     for 512 + 64. Each 128-value tile is quantized as sglang's NSA
//     quantize_k_cache does: scale = amax / 448 (no floor), values
//     e4m3(x * (1 / scale)) saturated; a tile of zeros has scale 0 and reads
//     back NaN, as it would on the GPU. Reads dequantize to bf16 (value x
//     scale, rounded), as FlashMLA does before its bf16 GEMMs.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "crashreplay/base/hd.h"
#include "crashreplay/formats/numeric.h"
#include "crashreplay/replay/kernels/attention.h"
#include "crashreplay/replay/kernels/check.h"
#include "crashreplay/replay/kernels/linear.h"

namespace crashreplay::replay {

inline constexpr int kMlaTile = 64;             // FlashMLA's page / top-k tile
inline constexpr int32_t kLatentQuantTile = 128;  // values sharing one fp32 scale
inline constexpr int32_t kFlashMlaHeadDim = 576;
inline constexpr int32_t kFlashMlaVHeadDim = 512;

enum class LatentAttention : int32_t { kPaged64 = 0, kSparseReference = 1, kSparseTiled64 = 2 };

struct LatentPoolView {
  uint8_t* data = nullptr;
  bool fp8 = false;
  int64_t pages = 0;
  int32_t page_size = 0;
  int32_t kv_lora = 0;
  int32_t rope = 0;
  int32_t token_bytes = 0;
};

CR_HD int32_t LatentScaleTiles(int32_t kv_lora) { return (kv_lora + kLatentQuantTile - 1) / kLatentQuantTile; }

CR_HD int32_t LatentTokenBytes(bool fp8, int32_t kv_lora, int32_t rope) {
  return fp8 ? kv_lora + 4 * LatentScaleTiles(kv_lora) + 2 * rope : 2 * (kv_lora + rope);
}

CR_HD uint8_t* LatentSlot(const LatentPoolView& v, int64_t page, int64_t slot) {
  return v.data + (page * v.page_size + slot) * v.token_bytes;
}

CR_HD float Bf16Round(float x) { return Bf16ToFloat(FloatToBf16(x)); }

// Writes one token's latent c[kv_lora] (normed) and k_rot[rope] (rotated).
CR_HD void LatentStore(const LatentPoolView& v, uint8_t* p, const float* c, const float* rot) {
  if (!v.fp8) {
    for (int32_t i = 0; i < v.kv_lora; ++i) {
      const uint16_t h = FloatToBf16(c[i]);
      memcpy(p + 2 * i, &h, 2);
    }
    for (int32_t i = 0; i < v.rope; ++i) {
      const uint16_t h = FloatToBf16(rot[i]);
      memcpy(p + 2 * (v.kv_lora + i), &h, 2);
    }
    return;
  }
  const int32_t tiles = LatentScaleTiles(v.kv_lora);
  for (int32_t t = 0; t < tiles; ++t) {
    const int32_t i0 = t * kLatentQuantTile;
    const int32_t i1 = i0 + kLatentQuantTile < v.kv_lora ? i0 + kLatentQuantTile : v.kv_lora;
    float amax = 0.0f;
    for (int32_t i = i0; i < i1; ++i) amax = AbsMaxAccumulate(amax, c[i]);
    const float scale = amax / 448.0f;
    const float inv = 1.0f / scale;
    for (int32_t i = i0; i < i1; ++i) p[i] = FloatToE4m3(c[i] * inv);
    memcpy(p + v.kv_lora + 4 * t, &scale, 4);
  }
  uint8_t* r = p + v.kv_lora + 4 * tiles;
  for (int32_t i = 0; i < v.rope; ++i) {
    const uint16_t h = FloatToBf16(rot[i]);
    memcpy(r + 2 * i, &h, 2);
  }
}

// Reads one token back: out[0, kv_lora) the latent, out[kv_lora, +rope) k_rot.
CR_HD void LatentLoad(const LatentPoolView& v, const uint8_t* p, float* out) {
  if (!v.fp8) {
    for (int32_t i = 0; i < v.kv_lora + v.rope; ++i) {
      uint16_t h;
      memcpy(&h, p + 2 * i, 2);
      out[i] = Bf16ToFloat(h);
    }
    return;
  }
  const int32_t tiles = LatentScaleTiles(v.kv_lora);
  for (int32_t t = 0; t < tiles; ++t) {
    float scale;
    memcpy(&scale, p + v.kv_lora + 4 * t, 4);
    const int32_t i0 = t * kLatentQuantTile;
    const int32_t i1 = i0 + kLatentQuantTile < v.kv_lora ? i0 + kLatentQuantTile : v.kv_lora;
    for (int32_t i = i0; i < i1; ++i) out[i] = Bf16Round(E4m3ToFloat(p[i]) * scale);
  }
  const uint8_t* r = p + v.kv_lora + 4 * tiles;
  for (int32_t i = 0; i < v.rope; ++i) {
    uint16_t h;
    memcpy(&h, r + 2 * i, 2);
    out[v.kv_lora + i] = Bf16ToFloat(h);
  }
}

// Writes token `pos` of a row: latent c and rotated k_rot into its slot.
CR_HD void LatentWriteToken(const LatentPoolView& v, PageTableRow row, int64_t pos, const float* c, const float* rot,
                            int64_t item, KernelStatus* st) {
  const int64_t page = ResolvePoolPage(v.pages, row, pos / v.page_size, item, st);
  if (page < 0) return;
  LatentStore(v, LatentSlot(v, page, pos % v.page_size), c, rot);
}

// Gathers position `pos` of a row from the cache: c into c_out[kv_lora],
// k_rot into rot_out[rope]. `tmp` holds kv_lora + rope floats.
CR_HD void LatentGatherRow(const LatentPoolView& v, PageTableRow row, int64_t pos, float* c_out, float* rot_out,
                           float* tmp, int64_t item, KernelStatus* st) {
  const int64_t page = ResolvePoolPage(v.pages, row, pos / v.page_size, item, st);
  if (page < 0) {
    for (int32_t i = 0; i < v.kv_lora; ++i) c_out[i] = 0.0f;
    for (int32_t i = 0; i < v.rope; ++i) rot_out[i] = 0.0f;
    return;
  }
  LatentLoad(v, LatentSlot(v, page, pos % v.page_size), tmp);
  for (int32_t i = 0; i < v.kv_lora; ++i) c_out[i] = tmp[i];
  for (int32_t i = 0; i < v.rope; ++i) rot_out[i] = tmp[v.kv_lora + i];
}

// A sparse index as the attention kernels take it: -1 is padding (false, no
// check); otherwise it must be a position of the sequence, [0, len).
CR_HD bool SparseIndexValid(int32_t j, int64_t len, int64_t item, KernelStatus* st) {
  if (j == -1) return false;
  if (j < 0 || j >= len) {
    Fail(st, Check::kTopkIndexInSequence, item, j, static_cast<double>(len));
    return false;
  }
  return true;
}

// ---- expanded (naive) attention ---------------------------------------------

// One head of one query over gathered, expanded positions. q: [nope + rope]
// (rope part rotated, last); kv: this rank's kv_b_proj output of position 0 of
// the row, rows of `kv_stride` floats holding every local head's
// [K_nope (nope) | V (v_dim)], head h at h * (nope + v_dim); rot: the gathered
// k_rot rows ([rope] each) of the same positions. Dense: positions [0, len);
// sparse (ids != null): the n_ids entries of ids, each checked against len.
CR_HD void MlaAttendExpanded(const float* q, const float* kv, const float* rot, int64_t kv_stride, int64_t h,
                             int64_t nope, int64_t rope, int64_t v_dim, int64_t len, const int32_t* ids, int64_t n_ids,
                             float scale, float* out, float* scratch, int64_t item, KernelStatus* st) {
  for (int64_t e = 0; e < v_dim; ++e) out[e] = 0.0f;
  const int64_t n = ids != nullptr ? n_ids : len;
  const int64_t head_off = h * (nope + v_dim);
  float m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    int64_t j = i;
    if (ids != nullptr) {
      if (!SparseIndexValid(ids[i], len, item, st)) {
        if (st->fired) return;
        scratch[i] = -INFINITY;
        continue;
      }
      j = ids[i];
    }
    const float* k = kv + j * kv_stride + head_off;
    const float* r = rot + j * rope;
    float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t d = 0; d < nope; ++d) lane[d & 7] = MulAdd(lane[d & 7], q[d], k[d]);
    for (int64_t d = 0; d < rope; ++d) lane[(nope + d) & 7] = MulAdd(lane[(nope + d) & 7], q[nope + d], r[d]);
    const float s = LaneSum8(lane) * scale;
    scratch[i] = s;
    m = s > m ? s : m;
  }
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    scratch[i] = expf(scratch[i] - m);  // -inf (padding) -> 0
    sum += scratch[i];
  }
  for (int64_t i = 0; i < n; ++i) {
    if (ids != nullptr && ids[i] == -1) continue;
    const int64_t j = ids != nullptr ? ids[i] : i;
    const float* v = kv + j * kv_stride + head_off + nope;
    for (int64_t e = 0; e < v_dim; ++e) out[e] = MulAdd(out[e], scratch[i], v[e]);
  }
  const float inv = 1.0f / sum;
  for (int64_t e = 0; e < v_dim; ++e) out[e] *= inv;
}

// ---- absorbed attention -----------------------------------------------------

// q576[0, kv_lora) = W_UK_h^T q_nope, q576[kv_lora, +rope) = q_rot: the query
// the latent attention kernels take. W_UK_h is rows [h*(nope+v), +nope) of
// kv_b_proj (this rank's shard), read dequantized (as engines dequantize
// kv_b_proj into the w_kc they multiply by); 8 lanes over the nope dims.
CR_HD void MlaQAbsorb(const QWeight& kv_b, const float* q, int64_t h, int64_t nope, int64_t rope, int64_t v_dim,
                      float* q576) {
  const int64_t kv_lora = kv_b.cols, row0 = h * (nope + v_dim);
  for (int64_t c = 0; c < kv_lora; ++c) {
    float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t d = 0; d < nope; ++d) lane[d & 7] = MulAdd(lane[d & 7], q[d], DequantAt(kv_b, row0 + d, c));
    q576[c] = LaneSum8(lane);
  }
  for (int64_t d = 0; d < rope; ++d) q576[kv_lora + d] = q[nope + d];
}

CR_HD float LatentDot(const float* q, const float* k, int64_t n) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t d = 0;  // whole groups of 8 lanes, then the tail: the same order
  for (; d + 8 <= n; d += 8) {
    for (int l = 0; l < 8; ++l) lane[l] = MulAdd(lane[l], q[d + l], k[d + l]);
  }
  for (int l = 0; d + l < n; ++l) lane[l] = MulAdd(lane[l], q[d + l], k[d + l]);  // d % 8 == 0 here
  return LaneSum8(lane);
}

// The FlashMLA preconditions shared by the tiled variants; false (and the
// check fired) when one does not hold.
CR_HD bool FlashMlaShapeOk(const LatentPoolView& v, int64_t item, KernelStatus* st) {
  if (v.kv_lora + v.rope != kFlashMlaHeadDim) {
    Fail(st, Check::kMlaHeadDim576, item, v.kv_lora + v.rope, static_cast<double>(v.kv_lora + v.rope));
    return false;
  }
  if (v.kv_lora != kFlashMlaVHeadDim) {
    Fail(st, Check::kMlaVHeadDim512, item, v.kv_lora, static_cast<double>(v.kv_lora));
    return false;
  }
  return true;
}

CR_HD int64_t LatentScratchFloats(int64_t kv_lora, int64_t rope, int64_t max_entries) {
  return 2 * (kv_lora + rope) + (max_entries > kMlaTile ? max_entries : kMlaTile);
}

// One tile of the online softmax (FlashMLA): scores s[0, n) of the tile's
// valid entries (-inf for masked ones), their latents fetched again by
// `fetch(i, k)`; bf16 probabilities for P.V, fp32 row sum.
template <typename Fetch>
CR_HD void OnlineTile(const float* s, int64_t n, int64_t kv_lora, float* m, float* l, float* acc, float* k,
                      Fetch fetch) {
  float tm = *m;
  for (int64_t i = 0; i < n; ++i) tm = s[i] > tm ? s[i] : tm;
  if (tm == -INFINITY) return;  // every entry of the tile masked
  const float rescale = expf(*m - tm);  // 0 on the first tile (m = -inf)
  *l = *l * rescale;
  for (int64_t c = 0; c < kv_lora; ++c) acc[c] *= rescale;
  for (int64_t i = 0; i < n; ++i) {
    if (s[i] == -INFINITY) continue;
    const float p = expf(s[i] - tm);
    *l += p;
    const float pb = Bf16Round(p);
    if (!fetch(i, k)) return;
    for (int64_t c = 0; c < kv_lora; ++c) acc[c] = MulAdd(acc[c], pb, k[c]);
  }
  *m = tm;
}

// One head of one query over the latent cache. q576: [kv_lora + rope]; out:
// [kv_lora] (the latent output W_UV is applied to). Dense (kPaged64):
// positions [0, len) by page; sparse: the n_ids entries of ids.
// `heads` is the rank's head count (the sparse kernel's h_q).
CR_HD void MlaAttendLatent(LatentAttention variant, const LatentPoolView& v, PageTableRow row, const float* q576,
                           int64_t len, const int32_t* ids, int64_t n_ids, int64_t heads, float scale, float* out,
                           float* scratch, int64_t item, KernelStatus* st) {
  const int64_t kv_lora = v.kv_lora, qd = v.kv_lora + v.rope;
  for (int64_t c = 0; c < kv_lora; ++c) out[c] = 0.0f;
  float* q = scratch;            // [qd]
  float* k = scratch + qd;       // [qd]
  float* s = scratch + 2 * qd;   // scores: [n_ids] (reference) or [kMlaTile]
  // Fetches position j's latent into k; false when a check fired.
  auto load = [&](int64_t j) {
    const int64_t page = ResolvePoolPage(v.pages, row, j / v.page_size, item, st);
    if (page < 0) return false;
    LatentLoad(v, LatentSlot(v, page, j % v.page_size), k);
    return true;
  };
  if (variant == LatentAttention::kSparseReference) {
    float m = -INFINITY;
    for (int64_t i = 0; i < n_ids; ++i) {
      s[i] = -INFINITY;
      if (!SparseIndexValid(ids[i], len, item, st)) {
        if (st->fired) return;
        continue;
      }
      if (!load(ids[i])) return;
      s[i] = LatentDot(q576, k, qd) * scale;
      m = s[i] > m ? s[i] : m;
    }
    float sum = 0.0f;
    for (int64_t i = 0; i < n_ids; ++i) {
      s[i] = expf(s[i] - m);
      sum += s[i];
    }
    for (int64_t i = 0; i < n_ids; ++i) {
      if (ids[i] == -1) continue;
      if (!load(ids[i])) return;
      for (int64_t c = 0; c < kv_lora; ++c) out[c] = MulAdd(out[c], s[i], k[c]);
    }
    const float inv = 1.0f / sum;
    for (int64_t c = 0; c < kv_lora; ++c) out[c] *= inv;
    return;
  }
  // The tiled (FlashMLA) kernels.
  if (!FlashMlaShapeOk(v, item, st)) return;
  if (variant == LatentAttention::kPaged64 && v.page_size != kMlaTile) {
    Fail(st, Check::kPageSizeIs64, item, v.page_size, static_cast<double>(v.page_size));
    return;
  }
  if (variant == LatentAttention::kSparseTiled64) {
    if (heads < 1 || heads > 128) {  // h_q padded to 64 or 128
      Fail(st, Check::kSparseMlaHeads, item, heads, static_cast<double>(heads));
      return;
    }
    if (n_ids % kMlaTile != 0) {
      Fail(st, Check::kTopkMultipleOf64, item, n_ids, static_cast<double>(n_ids));
      return;
    }
  }
  for (int64_t d = 0; d < qd; ++d) q[d] = Bf16Round(q576[d]);
  float m = -INFINITY, l = 0.0f;
  const int64_t n = variant == LatentAttention::kPaged64 ? len : n_ids;
  for (int64_t t0 = 0; t0 < n; t0 += kMlaTile) {
    const int64_t t1 = t0 + kMlaTile < n ? t0 + kMlaTile : n;
    for (int64_t i = t0; i < t1; ++i) {
      int64_t j = i;
      s[i - t0] = -INFINITY;
      if (variant == LatentAttention::kSparseTiled64) {
        if (!SparseIndexValid(ids[i], len, item, st)) {
          if (st->fired) return;
          continue;
        }
        j = ids[i];
      }
      if (!load(j)) return;
      s[i - t0] = LatentDot(q, k, qd) * scale;
    }
    bool ok = true;
    OnlineTile(s, t1 - t0, kv_lora, &m, &l, out, k, [&](int64_t i, float*) {
      const int64_t j = variant == LatentAttention::kSparseTiled64 ? ids[t0 + i] : t0 + i;
      ok = load(j);
      return ok;
    });
    if (!ok) return;
  }
  const float inv = 1.0f / l;
  for (int64_t c = 0; c < kv_lora; ++c) out[c] = Bf16Round(out[c] * inv);
}

}  // namespace crashreplay::replay
