// Small random checkpoints of every supported architecture and quantization,
// in real HF tensor names and layouts (what `crashreplay make-model` writes).
//
// Weights are drawn from a counter-based normal generator (std 1/sqrt(fan_in))
// so a (options, seed) pair gives the same bytes on every machine. Quantized
// checkpoints are produced the way the real quantizers do it, so their scales
// have the real properties: FP8 block scales are amax/448 per 128x128 block;
// NVFP4 block scales are e4m3 values of amax/6/weight_scale_2 (not powers of
// two), MXFP4 scales are e8m0 powers of two. NVFP4 checkpoints also carry a
// calibrated `input_scale` per linear layer: the amax of the layer's input
// over a calibration prompt (CalibrationTokens) run through the model with
// bf16 activations, divided by 6 * 448, as ModelOpt calibrates them.
//
// Threads: every draw is a pure function of (seed, its index in the stream),
// and every quantization block is computed from its own values, so tensors
// are drawn and quantized in row chunks on `threads` workers, and the
// calibration runs on a CPU executor with as many; the bytes are the same on
// any thread count (random_checkpoint_test checks it).
//
// Memory: GenerateRandomCheckpoint returns the whole checkpoint in memory
// (tests, benches). WriteRandomCheckpoint, what `make-model` runs, writes the
// same files as GenerateRandomCheckpoint + WriteCheckpointDir, byte for byte,
// without holding the model: a first pass of the generator lists every
// tensor's name, dtype and shape (nothing drawn), which fixes every shard's
// header and every tensor's offset; the shards are created at their final
// size, and the second pass writes each tensor (a bf16 matrix in ~32 MB
// pieces) where it belongs as soon as it is drawn and quantized. For NVFP4
// the calibration then runs over the files with layer streaming (it uses
// w4a16, which never reads input_scale), and the input_scale placeholders,
// fixed-size f32 scalars, are patched in place. Peak memory: the largest
// quantized tensor in fp32 (a bf16 one in pieces), or, calibrating, one
// layer's weights (mapped from the files) plus the prompt's activations.
//
// MLA models are quantized as their real checkpoints are: FP8 blocks on
// every linear but the indexer's weights_proj (DeepSeek-V3/V3.2); NVFP4 on
// the routed experts and dense MLPs only, with attention (and the indexer),
// the shared experts, the router and lm_head in bf16 and listed in the
// quantization config's ignore list (ModelOpt's GLM-5 NVFP4 exports).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "crashreplay/replay/model/model_spec.h"

namespace crashreplay::replay {

struct MakeModelOptions {
  // llama | qwen3 | qwen3_moe | mixtral | gpt_oss | glm4_moe (GLM-4.5: DeepSeek-V3
  // routing with GQA attention) | deepseek_v3 (MLA) | deepseek_v32 and
  // glm_moe_dsa (MLA + DSA indexer).
  std::string arch = "llama";
  std::string quant = "bf16";  // bf16 | fp8 | nvfp4 | mxfp4
  int64_t layers = 2;
  int64_t hidden = 64;
  int64_t heads = 4;
  int64_t kv_heads = 2;
  int64_t head_dim = 16;
  int64_t intermediate = 128;
  int64_t moe_intermediate = 32;
  int64_t experts = 8;
  int64_t experts_per_tok = 2;
  int64_t sliding_window = 8;  // gpt_oss: the sliding layers' window
  int64_t n_shared_experts = 1;
  int64_t n_group = 4;
  int64_t topk_group = 2;
  int64_t vocab = 320;
  uint64_t seed = 1;
  // Worker threads (<= 0: one per core). Never changes the bytes.
  int threads = 1;
  // Progress of the long phases, called on the calling thread: `done` of
  // `total` units of `phase`, `bytes` of tensors generated so far. Empty:
  // silent.
  std::function<void(std::string_view phase, int64_t done, int64_t total, int64_t bytes)> progress;
  // MLA (deepseek_v3, deepseek_v32, glm_moe_dsa): every head has a KV head
  // (kv_heads is ignored). The defaults are FlashMLA-shaped (512 + 64), so
  // the absorbed and tiled decode kernels' preconditions hold.
  int64_t q_lora_rank = 96;  // 0: q_proj (deepseek_v3 only)
  int64_t kv_lora_rank = 512;
  int64_t qk_nope_head_dim = 32;
  int64_t qk_rope_head_dim = 64;
  int64_t v_head_dim = 32;
  // DSA indexer (deepseek_v32, glm_moe_dsa).
  int64_t index_n_heads = 16;  // few heads make exact-zero score ties (every relu 0) common
  int64_t index_head_dim = 64;
  int64_t index_topk = 64;
  // glm_moe_dsa: per layer 'F' (runs its indexer) or 'S' (reuses the last
  // one's top-k), transformers' index_topk_pattern; empty: all 'F'.
  std::string index_pattern;
  // The RoPE keys of config.json: legacy (rope_theta / rope_scaling),
  // rope_parameters, or both. The tensors are the same for every form.
  std::string rope_form = "legacy";
  // A directory holding a checkpoint's config.json (and the small JSON files
  // beside it: hf_quant_config.json, generation_config.json): the model is
  // the one that config describes, as the engine reads it (arch, dimensions,
  // quantization and its ignore list, per-layer lists), and those files are
  // written verbatim; arch, quant, the size options and rope_form are
  // ignored. What shrink's weights stage regenerates a slice from: the same
  // tensors (names, dtypes, shapes) with values drawn from `seed`.
  // InvalidArgument for a config with tensors the generator does not draw
  // (MLP biases).
  std::string like;
};

struct RandomCheckpoint {
  ModelSpec spec;
  TensorSet tensors;
};

// The whole checkpoint in memory. InvalidArgument for options that make no
// model (unknown arch/quant/rope form, dimensions the quantization cannot
// block, a bad --index-pattern).
absl::StatusOr<RandomCheckpoint> GenerateRandomCheckpoint(const MakeModelOptions& options);

// Writes the checkpoint into `dir` (created if missing) in bounded memory
// (see above): config.json and safetensors shards of at most
// `max_shard_bytes` tensor bytes, the files WriteCheckpointDir writes for
// GenerateRandomCheckpoint's result. Each shard is written under a temporary
// name and renamed when complete; on failure none is left. Errors: as
// GenerateRandomCheckpoint's; FailedPrecondition naming `dir` when it cannot
// be created (a file in the way, ...), PermissionDenied / ResourceExhausted
// (no space) naming the file, all before anything is generated where the
// file system reserves space (fallocate).
struct WrittenCheckpoint {
  ModelSpec spec;           // as config.json has it
  size_t tensors = 0;
  uint64_t tensor_bytes = 0;
};
absl::StatusOr<WrittenCheckpoint> WriteRandomCheckpoint(const std::string& dir, const MakeModelOptions& options,
                                                        uint64_t max_shard_bytes = 1ull << 30);

// The calibration prompt of an NVFP4 checkpoint: min(64, max_position) token
// ids drawn from `seed` (the make-model seed), one request, prefilled once.
std::vector<int32_t> CalibrationTokens(const ModelSpec& spec, uint64_t seed);

}  // namespace crashreplay::replay
