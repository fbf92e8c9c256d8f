// The memory planner: how a serving engine splits one device's memory, done
// with the *recorded* device's capacity so a replay on any machine makes the
// same decisions (and the same OOMs) as the recorded run.
//
//   capacity   = device_memory_gb * 1e9 * s            (s = device_memory_scale)
//   static     = capacity * mem_fraction_static      weights + KV pool
//   weights    = the largest rank's shard bytes
//   kv_pool    = static - weights;  pages = floor(kv_pool / page_bytes)
//                page_bytes = KvBytesPerToken * page_size
//   dynamic    = capacity - static                   activations + CUDA graphs
//   workspace  = (kRuntimeBytes + act_per_token * kPrefillChunkTokens) * s
//   graphs     = (kGraphBytesPerSeq * max_bs + kPerGraphBytes * graphs
//                 + act_per_token * max_bs) * s
//                where max_bs = min(cuda_graph_max_bs, max_running_requests)
//                (an engine captures no batch its request pool cannot hold)
//                and graphs = the number of captured batch sizes.
//
// Weights and the KV pool are the replayed model's own bytes; every other
// reservation is a device-side cost of the recorded deployment, so it is
// scaled with the capacity. With s = 1 (replaying the recorded model) all
// terms are real bytes; with a small stand-in model and s = its weights over
// the recorded model's, the fractions come out as on the recorded device.
//
// Failures, in the order an engine meets them: weights > static or pages == 0
// -> OOM at stage "load"; workspace + graphs > dynamic -> OOM at stage
// "graph_capture" (when cuda_graph_max_bs > 0, else at "load"). Deterministic.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "crashreplay/replay/config/fault.h"
#include "crashreplay/replay/config/toggles.h"
#include "crashreplay/replay/model/model.h"

namespace crashreplay::replay {

inline constexpr int64_t kPrefillChunkTokens = 8192;
inline constexpr double kRuntimeBytes = 2.5e9;      // CUDA context, cuBLAS/NCCL/DeepGEMM workspaces
inline constexpr double kGraphBytesPerSeq = 40.0e6;  // graph memory pool per decode sequence slot
inline constexpr double kPerGraphBytes = 32.0e6;     // one captured graph's private memory

struct MemoryPlan {
  uint64_t capacity = 0;
  uint64_t static_budget = 0;
  uint64_t weights = 0;
  uint64_t kv_bytes_per_token = 0;  // one rank, all layers (KvBytesPerToken)
  uint64_t page_bytes = 0;
  int64_t pool_pages = 0;
  uint64_t dynamic_budget = 0;
  uint64_t workspace = 0;
  uint64_t graph_reservation = 0;
  std::vector<int> graph_batch_sizes;
  std::optional<Fault> fault;

  nlohmann::json ToJson() const;
};

// The decode batch sizes captured as graphs for a given maximum (sglang's
// schedule: 1, 2, 4, 8, then every 8 up to the maximum).
std::vector<int> GraphBatchSizes(int max_bs);

// KV-cache bytes one token takes on one rank, all layers: GQA K and V of the
// rank's KV heads; MLA the whole latent (kv_lora_rank + qk_rope_head_dim,
// bf16 or the fp8 layout) plus the DSA index key of every layer with its
// own indexer (index_head_dim bf16, or e4m3 + one fp32 scale).
uint64_t KvBytesPerToken(const Model& model, const EngineConfig& config);

// Activation bytes one token needs in one forward pass on one rank.
uint64_t ActivationBytesPerToken(const Model& model);

MemoryPlan PlanMemory(const Model& model, const EngineConfig& config);

}  // namespace crashreplay::replay
