// The model families hf_config understands. Private to formats/.
#pragma once

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
  kGlm4Moe,
};

inline std::optional<HfFamily> HfFamilyOf(std::string_view model_type) {
  if (model_type == "llama") return HfFamily::kLlama;
  if (model_type == "mistral") return HfFamily::kMistral;
  if (model_type == "qwen2") return HfFamily::kQwen2;
  if (model_type == "qwen2_moe") return HfFamily::kQwen2Moe;
  if (model_type == "qwen3") return HfFamily::kQwen3;
  if (model_type == "qwen3_moe") return HfFamily::kQwen3Moe;
  if (model_type == "mixtral") return HfFamily::kMixtral;
  if (model_type == "deepseek_v3") return HfFamily::kDeepseekV3;
  if (model_type == "glm4_moe") return HfFamily::kGlm4Moe;
  return std::nullopt;
}

inline constexpr std::string_view kSupportedModelTypes =
    "llama, mistral, qwen2, qwen2_moe, qwen3, qwen3_moe, mixtral, deepseek_v3, glm4_moe";

// DeepSeek-style MoE layout: first_k_dense_replace dense layers, then MoE
// every moe_layer_freq-th layer, shared experts counted by n_shared_experts.
inline bool IsDeepseekStyle(HfFamily f) {
  return f == HfFamily::kDeepseekV3 || f == HfFamily::kGlm4Moe;
}
// Qwen-style MoE layout: decoder_sparse_step and mlp_only_layers.
inline bool IsQwenMoe(HfFamily f) { return f == HfFamily::kQwen2Moe || f == HfFamily::kQwen3Moe; }

}  // namespace crashreplay
