// Threshold search and first-failing-step search over real trial scripts.
#include <cmath>

#include <gtest/gtest.h>

#include "crashreplay/bisect/first_step.h"
#include "crashreplay/bisect/threshold.h"
#include "test_util.h"

namespace crashreplay::bisect {
namespace {

using testing::TempDir;
using testing::WriteTrialScript;

TEST(Threshold, FindsTheHighestPassingFloatToThePrecision) {
  TempDir dir;
  // Fails (OOM at graph capture) above 0.9123.
  const std::string script = WriteTrialScript(
      dir, "mem.sh",
      "awk -v m=\"$(val mem_fraction_static)\" 'BEGIN{exit !(m > 0.9123)}' || exit 0\n"
      "echo '{\"class\":\"oom\",\"stage\":\"graph_capture\"}' > \"$CRASHREPLAY_SIGNATURE_OUT\"\nexit 1");
  CommandTrialRunner runner({{script}, {}, dir.path(), {}});
  Scheduler s(runner, {});
  Config base;
  base["mem_fraction_static"] = ConfigValue::Float(0.5);
  ThresholdOptions o;
  o.toggle = "mem_fraction_static";
  o.pass_value = 0.5;
  o.fail_value = 1.0;
  o.precision = 0.001;
  auto r = ThresholdSearch(s, base, o);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r->bracketed) << r->note;
  EXPECT_LE(r->last_pass, 0.9123);
  EXPECT_GT(r->first_fail, 0.9123);
  EXPECT_LE(r->first_fail - r->last_pass, 0.001);
  EXPECT_EQ(r->fail_signature.failure_class, FailureClass::kOom);
  // Binary search: log2(0.5 / 0.001) ~ 9 probes plus the two ends.
  EXPECT_LE(r->probes, 2 + 9);
  std::printf("[ counts   ] threshold 0.5..1.0 to 0.001: %d probes\n", r->probes);
}

TEST(Threshold, IntegerToggleWithParallelProbes) {
  TempDir dir;
  const std::string script =
      WriteTrialScript(dir, "bs.sh", "[ \"$(val cuda_graph_max_bs)\" -ge 161 ] && exit 1\nexit 0");
  CommandTrialRunner runner({{script}, {}, dir.path(), {}});
  SchedulerOptions so;
  so.jobs = 3;
  Scheduler s(runner, so);
  ThresholdOptions o;
  o.toggle = "cuda_graph_max_bs";
  o.pass_value = 1;
  o.fail_value = 512;
  o.integer = true;
  auto r = ThresholdSearch(s, Config{}, o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->last_pass, 160);
  EXPECT_EQ(r->first_fail, 161);
}

TEST(Threshold, NoBracketIsReportedNotInvented) {
  TempDir dir;
  const std::string script = WriteTrialScript(dir, "ok.sh", "exit 0");
  CommandTrialRunner runner({{script}, {}, dir.path(), {}});
  Scheduler s(runner, {});
  ThresholdOptions o;
  o.toggle = "x";
  o.pass_value = 0;
  o.fail_value = 1;
  auto r = ThresholdSearch(s, Config{}, o);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->bracketed);
  EXPECT_NE(r->note.find("no bracket"), std::string::npos);
}

std::string StepScript(const TempDir& dir) {
  // From step 37 on, every step fails with the target assert; step 20 alone
  // fails differently (a one-off OOM that must not be taken for the target).
  return WriteTrialScript(
      dir, "step.sh",
      "[ \"$CRASHREPLAY_STEP\" = \"$1\" ] || exit 2\n"
      "if [ \"$CRASHREPLAY_STEP\" -eq 20 ]; then echo '{\"class\":\"oom\"}' > \"$CRASHREPLAY_SIGNATURE_OUT\"; exit 1; "
      "fi\n"
      "[ \"$CRASHREPLAY_STEP\" -ge 37 ] || exit 0\n"
      "echo '{\"class\":\"device_assert\",\"kernel\":\"topk\"}' > \"$CRASHREPLAY_SIGNATURE_OUT\"\nexit 1");
}

FailureSignature TopkAssert() {
  FailureSignature t;
  t.failure_class = FailureClass::kDeviceAssert;
  t.kernel = "topk";
  return t;
}

TEST(FirstStep, BinarySearchFindsTheFirstFailingStep) {
  TempDir dir;
  CommandTrialRunner runner({{StepScript(dir), "{step}"}, {}, dir.path(), {}});
  Scheduler s(runner, {});
  Judge judge(TopkAssert(), Config{});
  auto r = FirstFailingStep(s, judge, Config{}, 0, 100, StepSearchMode::kBinary);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r->first_fail.has_value());
  EXPECT_EQ(*r->first_fail, 37);
  EXPECT_LE(r->probes, 2 + 7);  // the two ends plus ceil(log2 100)
  std::printf("[ counts   ] first step in 0..100: %d probes\n", r->probes);
}

TEST(FirstStep, LinearScanSkipsOtherFailures) {
  TempDir dir;
  CommandTrialRunner runner({{StepScript(dir), "{step}"}, {}, dir.path(), {}});
  SchedulerOptions so;
  so.jobs = 4;
  Scheduler s(runner, so);
  Judge judge(TopkAssert(), Config{});
  auto r = FirstFailingStep(s, judge, Config{}, 15, 45, StepSearchMode::kLinear);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->first_fail, 37);
  ASSERT_EQ(judge.other_findings().size(), 1u);
  EXPECT_EQ(judge.other_findings()[0].step, 20);
  EXPECT_EQ(judge.other_findings()[0].signature.failure_class, FailureClass::kOom);
}

}  // namespace
}  // namespace crashreplay::bisect
