// Quantization settings: config.json's `quantization_config` and ModelOpt's
// hf_quant_config.json, and module matching against their ignore lists.
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "crashreplay/base/status.h"
#include "hf_config_internal.h"
#include "json_fields.h"
#include "json_util.h"

namespace crashreplay {
namespace {

absl::Status ReadIgnoreLists(const JsonFields& f, QuantConfig* q) {
  // Each producer names the list differently; take whichever are present.
  for (const char* key : {"modules_to_not_convert", "ignored_layers", "ignore", "exclude_modules"}) {
    std::vector<std::string> list;
    CR_RETURN_IF_ERROR(f.StringList(key, &list));
    q->ignore.insert(q->ignore.end(), list.begin(), list.end());
  }
  return absl::OkStatus();
}

// ModelOpt's quant_algo names (modelopt/torch/export/convert_hf_config.py and
// quant_utils.py in nvidia-modelopt 0.47).
absl::Status ReadModelOptAlgo(const JsonFields& f, const std::string& source, QuantConfig* q) {
  CR_RETURN_IF_ERROR(f.String("quant_algo", &q->quant_algo, /*required=*/true));
  CR_RETURN_IF_ERROR(f.String("kv_cache_quant_algo", &q->kv_cache_quant_algo));
  if (q->quant_algo == "NVFP4" || q->quant_algo == "W4A16_NVFP4") {
    q->method = QuantMethod::kNvfp4;
    q->group_size = 16;
    CR_RETURN_IF_ERROR(f.Int("group_size", &q->group_size));
  } else if (q->quant_algo == "FP8") {
    q->method = QuantMethod::kFp8Tensor;
    q->fmt = "e4m3";
    q->activation_scheme = "static";
  } else if (q->quant_algo == "fp8_pb_wo" || q->quant_algo == "FP8_PB_WO") {
    q->quant_algo = "fp8_pb_wo";
    q->method = QuantMethod::kFp8Block;
    q->fmt = "e4m3";
    q->activation_scheme = "dynamic";
    q->weight_block_size = {128, 128};  // modelopt's FP8_2D_BLOCKWISE_WEIGHT_ONLY_CFG
  } else {
    return UnsupportedModelError(absl::StrCat("quantization in '", source, "': ModelOpt quant_algo '", q->quant_algo,
                                              "' is not supported (NVFP4, W4A16_NVFP4, FP8, fp8_pb_wo)"));
  }
  return absl::OkStatus();
}

absl::Status ReadProducer(const JsonFields& f, QuantConfig* q) {
  const nlohmann::json* p = f.Get("producer");
  if (p == nullptr) return absl::OkStatus();
  if (!p->is_object()) return f.Invalid("producer", "must be an object");
  const JsonFields pf(*p, f.source(), f.prefix() + "producer.");
  std::string name, version;
  CR_RETURN_IF_ERROR(pf.String("name", &name));
  CR_RETURN_IF_ERROR(pf.String("version", &version));
  q->producer = version.empty() ? name : absl::StrCat(name, " ", version);
  return absl::OkStatus();
}

absl::Status Finish(const std::string& source, const JsonFields& f, QuantConfig* q) {
  if (q->method == QuantMethod::kNvfp4 && q->group_size != 16) {
    return f.Invalid("group_size", absl::StrCat("is ", q->group_size, "; NVFP4 uses 16"));
  }
  if (q->method == QuantMethod::kFp8Block) {
    if (q->weight_block_size.size() != 2 || q->weight_block_size[0] <= 0 || q->weight_block_size[1] <= 0) {
      return f.Invalid("weight_block_size", "must be two positive integers, e.g. [128, 128]");
    }
    if (q->fmt != "e4m3") {
      return UnsupportedModelError(
          absl::StrCat("quantization in '", source, "': fp8 fmt '", q->fmt, "' is not supported (e4m3)"));
    }
    if (q->activation_scheme != "dynamic" && q->activation_scheme != "static") {
      return f.Invalid("activation_scheme",
                       absl::StrCat("is '", q->activation_scheme, "', expected dynamic or static"));
    }
  }
  q->source = source;
  return absl::OkStatus();
}

// fnmatch-style: '*' any run (dots included), '?' one character.
bool GlobMatch(std::string_view pattern, std::string_view text) {
  size_t p = 0, t = 0, star = std::string_view::npos, mark = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = t;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      t = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

bool PatternCovers(std::string_view pattern, std::string_view module) {
  if (pattern.find_first_of("*?") != std::string_view::npos) {
    // The whole name, or a dotted prefix of it (the pattern names a parent).
    if (GlobMatch(pattern, module)) return true;
    for (size_t i = 0; i < module.size(); ++i) {
      if (module[i] == '.' && GlobMatch(pattern, module.substr(0, i))) return true;
    }
    return false;
  }
  // A plain name: a run of whole dotted components.
  for (size_t pos = module.find(pattern); pos != std::string_view::npos; pos = module.find(pattern, pos + 1)) {
    const size_t end = pos + pattern.size();
    const bool starts = pos == 0 || module[pos - 1] == '.';
    const bool ends = end == module.size() || module[end] == '.';
    if (starts && ends) return true;
  }
  return false;
}

}  // namespace

bool QuantConfig::IsQuantized(std::string_view module) const {
  if (method == QuantMethod::kNone) return false;
  for (const std::string& pattern : ignore) {
    if (PatternCovers(pattern, module)) return false;
  }
  return true;
}

namespace hf_internal {

absl::StatusOr<QuantConfig> ParseQuantizationConfig(const nlohmann::json& qc, const std::string& source) {
  const nlohmann::json empty = nlohmann::json::object();
  const JsonFields top(empty, source);
  if (!qc.is_object()) return top.Invalid("quantization_config", "must be an object");
  const JsonFields f(qc, source, "quantization_config.");
  QuantConfig q;
  std::string method;
  CR_RETURN_IF_ERROR(f.String("quant_method", &method, /*required=*/true));
  CR_RETURN_IF_ERROR(ReadIgnoreLists(f, &q));
  if (method == "fp8") {
    q.method = QuantMethod::kFp8Block;
    q.fmt = "e4m3";
    q.activation_scheme = "dynamic";
    CR_RETURN_IF_ERROR(f.IntList("weight_block_size", &q.weight_block_size));
    if (q.weight_block_size.empty()) {
      return UnsupportedModelError(absl::StrCat("config '", source,
                                                "': fp8 quantization without weight_block_size (per-tensor or "
                                                "per-channel fp8 in transformers' layout) is not supported; "
                                                "crashreplay supports block-scaled fp8 and ModelOpt's FP8"));
    }
    CR_RETURN_IF_ERROR(f.String("fmt", &q.fmt));
    CR_RETURN_IF_ERROR(f.String("activation_scheme", &q.activation_scheme));
  } else if (method == "modelopt") {
    CR_RETURN_IF_ERROR(ReadModelOptAlgo(f, source, &q));
    CR_RETURN_IF_ERROR(ReadProducer(f, &q));
    // Newer ModelOpt exports describe the group size per config group.
    if (const nlohmann::json* groups = f.Get("config_groups"); groups && groups->is_object()) {
      for (const auto& [name, group] : groups->items()) {
        if (!group.is_object()) continue;
        auto w = group.find("weights");
        if (w == group.end() || !w->is_object()) continue;
        const JsonFields wf(*w, source, absl::StrCat("quantization_config.config_groups.", name, ".weights."));
        CR_RETURN_IF_ERROR(wf.Int("group_size", &q.group_size));
      }
    }
  } else if (method == "mxfp4") {
    q.method = QuantMethod::kMxfp4;
    q.group_size = 32;
  } else {
    return UnsupportedModelError(absl::StrCat("config '", source, "': quant_method '", method,
                                              "' is not supported (fp8, mxfp4, modelopt NVFP4 / "
                                              "W4A16_NVFP4 / FP8 / fp8_pb_wo)"));
  }
  CR_RETURN_IF_ERROR(Finish(source, f, &q));
  return q;
}

}  // namespace hf_internal

absl::StatusOr<QuantConfig> ParseHfQuantConfig(std::string_view json, std::string_view source_sv) {
  const std::string source(source_sv);
  CR_ASSIGN_OR_RETURN(nlohmann::json root,
                      json_util::ParseStrict(json, absl::StrCat("config '", source, "'"), hf_internal::kMaxConfigDepth,
                                             absl::StatusCode::kInvalidArgument));
  const JsonFields top(root, source);
  if (!root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("config '", source, "': expected a JSON object"));
  }
  const nlohmann::json* quant = top.Get("quantization");
  if (quant == nullptr) return top.Invalid("quantization", "is required but missing");
  if (!quant->is_object()) return top.Invalid("quantization", "must be an object");
  const JsonFields f(*quant, source, "quantization.");
  QuantConfig q;
  CR_RETURN_IF_ERROR(ReadModelOptAlgo(f, source, &q));
  CR_RETURN_IF_ERROR(ReadIgnoreLists(f, &q));
  CR_RETURN_IF_ERROR(ReadProducer(top, &q));
  CR_RETURN_IF_ERROR(Finish(source, f, &q));
  return q;
}

}  // namespace crashreplay
