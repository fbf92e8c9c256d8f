// The shape of multi-head latent attention (MLA, DeepSeek-V2/V3) and of
// DeepSeek Sparse Attention's lightning indexer (DSA: DeepSeek-V3.2, GLM-5),
// as the engine needs it. Part of ModelSpec (model_spec.h); filled from
// config.json (deepseek_v3, deepseek_v32, glm_moe_dsa) or by the random
// checkpoint generator. A value type.
//
// MLA (transformers' DeepseekV3Attention): per token
//   q      = q_b_proj(RMSNorm(q_a_proj(x)))   (q_lora_rank > 0)  or  q_proj(x)
//            [heads, qk_nope_head_dim + qk_rope_head_dim], rope part last;
//   kv_a   = kv_a_proj_with_mqa(x) = [c (kv_lora_rank) | k_rot (qk_rope_head_dim)];
//   c      = RMSNorm(c) (kv_a_layernorm); k_rot rotated, shared by every head;
//   the cache holds c and k_rot only (the latent); kv_b_proj expands c into
//   [heads, qk_nope_head_dim + v_head_dim] (K's nope part, then V).
// Both low-rank norms use eps 1e-6 whatever rms_norm_eps says (transformers
// builds them with the RMSNorm default).
//
// DSA (DeepseekV32Indexer): index_n_heads query heads of index_head_dim from
// the q latent (wq_b), one key from x (wk, then LayerNorm with bias, eps
// 1e-6), per-head weights from x (weights_proj); RoPE on the first
// qk_rope_head_dim dims of each (interleaved in GLM-5, half-split in
// DeepSeek-V3.2); score(t) = sum_h w_h relu(q_h . k_t / sqrt(index_head_dim))
// / sqrt(index_n_heads); attention then reads the index_topk best positions.
#pragma once

#include <cstdint>
#include <vector>

namespace crashreplay::replay {

struct MlaSpec {
  int64_t q_lora_rank = 0;   // 0: q = q_proj(x), no low-rank q
  int64_t kv_lora_rank = 0;  // > 0: the model uses MLA
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  // RoPE pairs (2i, 2i+1) of the rope part (DeepSeek's layout; transformers'
  // rope_interleave, always true for deepseek_v32 and glm_moe_dsa) or
  // (i, i + d/2) (rotate-half).
  bool rope_interleave = true;

  // DSA indexer; index_topk == 0: dense MLA (deepseek_v3).
  int64_t index_n_heads = 0;
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;
  bool index_rope_interleave = false;  // glm_moe_dsa: true; deepseek_v32: false
  // Per layer: 1 when the layer runs its own indexer ("full"), 0 when it
  // reuses the top-k of the last layer that did ("shared", GLM-5's
  // indexer_types). Empty: every layer is full.
  std::vector<uint8_t> index_full_layers;

  bool enabled() const { return kv_lora_rank > 0; }
  bool dsa() const { return enabled() && index_topk > 0; }
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  bool layer_has_indexer(int64_t layer) const {
    if (!dsa()) return false;
    if (index_full_layers.empty()) return true;
    return layer < static_cast<int64_t>(index_full_layers.size()) && index_full_layers[layer] != 0;
  }

  friend bool operator==(const MlaSpec&, const MlaSpec&) = default;
};

// The low-rank norms' epsilon (q_a_layernorm, kv_a_layernorm) and the
// indexer key norm's: transformers' and DeepSeek's defaults, not the
// config's rms_norm_eps.
inline constexpr double kMlaNormEps = 1e-6;

}  // namespace crashreplay::replay
