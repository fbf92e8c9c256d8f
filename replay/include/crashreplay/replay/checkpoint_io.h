// Reading and writing HF checkpoint directories for the engine: config.json
// <-> ModelSpec, and safetensors shards <-> TensorSet.
//
// config.json is read and written by formats/hf_config.h (ModelConfig); this
// file maps ModelConfig to the engine's ModelSpec and back. The rope_config
// toggle needs to know which RoPE form the file used: ModelConfig::rope.form
// gives it, and ModelSpec keeps the settings under that form only.
//
// Errors: NotFound for a missing directory/file/tensor, Unimplemented for a
// model the engine cannot run (MLA attention, qwen2_moe's gated shared
// expert, longrope/dynamic RoPE), InvalidArgument/DataLoss from the readers.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "crashreplay/formats/hf_config.h"
#include "crashreplay/replay/model_spec.h"

namespace crashreplay::replay {

absl::StatusOr<ModelSpec> ModelSpecFromHfConfig(const ModelConfig& config);
ModelConfig HfConfigFromModelSpec(const ModelSpec& spec);

struct LoadedCheckpoint {
  ModelSpec spec;
  TensorSet tensors;
  ModelConfig config;  // config.json as read
};

absl::StatusOr<LoadedCheckpoint> LoadCheckpointDir(const std::string& dir);

// Writes config.json and the tensors (sharded at `max_shard_bytes`).
absl::Status WriteCheckpointDir(const std::string& dir, const ModelSpec& spec, const TensorSet& tensors,
                                uint64_t max_shard_bytes = 1ull << 30);

}  // namespace crashreplay::replay
