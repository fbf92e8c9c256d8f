// Pieces of hf_config shared between its source files. Private to formats/.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "crashreplay/formats/hf_config.h"

namespace crashreplay::hf_internal {

// Deepest JSON nesting accepted in config files (real ones nest 4 deep).
inline constexpr int kMaxConfigDepth = 32;
// Largest config.json / hf_quant_config.json read.
inline constexpr uint64_t kMaxConfigBytes = 16ull << 20;

// Reads rope settings from the config's root object: `rope_parameters` when
// present, else `rope_theta` + `rope_scaling`. `default_partial_rotary` is
// the family's default for partial_rotary_factor.
absl::Status ParseRope(const nlohmann::json& root, const std::string& source,
                       double default_partial_rotary, RopeConfig* rope);

// Reads a `quantization_config` object from config.json.
absl::StatusOr<QuantConfig> ParseQuantizationConfig(const nlohmann::json& qc,
                                                    const std::string& source);

}  // namespace crashreplay::hf_internal
