// Flaky trials, with counting oracles whose verdicts depend on a seeded
// random draw per run: the search must end with the true culprit or with a
// status that claims none, never with a wrong culprit. Many seeds, in
// process (the end-to-end oracle scripts run 20 seeds through real
// processes, search_test.cc).
#include <cstdio>
#include <functional>
#include <map>

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

// A uniform draw in [0, 1) fixed by (seed, configuration, run number).
double Draw(uint64_t seed, const Config& c, int run) {
  uint64_t h = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(run) * 0xBF58476D1CE4E5B9ull;
  for (char ch : FormatConfig(c)) h = (h ^ static_cast<unsigned char>(ch)) * 0x100000001B3ull;
  h ^= h >> 31;
  h *= 0x94D049BB133111EBull;
  h ^= h >> 29;
  return static_cast<double>(h >> 11) / static_cast<double>(1ull << 53);
}

struct FlakyCase {
  const char* name;
  int n;
  std::set<std::string> culprit;
  std::function<std::optional<FailureSignature>(const Config&, double draw)> fn;
};

const FailureSignature kTarget = Failure(FailureClass::kDeviceAssert);

std::vector<FlakyCase> Cases() {
  // clang-format off: a table, one case a line or two as written
  return {
      {"noise: k001 fails half the time the way k005 always does", 8, {Key(5)},
       [](const Config& c, double d) -> std::optional<FailureSignature> {
         if (On(c, Key(5)) || (On(c, Key(1)) && d < 0.5)) return kTarget;
         return std::nullopt;
       }},
      {"intermittent: k005 fails half the time", 8, {Key(5)},
       [](const Config& c, double d) -> std::optional<FailureSignature> {
         if (On(c, Key(5)) && d < 0.5) return kTarget;
         return std::nullopt;
       }},
      {"intermittent: k011 fails 80% of the time", 16, {Key(11)},
       [](const Config& c, double d) -> std::optional<FailureSignature> {
         if (On(c, Key(11)) && d < 0.8) return kTarget;
         return std::nullopt;
       }},
      {"background: any configuration fails 10% of the time", 16, {Key(9)},
       [](const Config& c, double d) -> std::optional<FailureSignature> {
         if (On(c, Key(9)) || d < 0.1) return kTarget;
         return std::nullopt;
       }},
      {"intermittent pair: k003 and k009 fail together 60% of the time", 16, {Key(3), Key(9)},
       [](const Config& c, double d) -> std::optional<FailureSignature> {
         if (On(c, Key(3)) && On(c, Key(9)) && d < 0.6) return kTarget;
         return std::nullopt;
       }},
      {"another bug, flaky: k002 fails half the time with an OOM", 16, {Key(9)},
       [](const Config& c, double d) -> std::optional<FailureSignature> {
         if (On(c, Key(9))) return kTarget;
         if (On(c, Key(2)) && d < 0.5) return Failure(FailureClass::kOom, "cuda");
         return std::nullopt;
       }},
  };
  // clang-format on
}

TEST(Flaky, NoSeedEverEndsWithAWrongCulprit) {
  constexpr int kSeeds = 500;
  for (int repeat : {1, 3}) {
    for (const FlakyCase& fc : Cases()) {
      std::map<std::string, int> outcomes;
      for (int seed = 0; seed < kSeeds; ++seed) {
        FakeRunner runner(
            [&](const Config& c, int run) { return fc.fn(c, Draw(static_cast<uint64_t>(seed), c, run)); });
        SchedulerOptions so;
        so.repeat = repeat;
        Scheduler scheduler(runner, so);
        auto [good, bad] = Keys(fc.n);
        BisectOptions o;
        o.good = good;
        o.bad = bad;
        const BisectReport r = RunBisect(scheduler, o, nullptr);
        std::string outcome(BisectStatusName(r.status));
        if (r.status == BisectStatus::kCulpritFound) {
          const bool right = testing::CulpritNames(r) == fc.culprit;
          EXPECT_TRUE(right) << fc.name << ", repeat " << repeat << ", seed " << seed << ": " << r.message;
          outcome = right ? "right culprit" : "WRONG culprit";
        }
        ++outcomes[outcome];
      }
      std::string line;
      for (const auto& [k, v] : outcomes) line += " " + k + "=" + std::to_string(v);
      std::printf("[ flaky    ] repeat %d, %-62s:%s\n", repeat, fc.name, line.c_str());
    }
  }
}

TEST(Flaky, ADeterministicSearchNeverReportsFlaky) {
  FakeRunner runner([](const Config& c, int) -> std::optional<FailureSignature> {
    if (On(c, Key(3)) && On(c, Key(12))) return kTarget;
    if (On(c, Key(7))) return Failure(FailureClass::kOom, "cuda");
    return std::nullopt;
  });
  Scheduler scheduler(runner, {});
  auto [good, bad] = Keys(16);
  BisectOptions o;
  o.good = good;
  o.bad = bad;
  const BisectReport r = RunBisect(scheduler, o, nullptr);
  EXPECT_EQ(r.status, BisectStatus::kCulpritFound) << r.message;
  EXPECT_TRUE(r.flaky.empty());
}

}  // namespace
}  // namespace crashreplay::bisect
