// The experts in three stages (ops.h, ExpertStageItem), which the CUDA
// executor launches instead of one thread per token: run serially here on
// every routed- and shared-expert kernel of recorded steps, they must give
// the partial sums RunItem gives, bit for bit, from the same inputs. So must
// the dot-product stages on eight lanes (ExpertStageItemLane, the CUDA
// kernel's decomposition) on eight threads that combine their sums as its
// shuffles do, on the first expert kernels of each step.
#include <gtest/gtest.h>

#include <cstring>
#include <variant>

#include "exec_replay_test_util.h"
#include "lanes_test_util.h"

namespace crashreplay::replay {
namespace {

using testing::RecordRun;

struct Case {
  std::string name, arch, quant;
  std::vector<std::string> sets;
  int topk = 0;  // experts per token (0: the architecture's default)
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// Runs the three stages of `o` into a copy of its partial (which starts as
// the partial's current contents) and returns the copy: serially, or with
// stages 0 and 2 on eight lane threads (`lanes`; stage 1 serial, as the
// CUDA executor runs it on a thread an item).
template <typename E>
std::vector<float> Staged(E o, bool lanes, KernelStatus* st) {
  const int64_t n = o.ranks * o.tokens * o.hidden;
  std::vector<float> partial(o.partial, o.partial + n);
  o.partial = partial.data();
  std::vector<float> ws(static_cast<size_t>(ExpertStageItems(o, 1) * ExpertSlotFloats(o.inter)), -1.0f);
  for (int stage = 0; stage < 3; ++stage) {
    const int64_t items = ExpertStageItems(o, stage);
    if (!lanes || stage == 1) {
      for (int64_t i = 0; i < items; ++i) ExpertStageItem(o, stage, i, ws.data(), st);
      continue;
    }
    std::vector<KernelStatus> lane_st(8);
    testing::OnEightLanes([&](int j, const testing::BarrierLanes& l) {
      for (int64_t i = 0; i < items; ++i) ExpertStageItemLane(o, stage, i, ws.data(), j, l, &lane_st[j]);
    });
    for (int j = 1; j < 8; ++j) EXPECT_EQ(lane_st[j].fired, lane_st[0].fired) << "lanes disagree";
    if (lane_st[0].fired && !st->fired) *st = lane_st[0];
  }
  return partial;
}

class ExpertStages : public ::testing::TestWithParam<Case> {};

TEST_P(ExpertStages, GiveRunItemsBits) {
  const Case& c = GetParam();
  MakeModelOptions mo;
  mo.arch = c.arch;
  mo.quant = c.quant;
  if (c.topk > 0) mo.experts_per_tok = c.topk;
  auto run = RecordRun(mo, c.sets, 3, 0.8f);
  ASSERT_TRUE(run.engine);
  ASSERT_FALSE(run.result.fault) << run.result.fault->message;
  auto exec = MakeExecutor("cpu", ExecMode::kKernelByKernel, 1);
  ASSERT_TRUE(exec.ok());
  auto dm = DeviceModel::Upload(run.engine->model(), exec->get());
  ASSERT_TRUE(dm.ok());
  auto kv = KvCache::Create(run.engine->model(), run.engine->config(), testing::EnginePages(*run.engine), exec->get());
  ASSERT_TRUE(kv.ok());
  int compared = 0;
  // The lane threads meet at a barrier per sum: a few kernels a step.
  constexpr int kLaneKernelsPerStep = 2;
  int on_lanes = 0;
  for (size_t s = 0; s < run.inputs.size(); ++s) {
    int lane_kernels = 0;
    auto step = StepProgram::Lower(**dm, run.engine->config(), kv->get(), run.inputs[s]);
    ASSERT_FALSE(step->fault());
    step->set_watch(false);
    while (!step->done()) {
      const KernelCall& k = step->kernels()[step->next()];
      // The staged results from the inputs as they are before the kernel runs.
      std::vector<std::pair<float*, std::vector<float>>> want;
      KernelStatus st;
      for (const Op& op : k.ops) {
        const bool lanes = lane_kernels < kLaneKernelsPerStep;
        if (const auto* e = std::get_if<ExpertsOp>(&op)) {
          want.emplace_back(e->partial, Staged(*e, false, &st));
          if (lanes) want.emplace_back(e->partial, Staged(*e, true, &st));
        }
        if (const auto* e = std::get_if<SharedExpertOp>(&op)) {
          want.emplace_back(e->partial, Staged(*e, false, &st));
          if (lanes) want.emplace_back(e->partial, Staged(*e, true, &st));
        }
        if (lanes && (std::holds_alternative<ExpertsOp>(op) || std::holds_alternative<SharedExpertOp>(op))) {
          ++lane_kernels;
          ++on_lanes;
        }
      }
      EXPECT_FALSE(st.fired);
      ASSERT_FALSE(step->RunNext()) << step->status();
      for (const auto& [partial, staged] : want) {
        EXPECT_EQ(std::memcmp(partial, staged.data(), staged.size() * sizeof(float)), 0)
            << "step " << s << " " << k.Label();
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 0) << "no expert kernel ran";
  EXPECT_GT(on_lanes, 0) << "no expert kernel ran on lanes";
}

// clang-format off: a table, one case a line or two as written
INSTANTIATE_TEST_SUITE_P(
    Configs, ExpertStages,
    ::testing::Values(Case{"qwen3_moe_nvfp4_w4a4", "qwen3_moe", "nvfp4", {}},
                      // Four slots: the order of the slots' sum shows (two terms commute).
                      Case{"qwen3_moe_nvfp4_top4", "qwen3_moe", "nvfp4", {}, 4},
                      Case{"mixtral_bf16_top4_tp2", "mixtral", "bf16", {"tp_size=2"}, 4},
                      Case{"qwen3_moe_nvfp4_w4a16_fused", "qwen3_moe", "nvfp4",
                           {"nvfp4_activation=w4a16", "moe_backend=fused_blockscaled"}},
                      Case{"glm4_moe_nvfp4_tp2_shared", "glm4_moe", "nvfp4", {"tp_size=2"}},
                      Case{"glm4_moe_nvfp4_tp2_expert_parallel", "glm4_moe", "nvfp4",
                           {"tp_size=2", "moe_parallel=expert"}},
                      Case{"glm4_moe_mxfp4_ue8m0_fused", "glm4_moe", "mxfp4",
                           {"scale_format=ue8m0", "moe_backend=fused_blockscaled"}},
                      Case{"qwen3_moe_fp8_ue8m0_requant", "qwen3_moe", "fp8", {"scale_format=ue8m0_requant"}},
                      Case{"mixtral_bf16", "mixtral", "bf16", {}},
                      Case{"glm_moe_dsa_nvfp4_tp2", "glm_moe_dsa", "nvfp4", {"tp_size=2"}},
                      // Biases on every projection, the clamped SwiGLU.
                      Case{"gpt_oss_bf16", "gpt_oss", "bf16", {}},
                      Case{"gpt_oss_bf16_tp2", "gpt_oss", "bf16", {"tp_size=2"}}),
    [](const auto& info) { return info.param.name; });
// clang-format on

}  // namespace
}  // namespace crashreplay::replay
