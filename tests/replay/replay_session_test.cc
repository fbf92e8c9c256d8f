// Record a run in memory, then replay a step: same configuration reproduces
// bit for bit; a configuration that breaks a precondition fails with its
// signature; a configuration with another reduction order diverges at the
// first kernel that computes differently.
#include <gtest/gtest.h>

#include <optional>

#include "crashreplay/replay/session/replay_session.h"
#include "engine_test_util.h"

namespace crashreplay::replay {
namespace {

using testing::MakeEngine;
using testing::TwoRequests;

std::vector<RecordedStep> Record(const MakeModelOptions& o, const std::vector<std::string>& sets, int threads = 1) {
  auto e = MakeEngine(o, sets, threads);
  StepLogRecorder rec;
  auto reqs = TwoRequests(4);
  for (auto& q : reqs) q.prompt.insert(q.prompt.end(), 40, 'x');
  e->Run(reqs, &rec);
  return rec.steps();
}

MakeModelOptions Glm() {
  MakeModelOptions o;
  o.arch = "glm4_moe";
  o.quant = "nvfp4";
  return o;
}

TEST(ReplayStep, SameConfigurationReproducesEveryStepOnAnyThreadCount) {
  const auto log = Record(Glm(), {"tp_size=2"});
  ASSERT_EQ(log.size(), 4u);
  for (int threads : {1, 2}) {
    for (int64_t step = 0; step < 4; ++step) {
      auto e = MakeEngine(Glm(), {"tp_size=2"}, threads);
      ReplayReport r = ReplayStep(*e, log, step);
      EXPECT_EQ(r.outcome, "reproduced") << "step " << step << ": " << r.detail;
      EXPECT_EQ(r.digest, *log[step].digest);
    }
  }
}

// The determinism bar of the replay issue: 20 replays on 1 thread and 20 on
// 2 threads (the CpuPool size `--threads` sets) of a decode step of a
// tensor-parallel NVFP4 MoE capture, each on a fresh engine that rebuilds
// the state by re-execution, are bitwise equal: the step digest, and every
// kernel's output digest and statistics.
TEST(ReplayStep, TwentyReplaysOnOneAndOnTwoThreadsAreBitwiseEqual) {
  const std::vector<std::string> sets = {"tp_size=2"};
  const auto log = Record(Glm(), sets);
  ASSERT_GE(log.size(), 3u);
  std::optional<ReplayReport> first;
  for (int threads : {1, 2}) {
    for (int i = 0; i < 20; ++i) {
      auto e = MakeEngine(Glm(), sets, threads);
      ReplayReport r = ReplayStep(*e, log, 2);
      ASSERT_EQ(r.outcome, "reproduced") << "threads " << threads << " replay " << i << ": " << r.detail;
      ASSERT_EQ(r.digest, *log[2].digest);
      if (!first) {
        first = r;
        continue;
      }
      ASSERT_EQ(r.kernels.size(), first->kernels.size());
      for (size_t k = 0; k < r.kernels.size(); ++k) {
        const KernelRecord &a = r.kernels[k], &b = first->kernels[k];
        ASSERT_EQ(a.label, b.label);
        EXPECT_EQ(a.digest, b.digest) << a.label << ", threads " << threads << " replay " << i;
        EXPECT_EQ(a.nan, b.nan) << a.label;
        EXPECT_EQ(a.inf, b.inf) << a.label;
        // Statistics are computed from the same bytes in the same order.
        EXPECT_EQ(a.min, b.min) << a.label;
        EXPECT_EQ(a.max, b.max) << a.label;
        EXPECT_EQ(a.mean_abs, b.mean_abs) << a.label;
      }
    }
  }
  // Every kernel that has a recorded digest matches it too.
  ASSERT_EQ(log[2].kernel_digests.size(), first->kernels.size());
  for (size_t k = 0; k < first->kernels.size(); ++k) {
    EXPECT_EQ(log[2].kernel_digests[k].first, first->kernels[k].label);
    EXPECT_EQ(log[2].kernel_digests[k].second, first->kernels[k].digest) << first->kernels[k].label;
  }
}

TEST(ReplayStep, Paged64UnderSmallPagesReproducesPrefillAndFailsInDecode) {
  const auto log = Record(Glm(), {});
  auto e0 = MakeEngine(Glm(), {"attention_backend=paged64"});
  ReplayReport pre = ReplayStep(*e0, log, 0);
  EXPECT_EQ(pre.outcome, "reproduced") << pre.detail;  // prefill runs the reference kernel
  auto e1 = MakeEngine(Glm(), {"attention_backend=paged64"});
  ReplayReport dec = ReplayStep(*e1, log, 1);
  EXPECT_EQ(dec.outcome, "failed");
  ASSERT_TRUE(dec.fault);
  EXPECT_EQ(dec.fault->Signature(), "assert/decode/attention/page_size_is_64");
  EXPECT_EQ(dec.kernels.back().label, "L0.attention");
  EXPECT_TRUE(dec.kernels.back().failed);
}

TEST(ReplayStep, FlashDecodeDivergesAtTheFirstDecodeAttention) {
  const auto log = Record(Glm(), {});
  auto e = MakeEngine(Glm(), {"attention_backend=flashdecode"});
  ReplayReport r = ReplayStep(*e, log, 1);
  EXPECT_EQ(r.outcome, "diverged");
  EXPECT_EQ(r.diverged_step, 1);
  EXPECT_EQ(r.diverged_kernel, "L0.attention");
}

TEST(ReplayStep, RecordedFailureFiresAgainAndAGoodConfigurationRunsClean) {
  const auto log = Record(Glm(), {"attention_backend=paged64"});
  ASSERT_EQ(log.size(), 2u);
  ASSERT_TRUE(log[1].fault);
  auto bad = MakeEngine(Glm(), {"attention_backend=paged64"});
  ReplayReport r = ReplayStep(*bad, log, 1);
  EXPECT_EQ(r.outcome, "failed") << r.detail;
  EXPECT_TRUE(r.matches_recorded_failure);
  ASSERT_TRUE(r.fault);
  EXPECT_EQ(r.fault->Signature(), "assert/decode/attention/page_size_is_64");
  auto good = MakeEngine(Glm(), {"attention_backend=paged64", "page_size=64"});
  ReplayReport g = ReplayStep(*good, log, 1);
  EXPECT_EQ(g.outcome, "reproduced") << g.detail;  // ran clean where the recording failed
  EXPECT_FALSE(g.fault);
}

TEST(ReplayStep, StopAfterAKernelLeavesTheRestUnrun) {
  const auto log = Record(Glm(), {});
  auto e = MakeEngine(Glm(), {});
  ReplayReport r = ReplayStep(*e, log, 1, "L1.topk");
  EXPECT_EQ(r.outcome, "reproduced");
  EXPECT_EQ(r.kernels.back().label, "L1.topk");
  auto trace = ChromeTrace(r.kernels, 1);
  EXPECT_EQ(trace["traceEvents"].size(), r.kernels.size());
}

}  // namespace
}  // namespace crashreplay::replay
