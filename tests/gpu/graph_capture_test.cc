// The device pool and decode CUDA-graph capture against the planner: a
// configuration the planner says runs out of memory at graph capture runs out
// of memory for real there (a cudaErrorMemoryAllocation inside stream
// capture), and one that fits captures every batch size and replays the
// graph with the same bits as direct launches. Skips without a CUDA device.
#include <gtest/gtest.h>

#include "crashreplay/replay/cuda/device_pool.h"
#include "exec_replay_test_util.h"
#include "gpu_test_util.h"

namespace crashreplay::replay {
namespace {

using cuda::CaptureDecodeGraphs;
using cuda::CudaExecutor;
using cuda::DevicePool;

StepInput DecodeBatch(int bs) {
  StepInput in;
  in.mode = ForwardMode::kDecode;
  for (int r = 0; r < bs; ++r) {
    StepRow row;
    row.request_id = r;
    row.tokens = {static_cast<int32_t>(40 + r)};
    row.start_pos = 0;
    row.page_table = {r};
    in.rows.push_back(row);
  }
  return in;
}

struct GraphSetup {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<CudaExecutor> exec;
  std::unique_ptr<DevicePool> pool;
  std::unique_ptr<DeviceModel> model;
  std::unique_ptr<KvCache> kv;
};

// A recorded 24 GB device (fits any GPU these tests run on); the small model's
// weights and KV pool live in the pool's static arena.
void Make(double fraction, GraphSetup* s) {
  MakeModelOptions o;
  o.arch = "llama";
  s->engine = testing::MakeEngine(
      o, {"device_memory_gb=24", "cuda_graph_max_bs=32", "mem_fraction_static=" + std::to_string(fraction)});
  ASSERT_TRUE(s->engine);
  auto ex = CudaExecutor::Create(ExecMode::kAsync);
  ASSERT_TRUE(ex.ok()) << ex.status();
  s->exec = std::move(*ex);
  auto pool = DevicePool::Create(s->engine->plan(), 0);
  ASSERT_TRUE(pool.ok()) << pool.status();
  s->pool = std::move(*pool);
  s->exec->set_arena(s->pool.get());
  auto dm = DeviceModel::Upload(s->engine->model(), s->exec.get());
  ASSERT_TRUE(dm.ok()) << dm.status();
  s->model = std::move(*dm);
  auto kv = KvCache::Create(s->engine->model(), s->engine->config(), 64, s->exec.get());
  ASSERT_TRUE(kv.ok()) << kv.status();
  s->kv = std::move(*kv);
  s->exec->set_arena(nullptr);
}

// One decode step per planned graph batch size, captured as sglang does.
absl::StatusOr<std::unique_ptr<cuda::DecodeGraphs>> CaptureEveryBatchSize(
    GraphSetup& s, std::map<int, std::unique_ptr<StepProgram>>* steps) {
  for (int bs : s.engine->plan().graph_batch_sizes) {
    (*steps)[bs] = StepProgram::Lower(*s.model, s.engine->config(), s.kv.get(), DecodeBatch(bs));
    if ((*steps)[bs]->fault()) return (*steps)[bs]->status();
    (*steps)[bs]->set_watch(false);  // nothing may be read back inside a capture
  }
  return CaptureDecodeGraphs(*s.exec, *s.pool, s.engine->config(), [&](int bs) {
    (*steps)[bs]->RunAll();
    return (*steps)[bs]->status();
  });
}

TEST(CudaGraphs, PlannerGraphOomIsARealAllocationFailureDuringCapture) {
  CR_REQUIRE_CUDA_DEVICE();
  GraphSetup s;
  Make(0.88, &s);  // dynamic 2.88 GB: the workspace fits, workspace + graphs do not
  if (HasFatalFailure()) return;
  ASSERT_TRUE(s.engine->plan().fault);
  EXPECT_EQ(s.engine->plan().fault->stage, "graph_capture");
  std::map<int, std::unique_ptr<StepProgram>> steps;
  auto graphs = CaptureEveryBatchSize(s, &steps);
  ASSERT_TRUE(graphs.ok()) << graphs.status();
  ASSERT_TRUE((*graphs)->fault);
  const Fault& f = *(*graphs)->fault;
  EXPECT_EQ(f.klass, "oom");
  EXPECT_EQ(f.stage, "graph_capture");
  EXPECT_EQ(f.check, "cudaMalloc");
  EXPECT_NE(f.message.find("cudaErrorMemoryAllocation"), std::string::npos) << f.message;
  // The allocation failure is not sticky: the executor still works.
  EXPECT_TRUE(s.exec->Synchronize().ok());
}

TEST(CudaGraphs, FittingConfigurationCapturesEveryBatchSizeAndReplaysSameBits) {
  CR_REQUIRE_CUDA_DEVICE();
  GraphSetup s;
  Make(0.80, &s);
  if (HasFatalFailure()) return;
  ASSERT_FALSE(s.engine->plan().fault) << s.engine->plan().fault->message;
  std::map<int, std::unique_ptr<StepProgram>> steps;
  auto graphs = CaptureEveryBatchSize(s, &steps);
  ASSERT_TRUE(graphs.ok()) << graphs.status();
  ASSERT_FALSE((*graphs)->fault) << (*graphs)->fault->message;
  EXPECT_EQ((*graphs)->batch_sizes.size(), s.engine->plan().graph_batch_sizes.size());
  // Graph replay of bs=32 vs direct launches of the same kernels.
  auto direct = StepProgram::Lower(*s.model, s.engine->config(), s.kv.get(), DecodeBatch(32));
  direct->set_watch(false);
  ASSERT_FALSE(direct->RunAll()) << direct->status();
  const Hash128 want = direct->Digest();
  ASSERT_TRUE(s.exec->LaunchGraph((*graphs)->graphs[0], LaunchTag{"decode_graph", -1}).ok());
  ASSERT_TRUE(s.exec->Synchronize().ok());
  EXPECT_EQ(want, steps[32]->Digest());
}

}  // namespace
}  // namespace crashreplay::replay
