// MoE routing kernel bodies: one token's expert choice.
//
// RouteSoftmaxTopK   Mixtral / Qwen3-MoE: softmax over all experts, top-k,
//                    optionally renormalised over the chosen k.
// RouteTopKSoftmax   gpt-oss: top-k of the logits, softmax over those k.
// RouteSigmoidGrouped DeepSeek-V3 / GLM-4.5: sigmoid scores; choice scores add
//                    the correction bias; experts are grouped, a group scores
//                    the sum of its best two choice scores, the best topk_group
//                    groups stay eligible; top-k among them by choice score;
//                    weights are the unbiased sigmoid scores, optionally
//                    renormalised, times routed_scaling_factor.
// Top-k picks the largest value, lower index on ties, k times. A NaN never
// compares greater, so a row of NaN logits picks nothing and leaves -1: the
// expert-id check that follows reports it, as a real dispatch would index
// out of range.
#pragma once

#include <cmath>
#include <cstdint>

#include "crashreplay/base/hd.h"
#include "crashreplay/replay/kernels/check.h"

namespace crashreplay::replay {

inline constexpr int kMaxTopK = 16;
inline constexpr int kMaxExperts = 1024;

// ids[k] = indices of the k largest eligible values (eligible: mask == nullptr
// or mask[e] != 0), excluding those already picked.
CR_HD void TopK(const float* v, const uint8_t* mask, int32_t n, int32_t k, int32_t* ids) {
  for (int32_t i = 0; i < k; ++i) {
    int32_t best = -1;
    float bv = -INFINITY;
    for (int32_t e = 0; e < n; ++e) {
      if (mask != nullptr && mask[e] == 0) continue;
      bool taken = false;
      for (int32_t j = 0; j < i; ++j) taken = taken || ids[j] == e;
      if (taken) continue;
      if (v[e] > bv || (best < 0 && v[e] == bv)) {
        best = e;
        bv = v[e];
      }
    }
    ids[i] = best;
  }
}

CR_HD void CheckExpertIds(const int32_t* ids, int32_t k, int32_t experts, int64_t item, KernelStatus* st) {
  for (int32_t i = 0; i < k; ++i) {
    if (ids[i] < 0 || ids[i] >= experts) {
      Fail(st, Check::kExpertInRange, item, ids[i], static_cast<double>(experts));
      return;
    }
  }
}

// scratch: n floats.
CR_HD void RouteSoftmaxTopK(const float* logits, int32_t n, int32_t k, bool renormalize, int32_t* ids, float* weights,
                            float* scratch, int64_t item, KernelStatus* st) {
  float m = -INFINITY;
  for (int32_t e = 0; e < n; ++e) m = logits[e] > m ? logits[e] : m;
  float sum = 0.0f;
  for (int32_t e = 0; e < n; ++e) {
    scratch[e] = expf(logits[e] - m);
    sum += scratch[e];
  }
  for (int32_t e = 0; e < n; ++e) scratch[e] /= sum;
  TopK(scratch, nullptr, n, k, ids);
  CheckExpertIds(ids, k, n, item, st);
  float ws = 0.0f;
  for (int32_t i = 0; i < k; ++i) {
    weights[i] = ids[i] >= 0 ? scratch[ids[i]] : 0.0f;
    ws += weights[i];
  }
  if (renormalize) {
    for (int32_t i = 0; i < k; ++i) weights[i] /= ws;
  }
}

// gpt-oss (transformers' GptOssTopKRouter): the k largest logits (TopK's
// order and ties), then their softmax: weights[i] = exp(l_i - max) / sum,
// summed in top-k order.
CR_HD void RouteTopKSoftmax(const float* logits, int32_t n, int32_t k, int32_t* ids, float* weights, int64_t item,
                            KernelStatus* st) {
  TopK(logits, nullptr, n, k, ids);
  CheckExpertIds(ids, k, n, item, st);
  float m = -INFINITY;
  for (int32_t i = 0; i < k; ++i) {
    if (ids[i] >= 0 && logits[ids[i]] > m) m = logits[ids[i]];
  }
  float sum = 0.0f;
  for (int32_t i = 0; i < k; ++i) {
    weights[i] = ids[i] >= 0 ? expf(logits[ids[i]] - m) : 0.0f;
    sum += weights[i];
  }
  for (int32_t i = 0; i < k; ++i) weights[i] /= sum;
}

// scratch: 2 * n floats + n bytes (passed as mask).
CR_HD void RouteSigmoidGrouped(const float* logits, const float* bias, int32_t n, int32_t k, int32_t n_group,
                               int32_t topk_group, bool renormalize, float scaling, int32_t* ids, float* weights,
                               float* scratch, uint8_t* mask, int64_t item, KernelStatus* st) {
  float* score = scratch;
  float* choice = scratch + n;
  for (int32_t e = 0; e < n; ++e) {
    score[e] = 1.0f / (1.0f + expf(-logits[e]));
    choice[e] = score[e] + (bias != nullptr ? bias[e] : 0.0f);
  }
  const int32_t per_group = n / n_group;
  float group_score[kMaxTopK * 4];
  int32_t group_ids[kMaxTopK * 4];
  for (int32_t g = 0; g < n_group; ++g) {
    int32_t top2[2];
    TopK(choice + g * per_group, nullptr, per_group, per_group >= 2 ? 2 : 1, top2);
    float s = 0.0f;
    for (int32_t i = 0; i < (per_group >= 2 ? 2 : 1); ++i) s += top2[i] >= 0 ? choice[g * per_group + top2[i]] : NAN;
    group_score[g] = s;
  }
  TopK(group_score, nullptr, n_group, topk_group, group_ids);
  for (int32_t e = 0; e < n; ++e) mask[e] = 0;
  for (int32_t i = 0; i < topk_group; ++i) {
    if (group_ids[i] < 0) continue;
    for (int32_t e = 0; e < per_group; ++e) mask[group_ids[i] * per_group + e] = 1;
  }
  TopK(choice, mask, n, k, ids);
  CheckExpertIds(ids, k, n, item, st);
  float ws = 0.0f;
  for (int32_t i = 0; i < k; ++i) {
    weights[i] = ids[i] >= 0 ? score[ids[i]] : 0.0f;
    ws += weights[i];
  }
  for (int32_t i = 0; i < k; ++i) weights[i] = (renormalize ? weights[i] / (ws + 1e-20f) : weights[i]) * scaling;
}

}  // namespace crashreplay::replay
