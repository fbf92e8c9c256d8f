// The engine end to end on random checkpoints: every architecture and
// quantization runs; configurations that break a real precondition fail with
// the right structured fault; runs are bitwise deterministic.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "engine_test_util.h"

namespace crashreplay::replay {
namespace {

using testing::MakeEngine;
using testing::TwoRequests;

MakeModelOptions Opts(const std::string& arch, const std::string& quant) {
  MakeModelOptions o;
  o.arch = arch;
  o.quant = quant;
  return o;
}

class EveryArchAndQuant : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(EveryArchAndQuant, GeneratesWithFiniteLogitsAndNoFault) {
  auto [arch, quant] = GetParam();
  auto e = MakeEngine(Opts(arch, quant), {});
  ASSERT_TRUE(e);
  RunResult r = e->Run(TwoRequests(3));
  ASSERT_FALSE(r.fault) << r.fault->message;
  EXPECT_EQ(r.first_nonfinite, "");
  ASSERT_EQ(r.outputs.size(), 2u);
  EXPECT_EQ(r.outputs[1].size(), 3u);
  EXPECT_EQ(r.steps.size(), 3u);  // one prefill of both, two decodes
  EXPECT_EQ(r.steps[0].mode, ForwardMode::kPrefill);
  EXPECT_EQ(r.steps[1].mode, ForwardMode::kDecode);
}

INSTANTIATE_TEST_SUITE_P(Models, EveryArchAndQuant,
                         ::testing::Combine(::testing::Values("llama", "qwen3", "qwen3_moe", "mixtral", "glm4_moe"),
                                            ::testing::Values("bf16", "fp8", "nvfp4", "mxfp4")),
                         [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param); });

std::vector<Hash128> Digests(const RunResult& r) {
  std::vector<Hash128> d;
  for (const auto& s : r.steps) d.push_back(s.digest);
  return d;
}

TEST(EngineDeterminism, RepeatRunsAndThreadCountsGiveSameBits) {
  for (const char* arch : {"llama", "glm4_moe"}) {
    auto e1 = MakeEngine(Opts(arch, "nvfp4"), {"tp_size=2"}, 1);
    auto e2 = MakeEngine(Opts(arch, "nvfp4"), {"tp_size=2"}, 2);
    RunResult a = e1->Run(TwoRequests(4, 0.8f));
    RunResult b = e1->Run(TwoRequests(4, 0.8f));
    RunResult c = e2->Run(TwoRequests(4, 0.8f));
    ASSERT_FALSE(a.fault);
    EXPECT_EQ(Digests(a), Digests(b)) << arch;
    EXPECT_EQ(Digests(a), Digests(c)) << arch;
    EXPECT_EQ(a.outputs, c.outputs);
  }
}

TEST(EngineTensorParallel, EmulatedRanksMatchOneRankWithinTolerance) {
  auto one = MakeEngine(Opts("qwen3_moe", "bf16"), {});
  auto four = MakeEngine(Opts("qwen3_moe", "bf16"), {"tp_size=2", "moe_parallel=expert"});
  StepInput in;
  in.rows.resize(1);
  in.rows[0].tokens = {72, 105, 33};
  in.rows[0].page_table = {0};
  auto p1 = one->Prepare(in);
  auto p4 = four->Prepare(in);
  ASSERT_FALSE(p1->RunAll());
  ASSERT_FALSE(p4->RunAll());
  const Buffer* a = p1->buffer("logits");
  const Buffer* b = p4->buffer("logits");
  for (size_t i = 0; i < a->f.size(); ++i) EXPECT_NEAR(a->f[i], b->f[i], 1e-4 + 1e-4 * std::abs(a->f[i])) << i;
}

// A step's activation_bytes is the executor memory it allocated: its
// buffers (each as buffer() shows it), plus the batch's tables and the ops'
// views, which are small; a prefill of more tokens holds more.
TEST(EngineMemory, ActivationBytesAreTheStepsBuffersAndTheirTables) {
  struct Sizes : StepObserver {
    std::vector<std::pair<uint64_t, uint64_t>> steps;  // activation_bytes, sum of buffer bytes
    void BeforeStep(const StepInput&) override {}
    void AfterStep(const StepProgram& p) override {
      uint64_t sum = 0;
      for (const auto& [name, b] : p.buffers()) sum += b.bytes();
      steps.emplace_back(p.activation_bytes(), sum);
    }
  } sizes;
  MakeModelOptions o;
  o.arch = "glm_moe_dsa";
  auto e = MakeEngine(o, {"tp_size=2"});
  ASSERT_TRUE(e);
  const RunResult r = e->Run(TwoRequests(2), &sizes);
  ASSERT_FALSE(r.fault.has_value());
  ASSERT_EQ(sizes.steps.size(), 2u);
  for (const auto& [all, buffers] : sizes.steps) {
    EXPECT_GT(buffers, 0u);
    EXPECT_GE(all, buffers);
    EXPECT_LT(all - buffers, buffers / 4) << "tables and views are a small part";
  }
  EXPECT_GT(sizes.steps[0].first, sizes.steps[1].first);  // the prefill's tokens against the decode step's
  EXPECT_EQ(r.steps[0].activation_bytes, sizes.steps[0].first);
}

TEST(EngineFaults, Paged64WithSmallPagesPrefillsThenFailsInDecodeAttention) {
  auto e = MakeEngine(Opts("glm4_moe", "nvfp4"), {"attention_backend=paged64", "page_size=16"});
  RunResult r = e->Run(TwoRequests(3));
  ASSERT_TRUE(r.fault);
  EXPECT_EQ(r.fault->Signature(), "assert/decode/attention/page_size_is_64");
  EXPECT_EQ(r.fault->step, 1);
  EXPECT_EQ(r.fault->layer, 0);
  EXPECT_EQ(r.fault->index, 16);
  EXPECT_EQ(r.steps.size(), 2u);
  auto ok = MakeEngine(Opts("glm4_moe", "nvfp4"), {"attention_backend=paged64", "page_size=64"});
  RunResult g = ok->Run(TwoRequests(3));
  EXPECT_FALSE(g.fault) << g.fault->message;
}

TEST(EngineFaults, Ue8m0KernelRejectsNvfp4ScalesButAcceptsMxfp4AndRequantized) {
  auto e = MakeEngine(Opts("glm4_moe", "nvfp4"), {"scale_format=ue8m0"});
  RunResult r = e->Run(TwoRequests(2));
  ASSERT_TRUE(r.fault);
  EXPECT_EQ(r.fault->Signature(), "assert/prefill/q_proj/ue8m0_scale_layout");
  const float v = static_cast<float>(r.fault->value);
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  EXPECT_NE(bits & 0x807fffffu, 0u) << "the reported scale really has mantissa bits";
  for (auto [quant, fmt] :
       {std::pair{"mxfp4", "ue8m0"}, std::pair{"nvfp4", "ue8m0_requant"}, std::pair{"fp8", "ue8m0_requant"}}) {
    auto ok = MakeEngine(Opts("glm4_moe", quant), {std::string("scale_format=") + fmt});
    RunResult g = ok->Run(TwoRequests(2));
    EXPECT_FALSE(g.fault) << quant << " " << fmt << ": " << g.fault->message;
  }
}

TEST(EngineFaults, TokenOutsideVocabularyFailsInEmbedding) {
  auto e = MakeEngine(Opts("llama", "bf16"), {});
  auto reqs = TwoRequests(2);
  reqs[1].prompt[1] = 320;  // vocab is 320
  RunResult r = e->Run(reqs);
  ASSERT_TRUE(r.fault);
  EXPECT_EQ(r.fault->Signature(), "assert/prefill/embedding/token_id_in_vocab");
  EXPECT_EQ(r.fault->index, 320);
  EXPECT_EQ(r.fault->item, static_cast<int64_t>(reqs[0].prompt.size()) + 1);
}

TEST(EnginePlanner, HighMemFractionLeavesNoRoomForGraphs) {
  // Scale an 80 GB card so this model's weights take about 70% of it.
  auto probe = MakeEngine(Opts("glm4_moe", "nvfp4"), {"tp_size=2"});
  const double weights = static_cast<double>(probe->plan().weights);
  const std::string scale = "device_memory_scale=" + std::to_string(weights / 0.7 / 80e9);
  auto bad =
      MakeEngine(Opts("glm4_moe", "nvfp4"), {"tp_size=2", scale, "mem_fraction_static=0.95", "cuda_graph_max_bs=64"});
  RunResult r = bad->Run(TwoRequests(2));
  ASSERT_TRUE(r.fault);
  EXPECT_EQ(r.fault->Signature(), "oom/graph_capture/memory_planner/graph_memory_fits");
  EXPECT_TRUE(r.steps.empty());
  auto good =
      MakeEngine(Opts("glm4_moe", "nvfp4"), {"tp_size=2", scale, "mem_fraction_static=0.88", "cuda_graph_max_bs=64"});
  EXPECT_FALSE(good->plan().fault) << good->plan().ToJson().dump();
  EXPECT_GT(good->plan().pool_pages, 0);
  auto no_weights_room = MakeEngine(Opts("glm4_moe", "nvfp4"), {"tp_size=2", scale, "mem_fraction_static=0.5"});
  ASSERT_TRUE(no_weights_room->plan().fault);
  EXPECT_EQ(no_weights_room->plan().fault->stage, "load");
}

TEST(EngineBackends, FlashDecodeChangesBitsNotTokens) {
  auto ref = MakeEngine(Opts("qwen3", "bf16"), {});
  auto flash = MakeEngine(Opts("qwen3", "bf16"), {"attention_backend=flashdecode"});
  auto reqs = TwoRequests(6);
  for (auto& q : reqs) q.prompt.insert(q.prompt.end(), 40, 'a');  // > one 32-position chunk
  RunResult a = ref->Run(reqs), b = flash->Run(reqs);
  ASSERT_FALSE(a.fault);
  ASSERT_FALSE(b.fault);
  EXPECT_EQ(a.steps[0].digest, b.steps[0].digest);  // prefill uses the reference kernel
  EXPECT_NE(a.steps[1].digest, b.steps[1].digest);
}

}  // namespace
}  // namespace crashreplay::replay
