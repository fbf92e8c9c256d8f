// End-to-end searches over synthetic external trial commands with known
// culprits: real processes, real TOML files, the real scheduler and dd.
#include <cmath>
#include <cstdio>

#include <gtest/gtest.h>

#include "crashreplay/bisect/bisect.h"
#include "crashreplay/bisect/command_trial.h"
#include "test_util.h"

namespace crashreplay::bisect {
namespace {

using testing::BoolToggles;
using testing::CulpritNames;
using testing::ReadLines;
using testing::TempDir;
using testing::WriteTrialScript;

struct Search {
  BisectReport report;
  int invocations = 0;
};

Search RunSearch(const TempDir& dir, const std::string& script, const Config& good, const Config& bad,
                 SchedulerOptions so = {}, TrialLimits limits = {},
                 std::optional<std::string> threshold = std::nullopt) {
  CommandTrialRunner runner({{script, "{config}"}, {}, dir.path(), limits});
  Progress progress(stderr, /*live=*/false, /*quiet=*/true);
  Scheduler scheduler(runner, so, &progress);
  BisectOptions o;
  o.good = good;
  o.bad = bad;
  o.workdir = dir.path();
  o.threshold_toggle = threshold;
  o.threshold_precision = 0.001;
  Search s;
  s.report = RunBisect(scheduler, o, &progress);
  s.invocations = static_cast<int>(ReadLines(dir / "invocations.log").size());
  return s;
}

SchedulerOptions Jobs(int jobs, int repeat = 1) {
  SchedulerOptions so;
  so.jobs = jobs;
  so.repeat = repeat;
  return so;
}

int Log2Ceil(size_t n) { return static_cast<int>(std::ceil(std::log2(static_cast<double>(n)))); }

void PrintCounts(const char* what, const Search& s) {
  const size_t n = s.report.changes.size();
  std::printf("[ counts   ] %-34s n=%2zu log2(n)=%.2f trials=%d runs=%d\n", what, n, std::log2(double(n)),
              s.report.trials, s.report.runs);
  ::testing::Test::RecordProperty(std::string(what) + "_trials", s.report.trials);
}

TEST(BisectSearch, FindsOneToggleInLogarithmicTrials) {
  TempDir dir;
  const std::string script = WriteTrialScript(dir, "one.sh", "on t11 && exit 1\nexit 0");
  auto [good, bad] = BoolToggles(16);
  Search s = RunSearch(dir, script, good, bad);
  ASSERT_EQ(s.report.status, BisectStatus::kCulpritFound) << s.report.message;
  EXPECT_EQ(CulpritNames(s.report), (std::set<std::string>{"t11"}));
  EXPECT_TRUE(s.report.culprit_minimal);
  PrintCounts("one toggle of 16", s);
  // good + bad, then at most two trials per halving.
  EXPECT_LE(s.report.trials, 2 + 2 * Log2Ceil(16));
  EXPECT_EQ(s.invocations, s.report.runs);
  // The culprit file reproduces: the good configuration plus t11.
  auto culprit = ReadConfigFile(s.report.culprit_config_path);
  ASSERT_TRUE(culprit.ok());
  EXPECT_TRUE(culprit->at("t11").as_bool());
  EXPECT_FALSE(culprit->at("t3").as_bool());
  EXPECT_NE(s.report.reproduce.find("culprit.toml"), std::string::npos);
  EXPECT_NE(s.report.reproduce.find(script), std::string::npos);
}

TEST(BisectSearch, FindsAPairThatOnlyFailsTogether) {
  TempDir dir;
  const std::string script = WriteTrialScript(dir, "pair.sh", "on t3 && on t12 && exit 1\nexit 0");
  auto [good, bad] = BoolToggles(16);
  Search s = RunSearch(dir, script, good, bad);
  ASSERT_EQ(s.report.status, BisectStatus::kCulpritFound) << s.report.message;
  EXPECT_EQ(CulpritNames(s.report), (std::set<std::string>{"t3", "t12"}));
  EXPECT_TRUE(s.report.culprit_minimal);
  PrintCounts("pair of 16 (interaction)", s);
  EXPECT_LE(s.report.trials, 2 + 2 * 2 * Log2Ceil(16));  // checks + 2 k log2 n
}

TEST(BisectSearch, FindsThreeOfTwentyNeededTogether) {
  TempDir dir;
  const std::string script = WriteTrialScript(dir, "three.sh", "on t2 && on t9 && on t17 && exit 1\nexit 0");
  auto [good, bad] = BoolToggles(20);
  Search s = RunSearch(dir, script, good, bad, Jobs(2));
  ASSERT_EQ(s.report.status, BisectStatus::kCulpritFound) << s.report.message;
  EXPECT_EQ(CulpritNames(s.report), (std::set<std::string>{"t2", "t9", "t17"}));
  PrintCounts("three of 20 (jobs 2)", s);
  // Far fewer than the 2^20 subsets: within the checks + 2 k log2 n.
  EXPECT_LE(s.report.trials, 2 + 2 * 3 * Log2Ceil(20));
}

TEST(BisectSearch, ResultDoesNotDependOnParallelism) {
  TempDir d1, d2;
  const char* body = "on t1 && on t6 && exit 1\nexit 0";
  auto [good, bad] = BoolToggles(10);
  Search s1 = RunSearch(d1, WriteTrialScript(d1, "s.sh", body), good, bad, Jobs(1));
  Search s4 = RunSearch(d2, WriteTrialScript(d2, "s.sh", body), good, bad, Jobs(4));
  EXPECT_EQ(CulpritNames(s1.report), (std::set<std::string>{"t1", "t6"}));
  EXPECT_EQ(s1.report.culprit, s4.report.culprit);
  PrintCounts("pair of 10, jobs 1", s1);
  PrintCounts("pair of 10, jobs 4 (speculative)", s4);
}

TEST(BisectSearch, FlakyConfigurationsAreReportedFlakyAndNotGuessed) {
  TempDir dir;
  // t6 always fails. t1 without t6 fails every other run of the same
  // configuration (a counter file per configuration).
  const std::string script = WriteTrialScript(dir, "flaky.sh",
                                              "on t6 && exit 1\n"
                                              "if on t1; then\n"
                                              "  f=\"" + dir.path() + "/count-$(grep -v '^#' \"$cfg\" | cksum | cut -d' ' -f1)\"\n"
                                              "  n=$(cat \"$f\" 2>/dev/null || echo 0); n=$((n+1)); echo $n > \"$f\"\n"
                                              "  [ $((n % 2)) -eq 1 ] && exit 1\n"
                                              "fi\nexit 0");
  auto [good, bad] = BoolToggles(8);
  Search s = RunSearch(dir, script, good, bad, Jobs(1, 2));
  ASSERT_EQ(s.report.status, BisectStatus::kCulpritFound) << s.report.message;
  EXPECT_EQ(CulpritNames(s.report), (std::set<std::string>{"t6"}));
  int flaky = 0;
  for (const HistoryEntry& h : s.report.history) {
    if (h.result.verdict != Verdict::kFlaky) continue;
    ++flaky;
    EXPECT_TRUE(h.config.at("t1").as_bool());
    EXPECT_FALSE(h.config.at("t6").as_bool());
    EXPECT_EQ(h.result.runs, 2);
    EXPECT_EQ(h.result.bad_runs, 1);
  }
  EXPECT_GE(flaky, 1);
  EXPECT_EQ(s.report.runs, 2 * s.report.trials);
  PrintCounts("one of 8 with a flaky toggle, repeat 2", s);
}

TEST(BisectSearch, CrashBySignalIsClassifiedAndBisected) {
  TempDir dir;
  const std::string script = WriteTrialScript(dir, "segv.sh", "on t5 && kill -SEGV $$\nexit 0");
  auto [good, bad] = BoolToggles(8);
  Search s = RunSearch(dir, script, good, bad);
  ASSERT_EQ(s.report.status, BisectStatus::kCulpritFound) << s.report.message;
  EXPECT_EQ(s.report.target_signature.failure_class, FailureClass::kCrashSignal);
  EXPECT_EQ(s.report.target_signature.detail, "SIGSEGV");
  EXPECT_EQ(CulpritNames(s.report), (std::set<std::string>{"t5"}));
}

TEST(BisectSearch, HangIsClassifiedTimeoutAndBisected) {
  TempDir dir;
  const std::string script = WriteTrialScript(dir, "hang.sh", "on t2 && sleep 30\nexit 0");
  auto [good, bad] = BoolToggles(4);
  TrialLimits limits;
  limits.timeout_s = 0.4;
  limits.kill_grace_s = 0.2;
  Search s = RunSearch(dir, script, good, bad, Jobs(2), limits);
  ASSERT_EQ(s.report.status, BisectStatus::kCulpritFound) << s.report.message;
  EXPECT_EQ(s.report.target_signature.failure_class, FailureClass::kTimeout);
  EXPECT_EQ(CulpritNames(s.report), (std::set<std::string>{"t2"}));
  for (const HistoryEntry& h : s.report.history) EXPECT_LT(h.result.duration_s, 5.0);
}

TEST(BisectSearch, DifferentSignatureIsAnOtherFindingNotAReproduction) {
  TempDir dir;
  // The target: a device assert in decode when t3 is on. With the bad
  // configuration's mem_fraction_static=0.95 but t3 off, graph capture OOMs.
  const std::string script = WriteTrialScript(
      dir, "sig.sh",
      "if on t3; then\n"
      "  echo '{\"class\":\"device_assert\",\"stage\":\"decode\",\"kernel\":\"paged_decode\",\"check\":\"page_index_in_pool\",\"step\":17}' > \"$CRASHREPLAY_SIGNATURE_OUT\"\n"
      "  exit 1\n"
      "fi\n"
      "if [ \"$(val mem_fraction_static)\" = 0.95 ]; then\n"
      "  echo '{\"class\":\"oom\",\"stage\":\"graph_capture\"}' > \"$CRASHREPLAY_SIGNATURE_OUT\"\n"
      "  exit 1\n"
      "fi\nexit 0");
  auto [good, bad] = BoolToggles(6);
  good["mem_fraction_static"] = ConfigValue::Float(0.85);
  bad["mem_fraction_static"] = ConfigValue::Float(0.95);
  Search s = RunSearch(dir, script, good, bad, {}, {}, std::string("mem_fraction_static"));
  ASSERT_EQ(s.report.status, BisectStatus::kCulpritFound) << s.report.message;
  EXPECT_EQ(s.report.target_signature.failure_class, FailureClass::kDeviceAssert);
  EXPECT_EQ(s.report.target_signature.kernel, "paged_decode");
  EXPECT_EQ(CulpritNames(s.report), (std::set<std::string>{"t3"}));
  ASSERT_FALSE(s.report.other_findings.empty());
  for (const OtherFinding& f : s.report.other_findings) {
    EXPECT_EQ(f.signature.failure_class, FailureClass::kOom);
    EXPECT_EQ(f.signature.stage, FailureStage::kGraphCapture);
    EXPECT_DOUBLE_EQ(f.config.at("mem_fraction_static").as_float(), 0.95);
    EXPECT_FALSE(f.config.at("t3").as_bool());
    EXPECT_NE(f.changes.find("mem_fraction_static=0.95"), std::string::npos);
  }
  // mem_fraction_static is not in the culprit, so the threshold is searched
  // on the good configuration: everything below 0.95 passes.
  ASSERT_TRUE(s.report.threshold.has_value());
  EXPECT_TRUE(s.report.threshold->bracketed);
  EXPECT_EQ(s.report.threshold->fail_signature.failure_class, FailureClass::kOom);
  EXPECT_GE(s.report.threshold->last_pass, 0.949);
  EXPECT_DOUBLE_EQ(s.report.threshold->first_fail, 0.95);
}

TEST(BisectSearch, GoodConfigurationFailingTooStopsWithGoodFails) {
  TempDir dir;
  const std::string script = WriteTrialScript(dir, "always.sh", "exit 3");
  auto [good, bad] = BoolToggles(4);
  Search s = RunSearch(dir, script, good, bad);
  EXPECT_EQ(s.report.status, BisectStatus::kGoodFails);
  EXPECT_NE(s.report.message.find("good configuration"), std::string::npos);
  EXPECT_EQ(s.report.trials, 2);
}

TEST(BisectSearch, BadConfigurationPassingStopsWithNotReproducible) {
  TempDir dir;
  const std::string script = WriteTrialScript(dir, "never.sh", "exit 0");
  auto [good, bad] = BoolToggles(4);
  Search s = RunSearch(dir, script, good, bad);
  EXPECT_EQ(s.report.status, BisectStatus::kNotReproducible);
  EXPECT_NE(s.report.message.find("does not fail"), std::string::npos);
}

TEST(BisectSearch, AnAbortingExitCodeStopsTheSearch) {
  TempDir dir;
  // The first half tried, {t0}, exits 255: like git bisect run, that aborts.
  const std::string script = WriteTrialScript(dir, "abort.sh", "on t1 && exit 1\non t0 && exit 255\nexit 0");
  auto [good, bad] = BoolToggles(2);
  Search s = RunSearch(dir, script, good, bad);
  EXPECT_EQ(s.report.status, BisectStatus::kAborted);
  EXPECT_NE(s.report.message.find("exit code 255"), std::string::npos) << s.report.message;
  EXPECT_EQ(s.report.trials, 3);
}

TEST(BisectSearch, NoConfigurationRunsTwice) {
  TempDir dir;
  const std::string script = WriteTrialScript(dir, "pair.sh", "on t0 && on t7 && exit 1\nexit 0");
  auto [good, bad] = BoolToggles(12);
  Search s = RunSearch(dir, script, good, bad, Jobs(3));
  ASSERT_EQ(s.report.status, BisectStatus::kCulpritFound);
  const std::vector<std::string> lines = ReadLines(dir / "invocations.log");
  const std::set<std::string> distinct(lines.begin(), lines.end());
  EXPECT_EQ(distinct.size(), lines.size()) << "a configuration ran twice";
  EXPECT_EQ(static_cast<int>(lines.size()), s.report.trials);
}

}  // namespace
}  // namespace crashreplay::bisect
