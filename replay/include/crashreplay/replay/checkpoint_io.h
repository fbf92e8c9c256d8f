// Reading and writing HF checkpoint directories for the engine: config.json
// <-> ModelSpec, and safetensors shards <-> TensorSet.
//
// ModelSpecFromHfJson understands the config.json keys of llama, mistral,
// qwen2, qwen3, mixtral, qwen3_moe, glm4_moe and deepseek_v3-style MoE
// routing (model_type decides the defaults), the legacy RoPE keys
// (rope_theta + rope_scaling) and the newer rope_parameters object, and
// quantization_config for FP8 block (quant_method "fp8"), ModelOpt NVFP4
// (quant_method "modelopt", quant_algo "NVFP4") and MXFP4 (quant_method
// "mxfp4").
// TODO(merge): once formats/hf_config.h lands on main, build ModelSpec from
// its ModelConfig instead of reading the JSON here.
//
// Errors: NotFound for a missing directory/file/tensor, InvalidArgument for a
// config that lacks a required key or names an unsupported architecture or
// quantization (the message names the key), DataLoss for corrupt shards.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "crashreplay/replay/model_spec.h"

namespace crashreplay::replay {

absl::StatusOr<ModelSpec> ModelSpecFromHfJson(const nlohmann::json& config);
nlohmann::json ModelSpecToHfJson(const ModelSpec& spec);

struct LoadedCheckpoint {
  ModelSpec spec;
  TensorSet tensors;
  nlohmann::json config;  // config.json as read
};

absl::StatusOr<LoadedCheckpoint> LoadCheckpointDir(const std::string& dir);

// Writes config.json and the tensors (sharded at `max_shard_bytes`).
absl::Status WriteCheckpointDir(const std::string& dir, const ModelSpec& spec, const TensorSet& tensors,
                                uint64_t max_shard_bytes = 1ull << 30);

}  // namespace crashreplay::replay
