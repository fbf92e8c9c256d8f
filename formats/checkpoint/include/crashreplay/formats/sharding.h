// Tensor-parallel sharding rules: which slice of a HF checkpoint tensor a
// rank holds. The ONE definition, shared by the capture side (weight-shard
// hashes, `crashreplay hash`) and the replay engine's model builder, so that
// replay can verify the shards it builds against recorded hashes.
//
// The rules (by HF tensor name, any architecture replay knows):
//   column parallel, split along dim 0 (output rows):
//     *.q_proj.*, *.gate_proj.*, *.up_proj.*, experts' gate/up (w1/w3),
//     shared experts' gate/up, lm_head.*, MLA's *.q_b_proj.* and
//     *.kv_b_proj.* (heads);
//     *.k_proj.*, *.v_proj.*: split in KV-head units; with fewer KV heads
//     than ranks, rank r holds head floor(r * kv_heads / tp) (replicated).
//   row parallel, split along dim 1 (input columns):
//     *.o_proj.*, *.down_proj.*, experts' down (w2), shared experts' down.
//   expert parallel (moe_parallel = expert): routed experts' tensors are
//     whole and owned by rank floor(expert / (num_experts / tp)).
//   replicated: everything else (embeddings, norms, router gate,
//     e_score_correction_bias, scalar scales such as weight_scale_2, MLA's
//     q_a_proj and kv_a_proj_with_mqa, the DSA indexer's wq_b, wk,
//     weights_proj and k_norm).
// The same rule applies to a weight's companion tensors (weight_scale,
// weight_scale_inv, bias): a 2-D scale is split along the same dimension in
// the same number of equal parts; 1-D tensors (bias) of a column split are
// split along dim 0 and those of a row split are replicated; 0-D and
// single-element tensors are replicated. Packed tensors (fp4 as U8) are split
// by their stored dimension, which is what the rule's equal parts mean.
//
// Pure functions, thread-safe. Errors: InvalidArgument naming the tensor
// when its split dimension does not divide into the parts.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace crashreplay {

// What the rules need to know about the model (from config.json).
struct ShardingModel {
  int64_t num_kv_heads = 0;   // 0: unknown, K/V split like Q
  int64_t num_experts = 0;    // routed experts (0: dense)
  bool expert_parallel = false;  // moe_parallel = expert
};

enum class ShardKind : uint8_t {
  kReplicated = 0,  // every rank holds the whole tensor
  kSplit,           // rank holds part `part` of `parts` equal parts along `dim`
  kOwned,           // whole tensor, held only by rank `owner`
};

struct ShardSpec {
  ShardKind kind = ShardKind::kReplicated;
  int dim = 0;        // kSplit: 0 (column parallel) or 1 (row parallel)
  int64_t parts = 1;  // kSplit
  int64_t part = 0;   // kSplit: which part this rank holds
  int64_t owner = 0;  // kOwned
};

// The rule for `tensor_name` on `rank` of `tp_size`.
ShardSpec ShardingRuleFor(std::string_view tensor_name, std::span<const int64_t> shape, int64_t tp_size, int64_t rank,
                          const ShardingModel& model);

// The rank's piece as a 2-D block of the tensor viewed as [rows, cols]
// (rows = shape[0], cols = product of the rest; a 0-D tensor is [1, 1]):
// rows [row_begin, row_end) x byte columns [col_byte_begin, col_byte_end).
// `held` is false when the rank holds nothing (kOwned by another rank).
struct ShardBlock {
  bool held = true;
  int64_t rows = 1;
  uint64_t row_bytes = 0;  // bytes of one full row
  int64_t row_begin = 0, row_end = 1;
  uint64_t col_byte_begin = 0, col_byte_end = 0;
  uint64_t bytes() const {
    return held ? static_cast<uint64_t>(row_end - row_begin) * (col_byte_end - col_byte_begin) : 0;
  }
};

// Applies `spec` to a tensor of `shape` whose bytes total `byte_size`.
absl::StatusOr<ShardBlock> ShardBlockFor(std::string_view tensor_name, const ShardSpec& spec,
                                         std::span<const int64_t> shape, uint64_t byte_size);

}  // namespace crashreplay
