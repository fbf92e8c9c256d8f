// Rope settings from config.json, in either of the forms transformers uses:
//   legacy (transformers 4.x): "rope_theta": 1e6, "rope_scaling": null or
//     {"rope_type" | "type": "yarn", "factor": ..., ...}
//   transformers v5: "rope_parameters": {"rope_type": "yarn",
//     "rope_theta": 1e6, "factor": ..., ...}
#include "absl/strings/str_cat.h"
#include "crashreplay/base/status.h"
#include "hf_config_internal.h"
#include "json_fields.h"

namespace crashreplay::hf_internal {
namespace {

absl::StatusOr<RopeType> RopeTypeFromName(const std::string& name, const JsonFields& f,
                                          const char* key) {
  if (name == "default") return RopeType::kDefault;
  if (name == "linear") return RopeType::kLinear;
  if (name == "dynamic") return RopeType::kDynamic;
  if (name == "yarn") return RopeType::kYarn;
  if (name == "llama3") return RopeType::kLlama3;
  if (name == "longrope" || name == "su") return RopeType::kLongRope;  // "su": its old name
  return absl::UnimplementedError(absl::StrCat(
      "config '", f.source(), "': field '", f.prefix(), key, "' names rope type '", name,
      "', which is not supported (default, linear, dynamic, yarn, llama3, longrope)"));
}

// The scaling keys, read from `f` (the rope_scaling or rope_parameters dict).
absl::Status ParseScaling(const JsonFields& f, const JsonFields& top, RopeConfig* rope) {
  const bool needs_factor = rope->type == RopeType::kLinear || rope->type == RopeType::kDynamic ||
                            rope->type == RopeType::kYarn || rope->type == RopeType::kLlama3;
  CR_RETURN_IF_ERROR(f.Double("factor", &rope->factor, needs_factor));
  if (!(rope->factor > 0)) return f.Invalid("factor", "must be positive");
  // Phi-3 style configs keep this one at the top level.
  if (f.Has("original_max_position_embeddings")) {
    CR_RETURN_IF_ERROR(
        f.Int("original_max_position_embeddings", &rope->original_max_position_embeddings));
  } else if (rope->type != RopeType::kDefault) {
    CR_RETURN_IF_ERROR(
        top.Int("original_max_position_embeddings", &rope->original_max_position_embeddings));
  }
  const bool is_llama3 = rope->type == RopeType::kLlama3;
  if (is_llama3 && rope->original_max_position_embeddings == 0) {
    CR_RETURN_IF_ERROR(f.Int("original_max_position_embeddings",
                             &rope->original_max_position_embeddings, /*required=*/true));
  }
  if (rope->original_max_position_embeddings < 0) {
    return f.Invalid("original_max_position_embeddings", "must not be negative");
  }
  CR_RETURN_IF_ERROR(f.Double("low_freq_factor", &rope->low_freq_factor, is_llama3));
  CR_RETURN_IF_ERROR(f.Double("high_freq_factor", &rope->high_freq_factor, is_llama3));
  if (is_llama3 && !(rope->high_freq_factor > rope->low_freq_factor)) {
    return f.Invalid("high_freq_factor", "must be greater than low_freq_factor");
  }
  CR_RETURN_IF_ERROR(f.Double("beta_fast", &rope->beta_fast));
  CR_RETURN_IF_ERROR(f.Double("beta_slow", &rope->beta_slow));
  CR_RETURN_IF_ERROR(f.Double("mscale", &rope->mscale));
  CR_RETURN_IF_ERROR(f.Double("mscale_all_dim", &rope->mscale_all_dim));
  CR_RETURN_IF_ERROR(f.Double("attention_factor", &rope->attention_factor));
  const bool is_longrope = rope->type == RopeType::kLongRope;
  CR_RETURN_IF_ERROR(f.DoubleList("short_factor", &rope->short_factor, is_longrope));
  CR_RETURN_IF_ERROR(f.DoubleList("long_factor", &rope->long_factor, is_longrope));
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseRope(const nlohmann::json& root, const std::string& source,
                       double default_partial_rotary, RopeConfig* rope) {
  const JsonFields top(root, source);
  *rope = RopeConfig();
  rope->partial_rotary_factor = default_partial_rotary;
  CR_RETURN_IF_ERROR(top.Double("partial_rotary_factor", &rope->partial_rotary_factor));
  CR_RETURN_IF_ERROR(top.Double("rope_theta", &rope->theta));

  if (const nlohmann::json* params = top.Get("rope_parameters")) {
    if (!params->is_object()) {
      return top.Invalid("rope_parameters", "must be an object");
    }
    rope->form = RopeForm::kRopeParameters;
    const JsonFields p(*params, source, "rope_parameters.");
    if (!p.Has("rope_type") && !p.Has("type") && !p.Has("rope_theta")) {
      for (const auto& [key, value] : params->items()) {
        if (value.is_object()) {
          return absl::UnimplementedError(absl::StrCat(
              "config '", source, "': rope_parameters is given per layer type ('", key,
              "', ...); crashreplay supports one rope for all layers"));
        }
      }
    }
    CR_RETURN_IF_ERROR(p.Double("rope_theta", &rope->theta));
    CR_RETURN_IF_ERROR(p.Double("partial_rotary_factor", &rope->partial_rotary_factor));
    std::string type = "default";
    const char* type_key = p.Has("rope_type") ? "rope_type" : "type";
    CR_RETURN_IF_ERROR(p.String(type_key, &type));
    CR_ASSIGN_OR_RETURN(rope->type, RopeTypeFromName(type, p, type_key));
    CR_RETURN_IF_ERROR(ParseScaling(p, top, rope));
  } else if (const nlohmann::json* scaling = top.Get("rope_scaling")) {
    if (!scaling->is_object()) {
      return top.Invalid("rope_scaling", "must be an object or null");
    }
    const JsonFields s(*scaling, source, "rope_scaling.");
    std::string type;
    const char* type_key = "rope_type";
    if (!s.Has("rope_type") && s.Has("type")) {
      type_key = "type";
      rope->legacy_type_key = true;
    }
    CR_RETURN_IF_ERROR(s.String(type_key, &type, /*required=*/true));
    CR_ASSIGN_OR_RETURN(rope->type, RopeTypeFromName(type, s, type_key));
    CR_RETURN_IF_ERROR(ParseScaling(s, top, rope));
  }
  if (!(rope->theta > 0)) {
    return top.Invalid(rope->form == RopeForm::kLegacy ? "rope_theta" : "rope_parameters.rope_theta",
                       "must be positive");
  }
  if (!(rope->partial_rotary_factor > 0 && rope->partial_rotary_factor <= 1)) {
    return top.Invalid("partial_rotary_factor", "must be in (0, 1]");
  }
  return absl::OkStatus();
}

}  // namespace crashreplay::hf_internal
