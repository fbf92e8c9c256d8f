#include "crashreplay/replay/model/planner.h"

#include <algorithm>
#include <cmath>

#include "crashreplay/base/text.h"
#include "crashreplay/replay/kernels/indexer.h"
#include "crashreplay/replay/kernels/mla.h"

namespace crashreplay::replay {

using text::Cat;

std::vector<int> GraphBatchSizes(int max_bs) {
  std::vector<int> out;
  for (int bs : {1, 2, 4}) {
    if (bs <= max_bs) out.push_back(bs);
  }
  for (int bs = 8; bs <= max_bs; bs += 8) out.push_back(bs);
  if (max_bs > 0 && (out.empty() || out.back() != max_bs)) out.push_back(max_bs);
  return out;
}

uint64_t KvBytesPerToken(const Model& m, const EngineConfig& c) {
  const ModelSpec& s = m.spec;
  const bool fp8 = c.kv_cache_dtype == KvCacheDType::kFp8E4m3;
  if (!s.mla.enabled()) {
    return static_cast<uint64_t>(s.layers) * 2 * m.kv_heads_local * s.head_dim * (fp8 ? 1 : 2);
  }
  // Every rank holds the whole latent of every layer, and the index keys of
  // the layers that run their own indexer.
  const MlaSpec& mla = s.mla;
  uint64_t bytes = static_cast<uint64_t>(s.layers) *
                   static_cast<uint64_t>(LatentTokenBytes(fp8, static_cast<int32_t>(mla.kv_lora_rank),
                                                          static_cast<int32_t>(mla.qk_rope_head_dim)));
  for (int64_t l = 0; l < s.layers; ++l) {
    if (mla.layer_has_indexer(l)) {
      bytes +=
          static_cast<uint64_t>(IndexPageBytes(c.index_cache_dtype == KvCacheDType::kFp8E4m3, 1, mla.index_head_dim));
    }
  }
  return bytes;
}

uint64_t ActivationBytesPerToken(const Model& m) {
  const ModelSpec& s = m.spec;
  int64_t q = m.heads_local * s.head_dim, kv = m.kv_heads_local * s.head_dim;
  if (s.mla.enabled()) {
    // q, the absorbed q and its latent output, attn; kv_a and q_a; the
    // expanded K/V of one position; the indexer's q, k, weights and top-k.
    const MlaSpec& a = s.mla;
    const int64_t kva = a.kv_lora_rank + a.qk_rope_head_dim;
    q = m.heads_local * (a.qk_head_dim() + kva + a.kv_lora_rank + a.v_head_dim) / 2;
    kv = (kva + a.q_lora_rank + m.heads_local * (a.qk_nope_head_dim + a.v_head_dim) +
          a.index_n_heads * (a.index_head_dim + 1) + a.index_head_dim + a.index_topk) /
         2;
  }
  int64_t mlp = 3 * m.intermediate_local;
  if (s.is_moe()) {
    mlp = std::max<int64_t>(mlp, 3 * m.moe_intermediate_local * s.experts_per_tok + s.num_experts * 2);
  }
  // residual, normed input, q/k/v/attn, the row-parallel partials of every
  // rank (all-gathered), the MLP's widest intermediate, and this rank's logits.
  const int64_t floats = 2 * s.hidden + 2 * q + 2 * kv + m.tp * s.hidden + mlp + m.vocab_local;
  return static_cast<uint64_t>(floats) * 4;
}

MemoryPlan PlanMemory(const Model& m, const EngineConfig& c) {
  MemoryPlan p;
  const double scale = c.device_memory_scale;
  p.capacity = static_cast<uint64_t>(std::llround(c.device_memory_gb * 1e9 * scale));
  p.static_budget = static_cast<uint64_t>(std::floor(static_cast<double>(p.capacity) * c.mem_fraction_static));
  p.weights = *std::max_element(m.rank_weight_bytes.begin(), m.rank_weight_bytes.end());
  p.kv_bytes_per_token = KvBytesPerToken(m, c);
  p.page_bytes = p.kv_bytes_per_token * static_cast<uint64_t>(c.page_size);
  p.dynamic_budget = p.capacity - p.static_budget;
  const double per_token = static_cast<double>(ActivationBytesPerToken(m));
  p.workspace = static_cast<uint64_t>(std::llround((kRuntimeBytes + per_token * kPrefillChunkTokens) * scale));
  // An engine captures decode graphs only for batches its request pool can
  // hold: sglang's get_batch_sizes_to_capture (model_executor/runner/
  // base_cuda_graph_runner.py) drops sizes above req_to_token_pool.size, the
  // max_running_requests, and captures that size itself. A cuda_graph_max_bs
  // above it reserves nothing more (planning it did: a spurious OOM).
  const int graph_max_bs = std::min(c.cuda_graph_max_bs, std::max(c.max_running_requests, 0));
  p.graph_batch_sizes = GraphBatchSizes(graph_max_bs);
  const double max_bs = static_cast<double>(graph_max_bs);
  p.graph_reservation = static_cast<uint64_t>(
      std::llround((kGraphBytesPerSeq * max_bs + kPerGraphBytes * static_cast<double>(p.graph_batch_sizes.size()) +
                    per_token * max_bs) *
                   scale));
  auto oom = [&](const char* stage, std::string what, uint64_t need, uint64_t have) {
    Fault f;
    f.klass = "oom";
    f.stage = stage;
    f.kernel = "memory_planner";
    f.check = what;
    f.index = static_cast<int64_t>(need);
    f.value = static_cast<double>(have);
    f.message = Cat("out of memory at ", stage, ": ", what, " needs ", need, " bytes, ", have, " available (capacity ",
                    p.capacity, ", mem_fraction_static ", c.mem_fraction_static, ")");
    p.fault = f;
  };
  if (p.weights >= p.static_budget) {
    oom("load", "weights_fit_static_budget", p.weights, p.static_budget);
    return p;
  }
  p.pool_pages = static_cast<int64_t>((p.static_budget - p.weights) / p.page_bytes);
  if (c.max_total_tokens > 0) {
    p.pool_pages = std::min<int64_t>(p.pool_pages, (c.max_total_tokens + c.page_size - 1) / c.page_size);
  }
  if (p.pool_pages < 1) {
    oom("load", "kv_pool_has_pages", p.page_bytes, p.static_budget - p.weights);
    return p;
  }
  const uint64_t need = p.workspace + p.graph_reservation;
  if (need > p.dynamic_budget) {
    oom(graph_max_bs > 0 ? "graph_capture" : "load", graph_max_bs > 0 ? "graph_memory_fits" : "workspace_fits", need,
        p.dynamic_budget);
  }
  return p;
}

nlohmann::json MemoryPlan::ToJson() const {
  nlohmann::json j = {{"capacity", capacity},
                      {"static_budget", static_budget},
                      {"weights", weights},
                      {"kv_bytes_per_token", kv_bytes_per_token},
                      {"page_bytes", page_bytes},
                      {"pool_pages", pool_pages},
                      {"dynamic_budget", dynamic_budget},
                      {"workspace", workspace},
                      {"graph_reservation", graph_reservation},
                      {"graph_batch_sizes", graph_batch_sizes}};
  if (fault) j["fault"] = fault->ToJson();
  return j;
}

}  // namespace crashreplay::replay
