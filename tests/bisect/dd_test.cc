// The delta-debugging algorithm alone, over in-process predicates: exact
// culprits for every position and size, and counts against log2(n).
#include "crashreplay/bisect/dd.h"

#include <cmath>
#include <functional>
#include <random>
#include <set>

#include <gtest/gtest.h>

namespace crashreplay::bisect {
namespace {

// Fails iff every element of `culprit` is in the set; `unresolved` decides
// sets the predicate cannot judge.
class PredicateOracle : public DeltaOracle {
 public:
  PredicateOracle(std::set<size_t> culprit, int parallelism = 1,
                  std::function<bool(const ChangeSet&)> unresolved = nullptr)
      : culprit_(std::move(culprit)), parallelism_(parallelism), unresolved_(std::move(unresolved)) {}
  std::vector<Outcome> Test(const std::vector<ChangeSet>& sets) override {
    std::vector<Outcome> out;
    for (const ChangeSet& s : sets) {
      ++tests;
      if (!judged.insert(s).second) ++repeated;
      if (unresolved_ && unresolved_(s)) {
        out.push_back(Outcome::kUnresolved);
        continue;
      }
      bool all = true;
      for (size_t c : culprit_) all = all && std::find(s.begin(), s.end(), c) != s.end();
      out.push_back(all ? Outcome::kFail : Outcome::kPass);
    }
    return out;
  }
  int parallelism() const override { return parallelism_; }
  int tests = 0;
  int repeated = 0;
  std::set<ChangeSet> judged;

 private:
  std::set<size_t> culprit_;
  int parallelism_;
  std::function<bool(const ChangeSet&)> unresolved_;
};

ChangeSet Sorted(const std::set<size_t>& s) { return ChangeSet(s.begin(), s.end()); }

TEST(DeltaDebugging, SingleCulpritAtEveryPositionInAtMostTwoLog2NTests) {
  int worst_ratio_n = 0;
  for (size_t n = 2; n <= 40; ++n) {
    int worst = 0;
    for (size_t c = 0; c < n; ++c) {
      PredicateOracle oracle({c});
      auto r = IsolateCulprit(n, oracle);
      ASSERT_TRUE(r.ok());
      EXPECT_EQ(r->culprit, ChangeSet{c}) << "n=" << n;
      EXPECT_TRUE(r->minimal);
      EXPECT_EQ(oracle.repeated, 0);
      worst = std::max(worst, oracle.tests);
    }
    EXPECT_LE(worst, 2 * static_cast<int>(std::ceil(std::log2(double(n))))) << "n=" << n;
    if (n == 32) worst_ratio_n = worst;
  }
  std::printf("[ counts   ] single culprit, n=32: worst %d tests (log2 n = 5)\n", worst_ratio_n);
}

TEST(DeltaDebugging, EveryPairThatOnlyFailsTogether) {
  const size_t n = 12;
  int worst = 0;
  for (size_t a = 0; a < n; ++a) {
    for (size_t b = a + 1; b < n; ++b) {
      PredicateOracle oracle({a, b});
      auto r = IsolateCulprit(n, oracle);
      ASSERT_TRUE(r.ok());
      EXPECT_EQ(r->culprit, (ChangeSet{a, b}));
      EXPECT_TRUE(r->minimal);
      worst = std::max(worst, oracle.tests);
    }
  }
  std::printf("[ counts   ] any pair, n=12: worst %d tests (log2 n = %.2f)\n", worst, std::log2(12.0));
  EXPECT_LE(worst, 2 * 2 * 4);  // 2 k ceil(log2 n)
}

TEST(DeltaDebugging, RandomInteractionsUpToFourAreFoundExactly) {
  std::mt19937 rng(1234);
  for (int iter = 0; iter < 200; ++iter) {
    const size_t n = 2 + rng() % 30;
    const size_t k = 1 + rng() % std::min<size_t>(4, n);
    std::set<size_t> culprit;
    while (culprit.size() < k) culprit.insert(rng() % n);
    PredicateOracle oracle(culprit);
    auto r = IsolateCulprit(n, oracle);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->culprit, Sorted(culprit)) << "n=" << n << " k=" << k;
    EXPECT_EQ(oracle.repeated, 0);
    // O(k log n): isolation, then one prefix search per further change, then
    // one removal check per change.
    const int log2n = static_cast<int>(std::ceil(std::log2(double(n))));
    EXPECT_LE(oracle.tests, 2 * log2n + static_cast<int>(k - 1) * (log2n + 1) + static_cast<int>(k) + 1)
        << "n=" << n << " k=" << k;
  }
}

TEST(DeltaDebugging, ResultIsIndependentOfParallelism) {
  std::mt19937 rng(99);
  for (int iter = 0; iter < 50; ++iter) {
    const size_t n = 2 + rng() % 24;
    std::set<size_t> culprit;
    const size_t k = 1 + rng() % std::min<size_t>(3, n);
    while (culprit.size() < k) culprit.insert(rng() % n);
    PredicateOracle one(culprit, 1), four(culprit, 4);
    auto a = IsolateCulprit(n, one);
    auto b = IsolateCulprit(n, four);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->culprit, b->culprit);
    EXPECT_EQ(a->isolated, b->isolated);
  }
}

TEST(DeltaDebugging, UnresolvedSetsAreWorkedAroundNotGuessed) {
  // Sets holding change 1 without change 6 cannot be judged (skip, flaky or
  // a different failure); the culprit is still found exactly.
  for (size_t n : {8u, 16u}) {
    PredicateOracle oracle({6}, 1, [](const ChangeSet& s) {
      const bool has1 = std::find(s.begin(), s.end(), 1) != s.end();
      const bool has6 = std::find(s.begin(), s.end(), 6) != s.end();
      return has1 && !has6;
    });
    auto r = IsolateCulprit(n, oracle);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->culprit, ChangeSet{6});
  }
}

TEST(DeltaDebugging, EverythingUnresolvedKeepsTheWholeDifferenceAndSaysSo) {
  PredicateOracle oracle({0, 1, 2, 3}, 1, [](const ChangeSet& s) { return s.size() != 4; });
  auto r = IsolateCulprit(4, oracle);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->culprit, (ChangeSet{0, 1, 2, 3}));
  EXPECT_FALSE(r->minimal);
}

TEST(DeltaDebugging, MinimizeFailingKeepsTheFixedPartOutOfTheResult) {
  PredicateOracle oracle({2, 5});
  bool unresolved = true;
  auto m = MinimizeFailing({0, 1, 2, 3, 4}, {5}, 2, oracle, &unresolved);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(*m, ChangeSet{2});
  EXPECT_FALSE(unresolved);
}

class StoppingOracle : public PredicateOracle {
 public:
  using PredicateOracle::PredicateOracle;
  bool stopped() const override { return tests >= 3; }
};

TEST(DeltaDebugging, StoppedOracleCancelsTheSearch) {
  StoppingOracle oracle({7});
  auto r = IsolateCulprit(16, oracle);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled);
}

}  // namespace
}  // namespace crashreplay::bisect
