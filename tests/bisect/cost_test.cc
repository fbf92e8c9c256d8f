// What a search costs, measured with a counting oracle: an in-process trial
// runner behind the real Scheduler and RunBisect, so every configuration the
// search judges is counted, the good and bad checks included.
//
// Bounds (docs/bisect.md): a single culprit among n changes costs at most
// ⌈log2 n⌉ + 1 trials after the two checks (⌈log2 n⌉ + 3 in all), which is
// optimal for a search that tests the culprit on its own; a pair among 16
// costs at most 14 in all.
#include <cmath>
#include <cstdio>
#include <random>

#include <gtest/gtest.h>

#include "crashreplay/bisect/bisect.h"
#include "test_util.h"

namespace crashreplay::bisect {
namespace {

using testing::Failure;
using testing::FakeRunner;
using testing::Key;
using testing::Keys;
using testing::On;

int Log2Ceil(size_t n) { return static_cast<int>(std::ceil(std::log2(static_cast<double>(n)))); }

struct Searched {
  BisectReport report;
  int runs = 0;
};

Searched Bisect(FakeRunner::Fn fn, int n, SchedulerOptions so = {}) {
  FakeRunner runner(std::move(fn));
  Scheduler scheduler(runner, so);
  auto [good, bad] = Keys(n);
  BisectOptions o;
  o.good = good;
  o.bad = bad;
  Searched r;
  r.report = RunBisect(scheduler, o, nullptr);
  r.runs = runner.runs();
  return r;
}

std::set<std::string> Names(std::initializer_list<int> keys) {
  std::set<std::string> s;
  for (int k : keys) s.insert(Key(k));
  return s;
}

TEST(SearchCost, SingleCulpritCostsCeilLog2NPlusOneTrialsAfterTheChecks) {
  for (int n : {8, 9, 12, 16, 31, 32, 33, 64, 100, 128}) {
    int worst = 0;
    for (int c = 0; c < n; ++c) {
      const std::string culprit = Key(c);
      Searched r = Bisect(
          [&](const Config& cfg, int) -> std::optional<FailureSignature> {
            if (On(cfg, culprit)) return Failure(FailureClass::kOther, "exit 1");
            return std::nullopt;
          },
          n);
      ASSERT_EQ(r.report.status, BisectStatus::kCulpritFound) << "n=" << n << " culprit " << culprit;
      EXPECT_EQ(testing::CulpritNames(r.report), (std::set<std::string>{culprit}));
      EXPECT_TRUE(r.report.culprit_minimal);
      worst = std::max(worst, r.report.trials);
      // Confirmation reruns the good configuration and the culprit; it adds
      // runs, never trials.
      EXPECT_EQ(r.runs, r.report.trials + 2 * kDefaultConfirmRuns);
    }
    std::printf("[ counts   ] single culprit, n=%3d: worst %2d trials (2 checks + %d; ceil(log2 n) = %d)\n", n, worst,
                worst - 2, Log2Ceil(n));
    EXPECT_LE(worst - 2, Log2Ceil(n) + 1) << "n=" << n;
  }
}

TEST(SearchCost, EveryPairOfSixteenCostsAtMostFourteenTrials) {
  int worst = 0;
  for (int a = 0; a < 16; ++a) {
    for (int b = a + 1; b < 16; ++b) {
      Searched r = Bisect(
          [&](const Config& cfg, int) -> std::optional<FailureSignature> {
            if (On(cfg, Key(a)) && On(cfg, Key(b))) return Failure(FailureClass::kOther, "exit 1");
            return std::nullopt;
          },
          16);
      ASSERT_EQ(r.report.status, BisectStatus::kCulpritFound) << a << "," << b;
      EXPECT_EQ(testing::CulpritNames(r.report), Names({a, b}));
      EXPECT_TRUE(r.report.culprit_minimal);
      worst = std::max(worst, r.report.trials);
    }
  }
  std::printf("[ counts   ] any pair of 16: worst %d trials (checks included)\n", worst);
  EXPECT_LE(worst, 14);
}

TEST(SearchCost, EveryTripleOfTwentyIsFoundInOKLogNTrials) {
  int worst = 0;
  for (int a = 0; a < 20; ++a)
    for (int b = a + 1; b < 20; ++b)
      for (int c = b + 1; c < 20; ++c) {
        Searched r = Bisect(
            [&](const Config& cfg, int) -> std::optional<FailureSignature> {
              if (On(cfg, Key(a)) && On(cfg, Key(b)) && On(cfg, Key(c))) return Failure(FailureClass::kOther, "exit 1");
              return std::nullopt;
            },
            20);
        ASSERT_EQ(r.report.status, BisectStatus::kCulpritFound);
        ASSERT_EQ(testing::CulpritNames(r.report), Names({a, b, c}));
        worst = std::max(worst, r.report.trials);
      }
  std::printf("[ counts   ] any triple of 20: worst %d trials\n", worst);
  // Three prefix searches of ceil(log2 20) = 5, a check of the needed set
  // after each, and the removals of 1-minimality, plus the two checks.
  EXPECT_LE(worst, 2 + 3 * (Log2Ceil(20) + 1) + 3);
}

TEST(SearchCost, ParallelProbesFindTheSameCulprit) {
  std::mt19937 rng(7);
  for (int iter = 0; iter < 60; ++iter) {
    const int n = 4 + static_cast<int>(rng() % 40);
    std::set<int> culprit;
    const size_t k = 1 + rng() % 3;
    while (culprit.size() < k) culprit.insert(static_cast<int>(rng() % n));
    auto fn = [&](const Config& cfg, int) -> std::optional<FailureSignature> {
      for (int c : culprit)
        if (!On(cfg, Key(c))) return std::nullopt;
      return Failure(FailureClass::kOther, "exit 1");
    };
    SchedulerOptions one, four;
    four.jobs = 4;
    Searched a = Bisect(fn, n, one), b = Bisect(fn, n, four);
    ASSERT_EQ(a.report.status, BisectStatus::kCulpritFound);
    EXPECT_EQ(a.report.culprit, b.report.culprit) << "n=" << n;
    EXPECT_EQ(b.report.status, BisectStatus::kCulpritFound);
  }
}

TEST(SearchCost, TenThousandKeysAreSearchedInFewTrials) {
  Searched r = Bisect(
      [](const Config& cfg, int) -> std::optional<FailureSignature> {
        if (On(cfg, Key(7321))) return Failure(FailureClass::kOom, "cuda");
        if (On(cfg, Key(1234)) && On(cfg, Key(9876))) return Failure(FailureClass::kDeviceAssert);
        return std::nullopt;
      },
      10000);
  ASSERT_EQ(r.report.status, BisectStatus::kCulpritFound) << r.report.message;
  EXPECT_EQ(testing::CulpritNames(r.report), Names({7321}));
  EXPECT_LE(r.report.trials, Log2Ceil(10000) + 3);
}

}  // namespace
}  // namespace crashreplay::bisect
