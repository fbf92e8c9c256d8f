#include "crashreplay/replay/model/checkpoint_io.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "crashreplay/base/status.h"
#include "crashreplay/base/text.h"
#include "crashreplay/formats/checkpoint.h"
#include "crashreplay/formats/safetensors_writer.h"
#include "crashreplay/replay/kernels/router.h"
#include "crashreplay/replay/model/weight_check.h"

namespace crashreplay::replay {
namespace {

using text::Cat;

RopeSpec ToRopeSpec(const RopeConfig& r) {
  RopeSpec o;
  o.type = std::string(RopeTypeName(r.type));
  o.theta = r.theta;
  o.factor = r.factor;
  o.low_freq_factor = r.low_freq_factor;
  o.high_freq_factor = r.high_freq_factor;
  if (r.original_max_position_embeddings > 0) o.original_max_position = r.original_max_position_embeddings;
  o.beta_fast = r.beta_fast;
  o.beta_slow = r.beta_slow;
  o.mscale = r.mscale;
  o.mscale_all_dim = r.mscale_all_dim;
  o.attention_factor = r.attention_factor;
  o.truncate = r.truncate;
  return o;
}

RopeConfig ToRopeConfig(const RopeSpec& r, RopeForm form, double partial) {
  RopeConfig c;
  c.form = form;
  c.type = r.type == "linear"   ? RopeType::kLinear
           : r.type == "llama3" ? RopeType::kLlama3
           : r.type == "yarn"   ? RopeType::kYarn
                                : RopeType::kDefault;
  c.theta = r.theta;
  c.factor = r.factor;
  c.low_freq_factor = r.low_freq_factor;
  c.high_freq_factor = r.high_freq_factor;
  c.original_max_position_embeddings = r.type == "default" || r.type == "linear" ? 0 : r.original_max_position;
  c.beta_fast = r.beta_fast;
  c.beta_slow = r.beta_slow;
  c.mscale = r.mscale;
  c.mscale_all_dim = r.mscale_all_dim;
  c.attention_factor = r.attention_factor;
  c.truncate = r.truncate;
  c.partial_rotary_factor = partial;
  c.scaling_object = form == RopeForm::kLegacy && c.type != RopeType::kDefault;
  return c;
}

absl::Status CheckRopeImplemented(const ModelConfig& c) {
  for (const RopeConfig* r :
       {&c.rope, c.rope_parameters ? &*c.rope_parameters : nullptr, c.rope_legacy ? &*c.rope_legacy : nullptr}) {
    if (r == nullptr) continue;
    if (r->type != RopeType::kDefault && r->type != RopeType::kLinear && r->type != RopeType::kLlama3 &&
        r->type != RopeType::kYarn) {
      return UnsupportedModelError(Cat(c.source, ": RoPE type '", RopeTypeName(r->type),
                                       "' is not implemented (default, linear, llama3, yarn)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelSpec> ModelSpecFromHfConfig(const ModelConfig& c) {
  ModelSpec s;
  s.model_type = c.model_type;
  if (c.shared_expert_intermediate_size > 0) {
    return UnsupportedModelError(Cat(c.source, ": qwen2_moe's gated shared expert (shared_expert_intermediate_size ",
                                     c.shared_expert_intermediate_size, ") is not implemented"));
  }
  if (c.hidden_act != "silu") {
    return UnsupportedModelError(Cat(c.source, ": hidden_act '", c.hidden_act, "' is not implemented (silu)"));
  }
  CR_RETURN_IF_ERROR(CheckRopeImplemented(c));
  s.hidden = c.hidden_size;
  s.layers = c.num_hidden_layers;
  s.heads = c.num_attention_heads;
  s.kv_heads = c.num_key_value_heads;
  s.head_dim = c.head_dim;
  s.intermediate = c.intermediate_size;
  s.vocab = c.vocab_size;
  s.rms_eps = c.rms_norm_eps;
  s.qk_norm = c.qk_norm;
  s.attention_bias = c.attention_bias;
  s.attention_out_bias = c.attention_out_bias;
  s.mlp_bias = c.mlp_bias;
  s.tie_embeddings = c.tie_word_embeddings;
  s.sliding_window = c.sliding_window;
  s.partial_rotary_factor = c.rope.partial_rotary_factor;
  if (c.max_position_embeddings > 0) s.max_position = c.max_position_embeddings;
  if (c.rope_parameters) s.rope_parameters = ToRopeSpec(*c.rope_parameters);
  if (c.rope_legacy) {
    s.rope_legacy = ToRopeSpec(*c.rope_legacy);
    s.rope_scaling_wins = c.rope_legacy->scaling_object;
  }
  if (!c.rope_parameters && !c.rope_legacy) s.rope_legacy = ToRopeSpec(c.rope);  // no RoPE key: the defaults
  if (c.UsesMla()) {
    if (c.attention_bias) {
      return UnsupportedModelError(Cat(c.source, ": ", c.model_type,
                                       " with attention_bias true (biases on MLA's q_a/kv_a/o projections) is not "
                                       "implemented; released DeepSeek and GLM MLA models have none"));
    }
    MlaSpec& m = s.mla;
    m.q_lora_rank = c.q_lora_rank;
    m.kv_lora_rank = c.kv_lora_rank;
    m.qk_nope_head_dim = c.qk_nope_head_dim;
    m.qk_rope_head_dim = c.qk_rope_head_dim;
    m.v_head_dim = c.v_head_dim;
    m.rope_interleave = c.rope_interleave;
    // Every head reads the one shared latent; transformers' head_dim is the
    // rope part, which is what RoPE's frequencies are computed over.
    s.kv_heads = s.heads;
    s.head_dim = c.qk_rope_head_dim;
    if (c.UsesDsa()) {
      m.index_n_heads = c.index_n_heads;
      m.index_head_dim = c.index_head_dim;
      m.index_topk = c.index_topk;
      // DeepSeek-V3.2's indexer rotates half-split, GLM-5's interleaved
      // (transformers' DeepseekV32Indexer / GlmMoeDsaIndexer).
      m.index_rope_interleave = c.model_type == "glm_moe_dsa";
      if (!c.indexer_types.empty()) {
        for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
          m.index_full_layers.push_back(c.IsIndexerLayer(static_cast<int>(l)) ? 1 : 0);
        }
      }
    }
  }
  if (c.IsMoe()) {
    s.num_experts = c.num_experts;
    s.experts_per_tok = c.num_experts_per_tok;
    s.moe_intermediate = c.model_type == "mixtral" ? c.intermediate_size : c.moe_intermediate_size;
    s.n_shared_experts = c.n_shared_experts;
    s.scoring = c.scoring_func;
    s.n_group = c.n_group;
    s.topk_group = c.topk_group;
    s.routed_scaling_factor = c.routed_scaling_factor;
    // Mixtral's router always renormalises over the chosen k.
    s.norm_topk_prob = c.model_type == "mixtral" ? true : c.norm_topk_prob;
    s.first_k_dense = c.first_k_dense_replace;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) s.moe_layer_mask.push_back(c.IsMoeLayer(static_cast<int>(l)));
    if (s.experts_per_tok > kMaxTopK || s.num_experts > kMaxExperts || s.n_group > 4 * kMaxTopK) {
      return UnsupportedModelError(Cat(c.source, ": MoE routing beyond the kernels' limits (top-k <= ", kMaxTopK,
                                       ", experts <= ", kMaxExperts, ")"));
    }
  }
  s.quant_weight_only = c.quant.WeightOnly();
  switch (c.quant.method) {
    case QuantMethod::kNone: s.quant = QuantKind::kNone; break;
    case QuantMethod::kFp8Block:
      s.quant = QuantKind::kFp8Block;
      s.quant_block_rows = c.quant.weight_block_size.size() == 2 ? c.quant.weight_block_size[0] : 128;
      s.quant_block_cols = c.quant.weight_block_size.size() == 2 ? c.quant.weight_block_size[1] : 128;
      break;
    case QuantMethod::kFp8Tensor: s.quant = QuantKind::kFp8Tensor; break;
    case QuantMethod::kNvfp4:
      s.quant = QuantKind::kNvfp4;
      s.quant_block_cols = c.quant.group_size > 0 ? c.quant.group_size : 16;
      break;
    case QuantMethod::kMxfp4:
      s.quant = QuantKind::kMxfp4;
      s.quant_block_cols = 32;
      break;
  }
  return s;
}

ModelConfig HfConfigFromModelSpec(const ModelSpec& s) {
  ModelConfig c;
  c.model_type = s.model_type;
  static const std::map<std::string, std::string> kArch = {{"llama", "LlamaForCausalLM"},
                                                           {"mistral", "MistralForCausalLM"},
                                                           {"qwen2", "Qwen2ForCausalLM"},
                                                           {"qwen3", "Qwen3ForCausalLM"},
                                                           {"mixtral", "MixtralForCausalLM"},
                                                           {"qwen3_moe", "Qwen3MoeForCausalLM"},
                                                           {"glm4_moe", "Glm4MoeForCausalLM"},
                                                           {"deepseek_v3", "DeepseekV3ForCausalLM"},
                                                           {"deepseek_v32", "DeepseekV32ForCausalLM"},
                                                           {"glm_moe_dsa", "GlmMoeDsaForCausalLM"}};
  if (kArch.count(s.model_type)) c.architectures = {kArch.at(s.model_type)};
  c.hidden_size = s.hidden;
  c.intermediate_size = s.intermediate;
  c.num_hidden_layers = s.layers;
  c.num_attention_heads = s.heads;
  c.num_key_value_heads = s.kv_heads;
  c.head_dim = s.head_dim;
  c.vocab_size = s.vocab;
  c.max_position_embeddings = s.max_position;
  c.rms_norm_eps = s.rms_eps;
  c.tie_word_embeddings = s.tie_embeddings;
  c.attention_bias = s.attention_bias;
  c.attention_out_bias = s.attention_out_bias;
  c.mlp_bias = s.mlp_bias;
  c.qk_norm = s.qk_norm;
  c.sliding_window = s.sliding_window;
  c.torch_dtype = "bfloat16";
  if (s.mla.enabled()) {
    const MlaSpec& m = s.mla;
    c.q_lora_rank = m.q_lora_rank;
    c.kv_lora_rank = m.kv_lora_rank;
    c.qk_nope_head_dim = m.qk_nope_head_dim;
    c.qk_rope_head_dim = m.qk_rope_head_dim;
    c.v_head_dim = m.v_head_dim;
    c.rope_interleave = m.rope_interleave;
    c.head_dim = m.qk_head_dim();
    if (m.dsa()) {
      c.index_n_heads = m.index_n_heads;
      c.index_head_dim = m.index_head_dim;
      c.index_topk = m.index_topk;
      for (uint8_t full : m.index_full_layers) c.indexer_types.push_back(full ? "full" : "shared");
    }
  }
  if (s.rope_parameters)
    c.rope_parameters = ToRopeConfig(*s.rope_parameters, RopeForm::kRopeParameters, s.partial_rotary_factor);
  if (s.rope_legacy) {
    c.rope_legacy = ToRopeConfig(*s.rope_legacy, RopeForm::kLegacy, s.partial_rotary_factor);
    c.rope_legacy->scaling_object = c.rope_legacy->scaling_object || s.rope_scaling_wins;
  }
  c.rope = c.rope_legacy && (c.rope_legacy->scaling_object || !c.rope_parameters) ? *c.rope_legacy
           : c.rope_parameters                                                    ? *c.rope_parameters
                               : ToRopeConfig(RopeSpec{}, RopeForm::kNone, s.partial_rotary_factor);
  if (s.is_moe()) {
    c.num_experts = s.num_experts;
    c.num_experts_per_tok = s.experts_per_tok;
    c.moe_intermediate_size = s.model_type == "mixtral" ? 0 : s.moe_intermediate;
    c.n_shared_experts = s.n_shared_experts;
    c.norm_topk_prob = s.norm_topk_prob;
    c.scoring_func = s.scoring;
    c.topk_method = s.scoring == "sigmoid" ? "noaux_tc" : "greedy";
    c.n_group = s.n_group;
    c.topk_group = s.topk_group;
    c.routed_scaling_factor = s.routed_scaling_factor;
    c.first_k_dense_replace = s.first_k_dense;
  }
  switch (s.quant) {
    case QuantKind::kNone: break;
    case QuantKind::kFp8Block:
      c.quant.method = QuantMethod::kFp8Block;
      c.quant.weight_block_size = {s.quant_block_rows, s.quant_block_cols};
      c.quant.fmt = "e4m3";
      c.quant.activation_scheme = "dynamic";
      if (s.quant_weight_only) {
        c.quant.quant_algo = "fp8_pb_wo";
        c.quant.ignore = {"lm_head", "model.embed_tokens"};
      }
      break;
    case QuantKind::kFp8Tensor:
      c.quant.method = QuantMethod::kFp8Tensor;
      c.quant.quant_algo = "FP8";
      c.quant.fmt = "e4m3";
      c.quant.activation_scheme = "static";
      c.quant.ignore = {"lm_head", "model.embed_tokens"};
      break;
    case QuantKind::kNvfp4:
      c.quant.method = QuantMethod::kNvfp4;
      c.quant.quant_algo = s.quant_weight_only ? "W4A16_NVFP4" : "NVFP4";
      c.quant.group_size = s.quant_block_cols;
      c.quant.ignore = {"lm_head", "model.layers.*.mlp.gate"};
      break;
    case QuantKind::kMxfp4:
      c.quant.method = QuantMethod::kMxfp4;
      c.quant.group_size = 32;
      c.quant.ignore = {"lm_head", "model.layers.*.mlp.gate"};
      break;
  }
  if (!s.quant_ignore.empty()) c.quant.ignore = s.quant_ignore;
  return c;
}

namespace {

// A tensor of a deferred checkpoint: mapped on its own when read.
class MappedTensorSource final : public TensorSource {
 public:
  MappedTensorSource(std::shared_ptr<const Checkpoint> ck, std::string name)
      : ck_(std::move(ck)), name_(std::move(name)) {}
  absl::StatusOr<TensorBytes> Read() const override {
    CR_ASSIGN_OR_RETURN(std::shared_ptr<const TensorMapping> m, ck_->MapTensor(name_));
    const std::span<const std::byte> b = m->bytes();
    return TensorBytes::View({reinterpret_cast<const uint8_t*>(b.data()), b.size()}, std::move(m));
  }

 private:
  std::shared_ptr<const Checkpoint> ck_;
  std::string name_;
};

}  // namespace

absl::StatusOr<uint64_t> CheckpointFileBytes(const std::string& dir) {
  CR_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ck, Checkpoint::Open(dir, Checkpoint::Mode::kDeferred));
  return ck->file_bytes();
}

absl::StatusOr<LoadedCheckpoint> LoadCheckpointDir(const std::string& dir, LoadOptions options) {
  CR_ASSIGN_OR_RETURN(
      std::unique_ptr<Checkpoint> opened,
      Checkpoint::Open(dir, options.deferred ? Checkpoint::Mode::kDeferred : Checkpoint::Mode::kMapped));
  // The tensors view the mapped shards; the last of them to go unmaps them.
  const std::shared_ptr<const Checkpoint> ck = std::move(opened);
  if (ck->config_path().empty()) return absl::NotFoundError(Cat(dir, ": no config.json"));
  LoadedCheckpoint out;
  CR_ASSIGN_OR_RETURN(out.config, LoadHfConfig(ck->config_path()));
  CR_ASSIGN_OR_RETURN(out.spec, ModelSpecFromHfConfig(out.config));
  out.deferred = options.deferred;
  for (const std::string& name : ck->names()) {
    const CheckpointTensor* t = ck->Find(name);
    HostTensor h;
    h.dtype = t->info->dtype;
    h.shape = t->info->shape;
    if (options.deferred) {
      h.bytes = TensorBytes::Deferred(t->info->byte_size, std::make_shared<MappedTensorSource>(ck, name));
    } else {
      CR_ASSIGN_OR_RETURN(std::span<const std::byte> data, ck->Data(name));
      h.bytes = TensorBytes::View({reinterpret_cast<const uint8_t*>(data.data()), data.size()}, ck);
    }
    out.tensors.emplace(name, std::move(h));
  }
  CR_RETURN_IF_ERROR(CheckWeights(out.config, out.spec, dir, &out.tensors, &out.notes));
  if (out.spec.sliding_window > 0) {
    out.notes.push_back(Cat("config.json sets sliding_window ", out.spec.sliding_window,
                            "; the engine attends over the whole context, which is the same only while every "
                            "sequence stays within ",
                            out.spec.sliding_window, " tokens"));
  }
  if (out.spec.quant == QuantKind::kFp8Tensor) {
    out.notes.push_back(
        "ModelOpt FP8 (per-tensor): the engine multiplies by the fp8 weights with unquantized "
        "activations (W8A16); input_scale is read and hashed but not applied, whereas serving "
        "engines quantize activations to fp8 with it (W8A8)");
  }
  return out;
}

absl::Status WriteCheckpointDir(const std::string& dir, const ModelSpec& spec, const TensorSet& tensors,
                                uint64_t max_shard_bytes) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::FailedPreconditionError(Cat("cannot create ", dir, ": ", ec.message()));
  SafetensorsWriter w;
  w.SetMetadata("format", "pt");
  for (const auto& [name, t] : tensors) {
    CR_RETURN_IF_ERROR(
        w.Add(name, t.dtype, t.shape,
              std::span<const std::byte>(reinterpret_cast<const std::byte*>(t.bytes.data()), t.bytes.size())));
  }
  CR_RETURN_IF_ERROR(w.WriteSharded(dir, max_shard_bytes));
  return WriteFileAtomically(dir + "/config.json", HfConfigToJson(HfConfigFromModelSpec(spec)));
}

}  // namespace crashreplay::replay
