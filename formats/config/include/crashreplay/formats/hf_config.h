// What an inference engine needs from a Hugging Face `config.json`, for the
// llama, mistral, qwen2, qwen2_moe, qwen3, mixtral, qwen3_moe, deepseek_v3,
// deepseek_v32, glm_moe_dsa, glm4_moe and gpt_oss model types, plus quantization (FP8 block, ModelOpt NVFP4,
// MXFP4).
//
// Every family's spellings are normalised into one ModelConfig, accepting
// each key under every name transformers 4.x and 5.x give it (their
// config classes' attribute_map): mixtral's and qwen3_moe's
// `num_local_experts` / `num_experts`, deepseek's and glm4_moe's
// `n_routed_experts` / `num_local_experts` all become `num_experts`. A key
// the file leaves out takes the default of transformers' config class for
// that model_type (formats/config/src/hf_family.h), so a file reads as transformers
// reads it. RoPE is resolved as transformers 5 resolves it: a non-null
// `rope_scaling` wins over `rope_parameters`, which wins over a bare
// `rope_theta`; each form is also kept on its own (RoPE notes, the
// rope_config toggle). docs/formats/hf_config.md lists every key read per
// family, its aliases, its default and the validation rules.
//
// Errors (never exceptions): Unimplemented naming an unsupported model_type,
// rope type or quantization method, marked IsUnsupportedModel;
// InvalidArgument naming the field and the file for a value of the wrong
// JSON type, an inconsistent value (heads not divisible by kv heads, top-k >
// experts, two spellings of one key that disagree), or malformed JSON;
// NotFound for a missing file. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace crashreplay {

// A refusal of a valid input that the engine does not implement (a model
// type, a RoPE type, a quantization format, an attention kind): an
// Unimplemented status carrying a marker that `crashreplay` maps to its
// "unsupported" exit code. The message reads "unsupported model: " +
// `message`, which should say what is not supported and name the file.
absl::Status UnsupportedModelError(std::string_view message);
// Whether `status` came from UnsupportedModelError (the marker survives
// copies, not a rebuilt status).
bool IsUnsupportedModel(const absl::Status& status);

enum class RopeType { kDefault, kLinear, kDynamic, kYarn, kLlama3, kLongRope };
std::string_view RopeTypeName(RopeType t);  // the HF spelling: "yarn", ...

// Which keys the rope settings were read from.
enum class RopeForm {
  kLegacy,          // top-level `rope_theta` + `rope_scaling`
  kRopeParameters,  // transformers v5 `rope_parameters` dict
  kNone,            // the file has no RoPE key: the family's defaults
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
  bool truncate = true;                      // yarn: floor/ceil the correction range (transformers 5)
  double mscale = 0.0;                       // yarn (deepseek); 0 when not given
  double mscale_all_dim = 0.0;               // yarn (deepseek); 0 when not given
  double attention_factor = 0.0;             // yarn, longrope; 0 when not given
  std::vector<double> short_factor;          // longrope
  std::vector<double> long_factor;           // longrope
  double partial_rotary_factor = 1.0;        // fraction of head_dim rotated
  RopeForm form = RopeForm::kNone;
  // The dict named its type with the old "type" key (deepseek_v3 does)
  // instead of "rope_type".
  bool legacy_type_key = false;
  // Legacy form: `rope_scaling` was an object (not null or absent). Such a
  // rope_scaling wins over rope_parameters, as in transformers 5.
  bool scaling_object = false;

  bool operator==(const RopeConfig&) const = default;
};

enum class QuantMethod {
  kNone,
  kFp8Block,   // quant_method "fp8" with weight_block_size (DeepSeek-V3, Qwen3-FP8), or
               // ModelOpt "fp8_pb_wo" (2-D 128x128 blocks, weight-only)
  kNvfp4,      // ModelOpt NVFP4 / W4A16_NVFP4: e2m1 values, e4m3 scale per 16, fp32 global scale
  kMxfp4,      // quant_method "mxfp4": e2m1 values, e8m0 scale per 32
  kFp8Tensor,  // ModelOpt FP8: e4m3 weight, one fp32 weight_scale and input_scale per tensor
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
  // ModelOpt's name: "NVFP4", "W4A16_NVFP4", "FP8", "fp8_pb_wo"; empty otherwise.
  std::string quant_algo;
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
  // ModelOpt's weight-only formats (W4A16_NVFP4, fp8_pb_wo): no input_scale,
  // activations stay unquantized.
  bool WeightOnly() const { return quant_algo == "W4A16_NVFP4" || quant_algo == "fp8_pb_wo"; }

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
  bool mlp_bias = false;            // llama: gate/up/down have biases
  bool qk_norm = false;             // RMSNorm on q and k per head (qwen3, glm4_moe opt-in)
  std::string hidden_act = "silu";
  int64_t sliding_window = 0;       // 0: full attention
  std::vector<int64_t> bos_token_id;  // the JSON int or list; empty if null
  std::vector<int64_t> eos_token_id;
  std::string torch_dtype;          // "bfloat16"; also read from `dtype`
  // RoPE as transformers 5 reads the file: rope_scaling (not null) if present,
  // else rope_parameters, else rope_theta, else the family's defaults.
  RopeConfig rope;
  // Each form as the file states it on its own (absent when the file lacks
  // it): what an engine that reads only those keys sees.
  std::optional<RopeConfig> rope_parameters;  // `rope_parameters`
  std::optional<RopeConfig> rope_legacy;      // `rope_theta` and/or a non-null `rope_scaling`

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

  // Multi-head latent attention (deepseek_v3, deepseek_v32, glm_moe_dsa);
  // kv_lora_rank == 0: no MLA. head_dim is qk_nope_head_dim + qk_rope_head_dim.
  int64_t q_lora_rank = 0;  // 0: q is not low-rank compressed
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  // The rope part's pairs are (2i, 2i+1) (deepseek_v3's rope_interleave,
  // default true; always so in deepseek_v32 and glm_moe_dsa) or (i, i + d/2).
  bool rope_interleave = true;
  int64_t num_nextn_predict_layers = 0;  // MTP layers stored after the decoder layers
  // DeepSeek Sparse Attention's indexer (deepseek_v32, glm_moe_dsa);
  // index_topk == 0: dense attention.
  int64_t index_n_heads = 0;
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;
  // Per layer "full" (runs its indexer) or "shared" (reuses the last full
  // layer's top-k): glm_moe_dsa's indexer_types, or what its
  // index_topk_pattern / index_topk_freq / index_skip_topk_offset expand to.
  // Empty: every layer full.
  std::vector<std::string> indexer_types;
  // Per layer "dense" or "sparse" (MoE): deepseek_v32's and glm_moe_dsa's
  // mlp_layer_types; empty: first_k_dense_replace decides.
  std::vector<std::string> mlp_layer_types;

  // gpt_oss: per layer "sliding_attention" (attends the last sliding_window
  // positions) or "full_attention"; empty for the other families (every
  // layer sliding_window, when set). GptOssConfig's default alternates,
  // sliding first.
  std::vector<std::string> layer_types;
  // gpt_oss: one learned logit per head in the softmax's denominator
  // (self_attn.sinks), biases on the router and on every expert projection,
  // top-k over the router logits then a softmax over the k, and the
  // clamped SwiGLU: gate <= limit, |up| <= limit, (up + 1) * gate *
  // sigmoid(alpha * gate). swiglu_limit 0: the plain SiLU gate.
  bool attention_sinks = false;
  bool moe_bias = false;
  bool softmax_after_topk = false;
  double swiglu_alpha = 0.0;
  double swiglu_limit = 0.0;

  QuantConfig quant;

  bool IsMoe() const { return num_experts > 0; }
  bool UsesMla() const { return kv_lora_rank > 0; }
  bool UsesDsa() const { return UsesMla() && index_topk > 0; }
  // Whether decoder layer `layer` runs its own DSA indexer.
  bool IsIndexerLayer(int layer) const;
  // Whether decoder layer `layer` (0-based) has a routed-expert MLP.
  bool IsMoeLayer(int layer) const;
  // The attention window of decoder layer `layer` in positions (0: the
  // whole context): sliding_window, on gpt_oss's sliding_attention layers only.
  int64_t LayerWindow(int layer) const;

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
