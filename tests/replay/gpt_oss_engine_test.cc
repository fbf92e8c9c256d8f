// gpt_oss end to end on make-model checkpoints: it runs without a fault,
// bit for bit the same on repeat, thread count and emulated tensor
// parallelism's layouts; its sliding window changes exactly the tokens past
// the window; the fused expert tensors survive a write and a load.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "crashreplay/replay/model/checkpoint_io.h"
#include "engine_test_util.h"

namespace crashreplay::replay {
namespace {

using testing::MakeEngine;
using testing::TwoRequests;

MakeModelOptions GptOss(int64_t window = 8) {
  MakeModelOptions o;
  o.arch = "gpt_oss";
  o.quant = "bf16";
  o.layers = 3;
  o.experts = 4;
  o.experts_per_tok = 2;
  o.intermediate = 32;
  o.sliding_window = window;
  return o;
}

std::vector<Hash128> Digests(const RunResult& r) {
  std::vector<Hash128> d;
  for (const auto& s : r.steps) d.push_back(s.digest);
  return d;
}

TEST(GptOssEngine, GeneratesWithoutAFaultAndTheSameBitsOnEveryThreadCount) {
  auto e1 = MakeEngine(GptOss(), {}, 1);
  auto e3 = MakeEngine(GptOss(), {}, 3);
  ASSERT_TRUE(e1 && e3);
  RunResult a = e1->Run(TwoRequests(6, 0.8f));
  RunResult b = e1->Run(TwoRequests(6, 0.8f));
  RunResult c = e3->Run(TwoRequests(6, 0.8f));
  ASSERT_FALSE(a.fault) << a.fault->message;
  EXPECT_EQ(a.first_nonfinite, "");
  EXPECT_EQ(a.outputs.at(1).size(), 6u);
  EXPECT_EQ(Digests(a), Digests(b));
  EXPECT_EQ(Digests(a), Digests(c));
  EXPECT_EQ(a.outputs, c.outputs);
}

TEST(GptOssEngine, EmulatedRanksMatchOneRankWithinTolerance) {
  // tp 2 splits the heads (each rank its sinks), the experts' intermediate
  // (the down bias added on rank 0 only) or the experts themselves.
  StepInput in;
  in.rows.resize(1);
  in.rows[0].tokens = {72, 105, 33, 9, 17, 40, 41, 42, 43, 44, 45, 46};
  in.rows[0].page_table = {0};
  auto one = MakeEngine(GptOss(), {});
  auto p1 = one->Prepare(in);
  ASSERT_FALSE(p1->RunAll());
  const Buffer* a = p1->buffer("logits");
  for (const char* mode : {"moe_parallel=tensor", "moe_parallel=expert"}) {
    auto two = MakeEngine(GptOss(), {"tp_size=2", mode});
    auto p2 = two->Prepare(in);
    ASSERT_FALSE(p2->RunAll()) << mode;
    const Buffer* b = p2->buffer("logits");
    ASSERT_EQ(a->f.size(), b->f.size());
    for (size_t i = 0; i < a->f.size(); ++i) {
      ASSERT_NEAR(a->f[i], b->f[i], 1e-4 + 1e-4 * std::abs(a->f[i])) << mode << " logit " << i;
    }
  }
}

TEST(GptOssEngine, TheWindowChangesOnlyWhatLiesPastIt) {
  // The same weights (same seed) with a window of 8 and of 1000: a prompt
  // of 8 tokens attends the same positions either way, one of 12 does not.
  for (int64_t len : {8, 12}) {
    StepInput in;
    in.rows.resize(1);
    for (int64_t i = 0; i < len; ++i) in.rows[0].tokens.push_back(static_cast<int32_t>(3 + 7 * i));
    in.rows[0].page_table = {0};
    auto narrow = MakeEngine(GptOss(8), {});
    auto wide = MakeEngine(GptOss(1000), {});
    auto pn = narrow->Prepare(in);
    auto pw = wide->Prepare(in);
    ASSERT_FALSE(pn->RunAll());
    ASSERT_FALSE(pw->RunAll());
    const auto nf = pn->buffer("logits")->f, wf = pw->buffer("logits")->f;
    const std::vector<float> n(nf.begin(), nf.end()), w(wf.begin(), wf.end());
    if (len <= 8) {
      EXPECT_EQ(n, w) << "within the window the two models are one";
    } else {
      float diff = 0;
      for (size_t i = 0; i < n.size(); ++i) diff = std::max(diff, std::abs(n[i] - w[i]));
      EXPECT_GT(diff, 1e-3f) << "past the window the narrow model must drop positions";
    }
  }
}

TEST(GptOssCheckpoint, FusedExpertsRoundTripThroughTheFiles) {
  auto ck = GenerateRandomCheckpoint(GptOss());
  ASSERT_TRUE(ck.ok()) << ck.status();
  const std::string dir = ::testing::TempDir() + "/gpt_oss_roundtrip";
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(WriteCheckpointDir(dir, ck->spec, ck->tensors).ok());
  auto loaded = LoadCheckpointDir(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->notes, std::vector<std::string>{});
  EXPECT_EQ(loaded->config.layer_types,
            (std::vector<std::string>{"sliding_attention", "full_attention", "sliding_attention"}));
  EXPECT_EQ(loaded->spec.layer_window, (std::vector<int64_t>{8, 0, 8}));
  // Split again, every per-expert tensor is the generator's, byte for byte.
  int experts = 0;
  for (const auto& [name, t] : ck->tensors) {
    auto it = loaded->tensors.find(name);
    ASSERT_NE(it, loaded->tensors.end()) << name;
    EXPECT_EQ(it->second.shape, t.shape) << name;
    EXPECT_TRUE(it->second.bytes == t.bytes) << name;
    experts += name.find(".experts.") != std::string::npos;
  }
  EXPECT_EQ(experts, 3 * 4 * 6);  // layers x experts x (3 weights + 3 biases)
  EXPECT_EQ(loaded->tensors.size(), ck->tensors.size());
  std::filesystem::remove_all(dir);
}

TEST(GptOssCheckpoint, MissingOrMisshapedFusedTensorsAreNamed) {
  auto ck = GenerateRandomCheckpoint(GptOss());
  ASSERT_TRUE(ck.ok());
  TensorSet fused = ck->tensors;
  ASSERT_TRUE(FuseExperts(ck->spec, &fused).ok());
  TensorSet missing = fused;
  missing.erase("model.layers.1.mlp.experts.down_proj_bias");
  absl::Status s = SplitFusedExperts(ck->spec, "dir", &missing);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("model.layers.1.mlp.experts.down_proj_bias"), std::string::npos) << s;
  TensorSet wrong = fused;
  // [E, hidden, 2I] is [4, 64, 64] here; the same bytes declared [4, 32, 128].
  wrong["model.layers.0.mlp.experts.gate_up_proj"].shape = {4, 32, 128};
  s = SplitFusedExperts(ck->spec, "dir", &wrong);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("[4, 64, 64]"), std::string::npos) << s;
  // OpenAI's MXFP4 layout: blocks of the wrong shape, and a missing scale.
  TensorSet mx = fused;
  mx["model.layers.2.mlp.experts.gate_up_proj_blocks"] = HostTensor{DType::kU8, {1}, std::vector<uint8_t>(1)};
  s = SplitFusedExperts(ck->spec, "dir", &mx);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("[4, 64, 2, 16]"), std::string::npos) << s;
  mx = fused;  // the failed split already replaced layers 0 and 1
  mx["model.layers.2.mlp.experts.gate_up_proj_blocks"] =
      HostTensor{DType::kU8, {4, 64, 2, 16}, std::vector<uint8_t>(4 * 64 * 2 * 16)};
  s = SplitFusedExperts(ck->spec, "dir", &mx);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find("gate_up_proj_scales"), std::string::npos) << s;
}

}  // namespace
}  // namespace crashreplay::replay
