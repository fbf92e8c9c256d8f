// HfConfigToJson: ModelConfig -> config.json, in the family's own key names.
#include <nlohmann/json.hpp>

#include "crashreplay/formats/hf_config.h"
#include "hf_family.h"

namespace crashreplay {
namespace {

using nlohmann::json;

json TokenIds(const std::vector<int64_t>& ids) {
  if (ids.empty()) return nullptr;
  if (ids.size() == 1) return ids[0];
  return ids;
}

json OrNull(int64_t v) { return v > 0 ? json(v) : json(nullptr); }

// The keys of `r`'s dict (rope_scaling or rope_parameters) that its type
// needs or that differ from the defaults.
void WriteScaling(const RopeConfig& r, json* out) {
  const RopeConfig d;
  const bool needs_factor = r.type == RopeType::kLinear || r.type == RopeType::kDynamic || r.type == RopeType::kYarn ||
                            r.type == RopeType::kLlama3;
  if (needs_factor || r.factor != d.factor) (*out)["factor"] = r.factor;
  if (r.original_max_position_embeddings > 0) {
    (*out)["original_max_position_embeddings"] = r.original_max_position_embeddings;
  }
  if (r.type == RopeType::kLlama3 || r.low_freq_factor != d.low_freq_factor) {
    (*out)["low_freq_factor"] = r.low_freq_factor;
  }
  if (r.type == RopeType::kLlama3 || r.high_freq_factor != d.high_freq_factor) {
    (*out)["high_freq_factor"] = r.high_freq_factor;
  }
  if (r.type == RopeType::kYarn || r.beta_fast != d.beta_fast) (*out)["beta_fast"] = r.beta_fast;
  if (r.type == RopeType::kYarn || r.beta_slow != d.beta_slow) (*out)["beta_slow"] = r.beta_slow;
  if (!r.truncate) (*out)["truncate"] = false;
  if (r.mscale != 0) (*out)["mscale"] = r.mscale;
  if (r.mscale_all_dim != 0) (*out)["mscale_all_dim"] = r.mscale_all_dim;
  if (r.attention_factor != 0) (*out)["attention_factor"] = r.attention_factor;
  if (r.type == RopeType::kLongRope || !r.short_factor.empty()) {
    (*out)["short_factor"] = r.short_factor;
  }
  if (r.type == RopeType::kLongRope || !r.long_factor.empty()) {
    (*out)["long_factor"] = r.long_factor;
  }
}

// Writes each RoPE form the config has, so that reading it back gives the
// same forms and the same resolution. A dict's rope_theta is always written
// (a dict without it would take the top-level one); partial_rotary_factor is
// written where it differs from what a reader would fall back to.
void WriteRope(const ModelConfig& c, double family_partial, json* j) {
  const bool top_partial = (c.rope_legacy && c.rope_legacy->partial_rotary_factor != family_partial) ||
                           (!c.rope_legacy && !c.rope_parameters && c.rope.partial_rotary_factor != family_partial);
  if (top_partial) {
    (*j)["partial_rotary_factor"] = c.rope_legacy ? c.rope_legacy->partial_rotary_factor : c.rope.partial_rotary_factor;
  }
  if (c.rope_parameters) {
    const RopeConfig& r = *c.rope_parameters;
    json p = json::object();
    p[r.legacy_type_key ? "type" : "rope_type"] = std::string(RopeTypeName(r.type));
    p["rope_theta"] = r.theta;
    WriteScaling(r, &p);
    if (r.partial_rotary_factor != family_partial || top_partial) {
      p["partial_rotary_factor"] = r.partial_rotary_factor;
    }
    (*j)["rope_parameters"] = p;
  }
  if (c.rope_legacy) {
    const RopeConfig& r = *c.rope_legacy;
    (*j)["rope_theta"] = r.theta;
    if (!r.scaling_object) {
      (*j)["rope_scaling"] = nullptr;
      return;
    }
    json s = json::object();
    s[r.legacy_type_key ? "type" : "rope_type"] = std::string(RopeTypeName(r.type));
    WriteScaling(r, &s);
    (*j)["rope_scaling"] = s;
  }
}

json ProducerJson(const std::string& producer) {
  const size_t space = producer.find(' ');
  json p = {{"name", producer.substr(0, space)}};
  if (space != std::string::npos) p["version"] = producer.substr(space + 1);
  return p;
}

json QuantJson(const QuantConfig& q) {
  json out = json::object();
  if (!q.quant_algo.empty()) {  // ModelOpt's config.json form
    out["quant_method"] = "modelopt";
    out["quant_algo"] = q.quant_algo;
    if (q.method == QuantMethod::kNvfp4) out["group_size"] = q.group_size;
    if (!q.kv_cache_quant_algo.empty()) out["kv_cache_quant_algo"] = q.kv_cache_quant_algo;
    out["ignore"] = q.ignore;
    if (!q.producer.empty()) out["producer"] = ProducerJson(q.producer);
    return out;
  }
  switch (q.method) {
    case QuantMethod::kNone: return nullptr;
    case QuantMethod::kFp8Block:
      out["quant_method"] = "fp8";
      out["fmt"] = q.fmt;
      out["activation_scheme"] = q.activation_scheme;
      out["weight_block_size"] = q.weight_block_size;
      if (!q.ignore.empty()) out["modules_to_not_convert"] = q.ignore;
      return out;
    case QuantMethod::kNvfp4:
    case QuantMethod::kFp8Tensor:  // only ModelOpt writes these (quant_algo set above)
      out["quant_method"] = "modelopt";
      out["quant_algo"] = q.method == QuantMethod::kNvfp4 ? "NVFP4" : "FP8";
      if (q.method == QuantMethod::kNvfp4) out["group_size"] = q.group_size;
      out["ignore"] = q.ignore;
      return out;
    case QuantMethod::kMxfp4:
      out["quant_method"] = "mxfp4";
      if (!q.ignore.empty()) out["modules_to_not_convert"] = q.ignore;
      return out;
  }
  return nullptr;
}

void WriteQwenMoe(const ModelConfig& c, const char* experts_key, json* j) {
  (*j)[experts_key] = c.num_experts;
  (*j)["num_experts_per_tok"] = c.num_experts_per_tok;
  (*j)["moe_intermediate_size"] = c.moe_intermediate_size;
  (*j)["norm_topk_prob"] = c.norm_topk_prob;
  (*j)["decoder_sparse_step"] = c.decoder_sparse_step;
  (*j)["mlp_only_layers"] = c.mlp_only_layers;
}

void WriteDeepseekMoe(const ModelConfig& c, bool always_routing_keys, json* j) {
  (*j)["n_routed_experts"] = c.num_experts;
  (*j)["num_experts_per_tok"] = c.num_experts_per_tok;
  (*j)["moe_intermediate_size"] = c.moe_intermediate_size;
  (*j)["n_shared_experts"] = c.n_shared_experts;
  (*j)["n_group"] = c.n_group;
  (*j)["topk_group"] = c.topk_group;
  (*j)["norm_topk_prob"] = c.norm_topk_prob;
  (*j)["routed_scaling_factor"] = c.routed_scaling_factor;
  (*j)["first_k_dense_replace"] = c.first_k_dense_replace;
  (*j)["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  if (always_routing_keys || c.moe_layer_freq != 1) (*j)["moe_layer_freq"] = c.moe_layer_freq;
  // glm4_moe's transformers config has no such keys (it always routes this
  // way); write them only when they say something else.
  if (always_routing_keys || c.scoring_func != "sigmoid") (*j)["scoring_func"] = c.scoring_func;
  if (always_routing_keys || c.topk_method != "noaux_tc") (*j)["topk_method"] = c.topk_method;
}

void WriteSlidingWindow(const ModelConfig& c, bool with_use_flag, json* j) {
  if (with_use_flag) (*j)["use_sliding_window"] = c.sliding_window > 0;
  (*j)["sliding_window"] = OrNull(c.sliding_window);
}

}  // namespace

std::string HfConfigToJson(const ModelConfig& c) {
  json j = json::object();
  j["model_type"] = c.model_type;
  if (!c.architectures.empty()) j["architectures"] = c.architectures;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["hidden_act"] = c.hidden_act;
  j["bos_token_id"] = TokenIds(c.bos_token_id);
  j["eos_token_id"] = TokenIds(c.eos_token_id);
  if (!c.torch_dtype.empty()) j["torch_dtype"] = c.torch_dtype;

  const std::optional<HfFamily> family = HfFamilyOf(c.model_type);
  if (family && !IsMla(*family)) j["head_dim"] = c.head_dim;
  if (family) {
    switch (*family) {
      case HfFamily::kLlama:
        j["attention_bias"] = c.attention_bias;
        j["mlp_bias"] = c.mlp_bias;
        break;
      case HfFamily::kMistral: WriteSlidingWindow(c, false, &j); break;
      case HfFamily::kMixtral:
        WriteSlidingWindow(c, false, &j);
        j["num_local_experts"] = c.num_experts;
        j["num_experts_per_tok"] = c.num_experts_per_tok;
        break;
      case HfFamily::kQwen2: WriteSlidingWindow(c, true, &j); break;
      case HfFamily::kQwen2Moe:
        j["qkv_bias"] = c.attention_bias;
        WriteSlidingWindow(c, true, &j);
        WriteQwenMoe(c, "num_experts", &j);
        j["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
        break;
      case HfFamily::kQwen3:
      case HfFamily::kQwen3Moe:
        j["attention_bias"] = c.attention_bias;
        WriteSlidingWindow(c, true, &j);
        // transformers 5 writes num_local_experts (Qwen3MoeConfig's attribute_map).
        if (*family == HfFamily::kQwen3Moe) WriteQwenMoe(c, "num_local_experts", &j);
        break;
      case HfFamily::kDeepseekV3:
      case HfFamily::kDeepseekV32:
      case HfFamily::kGlmMoeDsa:
        j["attention_bias"] = c.attention_bias;
        j["q_lora_rank"] = OrNull(c.q_lora_rank);
        j["kv_lora_rank"] = c.kv_lora_rank;
        j["qk_nope_head_dim"] = c.qk_nope_head_dim;
        j["qk_rope_head_dim"] = c.qk_rope_head_dim;
        j["v_head_dim"] = c.v_head_dim;
        WriteDeepseekMoe(c, /*always_routing_keys=*/*family == HfFamily::kDeepseekV3, &j);
        if (*family == HfFamily::kDeepseekV3) {
          j["rope_interleave"] = c.rope_interleave;
          break;
        }
        j["index_n_heads"] = c.index_n_heads;
        j["index_head_dim"] = c.index_head_dim;
        j["index_topk"] = c.index_topk;
        if (!c.mlp_layer_types.empty()) j["mlp_layer_types"] = c.mlp_layer_types;
        if (*family == HfFamily::kGlmMoeDsa && !c.indexer_types.empty()) j["indexer_types"] = c.indexer_types;
        break;
      case HfFamily::kGlm4Moe:
        j["attention_bias"] = c.attention_bias;
        j["use_qk_norm"] = c.qk_norm;
        WriteDeepseekMoe(c, /*always_routing_keys=*/false, &j);
        break;
      case HfFamily::kGptOss:
        j["attention_bias"] = c.attention_bias;
        j["sliding_window"] = OrNull(c.sliding_window);
        j["layer_types"] = c.layer_types;
        j["num_local_experts"] = c.num_experts;
        j["num_experts_per_tok"] = c.num_experts_per_tok;
        j["swiglu_alpha"] = c.swiglu_alpha;
        j["swiglu_limit"] = c.swiglu_limit;
        break;
    }
  }
  const HfFamilyInfo* info = FindFamily(c.model_type);
  WriteRope(c, info ? info->partial_rotary_factor : 1.0, &j);
  if (c.quant.method != QuantMethod::kNone) j["quantization_config"] = QuantJson(c.quant);
  // Strings from a caller may hold invalid UTF-8; replace rather than throw.
  return j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

}  // namespace crashreplay
