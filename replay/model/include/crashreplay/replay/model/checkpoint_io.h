// Reading and writing HF checkpoint directories for the engine: config.json
// <-> ModelSpec, and safetensors shards <-> TensorSet.
//
// config.json is read and written by formats/hf_config.h (ModelConfig); this
// file maps ModelConfig to the engine's ModelSpec and back. ModelSpec keeps
// each RoPE form the file has (rope_theta/rope_scaling, rope_parameters) and
// which one transformers 5 reads, for the rope_config toggle.
// LoadCheckpointDir checks every tensor against the config
// (weight_check.h) before anything is built from it. Its tensors view the
// mapped shards without copying them (tensor_bytes.h); the mapping lives as
// long as any tensor or model shard that views it.
//
// Errors: NotFound for a missing directory/file/tensor; Unimplemented marked
// IsUnsupportedModel for a model the engine cannot run (MLA with attention
// biases,
// qwen2_moe's gated shared expert, longrope/dynamic RoPE, an activation
// other than SiLU); DataLoss for tensors that disagree with the config;
// InvalidArgument/DataLoss from the readers.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "crashreplay/formats/hf_config.h"
#include "crashreplay/replay/model/model_spec.h"

namespace crashreplay::replay {

absl::StatusOr<ModelSpec> ModelSpecFromHfConfig(const ModelConfig& config);
ModelConfig HfConfigFromModelSpec(const ModelSpec& spec);

struct LoadedCheckpoint {
  ModelSpec spec;
  TensorSet tensors;   // checked against the config; tensors it does not imply removed
  ModelConfig config;  // config.json as read
  // What loading decided that the user should know (tensors ignored, a
  // sliding window the engine does not apply, ...): `run` and `replay` print
  // them as notes, with the model's (Model::notes).
  std::vector<std::string> notes;
  bool deferred = false;  // tensors are TensorBytes::Deferred
};

// deferred: the shards are opened with Checkpoint::Mode::kDeferred and every
// tensor's bytes are TensorBytes::Deferred (nothing mapped until a reader
// resolves them, one tensor at a time): what layer streaming loads from.
struct LoadOptions {
  bool deferred = false;
};
absl::StatusOr<LoadedCheckpoint> LoadCheckpointDir(const std::string& dir, LoadOptions options = {});

// The sum of the safetensors files' sizes of the checkpoint in `dir`, as a
// load would open them (its index, model.safetensors, or every
// *.safetensors); errors as LoadCheckpointDir's.
absl::StatusOr<uint64_t> CheckpointFileBytes(const std::string& dir);

// gpt_oss keeps each layer's experts fused, as transformers' GptOssExperts
// holds them: mlp.experts.gate_up_proj [E, hidden, 2I] (x @ W; gate the even
// columns, up the odd ones), gate_up_proj_bias [E, 2I], down_proj
// [E, I, hidden], down_proj_bias [E, hidden]. This replaces them with
// per-expert [out, in] projections and biases under the names
// NamesFor(spec, l).expert(j, ...) gives (bits copied, in memory), which is
// what the engine builds experts from; a no-op for other families.
// Experts in OpenAI's MXFP4 layout (gate_up_proj_blocks [E, 2I, H/32, 16],
// gate_up_proj_scales [E, 2I, H/32], down_proj_blocks / _scales, the same
// biases; the released checkpoints' form) become per-expert MXFP4
// projections (U8 weight [out, in/2], U8 weight_scale [out, in/32]), their
// bytes copied, not decoded.
// NotFound / DataLoss for a missing tensor, wrong shape or dtype.
// LoadCheckpointDir calls it before checking the weights.
absl::Status SplitFusedExperts(const ModelSpec& spec, const std::string& where, TensorSet* tensors);
// The inverse, for writing a gpt_oss checkpoint as transformers does.
absl::Status FuseExperts(const ModelSpec& spec, TensorSet* tensors);

// Writes config.json and the tensors (sharded at `max_shard_bytes`).
absl::Status WriteCheckpointDir(const std::string& dir, const ModelSpec& spec, const TensorSet& tensors,
                                uint64_t max_shard_bytes = 1ull << 30);

}  // namespace crashreplay::replay
