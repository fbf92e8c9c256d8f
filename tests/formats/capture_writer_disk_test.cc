// CaptureWriter when a write fails part-way: under a real file-size limit
// (RLIMIT_FSIZE, SIGXFSZ ignored: EFBIG after a short write) the torn frame
// is cut off, the file stays its complete frames, and appends go on when
// the limit is raised ("space returns").
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <filesystem>

#include "capture_test_util.h"
#include "crashreplay/formats/capture_writer.h"

namespace crashreplay {
namespace {

using testing::TempDir;
using testing::TestManifest;
using testing::TestStep;

TEST(CaptureWriterDisk, FailedWriteIsCutBackAndAppendsResumeWhenSpaceReturns) {
  TempDir dir;
  const std::string path = dir.File("limit.crcap");
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  const sighandler_t old_handler = signal(SIGXFSZ, SIG_IGN);
  rlimit lim = saved;
  lim.rlim_cur = 16 << 10;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &lim), 0);
  auto writer = CaptureWriter::Create(path, TestManifest(0));
  ASSERT_TRUE(writer.ok()) << writer.status();
  uint64_t written = 0;
  absl::Status failed;
  for (uint64_t i = 0; i < 1000 && failed.ok(); ++i) {
    failed = (*writer)->Append(TestStep(i, 0));
    if (failed.ok()) ++written;
  }
  EXPECT_EQ(failed.code(), absl::StatusCode::kOutOfRange) << failed;  // EFBIG, errno's mapping
  EXPECT_EQ((*writer)->write_errors(), 1u);
  EXPECT_FALSE((*writer)->broken());
  // Cut back: the file is exactly its complete frames.
  EXPECT_EQ(std::filesystem::file_size(path), (*writer)->bytes_written());
  EXPECT_LE((*writer)->bytes_written(), 16u << 10);
  {
    auto prefix = CaptureReader::Open(path);
    ASSERT_TRUE(prefix.ok()) << prefix.status();
    EXPECT_TRUE((*prefix)->scan_status().ok()) << (*prefix)->scan_status();
    EXPECT_FALSE((*prefix)->truncated());
    EXPECT_EQ((*prefix)->steps().size(), written);
  }
  // Close fails too (the index and end record do not fit) and is cut back.
  EXPECT_FALSE((*writer)->Close().ok());
  EXPECT_EQ(std::filesystem::file_size(path), (*writer)->bytes_written());
  // Space returns: the failed step and the ones after it follow the prefix.
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &saved), 0);
  signal(SIGXFSZ, old_handler);
  for (uint64_t i = written; i < written + 10; ++i) ASSERT_TRUE((*writer)->Append(TestStep(i, 0)).ok());
  ASSERT_TRUE((*writer)->Close().ok());
  auto r = CaptureReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE((*r)->end().has_value());
  EXPECT_TRUE((*r)->end()->ok);
  EXPECT_EQ((*r)->end()->write_errors, 2u);
  EXPECT_TRUE((*r)->Verify().status.ok()) << (*r)->Verify().status;
  ASSERT_EQ((*r)->steps().size(), written + 10);
  for (uint64_t i = 0; i < written + 10; ++i) EXPECT_EQ((*r)->steps()[i].step, i);
}

}  // namespace
}  // namespace crashreplay
