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
#include "crashreplay/replay/model_spec.h"

namespace crashreplay::replay {

struct MakeModelOptions {
  // llama | qwen3 | qwen3_moe | mixtral | glm4_moe (GLM-4.5: DeepSeek-V3
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
};

struct RandomCheckpoint {
  ModelSpec spec;
  TensorSet tensors;
};

absl::StatusOr<RandomCheckpoint> GenerateRandomCheckpoint(const MakeModelOptions& options);

// The calibration prompt of an NVFP4 checkpoint: min(64, max_position) token
// ids drawn from `seed` (the make-model seed), one request, prefilled once.
std::vector<int32_t> CalibrationTokens(const ModelSpec& spec, uint64_t seed);

}  // namespace crashreplay::replay
