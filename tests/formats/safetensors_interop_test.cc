// Interoperability with the real Python `safetensors` package: files it
// writes load byte-identically, and files we write it reads back
// identically (and, with at most one metadata key, are byte-identical to
// its own output).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "crashreplay/formats/safetensors.h"
#include "safetensors_test_util.h"

namespace crashreplay {
namespace {

using testing_util::Pattern;
using testing_util::ReadBytes;
using testing_util::RunPython;
using testing_util::ScratchDir;
using testing_util::WriteBytes;

struct Spec {
  std::string name;
  std::string dtype;  // safetensors spelling, as Python writes it ("F4")
  std::vector<int64_t> shape;
  int seed;
};

DType ToDType(const std::string& s) {
  if (s == "F4") return DType::kF4E2M1;
  auto t = ParseDType(s);
  EXPECT_TRUE(t.has_value()) << s;
  return t.value_or(DType::kU8);
}

size_t BytesOf(const Spec& s) {
  int64_t n = 1;
  for (int64_t d : s.shape) n *= d;
  return DTypeBytes(ToDType(s.dtype), static_cast<uint64_t>(n));
}

std::vector<std::byte> BytesFor(const Spec& s) { return Pattern(s.seed, BytesOf(s), s.dtype == "BOOL"); }

// Every dtype the format and we share, plus the awkward shapes: scalar,
// empty, zero-sized middle dimension, odd sizes that leave unaligned offsets,
// and names that need JSON escaping or are non-ASCII.
std::vector<Spec> AllDTypeSpecs() {
  return {
      {"model.embed_tokens.weight", "BF16", {7, 3}, 1},
      {"lm_head.weight", "F16", {3, 5}, 2},
      {"norm.weight", "F32", {5}, 3},
      {"double", "F64", {2, 2}, 4},
      {"flag", "BOOL", {3}, 5},
      {"u8", "U8", {9}, 6},
      {"i8", "I8", {1, 1, 3}, 7},
      {"i16", "I16", {3}, 8},
      {"u16", "U16", {2}, 9},
      {"i32", "I32", {3}, 10},
      {"u32", "U32", {1}, 11},
      {"i64", "I64", {2}, 12},
      {"u64", "U64", {1}, 13},
      {"experts.w.weight", "F8_E4M3", {4, 3}, 14},
      {"e5m2", "F8_E5M2", {5}, 15},
      {"experts.w.weight_scale", "F8_E8M0", {3}, 16},
      {"packed_fp4", "F4", {3, 4}, 17},
      {"scalar", "F32", {}, 18},
      {"empty", "BF16", {0}, 19},
      {"zero_middle", "I32", {4, 0, 2}, 20},
      {"quote\"back\\slash\nnewline\ttab\x01", "U8", {2}, 21},
      {"\xc3\xa9t\xc3\xa9/\xe2\x82\xac", "U8", {1}, 22},
  };
}

std::string SpecJson(const std::vector<Spec>& specs, const nlohmann::json& metadata) {
  nlohmann::json j;
  j["tensors"] = nlohmann::json::array();
  for (const Spec& s : specs) {
    j["tensors"].push_back({{"name", s.name}, {"dtype", s.dtype}, {"shape", s.shape}, {"seed", s.seed}});
  }
  j["metadata"] = metadata;
  return j.dump();
}

std::string PythonWrite(const std::string& dir, const std::string& file, const std::vector<Spec>& specs,
                        const nlohmann::json& metadata, const std::string& command = "write") {
  const std::string spec_path = dir + "/" + file + ".spec.json";
  WriteBytes(spec_path, SpecJson(specs, metadata));
  const std::string out = dir + "/" + file;
  RunPython(command + " '" + out + "' '" + spec_path + "'");
  return out;
}

SafetensorsWriter WriterFor(const std::vector<Spec>& specs) {
  SafetensorsWriter w;
  for (const Spec& s : specs) {
    EXPECT_TRUE(w.Add(s.name, ToDType(s.dtype), s.shape, BytesFor(s)).ok()) << s.name;
  }
  return w;
}

void ExpectMatchesSpecs(const SafetensorsFile& f, std::vector<Spec> specs) {
  std::sort(specs.begin(), specs.end(), [](const Spec& a, const Spec& b) { return a.name < b.name; });
  ASSERT_EQ(f.tensors().size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorInfo& t = f.tensors()[i];
    SCOPED_TRACE(specs[i].name);
    EXPECT_EQ(t.name, specs[i].name);
    EXPECT_EQ(t.dtype, ToDType(specs[i].dtype));
    EXPECT_EQ(t.shape, specs[i].shape);
    const std::vector<std::byte> want = BytesFor(specs[i]);
    const std::span<const std::byte> got = f.Data(t);
    EXPECT_EQ(t.byte_size, want.size());
    EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin(), want.end()));
    EXPECT_EQ(f.Find(t.name), &t);
  }
}

TEST(SafetensorsInteropTest, FilesWrittenByPythonLoadByteIdentically) {
  const std::string dir = ScratchDir();
  const auto specs = AllDTypeSpecs();
  const std::string path = PythonWrite(dir, "py.safetensors", specs, {{"format", "pt"}});
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  ExpectMatchesSpecs(**f, specs);
  EXPECT_THAT((*f)->metadata(), testing::ElementsAre(testing::Pair("format", "pt")));
}

TEST(SafetensorsInteropTest, NumpySaveFileOutputLoads) {
  const std::string dir = ScratchDir();
  const std::vector<Spec> specs = {
      {"w", "F32", {4, 4}, 1}, {"ids", "I64", {3}, 2}, {"mask", "BOOL", {2, 2}, 3}, {"half", "F16", {6}, 4}};
  const std::string path = PythonWrite(dir, "np.safetensors", specs, nullptr, /*command=*/"write-numpy");
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  ExpectMatchesSpecs(**f, specs);
  EXPECT_TRUE((*f)->metadata().empty());
}

TEST(SafetensorsInteropTest, WriterOutputIsByteIdenticalToPython) {
  const std::string dir = ScratchDir();
  const auto specs = AllDTypeSpecs();
  for (const nlohmann::json& metadata : {nlohmann::json(nullptr), nlohmann::json({{"format", "pt"}})}) {
    SCOPED_TRACE(metadata.dump());
    const std::string py = ReadBytes(PythonWrite(dir, "py.safetensors", specs, metadata));
    SafetensorsWriter w = WriterFor(specs);
    if (metadata.is_object()) w.SetMetadata("format", "pt");
    const std::string ours = w.Serialize();
    ASSERT_EQ(ours.size(), py.size());
    EXPECT_TRUE(ours == py) << "first header bytes, ours:\n"
                            << ours.substr(8, 200) << "\npython:\n"
                            << py.substr(8, 200);
  }
}

TEST(SafetensorsInteropTest, EmptyFileIsByteIdenticalToPython) {
  const std::string dir = ScratchDir();
  const std::string py = ReadBytes(PythonWrite(dir, "empty.safetensors", {}, nullptr));
  EXPECT_EQ(SafetensorsWriter().Serialize(), py);
  auto f = SafetensorsFile::FromBuffer("empty", std::as_bytes(std::span(py)));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE((*f)->tensors().empty());
}

TEST(SafetensorsInteropTest, PythonReadsWriterOutputIdentically) {
  const std::string dir = ScratchDir();
  const auto specs = AllDTypeSpecs();
  SafetensorsWriter w = WriterFor(specs);
  // Several metadata keys: Python's own key order would differ run to run,
  // so this compares what it parses, not bytes.
  w.SetMetadata("format", "pt");
  w.SetMetadata("producer", "crashreplay");
  w.SetMetadata("zeta", "\"quoted\"\n");
  const std::string path = dir + "/ours.safetensors";
  ASSERT_TRUE(w.Write(path).ok());
  const nlohmann::json dump = nlohmann::json::parse(RunPython("dump '" + path + "'"));
  EXPECT_EQ(dump["metadata"],
            nlohmann::json({{"format", "pt"}, {"producer", "crashreplay"}, {"zeta", "\"quoted\"\n"}}));
  auto sorted = specs;
  std::sort(sorted.begin(), sorted.end(), [](const Spec& a, const Spec& b) { return a.name < b.name; });
  ASSERT_EQ(dump["tensors"].size(), sorted.size());
  for (size_t i = 0; i < sorted.size(); ++i) {
    const nlohmann::json& t = dump["tensors"][i];
    SCOPED_TRACE(sorted[i].name);
    EXPECT_EQ(t["name"], sorted[i].name);
    EXPECT_EQ(t["dtype"], sorted[i].dtype);
    EXPECT_EQ(t["shape"].get<std::vector<int64_t>>(), sorted[i].shape);
    std::string hex;
    for (std::byte b : BytesFor(sorted[i])) {
      static constexpr char kDigits[] = "0123456789abcdef";
      hex.push_back(kDigits[static_cast<unsigned>(b) >> 4]);
      hex.push_back(kDigits[static_cast<unsigned>(b) & 15]);
    }
    EXPECT_EQ(t["hex"], hex);
  }
}

TEST(SafetensorsInteropTest, ShardedCheckpointWrittenByUsReadsBackThroughIndex) {
  const std::string dir = ScratchDir();
  const auto specs = AllDTypeSpecs();
  SafetensorsWriter w = WriterFor(specs);
  w.SetMetadata("format", "pt");
  ASSERT_TRUE(w.WriteSharded(dir + "/ckpt", /*max_shard_bytes=*/32).ok());
  ASSERT_TRUE(std::filesystem::exists(dir + "/ckpt/model.safetensors.index.json"));
  auto ckpt = Checkpoint::Open(dir + "/ckpt");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_GT((*ckpt)->shards().size(), 2u);
  ASSERT_EQ((*ckpt)->names().size(), specs.size());
  EXPECT_TRUE(std::is_sorted((*ckpt)->names().begin(), (*ckpt)->names().end()));
  const nlohmann::json index = nlohmann::json::parse(ReadBytes(dir + "/ckpt/model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), w.data_bytes());
  for (const Spec& s : specs) {
    SCOPED_TRACE(s.name);
    const CheckpointTensor* t = (*ckpt)->Find(s.name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->info->shape, s.shape);
    auto data = (*ckpt)->Data(s.name);
    ASSERT_TRUE(data.ok());
    const auto want = BytesFor(s);
    EXPECT_TRUE(std::equal(data->begin(), data->end(), want.begin(), want.end()));
    // Each shard is a file the Python package reads, holding this tensor.
    const std::string shard = index["weight_map"][s.name];
    EXPECT_EQ(t->file->path(), dir + "/ckpt/" + shard);
  }
  for (const auto& shard : (*ckpt)->shards()) {
    const nlohmann::json dump = nlohmann::json::parse(RunPython("dump '" + shard->path() + "'"));
    EXPECT_EQ(dump["tensors"].size(), shard->tensors().size());
    EXPECT_EQ(dump["metadata"]["format"], "pt");
  }
  EXPECT_FALSE((*ckpt)->Data("no.such.tensor").ok());
}

TEST(SafetensorsInteropTest, PythonWrittenShardsLoadThroughIndex) {
  const std::string dir = ScratchDir();
  const auto specs = AllDTypeSpecs();
  // Two shards written by Python, and an index as transformers writes it.
  std::vector<Spec> first(specs.begin(), specs.begin() + 10);
  std::vector<Spec> second(specs.begin() + 10, specs.end());
  PythonWrite(dir, "model-00001-of-00002.safetensors", first, {{"format", "pt"}});
  PythonWrite(dir, "model-00002-of-00002.safetensors", second, {{"format", "pt"}});
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
  for (const Spec& s : first) index["weight_map"][s.name] = "model-00001-of-00002.safetensors";
  for (const Spec& s : second) index["weight_map"][s.name] = "model-00002-of-00002.safetensors";
  WriteBytes(dir + "/model.safetensors.index.json", index.dump(2));
  WriteBytes(dir + "/config.json", "{}");
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->config_path(), dir + "/config.json");
  EXPECT_EQ((*ckpt)->shards().size(), 2u);
  ASSERT_EQ((*ckpt)->names().size(), specs.size());
  for (const Spec& s : specs) {
    SCOPED_TRACE(s.name);
    auto data = (*ckpt)->Data(s.name);
    ASSERT_TRUE(data.ok()) << data.status();
    const auto want = BytesFor(s);
    EXPECT_TRUE(std::equal(data->begin(), data->end(), want.begin(), want.end()));
  }
}

}  // namespace
}  // namespace crashreplay
