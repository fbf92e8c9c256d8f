// What is not a safetensors file at all: a directory, a FIFO, a device.
// Each is refused at once with NotFound naming the path and what it is
// (exit 3 in the CLI), never read and never waited on. Plus the header
// parser on a 100,000-tensor shard (linear: the old DOM parse with a
// duplicate-key callback was quadratic) and the dtypes the safetensors
// package writes that crashreplay does not support.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <future>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "crashreplay/formats/checkpoint.h"
#include "crashreplay/formats/safetensors.h"
#include "safetensors_test_util.h"

namespace crashreplay {
namespace {

using testing::HasSubstr;
using testing_util::RawSafetensors;
using testing_util::ScratchDir;
using testing_util::WriteBytes;

// Runs `open` with a watchdog: if it has not returned after 10 s it is stuck
// on the FIFO, so the FIFO is opened for writing (which releases it) and the
// test fails instead of hanging.
absl::Status OpenedWithin(const std::string& fifo, std::function<absl::Status()> open) {
  auto done = std::async(std::launch::async, std::move(open));
  if (done.wait_for(std::chrono::seconds(10)) == std::future_status::timeout) {
    ADD_FAILURE() << "the reader blocked on the FIFO " << fifo;
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    const absl::Status s = done.get();
    if (fd >= 0) ::close(fd);
    return s;
  }
  return done.get();
}

void ExpectRefused(const absl::Status& s, const std::string& path, const std::string& what) {
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(path));
  EXPECT_THAT(std::string(s.message()), HasSubstr(what));
}

TEST(SafetensorsSpecialFiles, AFifoIsRefusedAtOnce) {
  const std::string fifo = ScratchDir() + "/model.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const absl::Status s = OpenedWithin(fifo, [&] { return SafetensorsFile::Open(fifo).status(); });
  ExpectRefused(s, fifo, "is a FIFO (named pipe), not a regular file");
}

TEST(SafetensorsSpecialFiles, ADeviceOrADirectoryIsRefused) {
  ExpectRefused(SafetensorsFile::Open("/dev/zero").status(), "/dev/zero", "is a character device");
  ExpectRefused(SafetensorsFile::Open("/dev/null").status(), "/dev/null", "is a character device");
  const std::string dir = ScratchDir();
  ExpectRefused(SafetensorsFile::Open(dir).status(), dir, "is a directory");
  EXPECT_EQ(SafetensorsFile::Open(dir + "/absent.safetensors").status().code(), absl::StatusCode::kNotFound);
}

TEST(SafetensorsSpecialFiles, ACheckpointWithAFifoShardOrIndexIsRefusedAtOnce) {
  const std::string dir = ScratchDir();
  ASSERT_EQ(::mkfifo((dir + "/model.safetensors").c_str(), 0600), 0);
  const absl::Status shard = OpenedWithin(dir + "/model.safetensors", [&] { return Checkpoint::Open(dir).status(); });
  ExpectRefused(shard, dir + "/model.safetensors", "FIFO");

  const std::string indexed = ScratchDir() + "/indexed";
  std::filesystem::create_directories(indexed);
  ASSERT_EQ(::mkfifo((indexed + "/model.safetensors.index.json").c_str(), 0600), 0);
  const absl::Status index =
      OpenedWithin(indexed + "/model.safetensors.index.json", [&] { return Checkpoint::Open(indexed).status(); });
  ExpectRefused(index, "model.safetensors.index.json", "FIFO");

  // A shard that is a device, named by an index.
  const std::string dev = ScratchDir() + "/dev";
  std::filesystem::create_directories(dev);
  WriteBytes(dev + "/model.safetensors.index.json", R"({"weight_map":{"w":"zero.safetensors"}})");
  ::symlink("/dev/zero", (dev + "/zero.safetensors").c_str());
  ExpectRefused(Checkpoint::Open(dev).status(), "zero.safetensors", "character device");
  // A checkpoint "directory" that is a file.
  ExpectRefused(Checkpoint::Open(dev + "/model.safetensors.index.json").status(), "index.json", "is not a directory");
}

// 100,000 tensors, written in reverse name order: every one is found, in
// name order, with its bytes. (The duplicate-key callback parse took
// minutes here; this one is linear, see bench/safetensors_header_bench.)
TEST(SafetensorsHeader, OneHundredThousandTensorsParse) {
  constexpr int kTensors = 100000;
  std::string header = "{";
  std::string data;
  for (int i = kTensors - 1; i >= 0; --i) {
    const std::string name = "model.layers." + std::to_string(i / 100) + ".experts." + std::to_string(i % 100) + ".w";
    header += (header.size() > 1 ? ",\"" : "\"") + name + "\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[" +
              std::to_string(data.size()) + "," + std::to_string(data.size() + 2) + "]}";
    data += static_cast<char>(i & 0xFF);
    data += static_cast<char>((i >> 8) & 0xFF);
  }
  header += "}";
  const std::string path = ScratchDir() + "/big.safetensors";
  WriteBytes(path, RawSafetensors(header, data));
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ((*f)->tensors().size(), static_cast<size_t>(kTensors));
  EXPECT_TRUE(std::is_sorted((*f)->tensors().begin(), (*f)->tensors().end(),
                             [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; }));
  const TensorInfo* t = (*f)->Find("model.layers.123.experts.45.w");
  ASSERT_NE(t, nullptr);
  const auto bytes = (*f)->Data(*t);
  ASSERT_EQ(bytes.size(), 2u);
  EXPECT_EQ(static_cast<int>(bytes[0]) | (static_cast<int>(bytes[1]) << 8), 12345);
}

TEST(SafetensorsHeader, ADuplicateNameAmongManyIsCaught) {
  std::string header = "{";
  for (int i = 0; i < 5000; ++i) {
    header += "\"t" + std::to_string(i) + "\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[" + std::to_string(i) +
              "," + std::to_string(i + 1) + "]},";
  }
  header += "\"t2500\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[5000,5001]}}";
  const std::string path = ScratchDir() + "/dup.safetensors";
  WriteBytes(path, RawSafetensors(header, std::string(5001, 'x')));
  const absl::Status s = SafetensorsFile::Open(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("key 't2500' appears twice"));
  // Inside one tensor's entry too.
  WriteBytes(path, RawSafetensors(R"({"w":{"dtype":"U8","dtype":"I8","shape":[1],"data_offsets":[0,1]}})", "x"));
  EXPECT_THAT(std::string(SafetensorsFile::Open(path).status().message()), HasSubstr("key 'dtype' appears twice"));
}

// The fp8 "fnuz" formats (one NaN, no negative zero; AMD GPUs) are written
// by the real safetensors package: valid files crashreplay does not
// support, so Unimplemented, not corruption.
TEST(SafetensorsDtypes, FnuzFp8IsUnsupportedNotCorrupt) {
  for (const std::string dtype : {"F8_E4M3FNUZ", "F8_E5M2FNUZ"}) {
    const std::string dir = ScratchDir();
    const std::string spec = dir + "/spec.json", out = dir + "/" + dtype + ".safetensors";
    WriteBytes(spec, R"({"tensors":[{"name":"w","dtype":")" + dtype + R"(","shape":[4],"seed":1}]})");
    testing_util::RunPython("write " + out + " " + spec);
    const absl::Status s = SafetensorsFile::Open(out).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(dtype));
    EXPECT_THAT(std::string(s.message()), HasSubstr("valid safetensors but crashreplay does not support it"));
  }
}

}  // namespace
}  // namespace crashreplay
