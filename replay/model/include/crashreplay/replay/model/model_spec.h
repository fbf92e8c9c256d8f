// The shape of a model as the engine needs it, and the host tensors of a
// checkpoint before sharding.
//
// ModelSpec is filled from a HF config.json (or by the random checkpoint
// generator). It keeps both RoPE descriptions a config may carry (the legacy
// rope_theta/rope_scaling keys and the newer rope_parameters object): by
// default the engine reads the file as transformers 5 does (FileRope), and
// the rope_config toggle can make it read one form only, as an engine that
// knows only those keys would.
// TensorSet holds named tensors in their HF names and layouts (row-major
// [out, in] weights, packed e2m1, block scales). Value types.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "crashreplay/formats/dtype.h"
#include "crashreplay/replay/model/mla_spec.h"
#include "crashreplay/replay/model/tensor_bytes.h"

namespace crashreplay::replay {

struct RopeSpec {
  std::string type = "default";  // default | linear | llama3 | yarn
  double theta = 10000.0;
  double factor = 1.0;
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  int64_t original_max_position = 8192;  // llama3, yarn
  double beta_fast = 32.0;        // yarn
  double beta_slow = 1.0;         // yarn
  double mscale = 0.0;            // yarn (DeepSeek form), 0: unset
  double mscale_all_dim = 0.0;
  double attention_factor = 0.0;  // yarn, 0: derived from factor
  bool truncate = true;           // yarn: floor/ceil the correction range

  bool operator==(const RopeSpec&) const = default;
};

// "llama3, theta 500000, factor 8, low/high freq 1/4, original 8192": the
// settings that matter for the type, for notes and messages.
std::string DescribeRope(const RopeSpec& rope);

// kFp8Tensor: ModelOpt FP8, one fp32 weight_scale (and input_scale) per tensor.
enum class QuantKind { kNone, kFp8Block, kNvfp4, kMxfp4, kFp8Tensor };

struct ModelSpec {
  std::string model_type;  // llama | mistral | qwen2 | qwen3 | mixtral | qwen3_moe | glm4_moe | deepseek_v3 |
                           // deepseek_v32 | glm_moe_dsa | gpt_oss
  int64_t hidden = 0;
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate = 0;
  int64_t vocab = 0;
  double rms_eps = 1e-6;
  bool qk_norm = false;
  bool attention_bias = false;      // q/k/v biases (o_proj and MLP biases: when the tensors are there)
  bool attention_out_bias = false;  // o_proj bias
  bool mlp_bias = false;            // gate/up/down biases (llama's mlp_bias)
  bool tie_embeddings = false;
  double partial_rotary_factor = 1.0;
  int64_t max_position = 4096;
  int64_t sliding_window = 0;       // 0: none; the engine attends over the full context
  // Per layer: the positions it attends (0: all), when the model windows
  // its attention (gpt_oss's sliding_attention layers); empty: every layer
  // attends the whole context (a sliding_window elsewhere is noted, not applied).
  std::vector<int64_t> layer_window;
  // gpt_oss: one learned logit per head (self_attn.sinks) joins every
  // softmax of the layer's attention.
  bool attention_sinks = false;
  int64_t window_of(int64_t layer) const {
    return layer >= 0 && layer < static_cast<int64_t>(layer_window.size()) ? layer_window[layer] : 0;
  }
  // What the file's rope_theta + rope_scaling and its rope_parameters say,
  // each on its own; absent when the file lacks those keys. A file with no
  // RoPE key at all has rope_legacy = the family's defaults.
  std::optional<RopeSpec> rope_legacy;
  std::optional<RopeSpec> rope_parameters;
  // The legacy keys include a rope_scaling object, which transformers 5
  // reads in preference to rope_parameters.
  bool rope_scaling_wins = false;
  // The RoPE the file states, resolved as transformers 5 does.
  RopeSpec FileRope() const {
    if (rope_legacy && (rope_scaling_wins || !rope_parameters)) return *rope_legacy;
    return rope_parameters.value_or(RopeSpec{});
  }
  // MoE (num_experts == 0: dense)
  int64_t num_experts = 0;
  int64_t experts_per_tok = 0;
  int64_t moe_intermediate = 0;
  int64_t n_shared_experts = 0;
  std::string scoring = "softmax";  // softmax | sigmoid
  int64_t n_group = 1;
  int64_t topk_group = 1;
  double routed_scaling_factor = 1.0;
  bool norm_topk_prob = true;
  // gpt_oss: the router has a bias and picks the top k logits, then
  // softmaxes over those k; every expert projection has a bias.
  bool softmax_after_topk = false;
  bool moe_bias = false;
  // gpt_oss's clamped SwiGLU (swiglu_limit > 0): gate <= limit, |up| <=
  // limit, (up + 1) * gate * sigmoid(alpha * gate); 0: silu(gate) * up.
  double swiglu_alpha = 0.0;
  double swiglu_limit = 0.0;
  int64_t first_k_dense = 0;
  // Per layer: 1 if it has routed experts. Empty: every layer from
  // first_k_dense on (what the random generator writes).
  std::vector<uint8_t> moe_layer_mask;
  // Quantization of the linear layers (embeddings, norms, router and lm_head
  // stay unquantized, as in ModelOpt and DeepSeek checkpoints).
  QuantKind quant = QuantKind::kNone;
  int64_t quant_block_rows = 1;  // fp8: 128
  int64_t quant_block_cols = 1;  // fp8: 128, nvfp4: 16, mxfp4: 32
  // Weight-only ModelOpt formats (W4A16_NVFP4, fp8_pb_wo): no input_scale;
  // NVFP4 layers never quantize their input, whatever nvfp4_activation says.
  bool quant_weight_only = false;
  // Modules the quantization leaves unquantized (the config's ignore /
  // exclude_modules globs, as formats/hf_config.h reads them); empty: the
  // writer's default list.
  std::vector<std::string> quant_ignore;
  // Multi-head latent attention and the DSA indexer (deepseek_v3,
  // deepseek_v32, glm_moe_dsa); mla.enabled() false for GQA models.
  MlaSpec mla;

  bool is_moe() const { return num_experts > 0; }
  bool layer_is_moe(int64_t layer) const {
    if (!is_moe()) return false;
    if (!moe_layer_mask.empty()) return layer < static_cast<int64_t>(moe_layer_mask.size()) && moe_layer_mask[layer];
    return layer >= first_k_dense;
  }
};

// A loaded checkpoint's tensors view the mapped files (see tensor_bytes.h);
// tensors made in memory own their bytes.
struct HostTensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  TensorBytes bytes;
};

using TensorSet = std::map<std::string, HostTensor>;

// HF tensor names of the linear layers, by architecture.
struct LayerNames {
  std::string prefix;       // "model.layers.3."
  std::string moe_prefix;   // "mlp." or "block_sparse_moe."
  std::string expert(int64_t j, const std::string& proj) const;  // proj: gate|up|down
  std::string shared(const std::string& proj) const;
  std::string router() const;
  std::string bias() const;
  std::string sinks() const;  // gpt_oss's self_attn.sinks
  std::string model_type;
};
LayerNames NamesFor(const ModelSpec& spec, int64_t layer);

}  // namespace crashreplay::replay
