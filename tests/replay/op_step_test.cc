// The op lowering (ops.h, op_step.h) against StepProgram on the CPU: the same
// kernels, the same bits after every kernel, the same faults. This pins the
// work-item decomposition the CUDA backend launches, on machines without a GPU.
#include <gtest/gtest.h>

#include <algorithm>

#include "op_step_test_util.h"

namespace crashreplay::replay {
namespace {

using testing::RecordRun;
using testing::ReplayOnExecutor;

struct Case {
  std::string name, arch, quant;
  std::vector<std::string> sets;
  float temperature;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class OpStepOnCpu : public ::testing::TestWithParam<Case> {};

TEST_P(OpStepOnCpu, EveryKernelOutputHasStepProgramBits) {
  const Case& c = GetParam();
  MakeModelOptions o;
  o.arch = c.arch;
  o.quant = c.quant;
  auto run = RecordRun(o, c.sets, 3, c.temperature);
  ASSERT_TRUE(run.engine);
  ASSERT_FALSE(run.result.fault) << run.result.fault->message;
  auto exec = MakeExecutor("cpu", ExecMode::kKernelByKernel, 2);
  ASSERT_TRUE(exec.ok()) << exec.status();
  auto rep = ReplayOnExecutor(run, exec->get(), /*watch=*/true);
  ASSERT_TRUE(rep.status.ok()) << rep.status;
  ASSERT_EQ(rep.kernel_digests.size(), run.records.size());
  for (size_t s = 0; s < run.records.size(); ++s) {
    ASSERT_EQ(rep.kernel_digests[s].size(), run.records[s].size()) << "step " << s;
    for (size_t k = 0; k < run.records[s].size(); ++k) {
      EXPECT_EQ(rep.kernel_digests[s][k], run.records[s][k].digest)
          << "step " << s << " kernel " << run.records[s][k].label;
    }
    EXPECT_EQ(rep.step_digests[s], run.result.steps[s].digest) << "step " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Configs, OpStepOnCpu,
    ::testing::Values(Case{"llama_bf16", "llama", "bf16", {}, 0.0f},
                      Case{"qwen3_nvfp4_tp2_flash_fused", "qwen3", "nvfp4",
                           {"tp_size=2", "attention_backend=flashdecode", "gemm_backend=fused_blockscaled"}, 0.8f},
                      Case{"mixtral_nvfp4_paged64_fp8kv_threshold", "mixtral", "nvfp4",
                           {"page_size=64", "attention_backend=paged64", "kv_cache_dtype=fp8_e4m3",
                            "sampling_backend=threshold"},
                           0.8f},
                      Case{"deepseek_mxfp4_ue8m0_fused", "deepseek_v3", "mxfp4",
                           {"scale_format=ue8m0", "moe_backend=fused_blockscaled"}, 0.8f},
                      Case{"deepseek_nvfp4_tp2_expert_parallel", "deepseek_v3", "nvfp4",
                           {"tp_size=2", "moe_parallel=expert"}, 0.8f},
                      Case{"qwen3_moe_fp8_ue8m0_requant", "qwen3_moe", "fp8", {"scale_format=ue8m0_requant"}, 0.0f},
                      Case{"llama_nvfp4_w4a4_fused_tp2", "llama", "nvfp4",
                           {"gemm_backend=fused_blockscaled", "tp_size=2"}, 0.0f},
                      Case{"deepseek_nvfp4_w4a4_requant_fused_moe", "deepseek_v3", "nvfp4",
                           {"scale_format=ue8m0_requant", "moe_backend=fused_blockscaled"}, 0.8f},
                      Case{"qwen3_moe_nvfp4_w4a16", "qwen3_moe", "nvfp4", {"nvfp4_activation=w4a16"}, 0.0f}),
    [](const auto& info) { return info.param.name; });

TEST(OpStepFaults, Paged64OnSmallPagesFailsInTheSameKernelAsStepProgram) {
  MakeModelOptions o;
  o.arch = "llama";
  auto run = RecordRun(o, {"attention_backend=paged64"}, 3, 0.0f);  // page_size 16
  ASSERT_TRUE(run.engine);
  ASSERT_TRUE(run.result.fault);
  const Fault& want = *run.result.fault;
  auto exec = MakeExecutor("cpu", ExecMode::kKernelByKernel, 1);
  ASSERT_TRUE(exec.ok());
  auto rep = ReplayOnExecutor(run, exec->get(), false);
  ASSERT_EQ(rep.status.code(), absl::StatusCode::kAborted) << rep.status;
  EXPECT_EQ(rep.failed_step, run.inputs.size() - 1);
  const auto& f = (*exec)->fault();
  ASSERT_TRUE(f);
  EXPECT_EQ(f->tag.kernel, want.kernel);
  EXPECT_EQ(f->tag.layer, want.layer);
  EXPECT_EQ(CheckName(f->status.check), want.check);
  EXPECT_EQ(f->status.index, want.index);
  EXPECT_EQ(f->status.value, want.value);
  EXPECT_EQ(f->op, OpKind::kAttention);
  EXPECT_NE(std::string(rep.status.message()).find("page_size_is_64"), std::string::npos) << rep.status;
}

TEST(OpStepFaults, TokenOutsideVocabularyNamesEmbeddingItemAndValue) {
  MakeModelOptions o;
  o.arch = "qwen3";
  auto e = testing::MakeEngine(o, {});
  ASSERT_TRUE(e);
  StepInput in;
  in.rows.resize(1);
  in.rows[0].tokens = {5, 7, 100000, 9};
  in.rows[0].page_table = {0};
  auto exec = MakeExecutor("cpu", ExecMode::kKernelByKernel, 2);
  ASSERT_TRUE(exec.ok());
  auto dm = DeviceModel::Upload(e->model(), exec->get());
  ASSERT_TRUE(dm.ok()) << dm.status();
  auto kv = DeviceKv::Create(e->model(), e->config(), 4, exec->get());
  ASSERT_TRUE(kv.ok());
  auto step = OpStep::Build(**dm, e->config(), kv->get(), exec->get(), in);
  ASSERT_TRUE(step.ok());
  const absl::Status s = (*step)->RunAll();
  ASSERT_EQ(s.code(), absl::StatusCode::kAborted);
  const auto& f = (*exec)->fault();
  ASSERT_TRUE(f);
  EXPECT_EQ(f->tag.kernel, "embedding");
  EXPECT_EQ(f->launch, 0u);
  EXPECT_EQ(f->status.check, Check::kTokenInVocab);
  EXPECT_EQ(f->status.item, 2);
  EXPECT_EQ(f->status.index, 100000);
  EXPECT_EQ(f->status.value, static_cast<double>(e->model().spec.vocab));
}

TEST(ExecutorRegistry, ListsCudaExactlyWhenTheCudaTranslationUnitsAreBuiltIn) {
  auto b = CompiledBackends();
  EXPECT_EQ(b.front(), "cpu");
#if defined(CRASHREPLAY_HAVE_CUDA)
  EXPECT_NE(std::find(b.begin(), b.end(), "cuda"), b.end());
#else
  EXPECT_EQ(std::find(b.begin(), b.end(), "cuda"), b.end());
#endif
}

TEST(ExecutorRegistry, CudaWithoutADeviceIsAClearUsageError) {
  auto e = MakeExecutor("cuda", ExecMode::kAsync);
  if (e.ok()) GTEST_SKIP() << "this machine has a CUDA device; tests/gpu covers it";
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument) << e.status();
#if defined(CRASHREPLAY_HAVE_CUDA)
  EXPECT_NE(std::string(e.status().message()).find("no CUDA device"), std::string::npos) << e.status();
#else
  EXPECT_NE(std::string(e.status().message()).find("without the CUDA backend"), std::string::npos) << e.status();
#endif
  EXPECT_NE(std::string(e.status().message()).find("--device cpu"), std::string::npos) << e.status();
}

TEST(ExecutorRegistry, UnknownDeviceIsRejected) {
  auto e = MakeExecutor("tpu", ExecMode::kAsync);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace crashreplay::replay
