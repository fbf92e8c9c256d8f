// The step's boundaries (replay/program/src/boundaries.cc): the names engines'
// fingerprints use, in run order, with shapes that do not depend on how
// many tensor-parallel ranks the replay emulates.
#include <gtest/gtest.h>

#include <algorithm>

#include "crashreplay/replay/session/replay_session.h"
#include "engine_test_util.h"

namespace crashreplay::replay {
namespace {

using testing::MakeEngine;
using testing::TwoRequests;

std::vector<crashreplay::Fingerprint> FirstStep(const std::string& arch, const std::string& quant,
                                                std::vector<std::string> sets) {
  MakeModelOptions o;
  o.arch = arch;
  o.quant = quant;
  auto engine = MakeEngine(o, sets);
  EXPECT_TRUE(engine);
  if (!engine) return {};
  StepLogRecorder log;
  engine->Run(TwoRequests(1), &log);
  auto fresh = MakeEngine(o, sets);
  auto p = fresh->Prepare(log.steps()[0].input);
  p->RunAll();
  EXPECT_FALSE(p->fault());
  return p->fingerprints();
}

std::vector<std::string> Names(const std::vector<crashreplay::Fingerprint>& fps) {
  std::vector<std::string> n;
  for (const auto& f : fps) n.push_back(f.name);
  return n;
}

TEST(Boundaries, ADenseModelNamesEachLayersPointsInOrder) {
  MakeModelOptions o;
  const auto fps = FirstStep("llama", "bf16", {});
  std::vector<std::string> want = {"embedding"};
  for (int l = 0; l < o.layers; ++l) {
    for (const char* p : {"attention", "o_proj", "mlp", "layer"}) want.push_back("L" + std::to_string(l) + "." + p);
  }
  want.push_back("final_norm");
  want.push_back("lm_head");
  EXPECT_EQ(Names(fps), want);
  // [tokens, hidden] for the residual stream, [rows, vocab] for the logits.
  const int64_t tokens =
      static_cast<int64_t>(std::string("Say hello in one sentence").size() + std::string("Hi").size());
  EXPECT_EQ(fps.front().numel % static_cast<uint64_t>(tokens), 0u);
  EXPECT_EQ(fps.back().numel, 2u * fps.back().columns);
}

TEST(Boundaries, AnMlaDsaMoeHasItsRouterIndexerAndExperts) {
  const auto names = Names(FirstStep("glm_moe_dsa", "bf16", {}));
  for (const char* n : {"L0.indexer", "L0.attention", "L0.o_proj", "L0.layer"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  }
  bool topk = false, experts = false;
  for (const std::string& n : names) {
    topk |= n.size() > 5 && n.substr(n.size() - 5) == ".topk";
    experts |= n.size() > 8 && n.substr(n.size() - 8) == ".experts";
  }
  EXPECT_TRUE(topk && experts);
}

TEST(Boundaries, TensorParallelRanksGiveTheSameTensorsAtEveryBoundary) {
  const auto one = FirstStep("qwen3_moe", "bf16", {});
  const auto two = FirstStep("qwen3_moe", "bf16", {"tp_size=2"});
  ASSERT_EQ(Names(one), Names(two));
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_EQ(one[i].numel, two[i].numel) << one[i].name;
    EXPECT_EQ(one[i].columns, two[i].columns) << one[i].name;
    // Emulated ranks sum the partials in another order: within tolerance, never a departure.
    EXPECT_FALSE(FingerprintDeparts(two[i], one[i]).has_value())
        << one[i].name << ": " << *FingerprintDeparts(two[i], one[i]);
  }
}

// Replay's earlier steps run only to rebuild the KV cache: without
// fingerprints they compute the same bits and summarise nothing.
TEST(Boundaries, AStepRunWithoutFingerprintsKeepsItsDigestAndSummarisesNothing) {
  MakeModelOptions o;
  auto engine = MakeEngine(o, {});
  ASSERT_TRUE(engine);
  StepLogRecorder log;
  engine->Run(TwoRequests(1), &log);
  auto a = MakeEngine(o, {});
  auto b = MakeEngine(o, {});
  auto with = a->Prepare(log.steps()[0].input);
  with->RunAll();
  auto without = b->Prepare(log.steps()[0].input);
  without->set_fingerprints(false);
  without->RunAll();
  ASSERT_FALSE(with->fault());
  ASSERT_FALSE(without->fault());
  EXPECT_FALSE(with->fingerprints().empty());
  EXPECT_TRUE(without->fingerprints().empty());
  EXPECT_EQ(with->Digest(), without->Digest());
  EXPECT_EQ(with->records().size(), without->records().size());
}

}  // namespace
}  // namespace crashreplay::replay
