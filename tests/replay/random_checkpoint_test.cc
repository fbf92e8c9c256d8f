// make-model's checkpoints (random_checkpoint.h) do not depend on the thread
// count: every tensor, the calibrated NVFP4 input scales included, has the
// same bytes on 1 and on several workers, and the bytes the generator wrote
// before it ran on threads; and progress is reported.
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "crashreplay/formats/hash.h"
#include "crashreplay/replay/make_model/random_checkpoint.h"

namespace crashreplay::replay {
namespace {

RandomCheckpoint Generate(MakeModelOptions o, int threads) {
  o.threads = threads;
  auto ck = GenerateRandomCheckpoint(o);
  EXPECT_TRUE(ck.ok()) << ck.status();
  return ck.ok() ? std::move(*ck) : RandomCheckpoint{};
}

void ExpectSameTensors(const RandomCheckpoint& a, const RandomCheckpoint& b) {
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [name, t] : a.tensors) {
    auto it = b.tensors.find(name);
    ASSERT_NE(it, b.tensors.end()) << name;
    EXPECT_EQ(t.dtype, it->second.dtype) << name;
    EXPECT_EQ(t.shape, it->second.shape) << name;
    EXPECT_TRUE(t.bytes == it->second.bytes) << name << " differs";
  }
}

// XXH3-64 over every tensor (name, dtype, shape, bytes) in name order.
uint64_t CheckpointDigest(const RandomCheckpoint& ck) {
  std::string all;
  for (const auto& [name, t] : ck.tensors) {
    all += name;
    all += '|' + std::to_string(static_cast<int>(t.dtype));
    for (int64_t d : t.shape) all += ',' + std::to_string(d);
    all.append(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
  }
  return XXH64Of(all.data(), all.size());
}

struct Case {
  const char* arch;
  const char* quant;
  uint64_t digest;  // CheckpointDigest of the single-threaded generator's bytes
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.arch << " " << c.quant; }

class MakeModelThreads : public ::testing::TestWithParam<Case> {};

TEST_P(MakeModelThreads, SameBytesOnOneAndSeveralThreads) {
  MakeModelOptions o;
  o.arch = GetParam().arch;
  o.quant = GetParam().quant;
  o.layers = 2;  // glm4_moe: one dense layer, one MoE layer
  // Row chunks hold ~256K elements: at hidden 256 a chunk is 1024 rows, so
  // the gate/up projections (2048 rows; mixtral's experts use these sizes,
  // the other MoE ones 1152) and the embedding (1500 rows) are split across
  // workers, and down_proj (256 rows of 2048 or 1152) in 128-row FP8 blocks.
  o.hidden = 256;
  o.intermediate = 2048;
  o.moe_intermediate = 1152;
  o.experts = 4;
  o.vocab = 1500;
  o.seed = 7;
  const RandomCheckpoint one = Generate(o, 1);
  ASSERT_FALSE(one.tensors.empty());
  // The bytes the generator wrote before it ran on threads (its make-model
  // output with these options and this build's compared equal file by file
  // when the digests were taken): chunking the draws and blocks changed
  // nothing.
  EXPECT_EQ(CheckpointDigest(one), GetParam().digest) << std::hex << "0x" << CheckpointDigest(one);
  for (int threads : {2, 5}) {
    SCOPED_TRACE("threads=" + std::to_string(threads));
    ExpectSameTensors(one, Generate(o, threads));
  }
}

INSTANTIATE_TEST_SUITE_P(EveryQuant, MakeModelThreads,
                         ::testing::Values(Case{"llama", "bf16", 0xa0340984b3e58f4eull},
                                           Case{"qwen3", "fp8", 0x964e7e430b9054bfull},
                                           Case{"glm4_moe", "nvfp4", 0xcbf64e333e70b1c5ull},
                                           Case{"qwen3_moe", "nvfp4", 0xac2b3deb7b919f48ull},
                                           Case{"mixtral", "mxfp4", 0x97a595d2ea5dffddull}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return std::string(i.param.arch) + "_" + i.param.quant;
                         });

TEST(MakeModel, ReportsEveryLayerAndTheCalibration) {
  MakeModelOptions o;
  o.arch = "deepseek_v3";
  o.quant = "nvfp4";
  o.layers = 3;
  std::vector<std::string> phases;
  int64_t last_layers = -1, total_layers = 0, bytes = 0;
  o.progress = [&](std::string_view phase, int64_t done, int64_t total, int64_t b) {
    if (phases.empty() || phases.back() != phase) phases.emplace_back(phase);
    if (phase.find("weights") != std::string_view::npos) {
      EXPECT_GE(done, last_layers) << "progress never goes back";
      last_layers = done;
      total_layers = total;
      bytes = b;
    }
  };
  auto ck = GenerateRandomCheckpoint(o);
  ASSERT_TRUE(ck.ok()) << ck.status();
  ASSERT_EQ(phases.size(), 2u);
  EXPECT_NE(phases[0].find("weights"), std::string::npos);
  EXPECT_NE(phases[1].find("calibrating"), std::string::npos);
  EXPECT_EQ(last_layers, 3);
  EXPECT_EQ(total_layers, 3);
  int64_t all = 0;
  for (const auto& [name, t] : ck->tensors) all += static_cast<int64_t>(t.bytes.size());
  EXPECT_GT(bytes, all / 2) << "bytes reported as generated";
}

}  // namespace
}  // namespace crashreplay::replay
