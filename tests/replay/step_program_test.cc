// The one lowering (step.h, step_lower.cc) on the CPU executor: a recorded
// run replayed on a fresh executor (another thread count, another device
// model and KV cache) has the recorded bits after every kernel; the watcher
// does not change them; faults name the kernel, rank and item; the CPU reads
// weights in place. The CUDA executor runs the same list (tests/gpu).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "exec_replay_test_util.h"

namespace crashreplay::replay {
namespace {

using testing::RecordRun;
using testing::ReplayOnExecutor;

using Case = testing::ConfigCase;

class StepOnFreshCpuExecutor : public ::testing::TestWithParam<Case> {};

TEST_P(StepOnFreshCpuExecutor, EveryKernelOutputHasTheRecordedBits) {
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
  testing::ExpectRecordedBits(run, rep);
  // Without the watcher nothing is read back, and the bits are the same.
  auto quiet_exec = MakeExecutor("cpu", ExecMode::kKernelByKernel, 1);
  ASSERT_TRUE(quiet_exec.ok());
  auto quiet = ReplayOnExecutor(run, quiet_exec->get(), /*watch=*/false);
  ASSERT_TRUE(quiet.status.ok()) << quiet.status;
  EXPECT_EQ(quiet.step_digests, rep.step_digests);
}

// clang-format off: a table, one case a line or two as written
INSTANTIATE_TEST_SUITE_P(
    Configs, StepOnFreshCpuExecutor,
    ::testing::Values(Case{"llama_bf16", "llama", "bf16", {}, 0.0f},
                      Case{"qwen3_nvfp4_tp2_flash_fused", "qwen3", "nvfp4",
                           {"tp_size=2", "attention_backend=flashdecode", "gemm_backend=fused_blockscaled"}, 0.8f},
                      Case{"mixtral_nvfp4_paged64_fp8kv_threshold", "mixtral", "nvfp4",
                           {"page_size=64", "attention_backend=paged64", "kv_cache_dtype=fp8_e4m3",
                            "sampling_backend=threshold"},
                           0.8f},
                      Case{"glm4_moe_mxfp4_ue8m0_fused", "glm4_moe", "mxfp4",
                           {"scale_format=ue8m0", "moe_backend=fused_blockscaled"}, 0.8f},
                      Case{"glm4_moe_nvfp4_tp2_expert_parallel", "glm4_moe", "nvfp4",
                           {"tp_size=2", "moe_parallel=expert"}, 0.8f},
                      Case{"qwen3_moe_fp8_ue8m0_requant", "qwen3_moe", "fp8", {"scale_format=ue8m0_requant"}, 0.0f},
                      Case{"llama_nvfp4_w4a4_fused_tp2", "llama", "nvfp4",
                           {"gemm_backend=fused_blockscaled", "tp_size=2"}, 0.0f},
                      Case{"glm4_moe_nvfp4_w4a4_requant_fused_moe", "glm4_moe", "nvfp4",
                           {"scale_format=ue8m0_requant", "moe_backend=fused_blockscaled"}, 0.8f},
                      Case{"qwen3_moe_nvfp4_w4a16", "qwen3_moe", "nvfp4", {"nvfp4_activation=w4a16"}, 0.0f}),
    [](const auto& info) { return info.param.name; });
// clang-format on

TEST(StepFaults, Paged64OnSmallPagesFailsInTheRecordedKernel) {
  MakeModelOptions o;
  o.arch = "llama";
  auto run = RecordRun(o, {"attention_backend=paged64"}, 3, 0.0f);  // page_size 16
  ASSERT_TRUE(run.engine);
  ASSERT_TRUE(run.result.fault);
  const Fault& want = *run.result.fault;
  EXPECT_EQ(want.Signature(), "assert/decode/attention/page_size_is_64");
  auto exec = MakeExecutor("cpu", ExecMode::kKernelByKernel, 1);
  ASSERT_TRUE(exec.ok());
  auto rep = ReplayOnExecutor(run, exec->get(), false);
  ASSERT_EQ(rep.status.code(), absl::StatusCode::kAborted) << rep.status;
  EXPECT_EQ(rep.failed_step, run.inputs.size() - 1);
  ASSERT_TRUE(rep.fault);
  EXPECT_EQ(rep.fault->Signature(), want.Signature());
  EXPECT_EQ(rep.fault->layer, want.layer);
  EXPECT_EQ(rep.fault->index, want.index);
  EXPECT_EQ(rep.fault->value, want.value);
  const auto& f = (*exec)->fault();
  ASSERT_TRUE(f);
  EXPECT_EQ(f->tag.kernel, "attention");
  EXPECT_EQ(f->op, OpKind::kAttention);
  EXPECT_NE(std::string(rep.status.message()).find("page_size_is_64"), std::string::npos) << rep.status;
}

TEST(StepFaults, TokenOutsideVocabularyNamesEmbeddingItemAndValue) {
  MakeModelOptions o;
  o.arch = "qwen3";
  auto e = testing::MakeEngine(o, {}, 2);
  ASSERT_TRUE(e);
  StepInput in;
  in.rows.resize(1);
  in.rows[0].tokens = {5, 7, 100000, 9};
  in.rows[0].page_table = {0};
  auto step = e->Prepare(in);
  const std::optional<Fault> f = step->RunAll();
  ASSERT_TRUE(f);
  EXPECT_EQ(step->status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(f->Signature(), "assert/prefill/embedding/token_id_in_vocab");
  EXPECT_EQ(f->item, 2);
  EXPECT_EQ(f->rank, -1);
  EXPECT_EQ(f->index, 100000);
  EXPECT_EQ(f->value, static_cast<double>(e->model().spec.vocab));
  ASSERT_EQ(step->records().size(), 1u);
  EXPECT_TRUE(step->records()[0].failed);
  const auto& ef = e->executor().fault();
  ASSERT_TRUE(ef);
  EXPECT_EQ(ef->launch, 0u);
}

TEST(StepFaults, ARankedKernelNamesTheRankAndTheTokenOnIt) {
  // kv_write of the second rank (tp 2) reads a page id outside the pool.
  MakeModelOptions o;
  o.arch = "llama";
  auto e = testing::MakeEngine(o, {"tp_size=2"}, 1);
  ASSERT_TRUE(e);
  StepInput in;
  in.rows.resize(1);
  in.rows[0].tokens = {5, 7, 9};
  in.rows[0].page_table = {1 << 20};
  const std::optional<Fault> f = e->Prepare(in)->RunAll();
  ASSERT_TRUE(f);
  EXPECT_EQ(f->Signature(), "assert/prefill/kv_write/page_index_in_pool");
  EXPECT_EQ(f->layer, 0);
  EXPECT_EQ(f->rank, 0) << "the first failing work item is rank 0's first token";
  EXPECT_EQ(f->item, 0);
  EXPECT_EQ(f->index, 1 << 20);
}

// Every lowered linear carries its shards' weight format where the host can
// read it (LinearOp::weight_format: the CUDA launcher picks its kernel by
// it), for every projection of GQA, MLA and DSA layers and lm_head, with
// resident and with streamed weights (whose views are empty until a layer
// is held).
TEST(StepLowering, EveryLinearCarriesItsShardsWeightFormat) {
  struct Case {
    const char* arch;
    const char* quant;
  };
  for (const Case c : {Case{"llama", "bf16"}, Case{"qwen3_moe", "nvfp4"}, Case{"glm_moe_dsa", "nvfp4"},
                       Case{"deepseek_v3", "mxfp4"}}) {
    SCOPED_TRACE(std::string(c.arch) + " " + c.quant);
    MakeModelOptions o;
    o.arch = c.arch;
    o.quant = c.quant;
    o.moe_intermediate = 64;  // halves of whole 32-column MXFP4 blocks at tp 2
    std::vector<WFormat> resident;
    for (const char* weights : {"weights=resident", "weights=stream"}) {
      auto e = testing::MakeEngine(o, {"tp_size=2", weights});
      ASSERT_TRUE(e);
      StepInput in;
      in.rows.resize(1);
      in.rows[0].tokens = {5, 7, 9};
      in.rows[0].page_table = {0};
      auto step = e->Prepare(in);
      ASSERT_TRUE(step);
      std::vector<WFormat> formats;
      int e2m1 = 0;
      for (const KernelCall& k : step->kernels()) {
        for (const Op& op : k.ops) {
          const LinearOp* l = std::get_if<LinearOp>(&op);
          if (l == nullptr) continue;
          formats.push_back(l->weight_format);
          e2m1 += l->weight_format == WFormat::kE2m1;
          if (std::string(weights) == "weights=resident") {
            for (int64_t r = 0; r < l->ranks; ++r) {
              EXPECT_EQ(l->weight_format, l->shards[r].w.format) << k.Label();
            }
          }
        }
      }
      ASSERT_GT(formats.size(), 4u);
      if (std::string(c.quant) != "bf16") {
        EXPECT_GT(e2m1, 0);
      }
      if (resident.empty()) {
        resident = formats;
      } else {
        EXPECT_EQ(formats, resident) << "streamed weights lower with other formats";
      }
    }
  }
}

// The CUDA reference attention's block decomposition (ops.h,
// AttentionItemPhase) on a real step's attention op: two ranks, two rows of
// different lengths, GQA heads; every item's output bits equal RunItem's.
TEST(StepLowering, AttentionItemPhasesGiveTheItemBits) {
  MakeModelOptions o;
  o.arch = "qwen3";
  auto e = testing::MakeEngine(o, {"tp_size=2"});
  ASSERT_TRUE(e);
  StepInput in;
  in.rows.resize(2);
  in.rows[0].tokens = {5, 7, 9, 11, 13};
  in.rows[0].page_table = {0};
  in.rows[1].tokens = {3, 4};
  in.rows[1].page_table = {1};
  auto step = e->Prepare(in);
  ASSERT_TRUE(step);
  int checked = 0;
  while (!step->done()) {
    const KernelCall& k = step->kernels()[step->next()];
    if (k.name == "attention") {
      const AttentionOp& op = std::get<AttentionOp>(k.ops.at(0));
      ASSERT_EQ(op.backend, 0);
      const int64_t n_out = op.ranks * op.batch.tokens * op.heads * op.head_dim;
      std::vector<float> scratch(ScratchFloats(op));
      std::vector<float> want(n_out);
      for (int64_t i = 0; i < Items(op); ++i) {
        KernelStatus st;
        RunItem(op, i, scratch.data(), &st);
        ASSERT_FALSE(st.fired);
      }
      std::copy(op.out, op.out + n_out, want.begin());
      for (int64_t n : {1, 7, 128}) {
        std::fill(op.out, op.out + n_out, -7.0f);
        for (int64_t i = 0; i < Items(op); ++i) {
          KernelStatus st;
          for (int phase = 0; phase < kAttendPhases; ++phase) {
            bool go = true;
            for (int64_t tid = 0; tid < n; ++tid) go = AttentionItemPhase(op, i, phase, tid, n, scratch.data(), &st);
            if (!go) break;
          }
          ASSERT_FALSE(st.fired);
        }
        EXPECT_EQ(std::memcmp(op.out, want.data(), n_out * 4), 0) << k.Label() << " on " << n << " threads";
      }
      ++checked;
    }
    ASSERT_FALSE(step->RunNext().has_value());
  }
  EXPECT_EQ(checked, 2) << "one attention kernel a layer";
}

TEST(StepOnCpu, WeightsAreReadInPlaceNotCopied) {
  MakeModelOptions o;
  o.arch = "glm4_moe";
  o.quant = "nvfp4";
  auto e = testing::MakeEngine(o, {"tp_size=2"});
  ASSERT_TRUE(e);
  auto dm = DeviceModel::Upload(e->model(), &e->executor());
  ASSERT_TRUE(dm.ok()) << dm.status();
  EXPECT_EQ((*dm)->uploaded_bytes(), 0u);
  EXPECT_EQ((*dm)->embed().data, e->model().embed.w.data) << "the CPU view is the model's own bytes";
}

TEST(StepOnCpu, DeviceCudaNeverRunsOnTheCpu) {
  MakeModelOptions o;
  o.arch = "llama";
  auto ckpt = GenerateRandomCheckpoint(o);
  ASSERT_TRUE(ckpt.ok());
  Config c = Config::Defaults();
  ASSERT_TRUE(c.Set("device", "cuda").ok());
  const EngineConfig ec = ResolveConfig(c);
  EXPECT_EQ(ec.device, "cuda");
  auto model = BuildModel(ckpt->spec, ckpt->tensors, ec);
  ASSERT_TRUE(model.ok());
  auto e = Engine::Create(std::move(*model), ec, 1, 64);
  auto cuda = MakeExecutor("cuda", ExecMode::kKernelByKernel);
  if (cuda.ok()) {
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_EQ((*e)->executor().name(), "cuda");
  } else {
    ASSERT_FALSE(e.ok()) << "device=cuda without a usable GPU must fail, not run on the CPU";
    EXPECT_EQ(e.status().message(), cuda.status().message());
  }
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
