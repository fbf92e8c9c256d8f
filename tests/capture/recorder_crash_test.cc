// The recorder's failure paths, each in a child process that really dies
// the way a serving process does; the parent then reads the capture.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>

#include <gtest/gtest.h>

#include "crashreplay/capture/recorder.h"
#include "crashreplay/formats/capture_reader.h"
#include "recorder_test_util.h"

namespace crashreplay::testing {
namespace {

using capture::Recorder;
using capture::RecorderOptions;
using capture::TensorView;

constexpr int kSteps = 20;
constexpr size_t kSnapshotBytes = 64 * 1024;
const int64_t kSnapshotShape[] = {static_cast<int64_t>(kSnapshotBytes / 2)};

RecorderOptions TestOptions(const std::string& dir) {
  RecorderOptions o;
  o.session_dir = dir;
  o.snapshot_ring_bytes = 4 << 20;
  return o;
}

// In the child: begin, record kSteps steps with a snapshot every 5th step,
// then `then`. Exit codes 90+ mean the setup failed.
void RecordThen(const std::string& dir, const std::function<void(Recorder&)>& then) {
  absl::StatusOr<std::unique_ptr<Recorder>> r = Recorder::Begin(TestManifest(), TestOptions(dir));
  if (!r.ok()) _exit(90);
  for (int i = 0; i < kSteps; ++i) {
    TestBatch b(i, 8);
    if (!(*r)->RecordStep(b.view()).ok()) _exit(91);
    if (i % 5 == 0) {
      const std::vector<std::byte> bytes = RandomBytes(kSnapshotBytes, i);
      const TensorView t{"input_ids", DType::kBF16, kSnapshotShape, bytes.data(), bytes.size()};
      if (!(*r)->SubmitSnapshot(i, {&t, 1}).ok()) _exit(92);
    }
  }
  then(**r);
  (*r).release();  // a crash path never runs the destructor; keep it that way
}

// Every step accepted before the failure, the snapshots with their bytes.
void ExpectStepsAndSnapshots(const CaptureReader& r) {
  ExpectSteps(r, kSteps);
  ASSERT_EQ(r.snapshots().size(), 4u);
  for (size_t k = 0; k < 4; ++k) {
    const SnapshotRecord& s = r.snapshots()[k];
    EXPECT_EQ(s.step, 5 * k);
    ASSERT_EQ(s.tensors.size(), 1u);
    EXPECT_TRUE(s.tensors[0].stored);
    absl::StatusOr<std::vector<std::byte>> blob = r.ReadBlob(s.tensors[0].content_hash);
    ASSERT_TRUE(blob.ok()) << blob.status();
    EXPECT_EQ(*blob, RandomBytes(kSnapshotBytes, static_cast<uint32_t>(5 * k))) << "snapshot of step " << 5 * k;
  }
}

void ExpectSignalFailure(const CaptureReader& r, int sig) {
  ASSERT_EQ(r.failures().size(), 1u);
  const FailureRecord& f = r.failures()[0];
  EXPECT_EQ(f.signal, sig);
  EXPECT_EQ(f.failure_class, FailureClass::kCrash);
  ASSERT_TRUE(f.step.has_value());
  EXPECT_EQ(*f.step, kSteps - 1u);
  EXPECT_EQ(f.stage, "decode");
  EXPECT_FALSE(r.Summary().ok) << "a crashed recorder never writes ok = true";
  EXPECT_FALSE(r.end().has_value());
  EXPECT_TRUE(r.Verify().status.ok()) << r.Verify().status;
}

TEST(RecorderCrash, AbortKeepsEveryAcceptedStepTheRingAndASignalFailure) {
  RecorderTempDir dir;
  const int status = RunInChild([&] { RecordThen(dir.path(), [](Recorder&) { std::abort(); }); });
  ASSERT_TRUE(DiedBy(status, SIGABRT)) << "wait status " << status;
  auto r = ReadCapture(capture::SessionRankPath(dir.path(), 0));
  ASSERT_NE(r, nullptr);
  ExpectStepsAndSnapshots(*r);
  ExpectSignalFailure(*r, SIGABRT);
}

TEST(RecorderCrash, RaisedSigsegvIsRecordedAndStillKills) {
  RecorderTempDir dir;
  const int status = RunInChild([&] { RecordThen(dir.path(), [](Recorder&) { raise(SIGSEGV); }); });
  ASSERT_TRUE(DiedBy(status, SIGSEGV)) << "wait status " << status;
  auto r = ReadCapture(capture::SessionRankPath(dir.path(), 0));
  ASSERT_NE(r, nullptr);
  ExpectStepsAndSnapshots(*r);
  ExpectSignalFailure(*r, SIGSEGV);
}

#if !defined(__SANITIZE_ADDRESS__)
TEST(RecorderCrash, RealNullWriteIsRecordedAndStillKills) {
  RecorderTempDir dir;
  const int status = RunInChild([&] {
    RecordThen(dir.path(), [](Recorder&) {
      volatile int* volatile p = nullptr;
      *p = 1;
    });
  });
  ASSERT_TRUE(DiedBy(status, SIGSEGV)) << "wait status " << status;
  auto r = ReadCapture(capture::SessionRankPath(dir.path(), 0));
  ASSERT_NE(r, nullptr);
  ExpectStepsAndSnapshots(*r);
  ExpectSignalFailure(*r, SIGSEGV);
}
#endif

TEST(RecorderCrash, UncaughtExceptionRecordsItsTextThenAborts) {
  RecorderTempDir dir;
  const int status = RunInChild([&] {
    RecordThen(dir.path(), [](Recorder&) {
      // Escaping a thread's function: std::terminate, as in a serving loop.
      std::thread([] { throw std::runtime_error("CUDA error: device-side assert triggered"); }).join();
    });
  });
  ASSERT_TRUE(DiedBy(status, SIGABRT)) << "wait status " << status;
  auto r = ReadCapture(capture::SessionRankPath(dir.path(), 0));
  ASSERT_NE(r, nullptr);
  ExpectStepsAndSnapshots(*r);
  ASSERT_EQ(r->failures().size(), 1u)
      << "the terminate path writes the failure; the SIGABRT that follows does not repeat it";
  const FailureRecord& f = r->failures()[0];
  EXPECT_EQ(f.failure_class, FailureClass::kException);
  EXPECT_EQ(f.stage, "decode");
  EXPECT_EQ(f.exception_type, "std::runtime_error");
  EXPECT_NE(f.reason.find("device-side assert triggered"), std::string::npos) << f.reason;
  ASSERT_TRUE(f.step.has_value());
  EXPECT_EQ(*f.step, kSteps - 1u);
  EXPECT_FALSE(r->Summary().ok);
}

TEST(RecorderCrash, SigkillKeepsEveryStepTheWriterHadWritten) {
  RecorderTempDir dir;
  const std::string path = capture::SessionRankPath(dir.path(), 0);
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    absl::StatusOr<std::unique_ptr<Recorder>> r = Recorder::Begin(TestManifest(), TestOptions(dir.path()));
    if (!r.ok()) _exit(90);
    for (uint64_t i = 0;; ++i) {
      TestBatch b(i, 8);
      if (!(*r)->RecordStep(b.view()).ok()) _exit(91);
      usleep(500);
    }
  }
  // Wait until the file holds at least K steps, then kill without warning.
  constexpr uint64_t kWritten = 40;
  uint64_t seen = 0;
  for (int tries = 0; tries < 2000 && seen < kWritten; ++tries) {
    usleep(5000);
    absl::StatusOr<std::unique_ptr<CaptureReader>> r = CaptureReader::Open(path);
    if (r.ok()) seen = (*r)->steps().size();
  }
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  ASSERT_GE(seen, kWritten) << "the child never wrote " << kWritten << " steps";
  auto r = ReadCapture(path);
  ASSERT_NE(r, nullptr);
  // Every step seen before the kill is still there, in order, complete.
  ASSERT_GE(r->steps().size(), seen);
  ExpectSteps(*r, r->steps().size());
  EXPECT_TRUE(r->failures().empty());
  EXPECT_FALSE(r->Summary().ok);
  EXPECT_FALSE(r->Summary().corrupt) << r->Summary().problem;
}

TEST(RecorderCrash, ExplicitOnFailureWritesRingAndFailureAndCloseStaysOk) {
  RecorderTempDir dir;
  const int status = RunInChild([&] {
    RecordThen(dir.path(), [](Recorder& r) {
      capture::FailureInfo f;
      f.reason = "torch.AcceleratorError: CUDA error: device-side assert triggered";
      f.stage = "decode";
      f.step = kSteps - 1;
      f.failure_class = FailureClass::kDeviceAssert;
      f.exception_type = "torch.AcceleratorError";
      if (!r.OnFailure(f).ok()) _exit(93);
      if (!r.Close().ok()) _exit(94);
    });
  });
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "wait status " << status;
  auto r = ReadCapture(capture::SessionRankPath(dir.path(), 0));
  ASSERT_NE(r, nullptr);
  ExpectStepsAndSnapshots(*r);
  ASSERT_EQ(r->failures().size(), 1u);
  EXPECT_EQ(r->failures()[0].failure_class, FailureClass::kDeviceAssert);
  EXPECT_EQ(r->failures()[0].stage, "decode");
  EXPECT_EQ(r->failures()[0].exception_type, "torch.AcceleratorError");
  EXPECT_TRUE(r->Summary().ok) << "closed cleanly after recording the failure";
  EXPECT_TRUE(r->Verify().status.ok()) << r->Verify().status;
}

TEST(RecorderCrash, CleanCloseWritesFooterWithOkAndNoRing) {
  RecorderTempDir dir;
  const int status = RunInChild([&] {
    RecordThen(dir.path(), [](Recorder& r) {
      if (!r.Close().ok()) _exit(94);
    });
  });
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "wait status " << status;
  auto r = ReadCapture(capture::SessionRankPath(dir.path(), 0));
  ASSERT_NE(r, nullptr);
  ExpectSteps(*r, kSteps);
  EXPECT_TRUE(r->snapshots().empty()) << "the ring is written on failure only (write_snapshots_on_close is off)";
  EXPECT_TRUE(r->failures().empty());
  ASSERT_TRUE(r->end().has_value());
  EXPECT_TRUE(r->end()->ok);
  EXPECT_EQ(r->end()->steps, static_cast<uint64_t>(kSteps));
  EXPECT_TRUE(r->Summary().ok);
  EXPECT_TRUE(r->Verify().status.ok()) << r->Verify().status;
}

TEST(RecorderCrash, ExitWithoutCloseClosesCleanlyAtExit) {
  RecorderTempDir dir;
  const int status = RunInChild([&] {
    RecordThen(dir.path(), [](Recorder&) { std::exit(0); });  // recorder leaked, as an engine might
  });
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "wait status " << status;
  auto r = ReadCapture(capture::SessionRankPath(dir.path(), 0));
  ASSERT_NE(r, nullptr);
  ExpectSteps(*r, kSteps);
  EXPECT_TRUE(r->Summary().ok);
}

int g_marker_fd = -1;
void PreviousAbortHandler(int) {
  const char msg[] = "previous";
  (void)!write(g_marker_fd, msg, sizeof msg - 1);
  _exit(7);
}

TEST(RecorderCrash, PreviousHandlerRunsAfterTheRecorderWrote) {
  RecorderTempDir dir;
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const int status = RunInChild([&] {
    close(fds[0]);
    g_marker_fd = fds[1];
    struct sigaction sa{};
    sa.sa_handler = PreviousAbortHandler;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGABRT, &sa, nullptr);  // installed before the recorder's
    RecordThen(dir.path(), [](Recorder&) { std::abort(); });
  });
  close(fds[1]);
  char buf[16] = {};
  const ssize_t n = read(fds[0], buf, sizeof buf - 1);
  close(fds[0]);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 7) << "wait status " << status;
  EXPECT_EQ(std::string(buf, n > 0 ? n : 0), "previous");
  auto r = ReadCapture(capture::SessionRankPath(dir.path(), 0));
  ASSERT_NE(r, nullptr);
  ExpectSteps(*r, kSteps);
  ExpectSignalFailure(*r, SIGABRT);
}

TEST(RecorderCrash, CrashBeforeAnyStepRecordsAStartupFailure) {
  RecorderTempDir dir;
  const int status = RunInChild([&] {
    absl::StatusOr<std::unique_ptr<Recorder>> r = Recorder::Begin(TestManifest(), TestOptions(dir.path()));
    if (!r.ok()) _exit(90);
    raise(SIGBUS);
  });
  ASSERT_TRUE(DiedBy(status, SIGBUS)) << "wait status " << status;
  auto r = ReadCapture(capture::SessionRankPath(dir.path(), 0));
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(r->steps().empty());
  ASSERT_EQ(r->failures().size(), 1u);
  EXPECT_EQ(r->failures()[0].signal, SIGBUS);
  EXPECT_FALSE(r->failures()[0].step.has_value());
  EXPECT_EQ(r->failures()[0].stage, "startup");
}

}  // namespace
}  // namespace crashreplay::testing
