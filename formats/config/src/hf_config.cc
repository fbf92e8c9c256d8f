// ModelConfig helpers and LoadHfConfig (file access around ParseHfConfig).
#include <algorithm>
#include <filesystem>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "crashreplay/base/status.h"
#include "crashreplay/formats/hf_config.h"
#include "hf_config_internal.h"
#include "hf_family.h"
#include "json_util.h"

namespace crashreplay {
namespace {
constexpr char kUnsupportedPayload[] = "type.crashreplay/unsupported_model";
}  // namespace

absl::Status UnsupportedModelError(std::string_view message) {
  absl::Status s = absl::UnimplementedError(absl::StrCat("unsupported model: ", std::string(message)));
  s.SetPayload(kUnsupportedPayload, absl::Cord("1"));
  return s;
}

bool IsUnsupportedModel(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnimplemented && status.GetPayload(kUnsupportedPayload).has_value();
}

std::string_view RopeTypeName(RopeType t) {
  switch (t) {
    case RopeType::kDefault: return "default";
    case RopeType::kLinear: return "linear";
    case RopeType::kDynamic: return "dynamic";
    case RopeType::kYarn: return "yarn";
    case RopeType::kLlama3: return "llama3";
    case RopeType::kLongRope: return "longrope";
  }
  return "default";
}

std::string_view QuantMethodName(QuantMethod m) {
  switch (m) {
    case QuantMethod::kNone: return "none";
    case QuantMethod::kFp8Block: return "fp8";
    case QuantMethod::kNvfp4: return "nvfp4";
    case QuantMethod::kMxfp4: return "mxfp4";
    case QuantMethod::kFp8Tensor: return "fp8_tensor";
  }
  return "none";
}

bool ModelConfig::IsIndexerLayer(int layer) const {
  if (!UsesDsa() || layer < 0 || layer >= num_hidden_layers) return false;
  if (indexer_types.empty()) return true;
  return static_cast<size_t>(layer) < indexer_types.size() && indexer_types[layer] == "full";
}

bool ModelConfig::IsMoeLayer(int layer) const {
  if (num_experts <= 0 || layer < 0 || layer >= num_hidden_layers) return false;
  const std::optional<HfFamily> family = HfFamilyOf(model_type);
  if (!family) return false;
  if (!mlp_layer_types.empty()) {
    return static_cast<size_t>(layer) < mlp_layer_types.size() && mlp_layer_types[layer] == "sparse";
  }
  if (IsDeepseekStyle(*family)) {
    return layer >= first_k_dense_replace && layer % std::max<int64_t>(moe_layer_freq, 1) == 0;
  }
  if (IsQwenMoe(*family)) {
    if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) {
      return false;
    }
    return (layer + 1) % std::max<int64_t>(decoder_sparse_step, 1) == 0;
  }
  return true;  // mixtral: every layer
}

int64_t ModelConfig::LayerWindow(int layer) const {
  if (layer_types.empty()) return sliding_window;
  if (layer < 0 || static_cast<size_t>(layer) >= layer_types.size()) return 0;
  return layer_types[layer] == "sliding_attention" ? sliding_window : 0;
}

absl::StatusOr<ModelConfig> LoadHfConfig(const std::string& path) {
  auto text = json_util::ReadTextFile(path, hf_internal::kMaxConfigBytes);
  if (!text.ok()) {
    return absl::Status(text.status().code(), absl::StrCat("cannot read config: ", text.status().message()));
  }
  CR_ASSIGN_OR_RETURN(ModelConfig config, ParseHfConfig(*text, path));
  if (config.quant.method != QuantMethod::kNone) return config;
  // ModelOpt checkpoints may carry their quantization only in a side file.
  const std::string side = (std::filesystem::path(path).parent_path() / "hf_quant_config.json").string();
  std::error_code ec;
  if (!std::filesystem::exists(side, ec)) return config;
  CR_ASSIGN_OR_RETURN(std::string side_text, json_util::ReadTextFile(side, hf_internal::kMaxConfigBytes));
  CR_ASSIGN_OR_RETURN(config.quant, ParseHfQuantConfig(side_text, side));
  return config;
}

}  // namespace crashreplay
