// Pieces of hf_config shared between its source files. Private to formats/.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "crashreplay/formats/hf_config.h"
#include "hf_family.h"

namespace crashreplay::hf_internal {

// Deepest JSON nesting accepted in config files (real ones nest 4 deep).
inline constexpr int kMaxConfigDepth = 32;
// Largest config.json / hf_quant_config.json read.
inline constexpr uint64_t kMaxConfigBytes = 16ull << 20;

// Reads the rope settings from the config's root object into c->rope,
// c->rope_parameters and c->rope_legacy (hf_config.h says how they relate).
// Needs c->max_position_embeddings; `family` gives the defaults.
absl::Status ParseRope(const nlohmann::json& root, const std::string& source, const HfFamilyInfo& family,
                       ModelConfig* c);

// Reads a `quantization_config` object from config.json.
absl::StatusOr<QuantConfig> ParseQuantizationConfig(const nlohmann::json& qc, const std::string& source);

}  // namespace crashreplay::hf_internal
