// RunProcess and ClassifyProcess on real child processes.
#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "crashreplay/bisect/process.h"
#include "crashreplay/bisect/trial.h"
#include "test_util.h"

namespace crashreplay::bisect {
namespace {

ProcessResult Sh(const std::string& script, std::optional<double> timeout = std::nullopt,
                 std::optional<uint64_t> mem = std::nullopt) {
  ProcessSpec spec;
  spec.argv = {"sh", "-c", script};
  spec.timeout_s = timeout;
  spec.kill_grace_s = 0.2;
  spec.memory_limit_bytes = mem;
  return RunProcess(spec);
}

TrialResult Judge(const ProcessResult& p, TrialLimits limits = {}) { return ClassifyProcess(p, limits, std::nullopt); }

TEST(Process, CapturesStdoutStderrAndExitCode) {
  ProcessResult p = Sh("echo out; echo err >&2; exit 7");
  ASSERT_TRUE(p.started);
  EXPECT_TRUE(p.exited);
  EXPECT_EQ(p.exit_code, 7);
  EXPECT_EQ(p.stdout_text, "out\n");
  EXPECT_EQ(p.stderr_tail, "err\n");
}

TEST(Process, StderrKeepsOnlyTheTail) {
  ProcessSpec spec;
  spec.argv = {"sh", "-c", "i=0; while [ $i -lt 2000 ]; do echo line$i >&2; i=$((i+1)); done"};
  spec.stderr_limit = 100;
  ProcessResult p = RunProcess(spec);
  EXPECT_LE(p.stderr_tail.size(), 100u);
  EXPECT_NE(p.stderr_tail.find("line1999\n"), std::string::npos);
}

TEST(Process, EnvironmentOverridesReachTheChild) {
  ProcessSpec spec;
  spec.argv = {"sh", "-c", "printf %s \"$CR_TEST_VAR\""};
  spec.env_set = {{"CR_TEST_VAR", "hello world"}};
  EXPECT_EQ(RunProcess(spec).stdout_text, "hello world");
}

TEST(Process, MissingCommandDoesNotStartAndAborts) {
  ProcessSpec spec;
  spec.argv = {"crashreplay-no-such-command-xyz"};
  ProcessResult p = RunProcess(spec);
  EXPECT_FALSE(p.started);
  EXPECT_NE(p.start_error.find("not found"), std::string::npos);
  TrialResult r = Judge(p);
  EXPECT_EQ(r.verdict, Verdict::kAbort);
}

TEST(Process, TimeoutKillsTheWholeGroupAndIsClassified) {
  const auto start = std::chrono::steady_clock::now();
  ProcessResult p = Sh("sleep 30 & sleep 30; echo never", 0.3);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(p.timed_out);
  EXPECT_LT(took, 5.0);
  TrialLimits limits;
  limits.timeout_s = 0.3;
  TrialResult r = Judge(p, limits);
  EXPECT_EQ(r.verdict, Verdict::kBad);
  EXPECT_EQ(r.signature.failure_class, FailureClass::kTimeout);
}

TEST(Process, TermIgnoringChildIsKilledAfterGrace) {
  const auto start = std::chrono::steady_clock::now();
  ProcessResult p = Sh("trap '' TERM; while :; do sleep 0.05; done", 0.2);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(p.timed_out);
  EXPECT_EQ(p.term_signal, SIGKILL);
  EXPECT_LT(took, 5.0);
}

TEST(Process, BackgroundStragglersDoNotHoldTheTrial) {
  const auto start = std::chrono::steady_clock::now();
  ProcessResult p = Sh("sleep 30 & echo done");
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(p.exit_code, 0);
  EXPECT_LT(took, 5.0);
}

TEST(Process, CancelFlagKillsTheRun) {
  std::atomic<bool> cancel{false};
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    cancel = true;
  });
  ProcessSpec spec;
  spec.argv = {"sleep", "30"};
  spec.cancel = &cancel;
  ProcessResult p = RunProcess(spec);
  t.join();
  EXPECT_TRUE(p.cancelled);
  EXPECT_EQ(Judge(p).verdict, Verdict::kAbort);
}

TEST(Classify, DeathBySignalIsCrashSignalWithItsName) {
  TrialResult r = Judge(Sh("kill -SEGV $$"));
  EXPECT_EQ(r.verdict, Verdict::kBad);
  EXPECT_EQ(r.signature.failure_class, FailureClass::kCrashSignal);
  EXPECT_EQ(r.signature.check, "SIGSEGV");  // part of the bug's identity: SIGABRT is another bug
  EXPECT_EQ(r.signature.detail, "killed by SIGSEGV");
  EXPECT_EQ(r.term_signal, SIGSEGV);
}

TEST(Classify, ShellReportedSignalExitIsCrashSignal) {
  TrialResult r = Judge(Sh("sh -c 'kill -ABRT $$'; exit $?"));
  EXPECT_EQ(r.exit_code, 128 + SIGABRT);
  EXPECT_EQ(r.signature.failure_class, FailureClass::kCrashSignal);
  EXPECT_EQ(r.signature.check, "SIGABRT");
  EXPECT_NE(r.signature.detail.find("SIGABRT"), std::string::npos);
}

TEST(Classify, ExitCodesFollowGitBisectRun) {
  EXPECT_EQ(Judge(Sh("exit 0")).verdict, Verdict::kGood);
  EXPECT_EQ(Judge(Sh("exit 125")).verdict, Verdict::kSkip);
  TrialResult bad = Judge(Sh("exit 1"));
  EXPECT_EQ(bad.verdict, Verdict::kBad);
  EXPECT_EQ(bad.signature.failure_class, FailureClass::kOther);
  EXPECT_EQ(bad.signature.check, "exit 1");
  EXPECT_EQ(Judge(Sh("exit 127")).verdict, Verdict::kBad);
  TrialResult abort = Judge(Sh("exit 255"));
  EXPECT_EQ(abort.verdict, Verdict::kAbort);
  EXPECT_NE(abort.note.find("255"), std::string::npos);
}

TEST(Classify, MemoryLimitExhaustionIsOom) {
  // python3 raises MemoryError when RLIMIT_AS refuses the allocation.
  TrialLimits limits;
  limits.memory_limit_bytes = 512ull << 20;
  ProcessSpec spec;
  spec.argv = {"python3", "-c", "x = bytearray(2 * 1024**3)"};
  spec.memory_limit_bytes = limits.memory_limit_bytes;
  ProcessResult p = RunProcess(spec);
  if (!p.started) GTEST_SKIP() << "python3 not available: " << p.start_error;
  TrialResult r = ClassifyProcess(p, limits, std::nullopt);
  EXPECT_EQ(r.verdict, Verdict::kBad);
  EXPECT_EQ(r.signature.failure_class, FailureClass::kOom) << p.stderr_tail;
  EXPECT_EQ(r.signature.check, "host");  // Python's MemoryError, read from its traceback
}

TEST(Process, StderrKeepsTheHeadAsWellAsTheTail) {
  ProcessSpec spec;
  spec.argv = {
      "sh", "-c",
      "echo first-error >&2; i=0; while [ $i -lt 3000 ]; do echo noise-noise-noise-noise >&2; i=$((i+1)); done"};
  spec.stderr_limit = 1024;
  spec.stderr_head_limit = 64;
  ProcessResult p = RunProcess(spec);
  EXPECT_EQ(p.stderr_head.rfind("first-error\n", 0), 0u);
  EXPECT_EQ(p.stderr_tail.size(), 1024u);
  EXPECT_EQ(p.stderr_bytes, 12u + 3000u * 24u);
  const std::string kept = KeptStderr(p);
  EXPECT_EQ(kept.rfind("first-error", 0), 0u);
  EXPECT_NE(kept.find("bytes ...]"), std::string::npos);
}

TEST(Classify, SigkillUnderAMemoryLimitIsOom) {
  TrialLimits limits;
  limits.memory_limit_bytes = 1ull << 30;
  TrialResult r = ClassifyProcess(Sh("kill -KILL $$"), limits, std::nullopt);
  EXPECT_EQ(r.signature.failure_class, FailureClass::kOom);
  TrialResult plain = ClassifyProcess(Sh("kill -KILL $$"), {}, std::nullopt);
  EXPECT_EQ(plain.signature.failure_class, FailureClass::kCrashSignal);
}

TEST(Classify, WrittenSignatureRefinesABadExit) {
  const std::string sig =
      R"({"class":"device_assert","stage":"decode","kernel":"topk","check":"expert_id_in_range","step":4})";
  TrialResult r = ClassifyProcess(Sh("exit 1"), {}, sig);
  EXPECT_EQ(r.signature.failure_class, FailureClass::kDeviceAssert);
  EXPECT_EQ(r.signature.kernel, "topk");
  EXPECT_EQ(r.signature.step, 4);
  // Exit 0 stays good whatever the file says; a malformed file is noted.
  EXPECT_EQ(ClassifyProcess(Sh("exit 0"), {}, sig).verdict, Verdict::kGood);
  TrialResult junk = ClassifyProcess(Sh("exit 1"), {}, std::string("{not json"));
  EXPECT_EQ(junk.signature.failure_class, FailureClass::kOther);
  EXPECT_NE(junk.note.find("not valid JSON"), std::string::npos);
}

TEST(Classify, RepeatsThatDisagreeAreFlaky) {
  TrialResult good, bad1, bad2;
  good.verdict = Verdict::kGood;
  bad1.verdict = bad2.verdict = Verdict::kBad;
  bad1.signature.failure_class = FailureClass::kOom;
  bad2.signature.failure_class = FailureClass::kDeviceAssert;
  EXPECT_EQ(CombineRepeats({good, good}).verdict, Verdict::kGood);
  EXPECT_EQ(CombineRepeats({bad1, bad1}).verdict, Verdict::kBad);
  TrialResult mixed = CombineRepeats({good, bad1, good});
  EXPECT_EQ(mixed.verdict, Verdict::kFlaky);
  EXPECT_EQ(mixed.bad_runs, 1);
  EXPECT_EQ(mixed.runs, 3);
  EXPECT_EQ(mixed.signature.failure_class, FailureClass::kOom);
  EXPECT_EQ(CombineRepeats({bad1, bad2}).verdict, Verdict::kFlaky);  // two different bugs
}

TEST(CommandLine, SplitsLikeAShell) {
  auto w = SplitCommandLine(R"(srun -G1 --exclusive 'a b' "c \"d\"" e\ f '' )");
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(*w, (std::vector<std::string>{"srun", "-G1", "--exclusive", "a b", "c \"d\"", "e f", ""}));
  EXPECT_FALSE(SplitCommandLine("'open").ok());
  EXPECT_FALSE(SplitCommandLine("\"open").ok());
  EXPECT_EQ(ShellJoin({"a b", "it's", "plain"}), "'a b' 'it'\\''s' plain");
  auto back = SplitCommandLine(ShellJoin({"a b", "it's", "x\"y"}));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, (std::vector<std::string>{"a b", "it's", "x\"y"}));
}

}  // namespace
}  // namespace crashreplay::bisect
