// The memory planner reserves CUDA-graph memory only for the decode batches
// an engine really captures: none larger than its request pool (sglang's
// get_batch_sizes_to_capture drops them and captures the pool size).
#include <gtest/gtest.h>

#include "crashreplay/replay/model/planner.h"
#include "engine_test_util.h"

namespace crashreplay::replay {
namespace {

using testing::MakeEngine;

MakeModelOptions Llama() {
  MakeModelOptions o;
  o.arch = "llama";
  o.quant = "bf16";
  return o;
}

TEST(PlannerGraphs, GraphBatchSizesStopAtTheRequestPool) {
  auto e = MakeEngine(Llama(), {"cuda_graph_max_bs=256", "max_running_requests=40"});
  ASSERT_NE(e, nullptr);
  const std::vector<int>& bs = e->plan().graph_batch_sizes;
  ASSERT_FALSE(bs.empty());
  EXPECT_EQ(bs.back(), 40);  // the pool size itself is captured
  EXPECT_EQ(bs, GraphBatchSizes(40));
  auto small = MakeEngine(Llama(), {"cuda_graph_max_bs=16", "max_running_requests=40"});
  EXPECT_EQ(small->plan().graph_batch_sizes, GraphBatchSizes(16));
}

TEST(PlannerGraphs, AGraphMaximumAboveThePoolCostsNothingMore) {
  // An 80 GB card at mem_fraction_static 0.88 leaves 9.6 GB for activations
  // and graphs: 256 graph slots do not fit, but a 64-request pool never
  // captures them.
  auto pool64 = MakeEngine(Llama(), {"cuda_graph_max_bs=256", "mem_fraction_static=0.88", "max_running_requests=64"});
  EXPECT_FALSE(pool64->plan().fault) << pool64->plan().ToJson().dump();
  auto same = MakeEngine(Llama(), {"cuda_graph_max_bs=64", "mem_fraction_static=0.88", "max_running_requests=64"});
  EXPECT_EQ(pool64->plan().graph_reservation, same->plan().graph_reservation);
  auto pool256 = MakeEngine(Llama(), {"cuda_graph_max_bs=256", "mem_fraction_static=0.88", "max_running_requests=256"});
  ASSERT_TRUE(pool256->plan().fault);
  EXPECT_EQ(pool256->plan().fault->Signature(), "oom/graph_capture/memory_planner/graph_memory_fits");
}

}  // namespace
}  // namespace crashreplay::replay
