// A capture path that is not a regular file (a FIFO, a device, a directory
// given as a file) is refused at once with NotFound naming it (exit 3 in the
// CLI, tests/tools/capture_cli_test.cc), never read and never waited on.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <future>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "crashreplay/formats/capture_reader.h"

namespace crashreplay {
namespace {

using testing::HasSubstr;

std::string TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "crspecial-XXXXXX").string();
  return ::mkdtemp(tmpl.data());
}

TEST(CaptureSpecialFiles, AFifoIsRefusedAtOnce) {
  const std::string dir = TempDir();
  const std::string fifo = dir + "/rank-00000.crcap";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto done = std::async(std::launch::async, [&] { return CaptureReader::Open(fifo).status(); });
  if (done.wait_for(std::chrono::seconds(10)) == std::future_status::timeout) {
    ADD_FAILURE() << "CaptureReader::Open blocked on a FIFO";
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // releases it
    done.wait();
    if (fd >= 0) ::close(fd);
  }
  const absl::Status s = done.get();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(fifo));
  EXPECT_THAT(std::string(s.message()), HasSubstr("is a FIFO (named pipe), not a regular file"));
  // A session directory holding it: the listing finds it, the reader refuses it.
  auto files = ListCaptureFiles(dir);
  ASSERT_TRUE(files.ok());
  EXPECT_EQ(CaptureReader::Open(files->front()).status().code(), absl::StatusCode::kNotFound);
  std::filesystem::remove_all(dir);
}

TEST(CaptureSpecialFiles, ADeviceOrADirectoryIsRefused) {
  for (const char* dev : {"/dev/zero", "/dev/null"}) {
    const absl::Status s = CaptureReader::Open(dev).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("is a character device"));
  }
  const std::string dir = TempDir();
  const absl::Status s = CaptureReader::Open(dir).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr("is a directory"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace crashreplay
