// The built-in trial path: replay's JSON contract (issue 3) read back into
// verdicts and signatures. Fixtures stand in for `crashreplay replay --json`
// until the replay command exists.
#include "crashreplay/bisect/replay_trial.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace crashreplay::bisect {
namespace {

using testing::ReadFile;
using testing::TempDir;
using testing::WriteFile;

ProcessResult Exited(int code, const std::string& stdout_text) {
  ProcessResult p;
  p.started = true;
  p.exited = true;
  p.exit_code = code;
  p.stdout_text = stdout_text;
  return p;
}

constexpr char kKernels[] =
    R"([{"name":"embedding","layer":-1,"numel":64,"nan_count":0,"inf_count":0,"digest":"aa","max_abs":1.0},
        {"name":"attention","layer":0,"numel":64,"nan_count":3,"inf_count":0,"digest":"bb","max_abs":2.0}])";

TEST(ReplayOutput, ReproducedIsGoodAndKeepsTheKernelTable) {
  TrialResult r = InterpretReplayOutput(
      Exited(0, std::string(R"({"outcome":"reproduced","step":3,"digest":"ff","kernels":)") + kKernels + "}"), {});
  EXPECT_EQ(r.verdict, Verdict::kGood);
  ASSERT_EQ(r.kernels.size(), 2u);
  EXPECT_EQ(r.kernels[1].nan_count, 3);
}

TEST(ReplayOutput, ExitSevenIsUntestableNeverGoodOrBad) {
  // replay --engine vllm on a machine without a GPU, or device=cuda without one.
  TrialResult r = InterpretReplayOutput(
      Exited(7, R"({"outcome":"untestable","engine":"vllm","refused":"vLLM runs its model only on a GPU here"})"), {});
  EXPECT_EQ(r.verdict, Verdict::kSkip);
  EXPECT_NE(r.note.find("untestable here: vLLM runs its model only on a GPU here"), std::string::npos) << r.note;
  TrialResult bare = InterpretReplayOutput(Exited(7, ""), {});
  EXPECT_EQ(bare.verdict, Verdict::kSkip);
}

TEST(ReplayOutput, ARealEngineReplayPutsBothEnginesOutcomesAndTheDivergenceBeside) {
  TrialResult r = InterpretReplayOutput(Exited(1, R"({"outcome":"failed","step":6,"engine":"transformers","kernels":[],
      "signature":{"class":"non_finite","stage":"decode","kernel":"sampler","check":"probabilities"},
      "exact":{"outcome":"diverged"},
      "engine_divergence":{"boundary":"L2.attention","reason":"the engine has 256 NaN where the reference is finite"}})"),
                                        {});
  EXPECT_EQ(r.verdict, Verdict::kBad);
  EXPECT_EQ(r.signature.kernel, "sampler");
  EXPECT_EQ(r.engines,
            "transformers: failed (non_finite during decode at sampler/probabilities); exact engine: diverged; "
            "departs from the exact engine at L2.attention: the engine has 256 NaN where the reference is finite")
      << r.engines;
  TrialResult exact_only = InterpretReplayOutput(Exited(0, R"({"outcome":"reproduced","step":1,"kernels":[]})"), {});
  EXPECT_EQ(exact_only.engines, "");
}

TEST(ReplayOutput, FailedCarriesReplaysSignatureAndStep) {
  TrialResult r = InterpretReplayOutput(Exited(1, R"({"outcome":"failed","step":17,"kernels":[],
                    "signature":{"class":"device_assert","stage":"decode","kernel":"paged_decode","check":"page_index_in_pool"}})"),
                                        {});
  EXPECT_EQ(r.verdict, Verdict::kBad);
  EXPECT_EQ(r.signature.failure_class, FailureClass::kDeviceAssert);
  EXPECT_EQ(r.signature.kernel, "paged_decode");
  EXPECT_EQ(r.signature.check, "page_index_in_pool");
  EXPECT_EQ(r.signature.step, 17);
}

TEST(ReplayOutput, AFaultWhileReexecutingAnEarlierStepNamesThatStepAndItsKernelTable) {
  // replay --step 3 under another configuration failed in step 0, which it
  // re-executed to rebuild step 3's state: the kernels it printed are step 0's.
  TrialResult r = InterpretReplayOutput(Exited(1, std::string(R"({"outcome":"failed","step":3,"kernels":)") + kKernels +
                                                      R"(,"fault":{"step":0,"layer":0},
                    "signature":{"class":"device_assert","stage":"prefill","kernel":"q_proj","check":"ue8m0_scale_layout"}})"),
                                        {});
  EXPECT_EQ(r.verdict, Verdict::kBad);
  EXPECT_EQ(r.signature.step, 0);
  EXPECT_EQ(r.kernels_step, 0);
  TrialResult good = InterpretReplayOutput(
      Exited(0, std::string(R"({"outcome":"reproduced","step":3,"kernels":)") + kKernels + "}"), {});
  EXPECT_EQ(good.kernels_step, 3);
  TrialResult no_table = InterpretReplayOutput(Exited(0, R"({"outcome":"reproduced","step":3})"), {});
  EXPECT_FALSE(no_table.kernels_step);
}

TEST(ReplayOutput, DivergedIsGoodByDefaultBecauseOtherConfigurationsChangeTheArithmetic) {
  TrialResult r = InterpretReplayOutput(
      Exited(1, R"({"outcome":"diverged","step":1,"diverged":{"step":1,"kernel":"L0.attention"}})"), {});
  EXPECT_EQ(r.verdict, Verdict::kGood);
  EXPECT_FALSE(r.signature.is_failure());
  EXPECT_NE(r.note.find("L0.attention"), std::string::npos) << r.note;
}

TEST(ReplayOutput, DivergedIsAnOutputMismatchAtTheFirstDivergingKernelWhenAskedFor) {
  TrialResult r = InterpretReplayOutput(
      Exited(1, R"({"outcome":"diverged","step":5,"diverged":{"kernel":"flash_decode","layer":2}})"), {},
      /*diverged_is_bad=*/true);
  EXPECT_EQ(r.verdict, Verdict::kBad);
  EXPECT_EQ(r.signature.failure_class, FailureClass::kOutputMismatch);
  EXPECT_EQ(r.signature.kernel, "flash_decode");
  EXPECT_EQ(r.signature.step, 5);
}

TEST(ReplayOutput, UsageAndDataErrorsAbortTheSearch) {
  TrialResult usage = InterpretReplayOutput(Exited(2, ""), {});
  EXPECT_EQ(usage.verdict, Verdict::kAbort);
  EXPECT_NE(usage.note.find("usage"), std::string::npos);
  EXPECT_EQ(InterpretReplayOutput(Exited(3, ""), {}).verdict, Verdict::kAbort);
}

TEST(ReplayOutput, MissingOrUnknownJsonAborts) {
  EXPECT_EQ(InterpretReplayOutput(Exited(1, "Segmentation fault"), {}).verdict, Verdict::kAbort);
  TrialResult unknown = InterpretReplayOutput(Exited(1, R"({"outcome":"exploded"})"), {});
  EXPECT_EQ(unknown.verdict, Verdict::kAbort);
  EXPECT_NE(unknown.note.find("exploded"), std::string::npos);
}

TEST(ReplayOutput, SignalsAndTimeoutsClassifyLikeAnyCommand) {
  ProcessResult p;
  p.started = true;
  p.term_signal = SIGABRT;
  TrialResult r = InterpretReplayOutput(p, {});
  EXPECT_EQ(r.signature.failure_class, FailureClass::kCrashSignal);
  ProcessResult t;
  t.started = true;
  t.timed_out = true;
  t.term_signal = SIGTERM;
  EXPECT_EQ(InterpretReplayOutput(t, {}).signature.failure_class, FailureClass::kTimeout);
}

TEST(ReplayTrialRunner, BuildsTheReplayCommandAndReadsItsJson) {
  TempDir dir;
  // A stand-in for the crashreplay binary: records its arguments, answers per
  // the configuration like replay would.
  const std::string fake = dir / "fake-crashreplay";
  WriteFile(fake,
            "#!/bin/sh\n"
            "echo \"$@\" > '" +
                dir.path() +
                "/args'\n"
                "cfg=\"$4\"\n"
                "if grep -q '^attention_backend = \"paged\"' \"$cfg\"; then\n"
                "  echo "
                "'{\"outcome\":\"failed\",\"step\":9,\"signature\":{\"class\":\"device_assert\",\"stage\":\"decode\","
                "\"kernel\":\"paged_decode\",\"check\":\"page_size_is_64\"}}'\n"
                "  exit 1\n"
                "fi\n"
                "echo '{\"outcome\":\"reproduced\",\"step\":9,\"kernels\":[]}'\n",
            true);
  ReplayTrialOptions o;
  o.crashreplay_binary = fake;
  o.capture = dir / "crash.crcap";
  o.workdir = dir.path();
  ReplayTrialRunner runner(o);
  TrialRequest req;
  req.config["attention_backend"] = ConfigValue::String("paged");
  req.step = 9;
  req.index = 1;
  TrialResult bad = runner.Run(req, nullptr);
  EXPECT_EQ(bad.verdict, Verdict::kBad);
  EXPECT_EQ(bad.signature.check, "page_size_is_64");
  EXPECT_EQ(ReadFile(dir / "args"),
            "replay " + o.capture + " --config " + dir.path() + "/trial-0001.toml --json --step 9\n");
  req.config["attention_backend"] = ConfigValue::String("reference");
  req.index = 2;
  EXPECT_EQ(runner.Run(req, nullptr).verdict, Verdict::kGood);
  EXPECT_EQ(runner.ReproduceCommand("/w/culprit.toml", 9),
            fake + " replay " + o.capture + " --config /w/culprit.toml --json --step 9");
  EXPECT_EQ(runner.SubjectId(), "capture:" + o.capture);
}

}  // namespace
}  // namespace crashreplay::bisect
