// The MLA attention and DSA indexer weights of one layer (model_builder_internal.h).
//
// Sharding (formats/sharding.h): q_b_proj / q_proj and kv_b_proj are column
// parallel (heads split), o_proj row parallel; q_a_proj, kv_a_proj_with_mqa,
// their norms and the whole indexer are replicated, as sglang and DeepSeek's
// reference shard them: every rank computes the latent and the indexer's
// top-k itself. The replicated weights are loaded once (rank 0's copy) but
// hashed and counted for every rank, since every GPU holds them.
#include <string>

#include "crashreplay/base/status.h"
#include "crashreplay/base/text.h"
#include "model_builder_internal.h"

namespace crashreplay::replay {
namespace {

using text::Cat;

absl::StatusOr<LinearShard> Replicated(WeightSource& b, const std::string& base, int tp) {
  LinearShard keep;
  for (int r = 0; r < tp; ++r) {
    CR_ASSIGN_OR_RETURN(LinearShard s, b.Linear(base, r));
    if (r == 0) keep = std::move(s);
  }
  return keep;
}

absl::Status Shape(const LinearShard& s, const std::string& base, int64_t rows, int64_t cols) {
  if (s.w.rows == rows && s.w.cols == cols) return absl::OkStatus();
  return absl::InvalidArgumentError(Cat("tensor '", base, ".weight' is ", s.w.rows, "x", s.w.cols,
                                        " (per rank), the config implies ", rows, "x", cols));
}

}  // namespace

absl::Status LoadMlaAttention(WeightSource& b, const ModelSpec& spec, const EngineConfig& cfg, int64_t l,
                              Layer* layer) {
  const MlaSpec& m = spec.mla;
  const int tp = cfg.tp_size;
  const int64_t heads = spec.heads / tp, H = spec.hidden;
  const std::string a = Cat("model.layers.", l, ".self_attn.");
  MlaLayer& ml = layer->mla;
  if (m.q_lora_rank > 0) {
    CR_ASSIGN_OR_RETURN(ml.q_a, Replicated(b, a + "q_a_proj", tp));
    CR_RETURN_IF_ERROR(Shape(ml.q_a, a + "q_a_proj", m.q_lora_rank, H));
    CR_ASSIGN_OR_RETURN(ml.q_a_norm, b.Vector(a + "q_a_layernorm.weight", m.q_lora_rank));
  }
  CR_ASSIGN_OR_RETURN(ml.kv_a, Replicated(b, a + "kv_a_proj_with_mqa", tp));
  CR_RETURN_IF_ERROR(Shape(ml.kv_a, a + "kv_a_proj_with_mqa", m.kv_lora_rank + m.qk_rope_head_dim, H));
  CR_ASSIGN_OR_RETURN(ml.kv_a_norm, b.Vector(a + "kv_a_layernorm.weight", m.kv_lora_rank));
  const std::string q_name = m.q_lora_rank > 0 ? "q_b_proj" : "q_proj";
  for (int r = 0; r < tp; ++r) {
    RankLayer& rl = layer->ranks[r];
    CR_ASSIGN_OR_RETURN(rl.q, b.Linear(a + q_name, r));
    CR_RETURN_IF_ERROR(Shape(rl.q, a + q_name, heads * m.qk_head_dim(), m.q_lora_rank > 0 ? m.q_lora_rank : H));
    CR_ASSIGN_OR_RETURN(rl.kv_b, b.Linear(a + "kv_b_proj", r));
    CR_RETURN_IF_ERROR(Shape(rl.kv_b, a + "kv_b_proj", heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank));
    CR_ASSIGN_OR_RETURN(rl.o, b.Linear(a + "o_proj", r));
    CR_RETURN_IF_ERROR(Shape(rl.o, a + "o_proj", H, heads * m.v_head_dim));
  }
  ml.has_indexer = m.layer_has_indexer(l);
  if (ml.has_indexer) {
    if (m.q_lora_rank <= 0) {
      return absl::InvalidArgumentError("a DSA indexer reads the q latent; the model has no q_lora_rank");
    }
    const std::string x = a + "indexer.";
    CR_ASSIGN_OR_RETURN(ml.index_wq_b, Replicated(b, x + "wq_b", tp));
    CR_RETURN_IF_ERROR(Shape(ml.index_wq_b, x + "wq_b", m.index_n_heads * m.index_head_dim, m.q_lora_rank));
    CR_ASSIGN_OR_RETURN(ml.index_wk, Replicated(b, x + "wk", tp));
    CR_RETURN_IF_ERROR(Shape(ml.index_wk, x + "wk", m.index_head_dim, H));
    CR_ASSIGN_OR_RETURN(ml.index_weights, Replicated(b, x + "weights_proj", tp));
    CR_RETURN_IF_ERROR(Shape(ml.index_weights, x + "weights_proj", m.index_n_heads, H));
    CR_ASSIGN_OR_RETURN(ml.index_k_norm, b.Vector(x + "k_norm.weight", m.index_head_dim));
    CR_ASSIGN_OR_RETURN(ml.index_k_norm_bias, b.Vector(x + "k_norm.bias", m.index_head_dim));
  } else if (m.dsa() && l == 0) {
    return absl::InvalidArgumentError(
        "layer 0 reuses the indexer top-k of an earlier layer (indexer_types "
        "'shared'), but there is none");
  }
  // A weight-only checkpoint (W4A16_NVFP4) has no input_scale to quantize with.
  if (cfg.nvfp4_activation != Nvfp4Activation::kW4a4 || spec.quant_weight_only) return absl::OkStatus();
  // The groups that quantize one shared input (engines fuse q_a_proj with
  // kv_a_proj_with_mqa); every other projection has an input of its own.
  std::vector<LinearShard*> xa = {&ml.kv_a};
  std::vector<std::string> xa_names = {a + "kv_a_proj_with_mqa"};
  if (m.q_lora_rank > 0) {
    xa.push_back(&ml.q_a);
    xa_names.push_back(a + "q_a_proj");
  } else {
    for (RankLayer& rl : layer->ranks) {
      xa.push_back(&rl.q);
      xa_names.push_back(a + "q_proj");
    }
  }
  CR_RETURN_IF_ERROR(SetGroupActivationScale(b, xa, xa_names));
  if (ml.has_indexer) {
    CR_RETURN_IF_ERROR(SetGroupActivationScale(b, {&ml.index_wq_b}, {a + "indexer.wq_b"}));
    CR_RETURN_IF_ERROR(SetGroupActivationScale(b, {&ml.index_wk}, {a + "indexer.wk"}));
    CR_RETURN_IF_ERROR(SetGroupActivationScale(b, {&ml.index_weights}, {a + "indexer.weights_proj"}));
  }
  for (RankLayer& rl : layer->ranks) {
    if (m.q_lora_rank > 0) CR_RETURN_IF_ERROR(SetGroupActivationScale(b, {&rl.q}, {a + q_name}));
    CR_RETURN_IF_ERROR(SetGroupActivationScale(b, {&rl.kv_b}, {a + "kv_b_proj"}));
    CR_RETURN_IF_ERROR(SetGroupActivationScale(b, {&rl.o}, {a + "o_proj"}));
  }
  return absl::OkStatus();
}

}  // namespace crashreplay::replay
