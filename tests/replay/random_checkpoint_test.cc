// make-model's checkpoints (random_checkpoint.h) do not depend on the thread
// count: every tensor, the calibrated NVFP4 input scales included, has the
// same bytes on 1 and on several workers; and progress is reported.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "crashreplay/formats/hash.h"
#include "crashreplay/replay/random_checkpoint.h"

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

struct Case {
  const char* arch;
  const char* quant;
};

class MakeModelThreads : public ::testing::TestWithParam<Case> {};

TEST_P(MakeModelThreads, SameBytesOnOneAndSeveralThreads) {
  MakeModelOptions o;
  o.arch = GetParam().arch;
  o.quant = GetParam().quant;
  o.layers = 3;
  o.hidden = 256;  // FP8: two 128-row blocks; tensors span several row chunks
  o.intermediate = 384;
  o.moe_intermediate = 64;
  o.experts = 8;
  o.vocab = 1500;
  o.seed = 7;
  const RandomCheckpoint one = Generate(o, 1);
  ASSERT_FALSE(one.tensors.empty());
  for (int threads : {2, 5}) {
    SCOPED_TRACE("threads=" + std::to_string(threads));
    ExpectSameTensors(one, Generate(o, threads));
  }
}

INSTANTIATE_TEST_SUITE_P(EveryQuant, MakeModelThreads,
                         ::testing::Values(Case{"llama", "bf16"}, Case{"qwen3", "fp8"},
                                           Case{"deepseek_v3", "nvfp4"}, Case{"qwen3_moe", "nvfp4"},
                                           Case{"mixtral", "mxfp4"}),
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
