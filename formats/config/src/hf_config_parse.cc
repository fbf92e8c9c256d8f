// ParseHfConfig: config.json -> ModelConfig. The rope and quantization
// parts live in hf_rope_parse.cc and hf_quant_config.cc.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "crashreplay/base/status.h"
#include "crashreplay/formats/hf_config.h"
#include "hf_config_internal.h"
#include "hf_family.h"
#include "json_fields.h"
#include "json_util.h"

namespace crashreplay {
namespace {

// Keys every family reads. Absent keys take transformers' defaults for the
// model_type (hf_family.h); a null num_key_value_heads or head_dim means
// "derive it", as the config classes' __post_init__ does.
absl::Status ParseCommon(const JsonFields& f, const HfFamilyInfo& fam, ModelConfig* c) {
  CR_RETURN_IF_ERROR(f.StringList("architectures", &c->architectures));
  c->vocab_size = fam.vocab_size;
  c->hidden_size = fam.hidden_size;
  c->intermediate_size = fam.intermediate_size;
  c->num_hidden_layers = fam.num_hidden_layers;
  c->num_attention_heads = fam.num_attention_heads;
  c->max_position_embeddings = fam.max_position_embeddings;
  c->rms_norm_eps = fam.rms_norm_eps;
  CR_RETURN_IF_ERROR(f.Int("vocab_size", &c->vocab_size));
  CR_RETURN_IF_ERROR(f.Int("hidden_size", &c->hidden_size));
  CR_RETURN_IF_ERROR(f.Int("intermediate_size", &c->intermediate_size));
  CR_RETURN_IF_ERROR(f.Int("num_hidden_layers", &c->num_hidden_layers));
  CR_RETURN_IF_ERROR(f.Int("num_attention_heads", &c->num_attention_heads));
  CR_RETURN_IF_ERROR(f.Int("max_position_embeddings", &c->max_position_embeddings));
  c->num_key_value_heads = fam.num_key_value_heads > 0 && !f.IsNull("num_key_value_heads") ? fam.num_key_value_heads
                                                                                           : c->num_attention_heads;
  CR_RETURN_IF_ERROR(f.Int("num_key_value_heads", &c->num_key_value_heads));
  CR_RETURN_IF_ERROR(f.Double("rms_norm_eps", &c->rms_norm_eps));
  CR_RETURN_IF_ERROR(f.Bool("tie_word_embeddings", &c->tie_word_embeddings));
  CR_RETURN_IF_ERROR(f.String("hidden_act", &c->hidden_act));
  if (fam.bos_token_id >= 0 && !f.IsNull("bos_token_id")) c->bos_token_id = {fam.bos_token_id};
  if (fam.eos_token_id >= 0 && !f.IsNull("eos_token_id")) c->eos_token_id = {fam.eos_token_id};
  CR_RETURN_IF_ERROR(f.IntOrIntList("bos_token_id", &c->bos_token_id));
  CR_RETURN_IF_ERROR(f.IntOrIntList("eos_token_id", &c->eos_token_id));
  // transformers 5 renamed torch_dtype to dtype.
  CR_RETURN_IF_ERROR(f.String("torch_dtype", &c->torch_dtype));
  if (c->torch_dtype.empty()) CR_RETURN_IF_ERROR(f.String("dtype", &c->torch_dtype));

  if (IsMla(fam.family)) return absl::OkStatus();  // head_dim comes from MLA
  if (f.Has("head_dim")) {
    CR_RETURN_IF_ERROR(f.Int("head_dim", &c->head_dim));
  } else if (fam.head_dim > 0 && !f.IsNull("head_dim")) {
    c->head_dim = fam.head_dim;  // qwen3: 128
  } else {
    if (c->num_attention_heads <= 0 || c->hidden_size % c->num_attention_heads != 0) {
      return f.Invalid("head_dim", absl::StrCat("is absent and hidden_size (", c->hidden_size,
                                                ") is not a multiple of num_attention_heads (", c->num_attention_heads,
                                                "); set head_dim explicitly"));
    }
    c->head_dim = c->hidden_size / c->num_attention_heads;
  }
  return absl::OkStatus();
}

// `default_window`: the class's sliding_window default (0: None). Qwen
// families apply it only under use_sliding_window.
absl::Status ParseSlidingWindow(const JsonFields& f, bool gated_by_use_flag, int64_t default_window, ModelConfig* c) {
  if (gated_by_use_flag) {
    bool use = false;
    CR_RETURN_IF_ERROR(f.Bool("use_sliding_window", &use));
    if (!use) return absl::OkStatus();
  }
  if (!f.IsNull("sliding_window")) c->sliding_window = default_window;
  return f.Int("sliding_window", &c->sliding_window);
}

// Qwen MoE keys; the defaults differ between qwen2_moe and qwen3_moe.
struct QwenMoeDefaults {
  int64_t experts, per_tok, moe_intermediate;
};

absl::Status ParseQwenMoe(const JsonFields& f, bool local_experts_alias, const QwenMoeDefaults& d, ModelConfig* c) {
  c->num_experts = d.experts;
  c->num_experts_per_tok = d.per_tok;
  c->moe_intermediate_size = d.moe_intermediate;
  // Qwen3MoeConfig (transformers 5) maps num_experts to num_local_experts and
  // writes the latter; 4.x wrote num_experts. Qwen2MoeConfig has no alias.
  if (local_experts_alias) {
    CR_RETURN_IF_ERROR(f.IntAlias({"num_experts", "num_local_experts"}, &c->num_experts));
  } else {
    CR_RETURN_IF_ERROR(f.Int("num_experts", &c->num_experts));
  }
  CR_RETURN_IF_ERROR(f.Int("num_experts_per_tok", &c->num_experts_per_tok));
  CR_RETURN_IF_ERROR(f.Int("moe_intermediate_size", &c->moe_intermediate_size));
  CR_RETURN_IF_ERROR(f.Bool("norm_topk_prob", &c->norm_topk_prob));
  CR_RETURN_IF_ERROR(f.Int("decoder_sparse_step", &c->decoder_sparse_step));
  CR_RETURN_IF_ERROR(f.IntList("mlp_only_layers", &c->mlp_only_layers));
  return absl::OkStatus();
}

// DeepSeek-style MoE keys, over the family's defaults already in `c`. Both
// DeepseekV3Config and Glm4MoeConfig (transformers 5) alias
// num_local_experts -> n_routed_experts and num_mtp_layers ->
// num_nextn_predict_layers (`mtp_alias`); DeepseekV32Config and
// GlmMoeDsaConfig alias num_local_experts, take num_experts too (their
// __post_init__), and have no num_mtp_layers.
absl::Status ParseDeepseekMoe(const JsonFields& f, bool mtp_alias, ModelConfig* c) {
  CR_RETURN_IF_ERROR(mtp_alias ? f.IntAlias({"n_routed_experts", "num_local_experts"}, &c->num_experts)
                               : f.IntAlias({"n_routed_experts", "num_local_experts", "num_experts"}, &c->num_experts));
  CR_RETURN_IF_ERROR(f.Int("num_experts_per_tok", &c->num_experts_per_tok));
  CR_RETURN_IF_ERROR(f.Int("moe_intermediate_size", &c->moe_intermediate_size));
  CR_RETURN_IF_ERROR(f.Int("n_shared_experts", &c->n_shared_experts));
  CR_RETURN_IF_ERROR(f.String("scoring_func", &c->scoring_func));
  CR_RETURN_IF_ERROR(f.String("topk_method", &c->topk_method));
  CR_RETURN_IF_ERROR(f.Int("n_group", &c->n_group));
  CR_RETURN_IF_ERROR(f.Int("topk_group", &c->topk_group));
  CR_RETURN_IF_ERROR(f.Bool("norm_topk_prob", &c->norm_topk_prob));
  CR_RETURN_IF_ERROR(f.Double("routed_scaling_factor", &c->routed_scaling_factor));
  CR_RETURN_IF_ERROR(f.Int("first_k_dense_replace", &c->first_k_dense_replace));
  CR_RETURN_IF_ERROR(f.Int("moe_layer_freq", &c->moe_layer_freq));
  if (mtp_alias) {
    return f.IntAlias({"num_nextn_predict_layers", "num_mtp_layers"}, &c->num_nextn_predict_layers);
  }
  return f.Int("num_nextn_predict_layers", &c->num_nextn_predict_layers);
}

// The defaults of one MLA config class.
struct MlaDefaults {
  int64_t experts, moe_intermediate, n_group, topk_group, first_k_dense;
  int64_t q_lora_rank, qk_nope_head_dim, v_head_dim;
  int64_t index_n_heads, index_head_dim, index_topk;  // 0: no indexer
};

// MLA keys (and the indexer's, for the DSA classes) over the class's
// defaults; every MLA class routes like DeepSeek-V3 (sigmoid scores with a
// correction bias, noaux_tc) without keys saying so.
absl::Status ParseMla(const JsonFields& f, const MlaDefaults& d, ModelConfig* c) {
  c->num_experts = d.experts;
  c->num_experts_per_tok = 8;
  c->moe_intermediate_size = d.moe_intermediate;
  c->n_shared_experts = 1;
  c->scoring_func = "sigmoid";
  c->topk_method = "noaux_tc";
  c->n_group = d.n_group;
  c->topk_group = d.topk_group;
  c->norm_topk_prob = true;
  c->routed_scaling_factor = 2.5;
  c->first_k_dense_replace = d.first_k_dense;
  c->q_lora_rank = d.q_lora_rank;
  c->kv_lora_rank = 512;
  c->qk_nope_head_dim = d.qk_nope_head_dim;
  c->qk_rope_head_dim = 64;
  c->v_head_dim = d.v_head_dim;
  CR_RETURN_IF_ERROR(f.Bool("attention_bias", &c->attention_bias));
  c->attention_out_bias = c->attention_bias;
  if (f.IsNull("q_lora_rank")) c->q_lora_rank = 0;  // null: q is not compressed
  CR_RETURN_IF_ERROR(f.Int("q_lora_rank", &c->q_lora_rank));
  CR_RETURN_IF_ERROR(f.Int("kv_lora_rank", &c->kv_lora_rank));
  CR_RETURN_IF_ERROR(f.Int("qk_nope_head_dim", &c->qk_nope_head_dim));
  CR_RETURN_IF_ERROR(f.Int("qk_rope_head_dim", &c->qk_rope_head_dim));
  CR_RETURN_IF_ERROR(f.Int("v_head_dim", &c->v_head_dim));
  c->head_dim = c->qk_nope_head_dim + c->qk_rope_head_dim;
  if (d.index_topk == 0) return absl::OkStatus();
  c->index_n_heads = d.index_n_heads;
  c->index_head_dim = d.index_head_dim;
  c->index_topk = d.index_topk;
  CR_RETURN_IF_ERROR(f.Int("index_n_heads", &c->index_n_heads));
  CR_RETURN_IF_ERROR(f.Int("index_head_dim", &c->index_head_dim));
  return f.Int("index_topk", &c->index_topk);
}

// glm_moe_dsa's indexer_types, or (as GlmMoeDsaConfig.__post_init__ derives
// it) index_topk_pattern ("FSS..." or a list), or index_topk_freq (default
// 1) with index_skip_topk_offset (default 2): layer i is full when
// max(i - offset + 1, 0) % freq == 0.
absl::Status ParseIndexerTypes(const JsonFields& f, ModelConfig* c) {
  if (f.Has("indexer_types") && !f.IsNull("indexer_types")) return f.StringList("indexer_types", &c->indexer_types);
  if (f.Has("index_topk_pattern") && !f.IsNull("index_topk_pattern")) {
    if (f.Get("index_topk_pattern")->is_string()) {
      std::string pattern;
      CR_RETURN_IF_ERROR(f.String("index_topk_pattern", &pattern));
      for (char ch : pattern) {
        if (ch != 'F' && ch != 'S') {
          return f.Invalid("index_topk_pattern", absl::StrCat("has '", std::string(1, ch), "'; expected F or S"));
        }
        c->indexer_types.push_back(ch == 'F' ? "full" : "shared");
      }
      return absl::OkStatus();
    }
    return f.StringList("index_topk_pattern", &c->indexer_types);
  }
  int64_t freq = 1, offset = 2;
  CR_RETURN_IF_ERROR(f.Int("index_topk_freq", &freq));
  CR_RETURN_IF_ERROR(f.Int("index_skip_topk_offset", &offset));
  freq = std::max<int64_t>(freq, 1);
  for (int64_t i = 0; i < c->num_hidden_layers; ++i) {
    c->indexer_types.push_back(std::max<int64_t>(i - offset + 1, 0) % freq == 0 ? "full" : "shared");
  }
  return absl::OkStatus();
}

// GptOssConfig's keys (transformers 5; the 4.x class has the same defaults):
// q/k/v/o biases, sliding_window 128 on the layers layer_types marks
// sliding (default: every other layer, from layer 0), 128 experts of
// intermediate_size, top-4, the clamped SwiGLU's alpha and limit.
absl::Status ParseGptOss(const JsonFields& f, ModelConfig* c) {
  c->attention_bias = true;
  CR_RETURN_IF_ERROR(f.Bool("attention_bias", &c->attention_bias));
  c->attention_out_bias = c->attention_bias;
  CR_RETURN_IF_ERROR(ParseSlidingWindow(f, /*gated_by_use_flag=*/false, /*default_window=*/128, c));
  c->num_experts = 128;
  c->num_experts_per_tok = 4;
  CR_RETURN_IF_ERROR(f.IntAlias({"num_local_experts", "num_experts"}, &c->num_experts));
  CR_RETURN_IF_ERROR(f.Int("num_experts_per_tok", &c->num_experts_per_tok));
  c->moe_intermediate_size = c->intermediate_size;  // every expert is intermediate_size wide
  c->norm_topk_prob = true;
  c->attention_sinks = true;
  c->moe_bias = true;
  c->softmax_after_topk = true;
  c->swiglu_alpha = 1.702;
  c->swiglu_limit = 7.0;
  CR_RETURN_IF_ERROR(f.Double("swiglu_alpha", &c->swiglu_alpha));
  CR_RETURN_IF_ERROR(f.Double("swiglu_limit", &c->swiglu_limit));
  if (f.Has("layer_types") && !f.IsNull("layer_types")) return f.StringList("layer_types", &c->layer_types);
  for (int64_t i = 0; i < c->num_hidden_layers; ++i) {
    c->layer_types.push_back((i + 1) % 2 != 0 ? "sliding_attention" : "full_attention");
  }
  return absl::OkStatus();
}

// The family's own keys, with transformers' class defaults for absent ones.
absl::Status ParseFamily(const JsonFields& f, HfFamily family, ModelConfig* c) {
  switch (family) {
    case HfFamily::kLlama:
      CR_RETURN_IF_ERROR(f.Bool("attention_bias", &c->attention_bias));
      c->attention_out_bias = c->attention_bias;
      CR_RETURN_IF_ERROR(f.Bool("mlp_bias", &c->mlp_bias));
      return absl::OkStatus();
    case HfFamily::kMistral: return ParseSlidingWindow(f, /*gated_by_use_flag=*/false, /*default_window=*/4096, c);
    case HfFamily::kMixtral:
      CR_RETURN_IF_ERROR(ParseSlidingWindow(f, false, 0, c));
      c->num_experts = 8;
      c->num_experts_per_tok = 2;
      CR_RETURN_IF_ERROR(f.IntAlias({"num_local_experts", "num_experts"}, &c->num_experts));
      CR_RETURN_IF_ERROR(f.Int("num_experts_per_tok", &c->num_experts_per_tok));
      c->moe_intermediate_size = c->intermediate_size;  // experts are full-width MLPs
      c->norm_topk_prob = true;  // mixtral renormalises the top-k softmax weights
      return absl::OkStatus();
    case HfFamily::kQwen2:
      c->attention_bias = true;  // qwen2 always has q/k/v biases, never an o_proj bias
      return ParseSlidingWindow(f, /*gated_by_use_flag=*/true, 4096, c);
    case HfFamily::kQwen2Moe:
      c->attention_bias = true;
      CR_RETURN_IF_ERROR(f.Bool("qkv_bias", &c->attention_bias));
      CR_RETURN_IF_ERROR(ParseSlidingWindow(f, true, 4096, c));
      CR_RETURN_IF_ERROR(ParseQwenMoe(f, /*local_experts_alias=*/false, {60, 4, 1408}, c));
      c->shared_expert_intermediate_size = 5632;
      return f.Int("shared_expert_intermediate_size", &c->shared_expert_intermediate_size);
    case HfFamily::kQwen3:
    case HfFamily::kQwen3Moe:
      c->qk_norm = true;
      CR_RETURN_IF_ERROR(f.Bool("attention_bias", &c->attention_bias));
      c->attention_out_bias = c->attention_bias;
      CR_RETURN_IF_ERROR(ParseSlidingWindow(f, true, 4096, c));
      if (family == HfFamily::kQwen3Moe) {
        CR_RETURN_IF_ERROR(ParseQwenMoe(f, /*local_experts_alias=*/true, {128, 8, 768}, c));
      }
      return absl::OkStatus();
    case HfFamily::kDeepseekV3:
      // DeepseekV3Config's defaults (transformers 5; 4.x's are the same).
      CR_RETURN_IF_ERROR(ParseMla(f, {256, 2048, 8, 4, 3, 1536, 128, 128, 0, 0, 0}, c));
      c->num_nextn_predict_layers = 1;
      CR_RETURN_IF_ERROR(f.Bool("rope_interleave", &c->rope_interleave));
      return ParseDeepseekMoe(f, /*mtp_alias=*/true, c);
    case HfFamily::kDeepseekV32:
      // DeepseekV32Config (transformers 5): DeepSeek-V3's MLA and routing
      // plus the indexer; interleaved RoPE always (no rope_interleave key).
      CR_RETURN_IF_ERROR(ParseMla(f, {256, 2048, 8, 4, 3, 1536, 128, 128, 64, 128, 2048}, c));
      CR_RETURN_IF_ERROR(ParseDeepseekMoe(f, /*mtp_alias=*/false, c));
      return f.StringList("mlp_layer_types", &c->mlp_layer_types);
    case HfFamily::kGlmMoeDsa:
      // GlmMoeDsaConfig (transformers 5): GLM-5. One expert group, wider
      // heads, and layers that reuse an earlier layer's top-k.
      CR_RETURN_IF_ERROR(ParseMla(f, {256, 2048, 1, 1, 3, 2048, 192, 256, 32, 128, 2048}, c));
      CR_RETURN_IF_ERROR(ParseDeepseekMoe(f, /*mtp_alias=*/false, c));
      CR_RETURN_IF_ERROR(f.StringList("mlp_layer_types", &c->mlp_layer_types));
      return ParseIndexerTypes(f, c);
    case HfFamily::kGlm4Moe:
      // Glm4MoeConfig's defaults; GLM-4.5 routes like DeepSeek-V3 (sigmoid,
      // noaux_tc) without keys saying so.
      c->num_experts = 128;
      c->num_experts_per_tok = 8;
      c->moe_intermediate_size = 1408;
      c->n_shared_experts = 1;
      c->scoring_func = "sigmoid";
      c->topk_method = "noaux_tc";
      c->norm_topk_prob = true;
      c->first_k_dense_replace = 1;
      c->num_nextn_predict_layers = 1;
      CR_RETURN_IF_ERROR(f.Bool("attention_bias", &c->attention_bias));  // q/k/v only
      CR_RETURN_IF_ERROR(f.Bool("use_qk_norm", &c->qk_norm));
      return ParseDeepseekMoe(f, /*mtp_alias=*/true, c);
    case HfFamily::kGptOss: return ParseGptOss(f, c);
  }
  return absl::OkStatus();
}

absl::Status Require(bool ok, const JsonFields& f, const char* key, const std::string& what) {
  return ok ? absl::OkStatus() : f.Invalid(key, what);
}

absl::Status Validate(const JsonFields& f, HfFamily family, const ModelConfig& c) {
  const struct {
    const char* key;
    int64_t value;
  } positive[] = {
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"head_dim", c.head_dim},
      {"vocab_size", c.vocab_size},
      {"max_position_embeddings", c.max_position_embeddings},
  };
  for (const auto& p : positive) {
    CR_RETURN_IF_ERROR(Require(p.value > 0, f, p.key, absl::StrCat("must be positive, is ", p.value)));
  }
  CR_RETURN_IF_ERROR(Require(
      c.num_attention_heads % c.num_key_value_heads == 0, f, "num_key_value_heads",
      absl::StrCat("(", c.num_key_value_heads, ") must divide num_attention_heads (", c.num_attention_heads, ")")));
  CR_RETURN_IF_ERROR(Require(c.rms_norm_eps > 0, f, "rms_norm_eps", "must be positive"));
  CR_RETURN_IF_ERROR(Require(c.sliding_window >= 0, f, "sliding_window", "must not be negative"));
  for (int64_t id : c.bos_token_id) {
    CR_RETURN_IF_ERROR(Require(id >= 0, f, "bos_token_id", "must not be negative"));
  }
  for (int64_t id : c.eos_token_id) {
    CR_RETURN_IF_ERROR(Require(id >= 0, f, "eos_token_id", "must not be negative"));
  }

  if (!c.layer_types.empty()) {
    CR_RETURN_IF_ERROR(
        Require(static_cast<int64_t>(c.layer_types.size()) == c.num_hidden_layers, f, "layer_types",
                absl::StrCat("has ", c.layer_types.size(), " entries for num_hidden_layers ", c.num_hidden_layers)));
    for (const std::string& e : c.layer_types) {
      CR_RETURN_IF_ERROR(Require(e == "sliding_attention" || e == "full_attention", f, "layer_types",
                                 absl::StrCat("has '", e, "'; expected 'sliding_attention' or 'full_attention'")));
    }
  }
  if (family == HfFamily::kGptOss) {
    CR_RETURN_IF_ERROR(Require(c.swiglu_alpha > 0, f, "swiglu_alpha", "must be positive"));
    CR_RETURN_IF_ERROR(Require(c.swiglu_limit > 0, f, "swiglu_limit", "must be positive"));
  }
  if (c.UsesMla() || IsMla(family)) {
    CR_RETURN_IF_ERROR(Require(c.kv_lora_rank > 0, f, "kv_lora_rank", "must be positive"));
    if (IsDsa(family)) {
      // The DSA classes always build q_a_proj: the indexer reads the q latent.
      CR_RETURN_IF_ERROR(
          Require(c.q_lora_rank > 0, f, "q_lora_rank", "must be positive (the DSA indexer reads the q latent)"));
      CR_RETURN_IF_ERROR(Require(c.index_n_heads > 0, f, "index_n_heads", "must be positive"));
      CR_RETURN_IF_ERROR(Require(c.index_topk > 0, f, "index_topk", "must be positive"));
      CR_RETURN_IF_ERROR(Require(c.index_head_dim >= c.qk_rope_head_dim, f, "index_head_dim",
                                 absl::StrCat("(", c.index_head_dim, ") must hold the qk_rope_head_dim (",
                                              c.qk_rope_head_dim, ") rotary dims")));
    }
    const auto per_layer = [&](const char* key, const std::vector<std::string>& v, const char* a,
                               const char* b) -> absl::Status {
      if (v.empty()) return absl::OkStatus();
      CR_RETURN_IF_ERROR(
          Require(static_cast<int64_t>(v.size()) == c.num_hidden_layers, f, key,
                  absl::StrCat("has ", v.size(), " entries for num_hidden_layers ", c.num_hidden_layers)));
      for (const std::string& e : v) {
        CR_RETURN_IF_ERROR(
            Require(e == a || e == b, f, key, absl::StrCat("has '", e, "'; expected '", a, "' or '", b, "'")));
      }
      return absl::OkStatus();
    };
    CR_RETURN_IF_ERROR(per_layer("mlp_layer_types", c.mlp_layer_types, "dense", "sparse"));
    CR_RETURN_IF_ERROR(per_layer("indexer_types", c.indexer_types, "full", "shared"));
    CR_RETURN_IF_ERROR(Require(c.indexer_types.empty() || c.indexer_types[0] == "full", f, "indexer_types",
                               "starts with 'shared', but layer 0 has no earlier layer's top-k to reuse"));
    CR_RETURN_IF_ERROR(Require(c.q_lora_rank >= 0, f, "q_lora_rank", "must not be negative"));
    CR_RETURN_IF_ERROR(Require(c.qk_nope_head_dim > 0, f, "qk_nope_head_dim", "must be positive"));
    CR_RETURN_IF_ERROR(Require(c.qk_rope_head_dim > 0 && c.qk_rope_head_dim % 2 == 0, f, "qk_rope_head_dim",
                               "must be positive and even"));
    CR_RETURN_IF_ERROR(Require(c.v_head_dim > 0, f, "v_head_dim", "must be positive"));
  } else {
    for (const RopeConfig* r :
         {&c.rope, c.rope_parameters ? &*c.rope_parameters : nullptr, c.rope_legacy ? &*c.rope_legacy : nullptr}) {
      if (r == nullptr) continue;
      const double rotary = static_cast<double>(c.head_dim) * r->partial_rotary_factor;
      CR_RETURN_IF_ERROR(Require(std::fmod(rotary, 2.0) == 0, f, "partial_rotary_factor",
                                 absl::StrCat("(", r->partial_rotary_factor, ") times head_dim (", c.head_dim,
                                              ") must be an even whole number of rotary dimensions")));
    }
  }

  if (!c.IsMoe()) return absl::OkStatus();
  const char* experts_key = family == HfFamily::kMixtral || family == HfFamily::kQwen3Moe || family == HfFamily::kGptOss
                                ? "num_local_experts"
                            : IsDeepseekStyle(family) ? "n_routed_experts"
                                                      : "num_experts";
  CR_RETURN_IF_ERROR(Require(c.num_experts > 0, f, experts_key, "must be positive"));
  CR_RETURN_IF_ERROR(
      Require(c.num_experts_per_tok > 0 && c.num_experts_per_tok <= c.num_experts, f, "num_experts_per_tok",
              absl::StrCat("(", c.num_experts_per_tok, ") must be in [1, ", experts_key, " = ", c.num_experts, "]")));
  CR_RETURN_IF_ERROR(Require(c.moe_intermediate_size > 0, f, "moe_intermediate_size", "must be positive"));
  CR_RETURN_IF_ERROR(Require(c.n_shared_experts >= 0, f, "n_shared_experts", "must not be negative"));
  CR_RETURN_IF_ERROR(
      Require(c.shared_expert_intermediate_size >= 0, f, "shared_expert_intermediate_size", "must not be negative"));
  if (c.scoring_func != "softmax" && c.scoring_func != "sigmoid") {
    return UnsupportedModelError(absl::StrCat("config '", f.source(), "': scoring_func '", c.scoring_func,
                                              "' is not supported (softmax, sigmoid)"));
  }
  if (c.topk_method != "greedy" && c.topk_method != "group_limited_greedy" && c.topk_method != "noaux_tc") {
    return UnsupportedModelError(absl::StrCat("config '", f.source(), "': topk_method '", c.topk_method,
                                              "' is not supported (greedy, group_limited_greedy, noaux_tc)"));
  }
  CR_RETURN_IF_ERROR(Require(c.n_group >= 1 && c.num_experts % c.n_group == 0, f, "n_group",
                             absl::StrCat("(", c.n_group, ") must divide the ", c.num_experts, " experts")));
  CR_RETURN_IF_ERROR(Require(c.topk_group >= 1 && c.topk_group <= c.n_group, f, "topk_group",
                             absl::StrCat("(", c.topk_group, ") must be in [1, n_group = ", c.n_group, "]")));
  CR_RETURN_IF_ERROR(Require(c.routed_scaling_factor > 0, f, "routed_scaling_factor", "must be positive"));
  CR_RETURN_IF_ERROR(Require(c.first_k_dense_replace >= 0 && c.first_k_dense_replace <= c.num_hidden_layers, f,
                             "first_k_dense_replace",
                             absl::StrCat("(", c.first_k_dense_replace, ") must be in [0, num_hidden_layers]")));
  CR_RETURN_IF_ERROR(Require(c.moe_layer_freq >= 1, f, "moe_layer_freq", "must be at least 1"));
  CR_RETURN_IF_ERROR(Require(c.decoder_sparse_step >= 1, f, "decoder_sparse_step", "must be at least 1"));
  for (int64_t layer : c.mlp_only_layers) {
    CR_RETURN_IF_ERROR(Require(layer >= 0 && layer < c.num_hidden_layers, f, "mlp_only_layers",
                               absl::StrCat("names layer ", layer, ", outside [0, ", c.num_hidden_layers, ")")));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ParseHfConfig(std::string_view json, std::string_view source_sv) {
  const std::string source(source_sv);
  CR_ASSIGN_OR_RETURN(nlohmann::json root,
                      json_util::ParseStrict(json, absl::StrCat("config '", source, "'"), hf_internal::kMaxConfigDepth,
                                             absl::StatusCode::kInvalidArgument));
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config '", source, "': expected a JSON object, found a ", json_util::TypeName(root)));
  }
  const JsonFields f(root, source);
  ModelConfig c;
  c.source = source;
  CR_RETURN_IF_ERROR(f.String("model_type", &c.model_type, /*required=*/true));
  const HfFamilyInfo* fam = FindFamily(c.model_type);
  if (fam == nullptr) {
    return UnsupportedModelError(absl::StrCat("config '", source, "': model_type '", c.model_type,
                                              "' is not supported (supported: ", std::string(kSupportedModelTypes),
                                              ")"));
  }
  const std::optional<HfFamily> family = fam->family;
  CR_RETURN_IF_ERROR(ParseCommon(f, *fam, &c));
  CR_RETURN_IF_ERROR(ParseFamily(f, *family, &c));
  CR_RETURN_IF_ERROR(hf_internal::ParseRope(root, source, *fam, &c));
  if (*family == HfFamily::kGptOss && c.rope.form == RopeForm::kNone) {
    // GptOssConfig.__post_init__: no rope_parameters means gpt-oss's YaRN.
    c.rope.type = RopeType::kYarn;
    c.rope.factor = 32.0;
    c.rope.beta_fast = 32.0;
    c.rope.beta_slow = 1.0;
    c.rope.truncate = false;
    c.rope.original_max_position_embeddings = 4096;
  }
  if (f.Has("quantization_config")) {
    CR_ASSIGN_OR_RETURN(c.quant, hf_internal::ParseQuantizationConfig(*f.Get("quantization_config"), source));
  }
  CR_RETURN_IF_ERROR(Validate(f, *family, c));
  return c;
}

}  // namespace crashreplay
