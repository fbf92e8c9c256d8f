// Helpers shared by the capture container tests: a small but complete
// capture (every record kind, shared blobs), bf16-like test data, and file
// helpers. Header-only; tests only.
#pragma once

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_format.h"

#include "crashreplay/formats/capture_reader.h"
#include "crashreplay/formats/capture_writer.h"

namespace crashreplay::testing {

// A fresh directory under the test temp dir, removed with the object.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "crcap-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string File(const std::string& name) const { return (std::filesystem::path(path_) / name).string(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline std::vector<unsigned char> ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<unsigned char>(std::istreambuf_iterator<char>(in), {});
}

inline void WriteFileBytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// bf16 bit patterns of N(0, scale) samples, deterministic in `seed`.
inline std::vector<std::byte> Bf16Normal(size_t count, uint32_t seed, float scale = 0.02f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<std::byte> out(count * 2);
  for (size_t i = 0; i < count; ++i) {
    const float f = dist(rng);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    bits += 0x7fff + ((bits >> 16) & 1);  // round to nearest even
    const uint16_t b = static_cast<uint16_t>(bits >> 16);
    std::memcpy(out.data() + 2 * i, &b, 2);
  }
  return out;
}

inline SessionManifest TestManifest(uint32_t rank) {
  SessionManifest m;
  m.session_id = "test-session";
  m.engine = "crashreplay-test";
  m.engine_version = "0.0";
  m.recorder_version = "0.1.0";
  m.created_unix_nanos = 1700000000000000000;
  m.hostname = "host";
  m.pid = 42;
  m.model.config_json = R"({"model_type": "llama", "num_hidden_layers": 2})";
  m.model.model_type = "llama";
  m.model.num_layers = 2;
  m.model.hidden_size = 64;
  m.model.vocab_size = 256;
  m.toggles = {{"attention_backend", std::string("flashinfer")},
               {"mem_fraction_static", 0.9},
               {"cuda_graph", true},
               {"page_size", int64_t{16}},
               {"unset_toggle", std::monostate{}}};
  m.device = {"NVIDIA H200", 90, 141ull << 30, "570.86", "12.8", rank};
  m.parallel.tp_size = 2;
  m.parallel.tp_rank = rank;
  m.parallel.world_size = 2;
  m.parallel.rank = rank;
  WeightShardHashes shard;
  shard.rank = rank;
  shard.tensors = {{"model.embed_tokens.weight", Hash128{1, 2}, 4096}, {"lm_head.weight", Hash128{3, 4}, 4096}};
  shard.root = Hash128{5, 6};
  m.weights = {shard};
  m.weight_check_period_steps = 8;
  m.quirks = 0;
  m.features = {"step-log", "snapshots"};
  return m;
}

inline StepRecord TestStep(uint64_t step, uint32_t rank, const std::vector<TensorDescriptor>& tensors = {}) {
  StepRecord s;
  s.step = step;
  s.rank = rank;
  s.mode = step == 0 ? ForwardMode::kPrefill : ForwardMode::kDecode;
  s.timestamp_nanos = 1000 + static_cast<int64_t>(step);
  s.request_ids = {"req-a", "req-b"};
  s.token_ids = {static_cast<int64_t>(10 + step), static_cast<int64_t>(20 + step)};
  s.positions = {static_cast<int64_t>(step), static_cast<int64_t>(step)};
  s.seq_lens = {static_cast<int64_t>(step + 1), static_cast<int64_t>(step + 1)};
  s.extend_lens = {1, 1};
  s.req_pool_indices = {0, 1};
  s.page_table = {{0, {0, 1, 2}}, {1, {16, 17}}};
  s.out_cache_loc = {static_cast<int64_t>(3 + step), static_cast<int64_t>(18 + step)};
  s.sampling = {{0.7f, 0.9f, 40, 0.05f, 1234, true}, {1.0f, 1.0f, -1, 0.0f, 0, false}};
  s.rng_seed = 99;
  s.rng_offset = step * 4;
  s.output_token_ids = {static_cast<int64_t>(11 + step), static_cast<int64_t>(21 + step)};
  s.digests = {{"logits.xxh3", uint64_t{0xabcdef}}, {"hidden.xxh128", Hash128{7, 8}}};
  s.tensors = tensors;
  return s;
}

inline TensorDescriptor Describe(const std::string& name, const std::vector<std::byte>& bytes, bool stored) {
  TensorDescriptor t;
  t.name = name;
  t.dtype = "BF16";
  t.shape = {static_cast<int64_t>(bytes.size() / 2)};
  t.content_hash = XXH128Of(bytes.data(), bytes.size());
  t.byte_size = bytes.size();
  t.stored = stored;
  t.device = "cpu";
  return t;
}

// Writes a small capture with every record kind: manifest, weight hashes,
// `steps` steps each with a snapshot of two tensors (one shared by all
// steps), a weight check, a dropped counter and a failure; closes it when
// `close` is true.
inline void WriteSmallCapture(const std::string& path, int steps, bool close, size_t tensor_elems = 64) {
  CaptureWriterOptions options;
  options.overwrite = true;
  options.fsync_on_close = false;
  auto writer = CaptureWriter::Create(path, TestManifest(0), options);
  ASSERT_TRUE(writer.ok()) << writer.status();
  WeightHashesRecord wh;
  wh.shards = TestManifest(0).weights;
  ASSERT_TRUE((*writer)->Append(wh).ok());
  const std::vector<std::byte> shared = Bf16Normal(tensor_elems, 7);
  for (int i = 0; i < steps; ++i) {
    const std::vector<std::byte> own = Bf16Normal(tensor_elems, 100 + static_cast<uint32_t>(i));
    ASSERT_TRUE((*writer)->Append(TestStep(static_cast<uint64_t>(i), 0, {Describe("input_ids", own, false)})).ok());
    ASSERT_TRUE((*writer)->AppendBlob(shared, 2).ok());
    ASSERT_TRUE((*writer)->AppendBlob(own, 2).ok());
    SnapshotRecord snap{
        static_cast<uint64_t>(i), 0, {Describe("kv_pages", shared, true), Describe("hidden", own, true)}};
    ASSERT_TRUE((*writer)->Append(snap).ok());
  }
  WeightCheckRecord wc{
      static_cast<uint64_t>(steps), 0, 8, {{"lm_head.weight", 0, 512, Hash128{3, 4}, Hash128{3, 4}, false}}};
  ASSERT_TRUE((*writer)->Append(wc).ok());
  ASSERT_TRUE((*writer)->Append(DroppedSnapshotsRecord{static_cast<uint64_t>(steps), 2, 4096}).ok());
  FailureRecord f;
  f.reason = "CUDA error: device-side assert triggered";
  f.stage = "decode";
  f.step = static_cast<uint64_t>(steps);
  f.failure_class = FailureClass::kDeviceAssert;
  f.exception_type = "torch.AcceleratorError";
  ASSERT_TRUE((*writer)->Append(f).ok());
  if (close) {
    ASSERT_TRUE((*writer)->Close().ok());
  }
}

}  // namespace crashreplay::testing
