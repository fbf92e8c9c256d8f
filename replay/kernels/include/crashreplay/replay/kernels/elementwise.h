// Row-wise kernel bodies: embedding lookup, RMSNorm, RoPE, SiLU-and-mul,
// residual add, and the tensor-parallel fixed-order sum. Each function
// computes one row (token) or one element; launchers loop over the rest.
#pragma once

#include <cmath>
#include <cstdint>

#include "crashreplay/base/hd.h"
#include "crashreplay/replay/kernels/check.h"
#include "crashreplay/replay/kernels/linear.h"

namespace crashreplay::replay {

// out[0..hidden) = embedding row `token`. The table is a [vocab, hidden] weight
// in any storage; the token id is checked against the table's rows.
CR_HD void EmbeddingRow(const QWeight& table, int32_t token, float* out, int64_t item, KernelStatus* st) {
  if (token < 0 || token >= table.rows) {
    Fail(st, Check::kTokenInVocab, item, token, static_cast<double>(table.rows));
    for (int64_t c = 0; c < table.cols; ++c) out[c] = 0.0f;
    return;
  }
  for (int64_t c = 0; c < table.cols; ++c) out[c] = DequantAt(table, token, c);
}

CR_HD float SumSquares(const float* x, int64_t n) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < n; ++i) lane[i & 7] = MulAdd(lane[i & 7], x[i], x[i]);
  return LaneSum8(lane);
}

// out = x / sqrt(mean(x^2) + eps) * w, in fp32 (out may alias x).
CR_HD void RmsNormRow(const float* x, const float* w, int64_t n, float eps, float* out) {
  const float inv = 1.0f / sqrtf(SumSquares(x, n) / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = (x[i] * inv) * w[i];
}

// Rotates the first `rotary_dim` elements of one head in place, rotate-half
// (GPT-NeoX) pairing (i, i + rotary_dim/2), the HF llama convention.
// inv_freq has rotary_dim/2 entries; `mscale` scales cos and sin (YaRN).
CR_HD void RopeHead(float* x, int64_t rotary_dim, int64_t pos, const float* inv_freq, float mscale) {
  const int64_t half = rotary_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float angle = static_cast<float>(pos) * inv_freq[i];
    const float c = cosf(angle) * mscale;
    const float s = sinf(angle) * mscale;
    const float a = x[i];
    const float b = x[i + half];
    x[i] = a * c - b * s;
    x[i + half] = b * c + a * s;
  }
}

// The same rotation with DeepSeek's interleaved pairing (2i, 2i + 1), pair i
// rotated by inv_freq[i] (transformers' apply_rotary_pos_emb_interleave, which
// writes the rotated pairs de-interleaved; the pairs' values are the same, so
// q . k is too).
CR_HD void RopeHeadInterleaved(float* x, int64_t rotary_dim, int64_t pos, const float* inv_freq, float mscale) {
  const int64_t half = rotary_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float angle = static_cast<float>(pos) * inv_freq[i];
    const float c = cosf(angle) * mscale;
    const float s = sinf(angle) * mscale;
    const float a = x[2 * i];
    const float b = x[2 * i + 1];
    x[2 * i] = a * c - b * s;
    x[2 * i + 1] = b * c + a * s;
  }
}

CR_HD float Silu(float g) { return g / (1.0f + expf(-g)); }

// out[i] = silu(gate[i]) * up[i]
CR_HD void SiluMulRow(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = Silu(gate[i]) * up[i];
}

// gpt-oss's clamped SwiGLU (transformers' GptOssExperts._apply_gate): the
// gate clamped from above and the up projection on both sides at `limit`
// (a NaN stays NaN, as torch.clamp keeps it), then
// (up + 1) * gate * sigmoid(alpha * gate).
CR_HD float ClampedSwiglu(float g, float u, float alpha, float limit) {
  g = g > limit ? limit : g;
  u = u > limit ? limit : (u < -limit ? -limit : u);
  return (u + 1.0f) * (g * (1.0f / (1.0f + expf(-(g * alpha)))));
}

// The experts' gated activation of a row: ClampedSwiglu when limit > 0, else
// silu(gate) * up (SiluMulRow's bits).
CR_HD void GatedActRow(const float* gate, const float* up, int64_t n, float alpha, float limit, float* out) {
  if (!(limit > 0.0f)) return SiluMulRow(gate, up, n, out);
  for (int64_t i = 0; i < n; ++i) out[i] = ClampedSwiglu(gate[i], up[i], alpha, limit);
}

// The tensor-parallel reduction of one element: the ranks' partial results
// (all-gathered, rank r at parts[r * stride]) summed in rank order.
CR_HD float FixedOrderSum(const float* parts, int32_t ranks, int64_t stride, int64_t i) {
  float s = parts[i];
  for (int32_t r = 1; r < ranks; ++r) s = s + parts[r * stride + i];
  return s;
}

}  // namespace crashreplay::replay
