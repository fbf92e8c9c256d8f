// SafetensorsWriter: input validation, layout, and atomic replacement.
#include "crashreplay/formats/safetensors_writer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "crashreplay/formats/safetensors_file.h"
#include "safetensors_test_util.h"

namespace crashreplay {
namespace {

using testing::HasSubstr;
using testing_util::ReadBytes;
using testing_util::ScratchDir;

std::vector<std::byte> Bytes(size_t n, uint8_t v = 1) { return std::vector<std::byte>(n, static_cast<std::byte>(v)); }

TEST(SafetensorsWriterTest, AddRejectsSizeThatDisagreesWithShape) {
  SafetensorsWriter w;
  const absl::Status s = w.Add("w", DType::kBF16, {2, 3}, Bytes(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("'w'"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("needs 12 bytes, got 10"));
  EXPECT_EQ(w.num_tensors(), 0u);
}

TEST(SafetensorsWriterTest, AddRejectsDuplicateReservedAndBadNames) {
  SafetensorsWriter w;
  ASSERT_TRUE(w.Add("w", DType::kU8, {1}, Bytes(1)).ok());
  EXPECT_EQ(w.Add("w", DType::kU8, {1}, Bytes(1)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w.Add("__metadata__", DType::kU8, {1}, Bytes(1)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w.Add("", DType::kU8, {1}, Bytes(1)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w.Add("bad\xc3", DType::kU8, {1}, Bytes(1)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w.Add("neg", DType::kU8, {-1}, {}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w.num_tensors(), 1u);
}

TEST(SafetensorsWriterTest, LaysOutByDtypeRankThenNameWithAlignedHeader) {
  SafetensorsWriter w;
  ASSERT_TRUE(w.Add("b_u8", DType::kU8, {3}, Bytes(3, 1)).ok());
  ASSERT_TRUE(w.Add("a_u8", DType::kU8, {1}, Bytes(1, 2)).ok());
  ASSERT_TRUE(w.Add("z_f32", DType::kF32, {1}, Bytes(4, 3)).ok());
  const std::string bytes = w.Serialize();
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
  EXPECT_EQ(n % 8, 0u);
  const std::string json = R"({"z_f32":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                           R"("a_u8":{"dtype":"U8","shape":[1],"data_offsets":[4,5]},)"
                           R"("b_u8":{"dtype":"U8","shape":[3],"data_offsets":[5,8]}})";
  ASSERT_GE(n, json.size());
  EXPECT_LT(n - json.size(), 8u);
  EXPECT_EQ(bytes.substr(8, n), json + std::string(n - json.size(), ' '));
  EXPECT_EQ(bytes.substr(8 + n), std::string("\x03\x03\x03\x03\x02\x01\x01\x01"));
}

TEST(SafetensorsWriterTest, WriteReplacesAtomicallyAndLeavesNoTemporary) {
  const std::string dir = ScratchDir();
  const std::string path = dir + "/m.safetensors";
  SafetensorsWriter first;
  ASSERT_TRUE(first.Add("old", DType::kU8, {1}, Bytes(1)).ok());
  ASSERT_TRUE(first.Write(path).ok());
  SafetensorsWriter second;
  ASSERT_TRUE(second.Add("new", DType::kI32, {2}, Bytes(8)).ok());
  ASSERT_TRUE(second.Write(path).ok());
  EXPECT_EQ(ReadBytes(path), second.Serialize());
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 1);
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok());
  EXPECT_NE((*f)->Find("new"), nullptr);
  EXPECT_EQ((*f)->Find("old"), nullptr);
}

TEST(SafetensorsWriterTest, WriteIntoMissingDirectoryFails) {
  SafetensorsWriter w;
  const absl::Status s = w.Write(ScratchDir() + "/no/such/dir/m.safetensors");
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("no/such/dir"));
}

TEST(SafetensorsWriterTest, SingleShardCheckpointHasNoIndex) {
  const std::string dir = ScratchDir();
  SafetensorsWriter w;
  ASSERT_TRUE(w.Add("w", DType::kF32, {4}, Bytes(16)).ok());
  ASSERT_TRUE(w.WriteSharded(dir, 1 << 20).ok());
  EXPECT_TRUE(std::filesystem::exists(dir + "/model.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/model.safetensors.index.json"));
}

}  // namespace
}  // namespace crashreplay
