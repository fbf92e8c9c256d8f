// The deferred reader (SafetensorsFile::OpenDeferred, Checkpoint kDeferred):
// what layer streaming opens. It maps nothing at open, maps one tensor when
// asked, unmaps it when the last holder lets go, and turns a file that
// shrank under it into an error instead of a SIGBUS. (Every corruption case
// of safetensors_corruption_test.cc also opens deferred and must fail alike.)
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ctime>

#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "crashreplay/formats/checkpoint.h"
#include "crashreplay/formats/safetensors.h"
#include "safetensors_test_util.h"

namespace crashreplay {
namespace {

using testing::HasSubstr;
using testing_util::Pattern;
using testing_util::ScratchDir;

// Lines of /proc/self/maps naming `path`: the process's mappings of the file.
int MappingsOf(const std::string& path) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  int n = 0;
  while (std::getline(maps, line)) n += line.find(path) != std::string::npos;
  return n;
}

std::string WriteThreeTensors(const std::string& name) {
  SafetensorsWriter w;
  EXPECT_TRUE(w.Add("a", DType::kBF16, {64, 96}, Pattern(1, 64 * 96 * 2)).ok());
  EXPECT_TRUE(w.Add("b", DType::kF32, {5000}, Pattern(2, 5000 * 4)).ok());  // spans pages, not page-aligned
  EXPECT_TRUE(w.Add("c", DType::kU8, {3}, Pattern(3, 3)).ok());
  const std::string path = ScratchDir() + "/" + name;
  EXPECT_TRUE(w.Write(path).ok());
  return path;
}

TEST(SafetensorsDeferred, MapsEachTensorAloneWithTheBytesOfTheMappedReader) {
  const std::string path = WriteThreeTensors("deferred.safetensors");
  auto mapped = SafetensorsFile::Open(path);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  auto deferred = SafetensorsFile::OpenDeferred(path);
  ASSERT_TRUE(deferred.ok()) << deferred.status();
  const int before = MappingsOf(path);  // the mapped reader's own mapping
  EXPECT_TRUE((*deferred)->deferred());
  EXPECT_EQ((*deferred)->file_size(), (*mapped)->file_size());
  EXPECT_EQ((*deferred)->header_size(), (*mapped)->header_size());
  ASSERT_EQ((*deferred)->tensors().size(), 3u);
  for (const TensorInfo& t : (*deferred)->tensors()) {
    EXPECT_TRUE((*deferred)->Data(t).empty()) << "a deferred file reads through MapTensor only";
    auto m = (*deferred)->MapTensor(t);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(MappingsOf(path), before + 1) << t.name;
    const auto want = (*mapped)->Data(*(*mapped)->Find(t.name));
    ASSERT_EQ((*m)->bytes().size(), want.size()) << t.name;
    EXPECT_TRUE(std::equal(want.begin(), want.end(), (*m)->bytes().begin())) << t.name;
    m->reset();
    EXPECT_EQ(MappingsOf(path), before) << t.name << " stays mapped after its last holder let go";
  }
}

TEST(SafetensorsDeferred, AFileThatShrankIsAnErrorNotASigbus) {
  const std::string path = WriteThreeTensors("shrinks.safetensors");
  auto f = SafetensorsFile::OpenDeferred(path);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>((*f)->file_size() - 1)), 0);
  for (const TensorInfo& t : (*f)->tensors()) {
    auto m = (*f)->MapTensor(t);
    ASSERT_FALSE(m.ok()) << t.name;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(std::string(m.status().message()), HasSubstr("'" + t.name + "'"));
    EXPECT_THAT(std::string(m.status().message()), HasSubstr("changed while it was in use"));
    EXPECT_THAT(std::string(m.status().message()), HasSubstr(path));
  }
}

TEST(SafetensorsDeferred, AFileRewrittenInPlaceIsAnError) {
  const std::string path = WriteThreeTensors("rewritten.safetensors");
  auto f = SafetensorsFile::OpenDeferred(path);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE((*f)->MapTensor((*f)->tensors()[0]).ok());
  // Same size, other bytes, a later modification time (set explicitly: a
  // coarse file-system clock could otherwise give the same one).
  {
    std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(-1, std::ios::end);
    io.put('\x77');
  }
  struct timespec later[2] = {{0, UTIME_OMIT}, {::time(nullptr) + 10, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), later, 0), 0);
  auto m = (*f)->MapTensor((*f)->tensors()[0]);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("was modified after it was opened"));
}

TEST(SafetensorsDeferred, CheckpointOpensEveryShardDeferred) {
  const std::string dir = ScratchDir() + "/deferred_ckpt";
  SafetensorsWriter w;
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(w.Add("t" + std::to_string(i), DType::kBF16, {128, 64}, Pattern(i, 128 * 64 * 2)).ok());
  }
  ASSERT_TRUE(w.WriteSharded(dir, 40000).ok());  // an index and several shards
  auto mapped = Checkpoint::Open(dir);
  auto deferred = Checkpoint::Open(dir, Checkpoint::Mode::kDeferred);
  ASSERT_TRUE(mapped.ok() && deferred.ok());
  EXPECT_GT((*deferred)->shards().size(), 1u);
  EXPECT_EQ((*deferred)->file_bytes(), (*mapped)->file_bytes());
  EXPECT_EQ(MappingsOf(dir + "/"), static_cast<int>((*mapped)->shards().size()));
  for (const std::string& name : (*deferred)->names()) {
    auto m = (*deferred)->MapTensor(name);
    ASSERT_TRUE(m.ok()) << m.status();
    auto want = (*mapped)->Data(name);
    ASSERT_TRUE(want.ok());
    ASSERT_EQ((*m)->bytes().size(), want->size());
    EXPECT_TRUE(std::equal(want->begin(), want->end(), (*m)->bytes().begin())) << name;
  }
  EXPECT_EQ((*deferred)->MapTensor("nope").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace crashreplay
