// GPU core dumps armed by the recorder, for real: a replay step that trips
// a device-side assert (the paged64 attention kernel on 16-token pages, as
// in device_assert_test.cc) runs under a Recorder with arm_coredumps; the
// driver writes a lightweight dump beside the capture, the failure record
// names it, the coredump reader reads it whole and its faulting kernel is
// the replay's attention kernel, and `crashreplay info` matches it to the
// replay's attention op. The step is also timed with dumps armed and not
// (the cost docs/capture.md asks to measure before arming by default).
//
// NEVER RUN YET: written on a machine without a GPU (tests/gpu's bundle
// runs it as part of gpu_test). Each case runs in a "threadsafe" death-test
// child, so the parent's CUDA context is not harmed. Skips without a
// CUDA device.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "../capture/recorder_test_util.h"
#include "crashreplay/capture/coredump_arming.h"
#include "crashreplay/capture/recorder.h"
#include "crashreplay/formats/capture_reader.h"
#include "crashreplay/formats/coredump/coredump.h"
#include "exec_replay_test_util.h"
#include "gpu_test_util.h"

namespace crashreplay::replay {
namespace {

using ::testing::HasSubstr;

class CoredumpArmed : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

// In the child: arm, replay the failing step on CUDA, record the failure.
[[noreturn]] void FailUnderTheRecorder(const std::string& dir) {
  capture::RecorderOptions o;
  o.session_dir = dir;
  o.install_signal_handlers = false;
  o.arm_coredumps = true;
  o.coredump_wait_s = 30.0;  // a dump of an H100's state: seconds at most
  auto rec = capture::Recorder::Begin(::crashreplay::testing::TestManifest(), o);
  if (!rec.ok()) std::_Exit(20);
  MakeModelOptions mo;
  mo.arch = "llama";
  auto run = testing::RecordRun(mo, {"attention_backend=paged64"}, 3, 0.0f);
  if (!run.engine) std::_Exit(21);
  auto gpu = MakeExecutor("cuda", ExecMode::kKernelByKernel);
  if (!gpu.ok()) std::_Exit(22);
  auto rep = testing::ReplayOnExecutor(run, gpu->get(), false);
  if (rep.status.ok()) std::_Exit(23);
  capture::FailureInfo f;
  f.reason = std::string(rep.status.message());
  f.stage = "decode";
  f.failure_class = FailureClass::kDeviceAssert;
  if (!(*rec)->OnFailure(f).ok()) std::_Exit(24);
  if (!(*rec)->Close().ok()) std::_Exit(25);
  std::_Exit(3);
}

TEST_F(CoredumpArmed, ADeviceAssertUnderTheRecorderWritesADumpTheFailureRecordNames) {
  CR_REQUIRE_CUDA_DEVICE();
  const std::string dir = (std::filesystem::temp_directory_path() / "crcoredump-gpu").string();
  std::filesystem::remove_all(dir);
  EXPECT_EXIT(FailUnderTheRecorder(dir), ::testing::ExitedWithCode(3), ::testing::A<const std::string&>());
  auto r = CaptureReader::Open(capture::SessionRankPath(dir, 0));
  ASSERT_TRUE(r.ok()) << r.status();
  const CoredumpArming& armed = (*r)->manifest()->coredump;
  // The test body initialised CUDA before the recorder began (the device
  // check), so the attribute API armed it; "env" only if it ran first.
  EXPECT_TRUE(armed.mode == "driver_api" || armed.mode == "env") << armed.mode << ": " << armed.reason;
  ASSERT_EQ((*r)->failures().size(), 1u);
  const FailureRecord& f = (*r)->failures()[0];
  ASSERT_FALSE(f.coredump.empty()) << "no dump named; manifest: " << armed.reason;
  EXPECT_TRUE(f.coredump_complete) << f.coredump_note;
  auto dump = coredump::ReadCoredumpFile(dir + "/" + f.coredump);
  ASSERT_TRUE(dump.ok()) << dump.status();
  ASSERT_FALSE(dump->faults.empty());
  const coredump::Location* loc = dump->LocationOf(dump->faults[0]);
  ASSERT_NE(loc, nullptr);
  ASSERT_TRUE(loc->function.has_value()) << loc->why_unknown;
  EXPECT_THAT(loc->function->demangled, HasSubstr("ttention"));
  std::fprintf(stderr, "dump %s: %s\n", f.coredump.c_str(), loc->function->demangled.c_str());
}

// What arming costs the step: the same good step replayed on CUDA with and
// without dumps armed, each in its own child (arming is per process).
// Prints both times for docs/capture.md; passes whatever they are.
[[noreturn]] void TimeGoodSteps(bool armed) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / (armed ? "crcoredump-armed" : "crcoredump-plain")).string();
  std::filesystem::remove_all(dir);
  capture::RecorderOptions o;
  o.session_dir = dir;
  o.install_signal_handlers = false;
  o.arm_coredumps = armed;
  auto rec = capture::Recorder::Begin(::crashreplay::testing::TestManifest(), o);
  if (!rec.ok()) std::_Exit(20);
  MakeModelOptions mo;
  mo.arch = "llama";
  auto run = testing::RecordRun(mo, {"attention_backend=paged64", "page_size=64"}, 3, 0.0f);
  auto gpu = MakeExecutor("cuda", ExecMode::kAsync);
  if (!run.engine || !gpu.ok()) std::_Exit(21);
  (void)testing::ReplayOnExecutor(run, gpu->get(), false);  // warm-up
  const auto t0 = std::chrono::steady_clock::now();
  constexpr int kRounds = 20;
  for (int i = 0; i < kRounds; ++i) {
    if (!testing::ReplayOnExecutor(run, gpu->get(), false).status.ok()) std::_Exit(22);
  }
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / kRounds;
  // The parent prints it: a death test's child output is not shown on success.
  std::FILE* f = std::fopen((dir + ".txt").c_str(), "w");
  if (f == nullptr) std::_Exit(23);
  std::fprintf(f, "coredumps %s: %.1f us a replay (%d replays of a 3-token llama step, async)\n",
               armed ? "armed" : "off", us, kRounds);
  std::fclose(f);
  std::fprintf(stderr, "timed\n");
  std::_Exit(0);
}

TEST_F(CoredumpArmed, StepTimeWithAndWithoutDumpsArmed) {
  CR_REQUIRE_CUDA_DEVICE();
  EXPECT_EXIT(TimeGoodSteps(false), ::testing::ExitedWithCode(0), HasSubstr("timed"));
  EXPECT_EXIT(TimeGoodSteps(true), ::testing::ExitedWithCode(0), HasSubstr("timed"));
  for (const char* which : {"plain", "armed"}) {
    const std::string path = (std::filesystem::temp_directory_path() / "crcoredump-").string() + which + ".txt";
    std::FILE* f = std::fopen(path.c_str(), "r");
    ASSERT_NE(f, nullptr) << path;
    char line[256] = {};
    if (std::fgets(line, sizeof line, f) != nullptr) std::printf("%s", line);
    std::fclose(f);
  }
}

}  // namespace
}  // namespace crashreplay::replay
