// Rope settings from config.json, in either of the forms transformers uses:
//   legacy (transformers 4.x): "rope_theta": 1e6, "rope_scaling": null or
//     {"rope_type" | "type": "yarn", "factor": ..., ...}
//   transformers 5: "rope_parameters": {"rope_type": "yarn",
//     "rope_theta": 1e6, "factor": ..., ...}
// Each form present is read on its own; the resolved RoPE follows
// transformers 5's convert_rope_params_to_dict / standardize_rope_params:
// a non-null rope_scaling replaces rope_parameters; a dict without
// rope_theta (or partial_rotary_factor) takes the top-level key, else the
// class default; llama3/yarn/longrope take original_max_position_embeddings
// from the top level when it is there (Phi-3's exception), else from the
// dict, else max_position_embeddings.
#include "absl/strings/str_cat.h"
#include "crashreplay/base/status.h"
#include "hf_config_internal.h"
#include "json_fields.h"

namespace crashreplay::hf_internal {
namespace {

absl::StatusOr<RopeType> RopeTypeFromName(const std::string& name, const JsonFields& f, const char* key) {
  if (name == "default") return RopeType::kDefault;
  if (name == "linear") return RopeType::kLinear;
  if (name == "dynamic") return RopeType::kDynamic;
  if (name == "yarn") return RopeType::kYarn;
  if (name == "llama3") return RopeType::kLlama3;
  if (name == "longrope" || name == "su") return RopeType::kLongRope;  // "su": its old name
  return UnsupportedModelError(
      absl::StrCat("config '", f.source(), "': field '", f.prefix(), key, "' names rope type '", name,
                   "', which is not supported (default, linear, dynamic, yarn, llama3, longrope)"));
}

struct TopLevel {
  const JsonFields& f;
  double theta;          // rope_theta, or the family's default
  double partial;        // partial_rotary_factor, or the family's default
  int64_t max_position;  // max_position_embeddings
};

// Reads one rope dict (`f`: rope_scaling or rope_parameters) into `rope`.
absl::Status ParseDict(const JsonFields& f, const TopLevel& top, bool type_required, RopeConfig* rope) {
  std::string type = "default";
  const char* type_key = "rope_type";
  if (!f.Has("rope_type") && f.Has("type")) {
    type_key = "type";
    rope->legacy_type_key = true;
  }
  CR_RETURN_IF_ERROR(f.String(type_key, &type, type_required));
  CR_ASSIGN_OR_RETURN(rope->type, RopeTypeFromName(type, f, type_key));
  rope->theta = top.theta;
  CR_RETURN_IF_ERROR(f.Double("rope_theta", &rope->theta));
  rope->partial_rotary_factor = top.partial;
  CR_RETURN_IF_ERROR(f.Double("partial_rotary_factor", &rope->partial_rotary_factor));

  const bool is_llama3 = rope->type == RopeType::kLlama3;
  const bool is_yarn = rope->type == RopeType::kYarn;
  const bool is_longrope = rope->type == RopeType::kLongRope;
  if (is_llama3 || is_yarn || is_longrope) {
    rope->original_max_position_embeddings = top.max_position;
    CR_RETURN_IF_ERROR(f.Int("original_max_position_embeddings", &rope->original_max_position_embeddings));
    CR_RETURN_IF_ERROR(top.f.Int("original_max_position_embeddings", &rope->original_max_position_embeddings));
  } else {
    CR_RETURN_IF_ERROR(f.Int("original_max_position_embeddings", &rope->original_max_position_embeddings));
  }
  if (rope->original_max_position_embeddings < 0) {
    return f.Invalid("original_max_position_embeddings", "must not be negative");
  }
  const bool needs_factor = rope->type == RopeType::kLinear || rope->type == RopeType::kDynamic || is_llama3;
  if (is_yarn && !f.Has("factor")) {
    // transformers 5: no factor means max_position_embeddings / original.
    if (rope->original_max_position_embeddings <= 0) {
      return f.Invalid("original_max_position_embeddings", "must be positive for yarn");
    }
    rope->factor = static_cast<double>(top.max_position) / static_cast<double>(rope->original_max_position_embeddings);
  }
  CR_RETURN_IF_ERROR(f.Double("factor", &rope->factor, needs_factor));
  if (!(rope->factor > 0)) return f.Invalid("factor", "must be positive");
  CR_RETURN_IF_ERROR(f.Double("low_freq_factor", &rope->low_freq_factor, is_llama3));
  CR_RETURN_IF_ERROR(f.Double("high_freq_factor", &rope->high_freq_factor, is_llama3));
  if (is_llama3 && !(rope->high_freq_factor > rope->low_freq_factor)) {
    return f.Invalid("high_freq_factor", "must be greater than low_freq_factor");
  }
  CR_RETURN_IF_ERROR(f.Double("beta_fast", &rope->beta_fast));
  CR_RETURN_IF_ERROR(f.Double("beta_slow", &rope->beta_slow));
  CR_RETURN_IF_ERROR(f.Bool("truncate", &rope->truncate));
  CR_RETURN_IF_ERROR(f.Double("mscale", &rope->mscale));
  CR_RETURN_IF_ERROR(f.Double("mscale_all_dim", &rope->mscale_all_dim));
  CR_RETURN_IF_ERROR(f.Double("attention_factor", &rope->attention_factor));
  CR_RETURN_IF_ERROR(f.DoubleList("short_factor", &rope->short_factor, is_longrope));
  CR_RETURN_IF_ERROR(f.DoubleList("long_factor", &rope->long_factor, is_longrope));
  return absl::OkStatus();
}

// `theta_key` / `partial_key`: the keys to name ("rope_theta" or
// "rope_parameters.rope_theta", ...).
absl::Status CheckRanges(const JsonFields& top, const char* theta_key, const char* partial_key,
                         const RopeConfig& rope) {
  if (!(rope.theta > 0)) return top.Invalid(theta_key, "must be positive");
  if (!(rope.partial_rotary_factor > 0 && rope.partial_rotary_factor <= 1)) {
    return top.Invalid(partial_key, "must be in (0, 1]");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseRope(const nlohmann::json& root, const std::string& source, const HfFamilyInfo& family,
                       ModelConfig* c) {
  const JsonFields top(root, source);
  TopLevel t{top, family.rope_theta, family.partial_rotary_factor, c->max_position_embeddings};
  CR_RETURN_IF_ERROR(top.Double("rope_theta", &t.theta));
  CR_RETURN_IF_ERROR(top.Double("partial_rotary_factor", &t.partial));
  c->rope_parameters.reset();
  c->rope_legacy.reset();

  if (const nlohmann::json* params = top.Get("rope_parameters")) {
    if (!params->is_object()) return top.Invalid("rope_parameters", "must be an object");
    if (!params->contains("rope_type") && !params->contains("type") && !params->contains("rope_theta")) {
      for (const auto& [key, value] : params->items()) {
        if (value.is_object()) {
          return UnsupportedModelError(absl::StrCat("config '", source, "': rope_parameters is given per layer type ('",
                                                    key, "', ...); crashreplay supports one rope for all layers"));
        }
      }
    }
    RopeConfig p;
    p.form = RopeForm::kRopeParameters;
    CR_RETURN_IF_ERROR(ParseDict(JsonFields(*params, source, "rope_parameters."), t, false, &p));
    CR_RETURN_IF_ERROR(CheckRanges(top, "rope_parameters.rope_theta", "rope_parameters.partial_rotary_factor", p));
    c->rope_parameters = p;
  }

  const nlohmann::json* scaling = top.Get("rope_scaling");
  if (scaling != nullptr && !scaling->is_object()) {
    return top.Invalid("rope_scaling", "must be an object or null");
  }
  if (scaling != nullptr || top.Has("rope_theta")) {
    RopeConfig l;
    l.form = RopeForm::kLegacy;
    l.theta = t.theta;
    l.partial_rotary_factor = t.partial;
    if (scaling != nullptr) {
      l.scaling_object = true;
      CR_RETURN_IF_ERROR(ParseDict(JsonFields(*scaling, source, "rope_scaling."), t, true, &l));
    }
    CR_RETURN_IF_ERROR(CheckRanges(top, "rope_theta", "partial_rotary_factor", l));
    c->rope_legacy = l;
  }

  if (c->rope_legacy && c->rope_legacy->scaling_object) {
    c->rope = *c->rope_legacy;  // transformers 5: rope_scaling replaces rope_parameters
  } else if (c->rope_parameters) {
    c->rope = *c->rope_parameters;
  } else if (c->rope_legacy) {
    c->rope = *c->rope_legacy;
  } else {
    c->rope = RopeConfig();
    c->rope.form = RopeForm::kNone;
    c->rope.theta = t.theta;
    c->rope.partial_rotary_factor = t.partial;
    CR_RETURN_IF_ERROR(CheckRanges(top, "rope_theta", "partial_rotary_factor", c->rope));
  }
  return absl::OkStatus();
}

}  // namespace crashreplay::hf_internal
