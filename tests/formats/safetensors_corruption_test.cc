// Named corruption cases for the safetensors reader and checkpoint loader.
// Each builds a damaged file through the ordinary bytes-on-disk path and
// checks the status code and that the message names the file and tensor.
#include <fcntl.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "crashreplay/formats/safetensors.h"
#include "safetensors_test_util.h"

namespace crashreplay {
namespace {

using testing::HasSubstr;
using testing_util::RawSafetensors;
using testing_util::ScratchDir;
using testing_util::WriteBytes;

// Opens `bytes` from a real file named after the case, so the message must
// carry the path. The deferred reader (header by pread, nothing mapped: layer
// streaming's) must refuse every case exactly as the mapping one does.
absl::Status OpenBytes(const std::string& file_name, const std::string& bytes, std::string* path_out = nullptr) {
  const std::string path = ScratchDir() + "/" + file_name;
  WriteBytes(path, bytes);
  if (path_out != nullptr) *path_out = path;
  const absl::Status mapped = SafetensorsFile::Open(path).status();
  const absl::Status deferred = SafetensorsFile::OpenDeferred(path).status();
  EXPECT_EQ(deferred, mapped) << "OpenDeferred disagrees with Open on " << file_name;
  return mapped;
}

void ExpectError(const absl::Status& s, absl::StatusCode code, const std::string& file, const std::string& tensor,
                 const std::string& detail) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(file));
  if (!tensor.empty()) {
    EXPECT_THAT(std::string(s.message()), HasSubstr("'" + tensor + "'"));
  }
  EXPECT_THAT(std::string(s.message()), HasSubstr(detail));
}

std::string OneTensor(const std::string& name, const std::string& dtype, const std::string& shape,
                      const std::string& offsets) {
  return "{\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":" + offsets + "}}";
}

constexpr auto kDataLoss = absl::StatusCode::kDataLoss;

TEST(SafetensorsCorruptionTest, FileShorterThanLengthPrefix) {
  ExpectError(OpenBytes("short.safetensors", "\x05\x00\x00"), kDataLoss, "short.safetensors", "",
              "shorter than the 8-byte header length");
}

TEST(SafetensorsCorruptionTest, EmptyFile) {
  ExpectError(OpenBytes("empty.safetensors", ""), kDataLoss, "empty.safetensors", "", "is 0 bytes");
}

TEST(SafetensorsCorruptionTest, HeaderLengthPastEndOfFile) {
  std::string bytes = RawSafetensors("{}", "");
  bytes[0] = 100;  // claims 100 header bytes, 2 follow
  ExpectError(OpenBytes("len.safetensors", bytes), kDataLoss, "len.safetensors", "",
              "header length 100 is more than the 2 bytes");
}

TEST(SafetensorsCorruptionTest, HeaderLengthHugeDoesNotAllocate) {
  std::string bytes = RawSafetensors("{}", "");
  for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = '\xff';
  ExpectError(OpenBytes("huge.safetensors", bytes), kDataLoss, "huge.safetensors", "", "18446744073709551615");
}

TEST(SafetensorsCorruptionTest, HeaderOverTheCapIsResourceExhausted) {
  // A sparse file just over the cap: the length is consistent with the file,
  // so only the cap refuses it. Sparse, so the test costs no disk or memory.
  const std::string path = ScratchDir() + "/big.safetensors";
  const uint64_t header = SafetensorsFile::kMaxHeaderBytes + 8;
  std::string prefix(8, '\0');
  for (int i = 0; i < 8; ++i) prefix[static_cast<size_t>(i)] = static_cast<char>(header >> (8 * i));
  WriteBytes(path, prefix + "{");
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(8 + header)), 0);
  ExpectError(SafetensorsFile::Open(path).status(), absl::StatusCode::kResourceExhausted, "big.safetensors", "",
              "over this reader's limit of 104857600");
}

TEST(SafetensorsCorruptionTest, TruncatedJson) {
  const std::string header = OneTensor("w", "F32", "[1]", "[0,4]");
  ExpectError(OpenBytes("trunc.safetensors", RawSafetensors(header.substr(0, 30), "")), kDataLoss, "trunc.safetensors",
              "", "malformed JSON");
}

TEST(SafetensorsCorruptionTest, HeaderNotAnObject) {
  ExpectError(OpenBytes("array.safetensors", RawSafetensors("[1,2]   ", "")), kDataLoss, "array.safetensors", "",
              "does not start with '{'");
}

TEST(SafetensorsCorruptionTest, TrailingGarbageAfterJson) {
  ExpectError(OpenBytes("trail.safetensors", RawSafetensors("{} x", "")), kDataLoss, "trail.safetensors", "",
              "malformed JSON");
}

TEST(SafetensorsCorruptionTest, InvalidUtf8InTensorName) {
  ExpectError(OpenBytes("utf8.safetensors", RawSafetensors(OneTensor("w\xff", "U8", "[1]", "[0,1]"), "x")), kDataLoss,
              "utf8.safetensors", "", "malformed JSON");
}

TEST(SafetensorsCorruptionTest, NestingDeeperThanLimit) {
  std::string deep = "{\"__metadata__\":" + std::string(40, '[') + std::string(40, ']') + "}";
  ExpectError(OpenBytes("deep.safetensors", RawSafetensors(deep, "")), kDataLoss, "deep.safetensors", "",
              "nests deeper than");
}

TEST(SafetensorsCorruptionTest, UnknownDtype) {
  ExpectError(OpenBytes("dtype.safetensors", RawSafetensors(OneTensor("layers.0.w", "F7", "[1]", "[0,1]"), "x")),
              kDataLoss, "dtype.safetensors", "layers.0.w", "unknown dtype \"F7\"");
}

TEST(SafetensorsCorruptionTest, SafetensorsDtypeWeDoNotSupportIsUnimplemented) {
  ExpectError(OpenBytes("c64.safetensors", RawSafetensors(OneTensor("z", "C64", "[1]", "[0,8]"), "12345678")),
              absl::StatusCode::kUnimplemented, "c64.safetensors", "z", "C64");
}

TEST(SafetensorsCorruptionTest, DtypeNotAString) {
  const std::string header = R"({"w":{"dtype":7,"shape":[1],"data_offsets":[0,1]}})";
  ExpectError(OpenBytes("dtype7.safetensors", RawSafetensors(header, "x")), kDataLoss, "dtype7.safetensors", "w",
              "\"dtype\" is a JSON integer");
}

TEST(SafetensorsCorruptionTest, MissingDataOffsets) {
  const std::string header = R"({"w":{"dtype":"U8","shape":[1]}})";
  ExpectError(OpenBytes("nooff.safetensors", RawSafetensors(header, "x")), kDataLoss, "nooff.safetensors", "w",
              "no \"data_offsets\"");
}

TEST(SafetensorsCorruptionTest, TensorEntryNotAnObject) {
  ExpectError(OpenBytes("entry.safetensors", RawSafetensors(R"({"w":[1,2]})", "")), kDataLoss, "entry.safetensors", "w",
              "expected an object");
}

TEST(SafetensorsCorruptionTest, NegativeShape) {
  ExpectError(OpenBytes("neg.safetensors", RawSafetensors(OneTensor("w", "F32", "[2,-3]", "[0,0]"), "")), kDataLoss,
              "neg.safetensors", "w", "dimension 1 is negative (-3)");
}

TEST(SafetensorsCorruptionTest, FractionalShape) {
  ExpectError(OpenBytes("frac.safetensors", RawSafetensors(OneTensor("w", "F32", "[2.5]", "[0,10]"), "0123456789")),
              kDataLoss, "frac.safetensors", "w", "dimension 0 is a JSON number");
}

TEST(SafetensorsCorruptionTest, ElementCountOverflows) {
  ExpectError(
      OpenBytes("ovf.safetensors", RawSafetensors(OneTensor("w", "U8", "[4294967296,4294967296]", "[0,0]"), "")),
      kDataLoss, "ovf.safetensors", "w", "element count overflows");
}

TEST(SafetensorsCorruptionTest, ByteSizeOverflows) {
  ExpectError(
      OpenBytes("bovf.safetensors", RawSafetensors(OneTensor("w", "F64", "[4611686018427387904]", "[0,0]"), "")),
      kDataLoss, "bovf.safetensors", "w", "byte size overflows");
}

TEST(SafetensorsCorruptionTest, DimensionBeyondInt64) {
  ExpectError(OpenBytes("big.safetensors", RawSafetensors(OneTensor("w", "U8", "[18446744073709551615]", "[0,0]"), "")),
              kDataLoss, "big.safetensors", "w", "does not fit");
}

TEST(SafetensorsCorruptionTest, TooManyDimensions) {
  std::string shape = "[";
  for (int i = 0; i < 40; ++i) shape += (i ? ",1" : "1");
  shape += "]";
  ExpectError(OpenBytes("rank.safetensors", RawSafetensors(OneTensor("w", "U8", shape, "[0,1]"), "x")), kDataLoss,
              "rank.safetensors", "w", "40 dimensions");
}

TEST(SafetensorsCorruptionTest, OddNumberOfFp4Elements) {
  ExpectError(OpenBytes("fp4.safetensors", RawSafetensors(OneTensor("w", "F4", "[3]", "[0,2]"), "xy")), kDataLoss,
              "fp4.safetensors", "w", "whole number of bytes");
}

TEST(SafetensorsCorruptionTest, OffsetsOutsideDataRegion) {
  ExpectError(OpenBytes("outside.safetensors", RawSafetensors(OneTensor("w", "F32", "[2]", "[4,12]"), "12345678")),
              kDataLoss, "outside.safetensors", "w", "reach past the data region, which holds 8");
}

TEST(SafetensorsCorruptionTest, DataRegionTruncated) {
  // A valid file cut short: the last tensor no longer fits.
  SafetensorsWriter w;
  std::vector<std::byte> data(64, std::byte{1});
  ASSERT_TRUE(w.Add("a", DType::kF32, {16}, data).ok());
  const std::string full = w.Serialize();
  ExpectError(OpenBytes("cut.safetensors", full.substr(0, full.size() - 1)), kDataLoss, "cut.safetensors", "a",
              "file truncated?");
}

TEST(SafetensorsCorruptionTest, OffsetsReversed) {
  ExpectError(OpenBytes("rev.safetensors", RawSafetensors(OneTensor("w", "U8", "[0]", "[4,2]"), "12345678")), kDataLoss,
              "rev.safetensors", "w", "end before they begin");
}

TEST(SafetensorsCorruptionTest, OffsetsWrongArity) {
  ExpectError(OpenBytes("arity.safetensors", RawSafetensors(OneTensor("w", "U8", "[1]", "[0,1,2]"), "xy")), kDataLoss,
              "arity.safetensors", "w", "must be [begin, end]");
}

TEST(SafetensorsCorruptionTest, OffsetsNegative) {
  ExpectError(OpenBytes("negoff.safetensors", RawSafetensors(OneTensor("w", "U8", "[1]", "[-1,0]"), "xy")), kDataLoss,
              "negoff.safetensors", "w", "non-negative integers");
}

TEST(SafetensorsCorruptionTest, ByteLengthDisagreesWithShape) {
  ExpectError(OpenBytes("len.safetensors", RawSafetensors(OneTensor("w", "BF16", "[2,3]", "[0,10]"), "0123456789ab")),
              kDataLoss, "len.safetensors", "w", "hold 10 bytes but shape [2, 3] of BF16 needs 12");
}

TEST(SafetensorsCorruptionTest, OverlappingTensors) {
  const std::string header = R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                             R"("b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})";
  ExpectError(OpenBytes("overlap.safetensors", RawSafetensors(header, "01234567")), kDataLoss, "overlap.safetensors",
              "b", "overlap tensor 'a'");
}

TEST(SafetensorsCorruptionTest, DuplicateTensorName) {
  const std::string header = R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                             R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})";
  ExpectError(OpenBytes("dup.safetensors", RawSafetensors(header, "xy")), kDataLoss, "dup.safetensors", "a",
              "appears twice");
}

TEST(SafetensorsCorruptionTest, MetadataValueNotAString) {
  ExpectError(OpenBytes("meta.safetensors", RawSafetensors(R"({"__metadata__":{"format":1}})", "")), kDataLoss,
              "meta.safetensors", "format", "expected a string");
}

TEST(SafetensorsCorruptionTest, AcceptsWhatTheRulesAllow) {
  // Counterpart to the cases above: gaps between tensors, trailing bytes,
  // empty tensors sharing an offset and unknown extra keys are all legal.
  const std::string header = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[4,6],"extra":{"x":1}},)"
                             R"("e1":{"dtype":"F32","shape":[0],"data_offsets":[5,5]},)"
                             R"("e2":{"dtype":"F32","shape":[3,0],"data_offsets":[5,5]}})";
  std::string path;
  ASSERT_TRUE(OpenBytes("ok.safetensors", RawSafetensors(header, "0123456789"), &path).ok());
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok());
  const TensorInfo* a = (*f)->Find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->data_offset, 8 + header.size() + 4);
  auto data = (*f)->Data(*a);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(data.data()), data.size()), "45");
  EXPECT_EQ((*f)->Find("e2")->NumElements(), 0);
}

// --- checkpoint directories ---

std::string ValidShard(const std::string& name) {
  SafetensorsWriter w;
  std::vector<std::byte> data(4, std::byte{7});
  EXPECT_TRUE(w.Add(name, DType::kF32, {1}, data).ok());
  return w.Serialize();
}

std::string Index(const std::string& weight_map) {
  return "{\"metadata\":{\"total_size\":4},\"weight_map\":" + weight_map + "}";
}

TEST(CheckpointCorruptionTest, IndexPointsAtMissingShard) {
  const std::string dir = ScratchDir();
  WriteBytes(dir + "/model.safetensors.index.json", Index(R"({"w":"model-00001-of-00002.safetensors"})"));
  ExpectError(Checkpoint::Open(dir).status(), absl::StatusCode::kNotFound, "model-00001-of-00002.safetensors", "w",
              "No such file");
}

TEST(CheckpointCorruptionTest, IndexPathTraversal) {
  const std::string dir = ScratchDir();
  WriteBytes(dir + "/../outside.safetensors", ValidShard("w"));
  WriteBytes(dir + "/model.safetensors.index.json", Index(R"({"w":"../outside.safetensors"})"));
  ExpectError(Checkpoint::Open(dir).status(), absl::StatusCode::kInvalidArgument, "model.safetensors.index.json", "w",
              "not a relative path inside");
}

TEST(CheckpointCorruptionTest, IndexAbsoluteShardPath) {
  const std::string dir = ScratchDir();
  WriteBytes(dir + "/a.safetensors", ValidShard("w"));
  WriteBytes(dir + "/model.safetensors.index.json", Index("{\"w\":\"" + dir + "/a.safetensors\"}"));
  ExpectError(Checkpoint::Open(dir).status(), absl::StatusCode::kInvalidArgument, "model.safetensors.index.json", "w",
              "not a relative path inside");
}

TEST(CheckpointCorruptionTest, IndexListsTensorMissingFromShard) {
  const std::string dir = ScratchDir();
  WriteBytes(dir + "/a.safetensors", ValidShard("w"));
  WriteBytes(dir + "/model.safetensors.index.json", Index(R"({"w":"a.safetensors","v":"a.safetensors"})"));
  ExpectError(Checkpoint::Open(dir).status(), kDataLoss, "a.safetensors", "v", "that shard has no such tensor");
}

TEST(CheckpointCorruptionTest, IndexMalformed) {
  const std::string dir = ScratchDir();
  WriteBytes(dir + "/model.safetensors.index.json", "{\"weight_map\": {\"w\": ");
  ExpectError(Checkpoint::Open(dir).status(), kDataLoss, "model.safetensors.index.json", "", "malformed JSON");
}

TEST(CheckpointCorruptionTest, IndexWeightMapWrongType) {
  const std::string dir = ScratchDir();
  WriteBytes(dir + "/model.safetensors.index.json", Index(R"({"w":3})"));
  ExpectError(Checkpoint::Open(dir).status(), kDataLoss, "model.safetensors.index.json", "w", "expected a file name");
}

TEST(CheckpointCorruptionTest, CorruptShardNamesShardAndIndex) {
  const std::string dir = ScratchDir();
  std::string shard = ValidShard("w");
  shard[0] = '\x7f';  // header length now past the end
  WriteBytes(dir + "/a.safetensors", shard);
  WriteBytes(dir + "/model.safetensors.index.json", Index(R"({"w":"a.safetensors"})"));
  ExpectError(Checkpoint::Open(dir).status(), kDataLoss, "a.safetensors", "w", "is more than the");
}

TEST(CheckpointCorruptionTest, SameTensorInTwoUnindexedShards) {
  const std::string dir = ScratchDir();
  WriteBytes(dir + "/a.safetensors", ValidShard("w"));
  WriteBytes(dir + "/b.safetensors", ValidShard("w"));
  ExpectError(Checkpoint::Open(dir).status(), kDataLoss, "b.safetensors", "w", "is in both");
}

TEST(CheckpointCorruptionTest, DirectoryWithoutShards) {
  const std::string dir = ScratchDir();
  WriteBytes(dir + "/config.json", "{}");
  ExpectError(Checkpoint::Open(dir).status(), absl::StatusCode::kNotFound, dir, "", "no model.safetensors.index.json");
}

TEST(CheckpointTest, UnindexedShardsAreAllLoaded) {
  const std::string dir = ScratchDir();
  WriteBytes(dir + "/b.safetensors", ValidShard("w2"));
  WriteBytes(dir + "/a.safetensors", ValidShard("w1"));
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_THAT((*ckpt)->names(), testing::ElementsAre("w1", "w2"));
  EXPECT_EQ((*ckpt)->Find("w2")->file->path(), dir + "/b.safetensors");
  EXPECT_TRUE((*ckpt)->config_path().empty());
}

TEST(CheckpointTest, SingleModelFileWinsOverOtherShards) {
  const std::string dir = ScratchDir();
  WriteBytes(dir + "/model.safetensors", ValidShard("w"));
  WriteBytes(dir + "/stale.safetensors", ValidShard("w"));  // ignored
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->shards().size(), 1u);
  EXPECT_EQ(Checkpoint::Open(dir + "/nope").status().code(), absl::StatusCode::kNotFound);
}

TEST(SafetensorsFileTest, OpenReportsMissingFileAndDirectory) {
  const std::string dir = ScratchDir();
  EXPECT_EQ(SafetensorsFile::Open(dir + "/absent.safetensors").status().code(), absl::StatusCode::kNotFound);
  // No regular file there: NotFound, like a missing file (exit 3 in the CLI).
  EXPECT_EQ(SafetensorsFile::Open(dir).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace crashreplay

namespace crashreplay {
namespace {

// The fuzz corpus doubles as labelled data: seed_* files are valid, golden_*
// files are known-bad inputs that must keep failing with DataLoss or
// ResourceExhausted (fuzz/corpus/safetensors/).
TEST(SafetensorsFuzzCorpusTest, SeedsLoadAndGoldenFailuresAreRejected) {
  const std::filesystem::path dir = std::filesystem::path(testing_util::SourceDir()) / "fuzz/corpus/safetensors";
  int seeds = 0;
  int golden = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    const std::string bytes = testing_util::ReadBytes(e.path().string());
    auto f = SafetensorsFile::FromBuffer(name, std::as_bytes(std::span(bytes)));
    if (name.starts_with("seed_")) {
      EXPECT_TRUE(f.ok()) << name << ": " << f.status();
      ++seeds;
    } else if (name.starts_with("golden_")) {
      EXPECT_TRUE(f.status().code() == absl::StatusCode::kDataLoss ||
                  f.status().code() == absl::StatusCode::kResourceExhausted)
          << name << ": " << f.status();
      EXPECT_THAT(std::string(f.status().message()), HasSubstr(name));
      ++golden;
    }
  }
  EXPECT_GE(seeds, 3);
  EXPECT_GE(golden, 15);
}

}  // namespace
}  // namespace crashreplay
