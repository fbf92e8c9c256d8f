// make-model's bounded writer (random_checkpoint.h WriteRandomCheckpoint)
// writes the files the in-memory path writes (GenerateRandomCheckpoint, then
// WriteCheckpointDir), byte for byte: one shard or several, every
// quantization, the NVFP4 input_scales calibrated from the files and
// patched in place. A directory it cannot use is a clear error before any
// weight is drawn, and a failed write leaves no temporary files.
//
// Reproduce one case: crashreplay make-model /tmp/a --arch glm_moe_dsa
// --quant nvfp4, then compare with the in-memory path (this test).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <ostream>
#include <sstream>
#include <string>

#include "crashreplay/formats/hash.h"
#include "crashreplay/formats/numeric.h"
#include "crashreplay/replay/make_model/random_checkpoint.h"
#include "crashreplay/replay/model/checkpoint_io.h"

namespace crashreplay::replay {
namespace {

namespace fs = std::filesystem;

std::string TempDir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("crashreplay_mmfiles_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d.string();
}

std::string ReadAll(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Every file of `dir` (name -> bytes).
std::map<std::string, std::string> Files(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out[e.path().filename().string()] = ReadAll(e.path());
  return out;
}

struct Case {
  const char* arch;
  const char* quant;
  uint64_t max_shard_bytes;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.arch << " " << c.quant << " shards<=" << c.max_shard_bytes; }

class BoundedWriter : public ::testing::TestWithParam<Case> {};

TEST_P(BoundedWriter, WritesTheInMemoryPathsBytes) {
  const Case& c = GetParam();
  MakeModelOptions o;
  o.arch = c.arch;
  o.quant = c.quant;
  o.layers = 3;  // MoE archs: a dense layer, then MoE layers
  o.rope_form = "both";
  o.threads = 1;
  auto ck = GenerateRandomCheckpoint(o);
  ASSERT_TRUE(ck.ok()) << ck.status();
  const std::string mem = TempDir(std::string("mem_") + c.arch + c.quant);
  ASSERT_TRUE(WriteCheckpointDir(mem, ck->spec, ck->tensors, c.max_shard_bytes).ok());

  o.threads = 2;  // the bytes never depend on it
  const std::string bounded = TempDir(std::string("bounded_") + c.arch + c.quant);
  auto w = WriteRandomCheckpoint(bounded, o, c.max_shard_bytes);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->tensors, ck->tensors.size());
  uint64_t bytes = 0;
  for (const auto& [name, t] : ck->tensors) bytes += t.bytes.size();
  EXPECT_EQ(w->tensor_bytes, bytes);

  const auto want = Files(mem), got = Files(bounded);
  if (c.max_shard_bytes < bytes) {
    EXPECT_TRUE(want.count("model.safetensors.index.json")) << "the case should span several shards";
  }
  ASSERT_EQ(got.size(), want.size()) << "files in " << bounded << " vs " << mem;
  for (const auto& [name, b] : want) {
    auto it = got.find(name);
    ASSERT_NE(it, got.end()) << name << " missing from " << bounded;
    EXPECT_EQ(it->second.size(), b.size()) << name;
    EXPECT_TRUE(it->second == b) << name << " differs: cmp " << bounded << "/" << name << " " << mem << "/" << name;
  }
  fs::remove_all(mem);
  fs::remove_all(bounded);
}

INSTANTIATE_TEST_SUITE_P(ArchsQuantsShards, BoundedWriter,
                         ::testing::Values(Case{"llama", "bf16", 1ull << 30}, Case{"llama", "bf16", 40 << 10},
                                           Case{"qwen3_moe", "fp8", 1ull << 30}, Case{"qwen3_moe", "fp8", 64 << 10},
                                           Case{"glm_moe_dsa", "nvfp4", 1ull << 30},
                                           Case{"glm_moe_dsa", "nvfp4", 100 << 10},
                                           Case{"deepseek_v3", "nvfp4", 200 << 10}, Case{"glm4_moe", "nvfp4", 64 << 10},
                                           Case{"mixtral", "mxfp4", 64 << 10}, Case{"deepseek_v32", "fp8", 1ull << 30}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return std::string(i.param.arch) + "_" + i.param.quant +
                                  (i.param.max_shard_bytes < (1ull << 30) ? "_sharded" : "");
                         });

// The calibration reads the layers from the files, one at a time, over an
// embedding of the prompt's rows only; the input_scales are those the
// in-memory generator wrote before it changed (pinned: XXH3-64 of the
// model.safetensors that make-model wrote with these default options before
// the bounded writer existed).
TEST(BoundedWriter, Nvfp4CalibrationKeepsTheBytesMakeModelWroteBefore) {
  struct Pinned {
    const char* arch;
    uint64_t digest;
  };
  for (const Pinned& p : {Pinned{"glm_moe_dsa", 0x2e68b7881e4b310cull}, Pinned{"deepseek_v3", 0xd0f9655cb7078a16ull},
                          Pinned{"qwen3_moe", 0x157c8721d9d445fcull}}) {
    MakeModelOptions o;
    o.arch = p.arch;
    o.quant = "nvfp4";
    const std::string dir = TempDir(std::string("pinned_") + p.arch);
    auto w = WriteRandomCheckpoint(dir, o);
    ASSERT_TRUE(w.ok()) << w.status();
    const std::string file = ReadAll(fs::path(dir) / "model.safetensors");
    EXPECT_EQ(XXH64Of(file.data(), file.size()), p.digest)
        << p.arch << ": 0x" << std::hex << XXH64Of(file.data(), file.size());
    fs::remove_all(dir);
  }
}

TEST(BoundedWriter, ADirectoryItCannotMakeIsAClearErrorBeforeAnyWork) {
  const std::string base = TempDir("blocked");
  fs::create_directories(base);
  const std::string file = base + "/not_a_dir";
  std::ofstream(file) << "x";
  MakeModelOptions o;
  o.arch = "llama";
  bool generated = false;
  o.progress = [&](std::string_view phase, int64_t, int64_t, int64_t) {
    if (phase.find("weights") != std::string_view::npos) generated = true;
  };
  for (const std::string& dir : {file + "/ckpt", file}) {
    auto w = WriteRandomCheckpoint(dir, o);
    ASSERT_FALSE(w.ok()) << dir;
    EXPECT_EQ(w.status().code(), absl::StatusCode::kFailedPrecondition) << w.status();
    EXPECT_NE(w.status().message().find(dir), std::string::npos) << "names the directory: " << w.status();
  }
  EXPECT_FALSE(generated) << "failed before drawing anything";
  fs::remove_all(base);
}

TEST(BoundedWriter, AFailedWriteLeavesNoTemporaryFiles) {
  const std::string dir = TempDir("nowhere_to_rename");
  // model.safetensors is a non-empty directory: the last step (the rename)
  // fails after every byte was written.
  fs::create_directories(fs::path(dir) / "model.safetensors" / "x");
  MakeModelOptions o;
  o.arch = "qwen3_moe";
  o.quant = "nvfp4";
  auto w = WriteRandomCheckpoint(dir, o);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("model.safetensors"), std::string::npos) << w.status();
  for (const auto& e : fs::directory_iterator(dir)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path() << " left behind";
  }
  fs::remove_all(dir);
}

TEST(BoundedWriter, BadOptionsAreInvalidArgument) {
  MakeModelOptions o;
  o.rope_form = "yarn_only";
  const std::string dir = TempDir("bad_options");
  auto w = WriteRandomCheckpoint(dir, o);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument) << w.status();
  EXPECT_NE(w.status().message().find("yarn_only"), std::string::npos) << w.status();
  EXPECT_FALSE(fs::exists(dir)) << "nothing created for options that make no model";
}

// make-model --like: the model a checkpoint's config.json describes, drawn
// from a seed. From make-model's own checkpoint and its seed, the same files
// byte for byte (the config read back gives every tensor the generator drew
// the first time, in the same order); from another seed, the same tensors
// (names, dtypes, shapes) with other values; the config files copied as they
// are.
class LikeACheckpoint : public ::testing::TestWithParam<Case> {};

TEST_P(LikeACheckpoint, TheSameSeedGivesTheSameFilesAnotherTheSameTensors) {
  const Case& c = GetParam();
  MakeModelOptions o;
  o.arch = c.arch;
  o.quant = c.quant;
  o.layers = 3;
  o.seed = 7;
  o.threads = 2;
  const std::string original = TempDir(std::string("like_src_") + c.arch + c.quant);
  ASSERT_TRUE(WriteRandomCheckpoint(original, o, c.max_shard_bytes).ok());
  MakeModelOptions like;
  like.like = original;
  like.seed = 7;
  like.threads = 2;
  like.arch = "llama";  // ignored: the config says
  like.layers = 1;
  const std::string same = TempDir(std::string("like_same_") + c.arch + c.quant);
  auto w = WriteRandomCheckpoint(same, like, c.max_shard_bytes);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->spec.model_type, c.arch);
  const auto want = Files(original), got = Files(same);
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, b] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_TRUE(got.at(name) == b) << name << " differs: cmp " << same << "/" << name << " " << original << "/" << name;
  }

  like.seed = 8;
  const std::string other = TempDir(std::string("like_other_") + c.arch + c.quant);
  ASSERT_TRUE(WriteRandomCheckpoint(other, like, c.max_shard_bytes).ok());
  EXPECT_EQ(ReadAll(fs::path(other) / "config.json"), ReadAll(fs::path(original) / "config.json"));
  auto a = LoadCheckpointDir(original), b = LoadCheckpointDir(other);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(a->tensors.size(), b->tensors.size());
  size_t differ = 0;
  for (const auto& [name, t] : a->tensors) {
    ASSERT_TRUE(b->tensors.count(name)) << name;
    const HostTensor& u = b->tensors.at(name);
    EXPECT_EQ(u.dtype, t.dtype) << name;
    EXPECT_EQ(u.shape, t.shape) << name;
    if (u.bytes.size() != t.bytes.size() || std::memcmp(u.bytes.data(), t.bytes.data(), t.bytes.size()) != 0) {
      ++differ;
    }
  }
  EXPECT_GT(differ, a->tensors.size() / 2) << "another seed should draw other values";
  for (const std::string& d : {original, same, other}) fs::remove_all(d);
}

INSTANTIATE_TEST_SUITE_P(ArchsQuants, LikeACheckpoint,
                         ::testing::Values(Case{"llama", "bf16", 1ull << 30}, Case{"qwen3_moe", "fp8", 64 << 10},
                                           Case{"glm_moe_dsa", "nvfp4", 1ull << 30},
                                           Case{"mixtral", "mxfp4", 1ull << 30}, Case{"glm4_moe", "nvfp4", 64 << 10},
                                           Case{"gpt_oss", "bf16", 1ull << 30}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return std::string(i.param.arch) + "_" + i.param.quant;
                         });

// A float16 or float32 checkpoint (what save_pretrained writes for a model
// held in that dtype): the unquantized tensors are drawn in its dtype, the
// values those of the bf16 draw's normal stream rounded once to it.
TEST(LikeACheckpoint, TheConfigsFloatDTypeIsTheTensorsDType) {
  MakeModelOptions o;
  o.arch = "qwen3";
  o.layers = 1;
  const std::string src = TempDir("like_dtype_src");
  ASSERT_TRUE(WriteRandomCheckpoint(src, o).ok());
  auto bf16 = LoadCheckpointDir(src);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  for (const auto& [word, dt] : {std::pair{"float16", DType::kF16}, std::pair{"float32", DType::kF32}}) {
    std::string cfg = ReadAll(fs::path(src) / "config.json");
    const std::string like = TempDir(std::string("like_dtype_") + word);
    fs::create_directories(like);
    const std::string key = "\"torch_dtype\": \"bfloat16\"";
    ASSERT_NE(cfg.find(key), std::string::npos) << cfg;
    std::ofstream(like + "/config.json") << cfg.replace(cfg.find(key), key.size(),
                                                        std::string("\"torch_dtype\": \"") + word + "\"");
    MakeModelOptions l;
    l.like = like;
    const std::string out = TempDir(std::string("like_dtype_out_") + word);
    auto wr = WriteRandomCheckpoint(out, l);
    ASSERT_TRUE(wr.ok()) << wr.status();
    auto got = LoadCheckpointDir(out);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->tensors.size(), bf16->tensors.size());
    for (const auto& [name, t] : got->tensors) {
      EXPECT_EQ(t.dtype, dt) << name;
      EXPECT_EQ(t.shape, bf16->tensors.at(name).shape) << name;
    }
    // f32 holds the draw unrounded: rounded to bf16 it is the bf16 checkpoint's value.
    if (dt == DType::kF32) {
      const HostTensor& w = got->tensors.at("model.layers.0.mlp.up_proj.weight");
      const HostTensor& b = bf16->tensors.at("model.layers.0.mlp.up_proj.weight");
      const float* f = reinterpret_cast<const float*>(w.bytes.data());
      const uint16_t* h = reinterpret_cast<const uint16_t*>(b.bytes.data());
      for (size_t i = 0; i < b.bytes.size() / 2; ++i) ASSERT_EQ(FloatToBf16(f[i]), h[i]) << i;
    }
    fs::remove_all(like);
    fs::remove_all(out);
  }
  fs::remove_all(src);
}

TEST(LikeACheckpoint, AConfigWithTensorsMakeModelDoesNotDrawIsRefused) {
  const std::string dir = TempDir("like_bias");
  fs::create_directories(dir);
  std::ofstream(dir + "/config.json") << R"({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
    "intermediate_size": 128, "vocab_size": 256, "mlp_bias": true})";
  MakeModelOptions o;
  o.like = dir;
  auto w = WriteRandomCheckpoint(TempDir("like_bias_out"), o);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(w.status().message().find("MLP biases"), std::string_view::npos) << w.status();
  o.like = dir + "/missing";
  w = WriteRandomCheckpoint(TempDir("like_missing_out"), o);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("missing"), std::string_view::npos) << w.status();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace crashreplay::replay
