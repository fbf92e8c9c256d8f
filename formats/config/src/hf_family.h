// The model families hf_config understands, and for each the defaults that
// transformers' config class for that model_type gives to keys a
// config.json leaves out. Private to formats/.
//
// Adding a family: an HfFamily value, a row in kFamilies (defaults read from
// transformers 5.x `models/<type>/configuration_<type>.py`, and 4.x where it
// differs), its keys in ParseFamily (hf_config_parse.cc), its key names in
// HfConfigToJson (hf_config_write.cc), and its row in docs/formats/hf_config.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace crashreplay {

enum class HfFamily {
  kLlama,
  kMistral,
  kQwen2,
  kQwen2Moe,
  kQwen3,
  kQwen3Moe,
  kMixtral,
  kDeepseekV3,
  kDeepseekV32,
  kGlmMoeDsa,
  kGlm4Moe,
  kGptOss,
};

// transformers' defaults for one model_type. A head_dim or
// num_key_value_heads of 0 means "derived": hidden_size / num_attention_heads
// and num_attention_heads, as the config class (or the modeling code, for
// classes without the field) derives them.
struct HfFamilyInfo {
  std::string_view model_type;
  HfFamily family;
  int64_t vocab_size;
  int64_t hidden_size;
  int64_t intermediate_size;
  int64_t num_hidden_layers;
  int64_t num_attention_heads;
  int64_t num_key_value_heads;  // 0: num_attention_heads
  int64_t head_dim;             // 0: hidden_size / num_attention_heads
  int64_t max_position_embeddings;
  double rms_norm_eps;
  double rope_theta;             // the class's default_theta
  double partial_rotary_factor;
  int64_t bos_token_id;          // -1: None
  int64_t eos_token_id;          // -1: None
};

inline constexpr HfFamilyInfo kFamilies[] = {
    // model_type   family                vocab   hidden inter  layers heads kv   hd   max_pos  eps   theta  prf  bos
    // eos
    {"llama", HfFamily::kLlama, 32000, 4096, 11008, 32, 32, 0, 0, 2048, 1e-6, 1e4, 1.0, 1, 2},
    {"mistral", HfFamily::kMistral, 32000, 4096, 14336, 32, 32, 8, 0, 131072, 1e-6, 1e4, 1.0, 1, 2},
    {"qwen2", HfFamily::kQwen2, 151936, 4096, 22016, 32, 32, 32, 0, 32768, 1e-6, 1e4, 1.0, -1, -1},
    {"qwen2_moe", HfFamily::kQwen2Moe, 151936, 2048, 5632, 24, 16, 16, 0, 32768, 1e-6, 1e4, 1.0, -1, -1},
    {"qwen3", HfFamily::kQwen3, 151936, 4096, 22016, 32, 32, 32, 128, 32768, 1e-6, 1e4, 1.0, -1, -1},
    // Qwen3MoeConfig has no head_dim field (4.x and 5.x); the attention
    // module falls back to hidden_size / num_attention_heads.
    {"qwen3_moe", HfFamily::kQwen3Moe, 151936, 2048, 6144, 24, 32, 4, 0, 32768, 1e-6, 1e4, 1.0, -1, -1},
    {"mixtral", HfFamily::kMixtral, 32000, 4096, 14336, 32, 32, 8, 0, 131072, 1e-5, 1e6, 1.0, 1, 2},
    // DeepSeek-V3's head_dim is its MLA's (qk_nope_head_dim + qk_rope_head_dim).
    {"deepseek_v3", HfFamily::kDeepseekV3, 129280, 7168, 18432, 61, 128, 128, 0, 4096, 1e-6, 1e4, 1.0, 0, 1},
    // DeepseekV32Config and GlmMoeDsaConfig (transformers 5 only): MLA with
    // the DSA indexer; their head_dim field is overwritten with
    // qk_rope_head_dim in __post_init__, like DeepSeek-V3's.
    {"deepseek_v32", HfFamily::kDeepseekV32, 129280, 7168, 18432, 61, 128, 128, 0, 163840, 1e-6, 1e4, 1.0, 0, 1},
    {"glm_moe_dsa", HfFamily::kGlmMoeDsa, 154880, 6144, 12288, 78, 64, 64, 0, 202752, 1e-5, 1e4, 1.0, 0, 1},
    // Glm4MoeConfig has no head_dim field either; partial_rotary_factor 0.5.
    {"glm4_moe", HfFamily::kGlm4Moe, 151552, 4096, 10944, 46, 96, 8, 0, 131072, 1e-5, 1e4, 0.5, -1, -1},
    // GptOssConfig (transformers 5): head_dim 64, default_theta 150000; its
    // __post_init__ gives a file without RoPE keys gpt-oss's YaRN (hf_config_parse.cc).
    {"gpt_oss", HfFamily::kGptOss, 201088, 2880, 2880, 36, 64, 8, 64, 131072, 1e-5, 150000.0, 1.0, -1, -1},
};

inline const HfFamilyInfo* FindFamily(std::string_view model_type) {
  for (const HfFamilyInfo& f : kFamilies) {
    if (f.model_type == model_type) return &f;
  }
  return nullptr;
}

inline std::optional<HfFamily> HfFamilyOf(std::string_view model_type) {
  const HfFamilyInfo* f = FindFamily(model_type);
  if (f == nullptr) return std::nullopt;
  return f->family;
}

inline constexpr std::string_view kSupportedModelTypes =
    "llama, mistral, qwen2, qwen2_moe, qwen3, qwen3_moe, mixtral, deepseek_v3, deepseek_v32, glm_moe_dsa, "
    "glm4_moe, gpt_oss";

// DeepSeek-style MoE layout: first_k_dense_replace dense layers, then MoE
// every moe_layer_freq-th layer, shared experts counted by n_shared_experts.
inline bool IsDeepseekStyle(HfFamily f) {
  return f == HfFamily::kDeepseekV3 || f == HfFamily::kDeepseekV32 || f == HfFamily::kGlmMoeDsa ||
         f == HfFamily::kGlm4Moe;
}
// Multi-head latent attention (DeepSeek-V3 and its DSA descendants).
inline bool IsMla(HfFamily f) {
  return f == HfFamily::kDeepseekV3 || f == HfFamily::kDeepseekV32 || f == HfFamily::kGlmMoeDsa;
}
// DeepSeek Sparse Attention: MLA plus the lightning indexer.
inline bool IsDsa(HfFamily f) { return f == HfFamily::kDeepseekV32 || f == HfFamily::kGlmMoeDsa; }
// Qwen-style MoE layout: decoder_sparse_step and mlp_only_layers.
inline bool IsQwenMoe(HfFamily f) { return f == HfFamily::kQwen2Moe || f == HfFamily::kQwen3Moe; }

}  // namespace crashreplay
