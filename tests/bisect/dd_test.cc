// The isolation algorithm alone, over in-process predicates: exact culprits
// for every position and size, counts against log2(n), unresolved and
// contradictory outcomes.
#include "crashreplay/bisect/dd.h"

#include <cmath>
#include <functional>
#include <random>
#include <set>

#include <gtest/gtest.h>

namespace crashreplay::bisect {
namespace {

bool Has(const ChangeSet& s, size_t x) { return std::find(s.begin(), s.end(), x) != s.end(); }

// Fails iff every element of `culprit` is in the set; `override_fn` may
// decide a set otherwise (unresolved, another failure).
class PredicateOracle : public DeltaOracle {
 public:
  PredicateOracle(std::set<size_t> culprit, int parallelism = 1,
                  std::function<std::optional<Outcome>(const ChangeSet&)> override_fn = nullptr)
      : culprit_(std::move(culprit)), parallelism_(parallelism), override_(std::move(override_fn)) {}
  std::vector<Outcome> Test(const std::vector<ChangeSet>& sets) override {
    std::vector<Outcome> out;
    for (const ChangeSet& s : sets) {
      ++tests;
      if (!judged.insert(s).second) ++repeated;
      out.push_back(Judge(s));
    }
    return out;
  }
  std::vector<Outcome> Confirm(const std::vector<ChangeSet>& sets) override {
    confirmed.insert(confirmed.end(), sets.begin(), sets.end());
    std::vector<Outcome> out;
    for (const ChangeSet& s : sets) out.push_back(ConfirmOne(s));
    return out;
  }
  int parallelism() const override { return parallelism_; }
  int tests = 0;
  int repeated = 0;
  std::set<ChangeSet> judged;
  std::vector<ChangeSet> confirmed;

 protected:
  virtual Outcome ConfirmOne(const ChangeSet& s) { return Judge(s); }
  Outcome Judge(const ChangeSet& s) {
    if (override_) {
      if (auto o = override_(s)) return *o;
    }
    bool all = true;
    for (size_t c : culprit_) all = all && Has(s, c);
    return all ? Outcome::kFail : Outcome::kPass;
  }

 private:
  std::set<size_t> culprit_;
  int parallelism_;
  std::function<std::optional<Outcome>(const ChangeSet&)> override_;
};

int Log2Ceil(size_t n) { return n <= 1 ? 0 : static_cast<int>(std::ceil(std::log2(double(n)))); }

TEST(Isolation, SingleCulpritAtEveryPositionInCeilLog2NPlusOneSets) {
  for (size_t n = 1; n <= 130; ++n) {
    int worst = 0;
    for (size_t c = 0; c < n; ++c) {
      PredicateOracle oracle({c});
      const DdResult r = IsolateCulprit(n, oracle);
      ASSERT_TRUE(r.complete);
      EXPECT_EQ(r.culprit, ChangeSet{c}) << "n=" << n;
      EXPECT_TRUE(r.minimal);
      EXPECT_TRUE(r.confirmed);
      EXPECT_FALSE(r.contradicted);
      EXPECT_EQ(oracle.repeated, 0);
      worst = std::max(worst, oracle.tests);
    }
    // ceil(log2 n) probes find it, one more judges it alone (unless the
    // last probe already did).
    EXPECT_LE(worst, Log2Ceil(n) + 1) << "n=" << n;
  }
}

TEST(Isolation, TheDecisiveSetsAreConfirmed) {
  PredicateOracle oracle({3, 9});
  const DdResult r = IsolateCulprit(16, oracle);
  ASSERT_EQ(r.culprit, (ChangeSet{3, 9}));
  const std::set<ChangeSet> confirmed(oracle.confirmed.begin(), oracle.confirmed.end());
  EXPECT_EQ(confirmed, (std::set<ChangeSet>{{}, {3, 9}, {3}, {9}}));
  EXPECT_EQ(r.confirmations, 4);
}

TEST(Isolation, EveryPairThatOnlyFailsTogether) {
  const size_t n = 16;
  int worst = 0;
  for (size_t a = 0; a < n; ++a) {
    for (size_t b = a + 1; b < n; ++b) {
      PredicateOracle oracle({a, b});
      const DdResult r = IsolateCulprit(n, oracle);
      EXPECT_EQ(r.culprit, (ChangeSet{a, b}));
      EXPECT_TRUE(r.minimal);
      worst = std::max(worst, oracle.tests);
    }
  }
  std::printf("[ counts   ] any pair, n=16: worst %d sets (log2 n = 4)\n", worst);
  EXPECT_LE(worst, 12);  // + the good and bad checks: 14
}

TEST(Isolation, RandomInteractionsUpToFourAreFoundExactly) {
  std::mt19937 rng(1234);
  for (int iter = 0; iter < 300; ++iter) {
    const size_t n = 2 + rng() % 60;
    const size_t k = 1 + rng() % std::min<size_t>(4, n);
    std::set<size_t> culprit;
    while (culprit.size() < k) culprit.insert(rng() % n);
    PredicateOracle oracle(culprit);
    const DdResult r = IsolateCulprit(n, oracle);
    EXPECT_EQ(r.culprit, ChangeSet(culprit.begin(), culprit.end())) << "n=" << n << " k=" << k;
    EXPECT_EQ(oracle.repeated, 0);
    // Per needed change: one prefix search and one check of the needed set;
    // then one removal per change.
    const int log2n = Log2Ceil(n);
    EXPECT_LE(oracle.tests, static_cast<int>(k) * (log2n + 1) + static_cast<int>(k)) << "n=" << n << " k=" << k;
  }
}

TEST(Isolation, ResultIsIndependentOfParallelism) {
  std::mt19937 rng(99);
  for (int iter = 0; iter < 80; ++iter) {
    const size_t n = 2 + rng() % 40;
    std::set<size_t> culprit;
    const size_t k = 1 + rng() % std::min<size_t>(3, n);
    while (culprit.size() < k) culprit.insert(rng() % n);
    PredicateOracle one(culprit, 1), four(culprit, 4);
    EXPECT_EQ(IsolateCulprit(n, one).culprit, IsolateCulprit(n, four).culprit);
  }
}

TEST(Isolation, AUniverseSubsetIsSearchedAlone) {
  // Another finding's own search: only the changes of the configuration that
  // failed that way.
  PredicateOracle oracle({21});
  const DdResult r = IsolateCulprit(ChangeSet{2, 5, 8, 13, 21, 34}, oracle);
  EXPECT_EQ(r.culprit, ChangeSet{21});
  for (const ChangeSet& s : oracle.judged)
    for (size_t x : s) EXPECT_TRUE(x == 2 || x == 5 || x == 8 || x == 13 || x == 21 || x == 34);
}

TEST(Isolation, UnresolvedSetsAreSteppedAroundNotGuessed) {
  // Sets holding change 1 without change 6 cannot be judged (skipped).
  for (size_t n : {8u, 16u, 64u}) {
    PredicateOracle oracle({6}, 1, [](const ChangeSet& s) -> std::optional<Outcome> {
      if (Has(s, 1) && !Has(s, 6)) return Outcome::kUnresolved;
      return std::nullopt;
    });
    const DdResult r = IsolateCulprit(n, oracle);
    EXPECT_EQ(r.culprit, ChangeSet{6}) << n;
    EXPECT_TRUE(r.confirmed);
  }
}

TEST(Isolation, AnotherFailureCountsAsNotTheTarget) {
  // Change 4 alone makes another bug fire; the target needs change 11.
  PredicateOracle oracle({11}, 1, [](const ChangeSet& s) -> std::optional<Outcome> {
    if (Has(s, 4) && !Has(s, 11)) return Outcome::kOther;
    return std::nullopt;
  });
  const DdResult r = IsolateCulprit(16, oracle);
  EXPECT_EQ(r.culprit, ChangeSet{11});
  EXPECT_TRUE(r.minimal);
}

TEST(Isolation, EverythingUnresolvedIsNotConfirmed) {
  PredicateOracle oracle({0, 1, 2, 3}, 1, [](const ChangeSet& s) -> std::optional<Outcome> {
    if (s.size() != 4 && !s.empty()) return Outcome::kUnresolved;
    return std::nullopt;
  });
  const DdResult r = IsolateCulprit(4, oracle);
  EXPECT_TRUE(r.complete);
  EXPECT_FALSE(r.minimal);
}

// A set that fails only on some runs: the first judgment says pass, the
// confirmation's runs disagree.
class FlakyOracle : public PredicateOracle {
 public:
  FlakyOracle(std::set<size_t> culprit, std::set<ChangeSet> flaky_pass)
      : PredicateOracle(std::move(culprit)), flaky_(std::move(flaky_pass)) {}
  std::vector<Outcome> Test(const std::vector<ChangeSet>& sets) override {
    std::vector<Outcome> out = PredicateOracle::Test(sets);
    for (size_t i = 0; i < sets.size(); ++i)
      if (flaky_.count(sets[i])) out[i] = Outcome::kPass;  // the failing set passed this time
    return out;
  }

 protected:
  Outcome ConfirmOne(const ChangeSet& s) override { return flaky_.count(s) ? Outcome::kUnresolved : Judge(s); }

 private:
  std::set<ChangeSet> flaky_;
};

TEST(Isolation, AContradictionIsConfirmedAndAFlakySetIsReported) {
  // {5} fails, but {0..7} passed once: a failing set inside a passing one.
  ChangeSet first_half = {0, 1, 2, 3, 4, 5, 6, 7};
  FlakyOracle oracle({5}, {first_half});
  const DdResult r = IsolateCulprit(16, oracle);
  EXPECT_TRUE(r.contradicted);
  EXPECT_NE(std::find(oracle.confirmed.begin(), oracle.confirmed.end(), first_half), oracle.confirmed.end());
}

class StoppingOracle : public PredicateOracle {
 public:
  using PredicateOracle::PredicateOracle;
  bool stopped() const override { return tests >= 3; }
};

TEST(Isolation, AStoppedSearchReturnsItsCandidates) {
  StoppingOracle oracle({7});
  const DdResult r = IsolateCulprit(16, oracle);
  EXPECT_FALSE(r.complete);
  EXPECT_FALSE(r.confirmed);
  EXPECT_TRUE(Has(r.candidates, 7));
  EXPECT_LT(r.candidates.size(), 16u);
}

}  // namespace
}  // namespace crashreplay::bisect
