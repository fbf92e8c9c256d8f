#include "value_stats.h"

#include <cfloat>
#include <cmath>
#include <cstring>

namespace crashreplay::replay {
namespace {

typedef float f32x8 __attribute__((vector_size(32)));
typedef int32_t i32x8 __attribute__((vector_size(32)));
typedef float f32x4 __attribute__((vector_size(16)));
typedef double f64x4 __attribute__((vector_size(32)));

// Counters are int32 lanes, flushed at least every 2^28 vectors.
constexpr size_t kFlush = size_t{1} << 28;

struct Lanes {
  double sum[8] = {};
  float min[8], max[8], max_abs[8] = {};
  int64_t nan = 0, inf = 0;
  Lanes() {
    for (int l = 0; l < 8; ++l) {
      min[l] = INFINITY;
      max[l] = -INFINITY;
    }
  }
};

inline __attribute__((always_inline)) void Body(const float* p, size_t n, Lanes* out) {
  f64x4 sum_lo = {}, sum_hi = {};  // lanes 0-3 and 4-7
  f32x8 mn = f32x8{} + INFINITY, mx = f32x8{} - INFINITY, ma = {};
  const size_t whole = n / 8 * 8;
  for (size_t c0 = 0; c0 < whole; c0 += 8 * kFlush) {
    const size_t c1 = c0 + 8 * kFlush < whole ? c0 + 8 * kFlush : whole;
    i32x8 nan = {}, inf = {};
    for (size_t i = c0; i < c1; i += 8) {
      f32x8 x;
      std::memcpy(&x, p + i, sizeof x);
      const f32x8 a = (f32x8)((i32x8)x & 0x7fffffff);
      const i32x8 fin = a <= FLT_MAX;  // -1: finite (false for NaN and infinities)
      nan -= x != x;
      inf -= a == INFINITY;
      const f32x8 af = (f32x8)((i32x8)a & fin);
      sum_lo += __builtin_convertvector(__builtin_shufflevector(af, af, 0, 1, 2, 3), f64x4);
      sum_hi += __builtin_convertvector(__builtin_shufflevector(af, af, 4, 5, 6, 7), f64x4);
      mn = (fin & (x < mn)) != 0 ? x : mn;
      mx = (fin & (x > mx)) != 0 ? x : mx;
      ma = (fin & (a > ma)) != 0 ? a : ma;
    }
    for (int l = 0; l < 8; ++l) {
      out->nan += nan[l];
      out->inf += inf[l];
    }
  }
  for (int l = 0; l < 8; ++l) {
    out->sum[l] = l < 4 ? sum_lo[l] : sum_hi[l - 4];
    out->min[l] = mn[l];
    out->max[l] = mx[l];
    out->max_abs[l] = ma[l];
  }
  for (size_t i = whole; i < n; ++i) {  // the tail, lane i mod 8 as above
    const int l = static_cast<int>(i - whole);
    const float x = p[i], a = std::fabs(x);
    if (x != x) {
      out->nan += 1;
    } else if (a == INFINITY) {
      out->inf += 1;
    } else {
      out->sum[l] += a;
      out->min[l] = x < out->min[l] ? x : out->min[l];
      out->max[l] = x > out->max[l] ? x : out->max[l];
      out->max_abs[l] = a > out->max_abs[l] ? a : out->max_abs[l];
    }
  }
}

__attribute__((noinline)) void BodyGeneric(const float* p, size_t n, Lanes* out) { Body(p, n, out); }
#if defined(__x86_64__)
__attribute__((target("avx2"), noinline)) void BodyAvx2(const float* p, size_t n, Lanes* out) { Body(p, n, out); }
#endif

}  // namespace

ValueStats SummarizeFloats(const float* p, size_t n) {
  Lanes l;
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) {
    BodyAvx2(p, n, &l);
  } else {
    BodyGeneric(p, n, &l);
  }
#else
  BodyGeneric(p, n, &l);
#endif
  ValueStats s;
  s.nan = l.nan;
  s.inf = l.inf;
  s.finite = static_cast<int64_t>(n) - l.nan - l.inf;
  s.sum_abs = ((l.sum[0] + l.sum[1]) + (l.sum[2] + l.sum[3])) + ((l.sum[4] + l.sum[5]) + (l.sum[6] + l.sum[7]));
  if (s.finite > 0) {
    s.min = l.min[0];
    s.max = l.max[0];
    s.max_abs = l.max_abs[0];
    for (int k = 1; k < 8; ++k) {
      s.min = l.min[k] < s.min ? l.min[k] : s.min;
      s.max = l.max[k] > s.max ? l.max[k] : s.max;
      s.max_abs = l.max_abs[k] > s.max_abs ? l.max_abs[k] : s.max_abs;
    }
  }
  return s;
}

}  // namespace crashreplay::replay
