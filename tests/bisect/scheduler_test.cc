// The scheduler with real trial processes: cache, runner prefix, GPU pool,
// repeats.
#include "crashreplay/bisect/scheduler.h"

#include <gtest/gtest.h>

#include "crashreplay/bisect/command_trial.h"
#include "test_util.h"

namespace crashreplay::bisect {
namespace {

using testing::ReadLines;
using testing::TempDir;
using testing::WriteFile;
using testing::WriteTrialScript;

Config Cfg(int x) {
  Config c;
  c["x"] = ConfigValue::Int(x);
  return c;
}

TEST(Scheduler, NoConfigurationRunsTwiceAcrossAndWithinBatches) {
  TempDir dir;
  const std::string script = WriteTrialScript(dir, "t.sh", "exit 0");
  CommandTrialRunner runner({{script}, {}, dir.path(), {}});
  SchedulerOptions so;
  so.jobs = 2;
  Scheduler s(runner, so);
  s.RunBatch({Cfg(1), Cfg(2), Cfg(1), Cfg(3)});
  s.RunBatch({Cfg(3), Cfg(4)});
  s.RunOne(Cfg(1));
  EXPECT_EQ(ReadLines(dir / "invocations.log").size(), 4u);
  EXPECT_EQ(s.launches(), 4);
  EXPECT_EQ(s.evaluations(), 4);
  // A different step is a different trial.
  s.RunOne(Cfg(1), 7);
  EXPECT_EQ(s.launches(), 5);
}

TEST(Scheduler, RunnerPrefixWrapsEveryTrialAndConfigPlaceholderIsSubstituted) {
  TempDir dir;
  const std::string wrapper = dir / "wrap.sh";
  WriteFile(wrapper,
            "#!/bin/sh\n"
            "echo \"wrapped $1 $2 | $3 $4\" >> '" +
                dir.path() +
                "/wrap.log'\n"
                "shift 2\nexec \"$@\"\n",
            true);
  const std::string script = WriteTrialScript(dir, "t.sh", "[ \"$1\" = \"$CRASHREPLAY_CONFIG\" ] || exit 1\nexit 0");
  auto prefix = SplitCommandLine("'" + wrapper + "' --tag 'a b'");
  ASSERT_TRUE(prefix.ok());
  CommandTrialRunner runner({{script, "{config}"}, *prefix, dir.path(), {}});
  Scheduler s(runner, {});
  TrialResult r = s.RunOne(Cfg(1));
  EXPECT_EQ(r.verdict, Verdict::kGood) << r.stderr_tail;
  const auto lines = ReadLines(dir / "wrap.log");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "wrapped --tag a b | " + script + " " + r.config_path);
  EXPECT_NE(runner.ReproduceCommand("/x/culprit.toml", std::nullopt).find(wrapper), std::string::npos);
}

TEST(Scheduler, GpuPoolGivesEachConcurrentWorkerItsOwnDevices) {
  TempDir dir;
  // mkdir is atomic: two trials holding the same GPU at once would collide.
  const std::string script =
      WriteTrialScript(dir, "gpu.sh",
                       "echo \"$CUDA_VISIBLE_DEVICES\" >> '" + dir.path() +
                           "/seen.log'\n"
                           "mkdir '" +
                           dir.path() + "/gpu-'\"$CUDA_VISIBLE_DEVICES\" || echo CONFLICT >> '" + dir.path() +
                           "/seen.log'\n"
                           "sleep 0.2\n"
                           "rmdir '" +
                           dir.path() + "/gpu-'\"$CUDA_VISIBLE_DEVICES\"\nexit 0");
  CommandTrialRunner runner({{script}, {}, dir.path(), {}});
  SchedulerOptions so;
  so.jobs = 8;  // more jobs than GPUs: the pool caps parallelism
  so.gpus = ParseGpuList("4,7");
  Scheduler s(runner, so);
  EXPECT_EQ(s.parallelism(), 2);
  s.RunBatch({Cfg(1), Cfg(2), Cfg(3), Cfg(4), Cfg(5), Cfg(6)});
  const auto seen = ReadLines(dir / "seen.log");
  std::set<std::string> devices(seen.begin(), seen.end());
  EXPECT_EQ(devices, (std::set<std::string>{"4", "7"}));
  EXPECT_EQ(seen.size(), 6u);
}

TEST(Scheduler, GpuListSyntax) {
  EXPECT_EQ(ParseGpuList("0,1,2"), (std::vector<std::string>{"0", "1", "2"}));
  EXPECT_EQ(ParseGpuList("0,1;2,3"), (std::vector<std::string>{"0,1", "2,3"}));
  EXPECT_TRUE(ParseGpuList("").empty());
}

TEST(Scheduler, RepeatDetectsAFlakyCommand) {
  TempDir dir;
  // Fails on every other invocation overall.
  const std::string script = WriteTrialScript(
      dir, "flaky.sh", "n=$(wc -l < '" + dir.path() + "/invocations.log')\n[ $((n % 2)) -eq 1 ] && exit 1\nexit 0");
  CommandTrialRunner runner({{script}, {}, dir.path(), {}});
  SchedulerOptions so;
  so.repeat = 2;
  Scheduler s(runner, so);
  TrialResult r = s.RunOne(Cfg(1));
  EXPECT_EQ(r.verdict, Verdict::kFlaky);
  EXPECT_EQ(r.runs, 2);
  EXPECT_EQ(r.bad_runs, 1);
  EXPECT_EQ(s.launches(), 2);
}

TEST(Scheduler, AbortStopsLaunchingTheRestOfTheBatch) {
  TempDir dir;
  const std::string script = WriteTrialScript(dir, "t.sh", "[ \"$(val x)\" = 1 ] && exit 200\nexit 0");
  CommandTrialRunner runner({{script}, {}, dir.path(), {}});
  Scheduler s(runner, {});
  auto results = s.RunBatch({Cfg(1), Cfg(2), Cfg(3)});
  EXPECT_TRUE(s.aborted());
  EXPECT_NE(s.abort_reason().find("200"), std::string::npos);
  EXPECT_EQ(results[0].verdict, Verdict::kAbort);
  EXPECT_EQ(results[1].verdict, Verdict::kAbort);
  EXPECT_EQ(ReadLines(dir / "invocations.log").size(), 1u);
}

TEST(Scheduler, InterruptKillsRunningTrialsAndLaunchesNoMore) {
  TempDir dir;
  const std::string script = WriteTrialScript(dir, "t.sh", "sleep 30\nexit 0");
  CommandTrialRunner runner({{script}, {}, dir.path(), {}});
  std::atomic<bool> interrupt{false};
  SchedulerOptions so;
  so.jobs = 2;
  so.interrupt = &interrupt;
  Scheduler s(runner, so);
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    interrupt = true;
  });
  const auto start = std::chrono::steady_clock::now();
  auto results = s.RunBatch({Cfg(1), Cfg(2), Cfg(3), Cfg(4)});
  t.join();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
  EXPECT_TRUE(s.interrupted());
  EXPECT_EQ(s.launches(), 2);
  for (const auto& r : results) EXPECT_EQ(r.verdict, Verdict::kAbort);
}

}  // namespace
}  // namespace crashreplay::bisect
