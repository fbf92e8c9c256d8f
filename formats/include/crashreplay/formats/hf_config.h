// What an inference engine needs from a Hugging Face `config.json`, for the
// llama, mistral, qwen2, qwen2_moe, qwen3, mixtral, qwen3_moe, deepseek_v3
// and glm4_moe model types, plus quantization (FP8 block, ModelOpt NVFP4,
// MXFP4).
//
// Every family's spellings are normalised into one ModelConfig: mixtral's
// `num_local_experts`, qwen's `num_experts` and deepseek's `n_routed_experts`
// all become `num_experts`; rope settings become one RopeConfig whether they
// came as legacy `rope_theta` + `rope_scaling` (with "type" or "rope_type")
// or as transformers v5's `rope_parameters`. docs/formats/hf_config.md lists
// every key read per family, the defaults and the validation rules.
//
// Errors (never exceptions): Unimplemented naming an unsupported model_type,
// rope type or quantization method; InvalidArgument naming the field and the
// file for a missing required field, a value of the wrong JSON type, an
// inconsistent value (heads not divisible by kv heads, top-k > experts), or
// malformed JSON; NotFound for a missing file. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace crashreplay {

enum class RopeType { kDefault, kLinear, kDynamic, kYarn, kLlama3, kLongRope };
std::string_view RopeTypeName(RopeType t);  // the HF spelling: "yarn", ...

// Which keys the rope settings were read from; HfConfigToJson writes the same
// form back.
enum class RopeForm {
  kLegacy,          // top-level `rope_theta` + `rope_scaling` (or none)
  kRopeParameters,  // transformers v5 `rope_parameters` dict
};

struct RopeConfig {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;
  double factor = 1.0;                       // linear, dynamic, yarn, llama3, longrope
  int64_t original_max_position_embeddings = 0;  // 0 when not given
  double low_freq_factor = 1.0;              // llama3
  double high_freq_factor = 4.0;             // llama3
  double beta_fast = 32.0;                   // yarn
  double beta_slow = 1.0;                    // yarn
  double mscale = 0.0;                       // yarn (deepseek); 0 when not given
  double mscale_all_dim = 0.0;               // yarn (deepseek); 0 when not given
  double attention_factor = 0.0;             // yarn, longrope; 0 when not given
  std::vector<double> short_factor;          // longrope
  std::vector<double> long_factor;           // longrope
  double partial_rotary_factor = 1.0;        // fraction of head_dim rotated
  RopeForm form = RopeForm::kLegacy;
  // In the legacy form, the scaling dict named its type with the old "type"
  // key (deepseek_v3 does) instead of "rope_type".
  bool legacy_type_key = false;

  bool operator==(const RopeConfig&) const = default;
};

enum class QuantMethod {
  kNone,
  kFp8Block,  // quant_method "fp8" with weight_block_size (DeepSeek-V3, Qwen3-FP8)
  kNvfp4,     // ModelOpt NVFP4: e2m1 values, e4m3 scale per 16, fp32 global scale
  kMxfp4,     // quant_method "mxfp4": e2m1 values, e8m0 scale per 32
};
std::string_view QuantMethodName(QuantMethod m);

struct QuantConfig {
  QuantMethod method = QuantMethod::kNone;
  // Where it was read: "<dir>/config.json" or "<dir>/hf_quant_config.json".
  std::string source;
  // FP8 block.
  std::vector<int64_t> weight_block_size;  // {rows, cols}, e.g. {128, 128}
  std::string fmt;                         // "e4m3"
  std::string activation_scheme;          // "dynamic" or "static"
  // NVFP4 / MXFP4.
  int64_t group_size = 0;          // 16 for NVFP4, 32 for MXFP4
  std::string quant_algo;          // ModelOpt's name, "NVFP4"
  std::string kv_cache_quant_algo; // ModelOpt's, e.g. "FP8"; empty if none
  std::string producer;            // e.g. "modelopt 0.29.0"
  // Modules left unquantized: `modules_to_not_convert`, `ignored_layers`,
  // `ignore` or `exclude_modules`, whichever the config uses. Entries are
  // module names or fnmatch-style globs ("model.layers.*.self_attn*").
  std::vector<std::string> ignore;

  // Whether weights of `module` (a module name such as
  // "model.layers.3.mlp.experts.7.down_proj", not a tensor name) are
  // quantized. A pattern matches the module or any module containing it: a
  // glob must match the whole name or a dotted prefix of it; a plain name
  // must equal a dotted run of components ("lm_head", "mlp.gate").
  bool IsQuantized(std::string_view module) const;

  bool operator==(const QuantConfig&) const = default;
};

struct ModelConfig {
  std::string source;  // the file it was read from, for messages
  std::string model_type;
  std::vector<std::string> architectures;

  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // dense MLP width
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // default: num_attention_heads
  int64_t head_dim = 0;             // default: hidden_size / num_attention_heads
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;      // q/k/v projections have a bias
  bool attention_out_bias = false;  // o_proj has a bias
  bool mlp_bias = false;
  bool qk_norm = false;             // RMSNorm on q and k per head (qwen3, glm4_moe opt-in)
  std::string hidden_act = "silu";
  int64_t sliding_window = 0;       // 0: full attention
  std::vector<int64_t> bos_token_id;  // the JSON int or list; empty if null
  std::vector<int64_t> eos_token_id;
  std::string torch_dtype;          // "bfloat16"; also read from `dtype`
  RopeConfig rope;

  // Mixture of experts (num_experts == 0: dense model).
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t n_shared_experts = 0;                 // deepseek/glm: each intermediate wide
  int64_t shared_expert_intermediate_size = 0;  // qwen2_moe: one shared expert this wide
  bool norm_topk_prob = false;
  std::string scoring_func = "softmax";  // "softmax" or "sigmoid"
  std::string topk_method = "greedy";    // "greedy", "group_limited_greedy", "noaux_tc"
  int64_t n_group = 1;
  int64_t topk_group = 1;
  double routed_scaling_factor = 1.0;
  int64_t first_k_dense_replace = 0;  // deepseek/glm: layers [0, k) are dense
  int64_t moe_layer_freq = 1;         // deepseek: MoE every n-th layer after those
  int64_t decoder_sparse_step = 1;    // qwen MoE: layer i is MoE if (i + 1) % step == 0
  std::vector<int64_t> mlp_only_layers;  // qwen MoE: dense layers

  // Multi-head latent attention (deepseek_v3); kv_lora_rank == 0: no MLA.
  int64_t q_lora_rank = 0;  // 0: q is not low-rank compressed
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  int64_t num_nextn_predict_layers = 0;  // MTP layers stored after the decoder layers

  QuantConfig quant;

  bool IsMoe() const { return num_experts > 0; }
  bool UsesMla() const { return kv_lora_rank > 0; }
  // Whether decoder layer `layer` (0-based) has a routed-expert MLP.
  bool IsMoeLayer(int layer) const;

  bool operator==(const ModelConfig&) const = default;
};

// Parses config.json text. `source` names it in messages (and is stored in
// ModelConfig::source and QuantConfig::source).
absl::StatusOr<ModelConfig> ParseHfConfig(std::string_view json, std::string_view source);

// Parses ModelOpt's hf_quant_config.json text.
absl::StatusOr<QuantConfig> ParseHfQuantConfig(std::string_view json, std::string_view source);

// Reads `path` (a config.json). When it has no `quantization_config` and an
// `hf_quant_config.json` sits beside it, the quantization comes from there.
absl::StatusOr<ModelConfig> LoadHfConfig(const std::string& path);

// A config.json for `config` that transformers accepts for its model_type,
// using that family's own key names; ParseHfConfig of it gives `config` back
// (except `source`). Keys sorted, indent 2.
std::string HfConfigToJson(const ModelConfig& config);

}  // namespace crashreplay
