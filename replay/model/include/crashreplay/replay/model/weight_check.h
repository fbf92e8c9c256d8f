// Checks a checkpoint's tensors against what its config.json implies, before
// the engine builds anything from them.
//
// Every tensor the engine reads must exist with the shape and dtype the
// config implies: q/k/v/o from num_attention_heads, num_key_value_heads and
// head_dim; the MLP from intermediate_size; experts, router and shared
// experts from the MoE keys; embeddings and lm_head from vocab_size (lm_head
// absent only under tie_word_embeddings); biases, q/k norms and the router's
// correction bias where the family and its flags say so. A quantized weight
// must be in a form of the config's quantization (FP8 block or per-tensor
// with fp32 scales, NVFP4 as ModelOpt writes it, MXFP4), with scales of the
// matching shape, and only in a module the config quantizes; an unquantized
// weight may be bf16, fp16 or fp32 anywhere. The engine's kernels take their
// strides from the weights, so without this check a config that disagrees
// with its weights would run and give garbage.
//
// Tensors the config does not imply are handled as transformers handles
// them, except where that would hide a mismatch:
//   - layers past num_hidden_layers: the MTP layers (num_nextn_predict_layers)
//     are dropped with a note; any other layer is a mismatch (DataLoss);
//   - a bias of a projection the config gives no bias: a mismatch;
//   - anything else (rotary inv_freq buffers, KV-cache scales, ...): dropped
//     from `tensors` with a note, so the engine cannot read it.
// ModelOpt's fp8_pb_wo scales ([rows/128, 1, cols/128, 1], or a scalar for
// one block) are reshaped in place to [rows/128, cols/128]; the bytes are
// unchanged.
//
// Errors: DataLoss naming the tensor, the shape or dtype found and the one
// the config implies with the keys that imply it; NotFound naming a missing
// tensor and why the config implies it. `where` (the checkpoint directory)
// prefixes every message. Notes are appended to `notes`.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "crashreplay/formats/hf_config.h"
#include "crashreplay/replay/model/model_spec.h"

namespace crashreplay::replay {

absl::Status CheckWeights(const ModelConfig& config, const ModelSpec& spec, const std::string& where,
                          TensorSet* tensors, std::vector<std::string>* notes);

}  // namespace crashreplay::replay
