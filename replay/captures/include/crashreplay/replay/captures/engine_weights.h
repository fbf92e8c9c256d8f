// Verifying a capture's load-time weight hashes against the checkpoint a
// replay loads, for the built-in engine and for sglang and vLLM.
//
// sglang and vLLM do not hold the HF tensors under their HF names: their
// loaders fuse and pad them, and each rank holds its own slice. The capture
// adapters hash the parameters as the engine holds them after loading, in
// each rank's own file. To verify such a hash, the replay builds the same
// bytes from the checkpoint, laid out as that engine's loader lays them out
// on that rank (EngineParameterBytes), and hashes them (XXH3-128, as
// capture/weight_hash.h defines). The layouts, read from the engines'
// weight loaders (sglang 0.5.23 layers/linear.py, vocab_parallel_embedding.py,
// moe/fused_moe_triton/layer.py; vLLM 0.34 model_executor/layers/ same names)
// and checked against those loaders running on a real checkpoint
// (python/tests/test_adapters_sglang_real.py, test_adapters_vllm_real.py):
//
//   qkv_proj.{weight,bias}   rows: q's rank shard, then k's, then v's (dim 0).
//                            q: heads split evenly over tp; k/v: KV heads split
//                            over tp, or with fewer KV heads than ranks, rank r
//                            holds head r / (tp / kv_heads) (replicated)
//   gate_up_proj.weight      gate's rank shard (dim 0), then up's
//   q/k/v/gate/up_proj.*     (unfused) that projection's rank shard, dim 0
//   o_proj.weight,
//   down_proj.weight         the rank's column slice (dim 1); o_proj.bias whole
//   embed_tokens.weight,     vocabulary padded to a multiple of 64 rows, split
//   lm_head.weight           evenly over tp; rows past the vocabulary are zero
//                            (lm_head from embed_tokens when tied)
//   experts.w13_weight       [local experts, 2 * I / moe_tp, H]: per local
//                            expert, gate's moe-tp shard then up's
//   experts.w2_weight        [local experts, H, I / moe_tp]: down's column slice
//                            local experts: moe_ep_rank * E / moe_ep ..., with
//                            moe_tp = tp / ep, moe_ep_rank = rank / moe_tp
//   norms, router gate,      the HF tensor whole
//   e_score_correction_bias
//   attn._{k,v,q,prob}_scale (vLLM) fp32 1.0 when the checkpoint holds no such
//                            scale (Attention's default)
//
// What is not mapped is listed by name with the reason, never skipped in
// silence: quantized tensors and their scales (quantization methods repack
// them after loading: requantized scales, transposes), experts under a MoE
// runner that lays them out its own way (sglang moe_runner_backend other
// than auto/triton; vLLM with FlashInfer MoE), non-persistent state, and any
// parameter whose bytes the layout gives a different size than recorded
// (e.g. shared experts fused into the routed ones).
//
// Thread safety: pure functions. Errors: DataLoss on a hash mismatch, naming
// the rank, the tensor, its HF sources and both hashes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "crashreplay/replay/captures/capture_io.h"
#include "crashreplay/replay/model/checkpoint_io.h"
#include "crashreplay/replay/model/model.h"

namespace crashreplay::replay {

// One rank's place in the recorded engine's layout.
struct EngineLayout {
  std::string engine;  // "sglang" | "vllm"
  int64_t tp_size = 1, tp_rank = 0;
  int64_t moe_tp_size = 1, moe_tp_rank = 0;
  int64_t moe_ep_size = 1, moe_ep_rank = 0;
  int64_t vocab_padding = 64;
  std::string experts_unmapped;  // why routed experts are not mapped; "" when they are
  // The per-rank expert intermediate size the engine padded its fused
  // experts to (0: not padded). sglang pads it with zero rows (w13: gate and
  // up each) and zero columns (w2); VerifyEngineWeights infers it from a
  // recorded size that only such padding explains.
  int64_t expert_intermediate_padded = 0;
};

// The layout of the rank file with `parallel`, from the recorded toggles
// (tp_size / ep_size for sglang, parallel_config.* for vLLM, the MoE runner).
EngineLayout EngineLayoutFor(const SessionManifest& manifest, const ParallelLayout& parallel);

// The bytes rank `layout` holds for engine parameter `name`, built from the
// checkpoint. `sources` gets the HF tensors used. NotFound or Unimplemented,
// with the reason, when the parameter cannot be mapped.
absl::StatusOr<std::vector<uint8_t>> EngineParameterBytes(const EngineLayout& layout, std::string_view name,
                                                          const ModelSpec& spec, const TensorSet& tensors,
                                                          std::vector<std::string>* sources = nullptr);

struct WeightVerification {
  int ranks = 0;                      // rank files whose hashes were checked
  int64_t verified = 0;               // tensors whose hash matched
  std::vector<std::string> unmapped;  // "rank R 'NAME': reason"
  std::string summary;                // the replay's "weights:" line
};

// Checks every recorded hash of every rank file of an sglang/vLLM capture.
// DataLoss on the first mismatch.
absl::StatusOr<WeightVerification> VerifyEngineWeights(const LoadedCapture& capture, const ModelSpec& spec,
                                                       const TensorSet& tensors);

// The replay's weights line for any capture: the built-in engine's shard
// hashes (VerifyShardHashes) when the replay's tp_size is the recorded one,
// another engine's through VerifyEngineWeights. DataLoss on a mismatch.
absl::StatusOr<std::string> VerifyCaptureWeights(const LoadedCapture& capture, const LoadedCheckpoint& checkpoint,
                                                 const Model& model, const EngineConfig& config);

}  // namespace crashreplay::replay
