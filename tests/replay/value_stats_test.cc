// The watcher's value statistics (replay/program/src/value_stats.h) against a plain
// loop over every element: counts, extremes and magnitudes exactly, the sum
// of magnitudes exactly against its 8-lane definition and within rounding of
// a long double sum, on every tail length and with non-finite values mixed in.
#include "value_stats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace crashreplay::replay {
namespace {

TEST(ValueStats, MatchesAnElementLoopOnEveryTailAndWithNonFiniteValues) {
  std::mt19937 g(5);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::uniform_int_distribution<int> pick(0, 40);
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{63}, size_t{1000}, size_t{4099}}) {
    for (int specials = 0; specials < 2; ++specials) {
      std::vector<float> x(n);
      for (auto& v : x) {
        v = nd(g);
        if (specials) {
          const int k = pick(g);
          if (k == 0) v = NAN;
          if (k == 1) v = INFINITY;
          if (k == 2) v = -INFINITY;
          if (k == 3) v = -0.0f;
          if (k == 4) v = 1e-42f;  // subnormal
        }
      }
      int64_t nan = 0, inf = 0, finite = 0;
      float mn = INFINITY, mx = -INFINITY, ma = 0;
      double lane[8] = {};
      long double exact = 0;
      for (size_t i = 0; i < n; ++i) {
        if (std::isnan(x[i])) {
          ++nan;
        } else if (std::isinf(x[i])) {
          ++inf;
        } else {
          ++finite;
          mn = std::min(mn, x[i]);
          mx = std::max(mx, x[i]);
          ma = std::max(ma, std::fabs(x[i]));
          lane[i % 8] += std::fabs(x[i]);
          exact += std::fabs(x[i]);
        }
      }
      const ValueStats s = SummarizeFloats(x.data(), n);
      SCOPED_TRACE(testing::Message() << "n " << n << " specials " << specials);
      EXPECT_EQ(s.nan, nan);
      EXPECT_EQ(s.inf, inf);
      EXPECT_EQ(s.finite, finite);
      if (finite > 0) {
        EXPECT_EQ(s.min, mn);
        EXPECT_EQ(s.max, mx);
      } else {
        EXPECT_EQ(s.min, 0.0f);
        EXPECT_EQ(s.max, 0.0f);
      }
      EXPECT_EQ(s.max_abs, ma);
      const double tree = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
      EXPECT_EQ(s.sum_abs, tree);
      EXPECT_NEAR(s.sum_abs, static_cast<double>(exact), 1e-12 * static_cast<double>(exact) + 1e-300);
    }
  }
}

TEST(ValueStats, AllNonFiniteHasNoExtremes) {
  const std::vector<float> x(20, NAN);
  const ValueStats s = SummarizeFloats(x.data(), x.size());
  EXPECT_EQ(s.nan, 20);
  EXPECT_EQ(s.finite, 0);
  EXPECT_EQ(s.sum_abs, 0.0);
  EXPECT_EQ(s.max_abs, 0.0f);
}

}  // namespace
}  // namespace crashreplay::replay
