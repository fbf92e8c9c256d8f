// Logits processing and sampling kernel bodies, one request row each.
//
// ProcessLogits turns a logits row into a probability row: temperature, then
// softmax, then top-k / top-p / min-p filtering and renormalisation. Two
// filters, chosen by sampling_backend:
//   sorted     sort by probability (descending, lower id first on ties) and
//              keep the prefix that top-k, top-p and min-p allow;
//   threshold  find the cut value by bisection on probability without a sort
//              (as rejection/pivot samplers do); sums in vocabulary order.
// SampleRow checks the probabilities (finite, non-negative, positive sum) and
// draws with a counter-based RNG, so the draw for (seed, request, step) is the
// same on any device and thread count. Greedy rows take the first maximum.
#pragma once

#include <cmath>
#include <cstdint>

#include "crashreplay/base/hd.h"
#include "crashreplay/replay/kernels/check.h"

namespace crashreplay::replay {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int32_t top_k = 0;         // 0: off
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;
};

CR_HD uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in [0, 1) with 24 random bits, from (seed, request, offset).
CR_HD float CounterUniform(uint64_t seed, uint64_t request, uint64_t offset) {
  const uint64_t h = SplitMix64(seed ^ SplitMix64(request ^ SplitMix64(offset)));
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
}

CR_HD int32_t ArgMaxRow(const float* x, int32_t n, int64_t item, KernelStatus* st) {
  int32_t best = 0;
  for (int32_t i = 0; i < n; ++i) {
    if (!IsFinite(x[i])) {
      Fail(st, Check::kLogitsFinite, item, i, static_cast<double>(x[i]));
      return -1;
    }
    if (x[i] > x[best]) best = i;
  }
  return best;
}

// Heap sort of ids by (prob desc, id asc); deterministic, no allocation.
CR_HD bool Before(const float* p, int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); }
CR_HD void SiftDown(const float* p, int32_t* ids, int32_t start, int32_t end) {
  int32_t root = start;
  while (2 * root + 1 < end) {
    int32_t child = 2 * root + 1;
    // max-heap on "after" order so the array ends sorted in Before order
    if (child + 1 < end && Before(p, ids[child + 1], ids[child])) child += 1;
    if (Before(p, ids[child], ids[root])) {
      const int32_t t = ids[root];
      ids[root] = ids[child];
      ids[child] = t;
      root = child;
    } else {
      return;
    }
  }
}
CR_HD void SortByProb(const float* p, int32_t* ids, int32_t n) {
  for (int32_t i = 0; i < n; ++i) ids[i] = i;
  for (int32_t s = n / 2 - 1; s >= 0; --s) SiftDown(p, ids, s, n);
  for (int32_t end = n - 1; end > 0; --end) {
    const int32_t t = ids[0];
    ids[0] = ids[end];
    ids[end] = t;
    SiftDown(p, ids, 0, end);
  }
  // The heap built on Before puts the "last" element at the end: reverse.
  for (int32_t i = 0, j = n - 1; i < j; ++i, --j) {
    const int32_t t = ids[i];
    ids[i] = ids[j];
    ids[j] = t;
  }
}

// probs[n] from logits[n]; `ids` is n int32 of scratch. Temperature > 0.
CR_HD void ProcessLogits(const float* logits, int32_t n, const SamplingParams& sp, bool sorted, float* probs,
                         int32_t* ids) {
  float m = -INFINITY;
  for (int32_t i = 0; i < n; ++i) m = logits[i] / sp.temperature > m ? logits[i] / sp.temperature : m;
  float sum = 0.0f;
  for (int32_t i = 0; i < n; ++i) {
    probs[i] = expf(logits[i] / sp.temperature - m);
    sum += probs[i];
  }
  float pmax = 0.0f;
  for (int32_t i = 0; i < n; ++i) {
    probs[i] /= sum;
    pmax = probs[i] > pmax ? probs[i] : pmax;
  }
  const bool filter = sp.top_k > 0 || sp.top_p < 1.0f || sp.min_p > 0.0f;
  if (!filter) return;
  if (sorted) {
    SortByProb(probs, ids, n);
    int32_t keep = n;
    if (sp.top_k > 0 && sp.top_k < keep) keep = sp.top_k;
    float cum = 0.0f;
    for (int32_t i = 0; i < keep; ++i) {
      cum += probs[ids[i]];
      if (cum >= sp.top_p) {
        keep = i + 1;
        break;
      }
    }
    for (int32_t i = 1; i < keep; ++i) {
      if (probs[ids[i]] < sp.min_p * pmax) {
        keep = i;
        break;
      }
    }
    for (int32_t i = keep; i < n; ++i) probs[ids[i]] = 0.0f;
  } else {
    // The cut: the largest t whose kept set {p >= t} still satisfies top-k or
    // top-p, by bisection on t in [0, pmax]; then min-p raises it.
    float lo = 0.0f, hi = pmax;
    for (int it = 0; it < 40; ++it) {
      const float t = 0.5f * (lo + hi);
      int32_t count = 0;
      float mass = 0.0f;
      for (int32_t i = 0; i < n; ++i) {
        if (probs[i] >= t) {
          count += 1;
          mass += probs[i];
        }
      }
      // Each of top-k and top-p allows raising the cut while its own set is
      // still large enough; the kept set is the smaller of the two, as in the
      // sorted filter, so the cut may rise while either allows it.
      const bool ok_k = sp.top_k > 0 && count >= sp.top_k;
      const bool ok_p = sp.top_p < 1.0f && mass >= sp.top_p;
      if (ok_k || ok_p)
        lo = t;
      else
        hi = t;
    }
    float cut = lo;
    if (sp.min_p * pmax > cut) cut = sp.min_p * pmax;
    if (cut > pmax) cut = pmax;
    int32_t kept = 0;
    for (int32_t i = 0; i < n; ++i) {
      if (probs[i] < cut || (sp.top_k > 0 && kept >= sp.top_k)) {
        probs[i] = 0.0f;
      } else {
        kept += 1;
      }
    }
  }
  float s2 = 0.0f;
  for (int32_t i = 0; i < n; ++i) s2 += probs[i];
  for (int32_t i = 0; i < n; ++i) probs[i] /= s2;
}

// Checks the row and draws one token by inverse CDF in vocabulary order.
CR_HD int32_t SampleRow(const float* probs, int32_t n, float u, int64_t item, KernelStatus* st) {
  float sum = 0.0f;
  for (int32_t i = 0; i < n; ++i) {
    if (!IsFinite(probs[i])) {
      Fail(st, Check::kProbFinite, item, i, static_cast<double>(probs[i]));
      return -1;
    }
    if (probs[i] < 0.0f) {
      Fail(st, Check::kProbNonNegative, item, i, static_cast<double>(probs[i]));
      return -1;
    }
    sum += probs[i];
  }
  if (!(sum > 0.0f)) {
    Fail(st, Check::kProbSumPositive, item, n, static_cast<double>(sum));
    return -1;
  }
  const float target = u * sum;
  float cum = 0.0f;
  int32_t last = 0;
  for (int32_t i = 0; i < n; ++i) {
    if (probs[i] > 0.0f) last = i;
    cum += probs[i];
    if (cum > target && probs[i] > 0.0f) return i;
  }
  return last;
}

}  // namespace crashreplay::replay
