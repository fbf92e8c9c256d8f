#include "crashreplay/formats/sharding.h"

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"

namespace crashreplay {
namespace {

bool Contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

// The routed expert index in "...experts.<j>....", or -1 (shared experts and
// non-expert tensors).
int64_t RoutedExpert(std::string_view name) {
  const size_t at = name.find(".experts.");
  if (at == std::string_view::npos || Contains(name, "shared_expert")) return -1;
  size_t i = at + 9;
  int64_t v = 0;
  bool any = false;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9') {
    v = v * 10 + (name[i] - '0');
    ++i;
    any = true;
  }
  return any && i < name.size() && name[i] == '.' ? v : -1;
}

enum class Linear { kNone, kColumn, kRow, kKv };

Linear LinearKind(std::string_view name) {
  if (Contains(name, ".q_proj.")) return Linear::kColumn;
  // MLA: q_b_proj and kv_b_proj are split by heads; q_a_proj,
  // kv_a_proj_with_mqa and the DSA indexer (indexer.wq_b/wk/weights_proj)
  // are replicated, as sglang and DeepSeek's reference shard them.
  if (Contains(name, ".q_b_proj.") || Contains(name, ".kv_b_proj.")) return Linear::kColumn;
  if (Contains(name, ".k_proj.") || Contains(name, ".v_proj.")) return Linear::kKv;
  if (Contains(name, ".o_proj.")) return Linear::kRow;
  if (Contains(name, ".gate_proj.") || Contains(name, ".up_proj.")) return Linear::kColumn;
  if (Contains(name, ".down_proj.")) return Linear::kRow;
  if (name.starts_with("lm_head.")) return Linear::kColumn;
  // Mixtral experts: w1 = gate, w3 = up (column), w2 = down (row).
  if (Contains(name, ".experts.")) {
    if (Contains(name, ".w1.") || Contains(name, ".w3.")) return Linear::kColumn;
    if (Contains(name, ".w2.")) return Linear::kRow;
  }
  return Linear::kNone;
}

}  // namespace

ShardSpec ShardingRuleFor(std::string_view tensor_name, std::span<const int64_t> shape, int64_t tp_size, int64_t rank,
                          const ShardingModel& model) {
  ShardSpec s;
  if (tp_size <= 1) return s;
  int64_t elements = 1;
  for (int64_t d : shape) elements *= d;
  if (elements <= 1) return s;  // scalars (weight_scale_2, input scales) are replicated
  const Linear kind = LinearKind(tensor_name);
  if (kind == Linear::kNone) return s;
  const int64_t expert = RoutedExpert(tensor_name);
  if (expert >= 0 && model.expert_parallel && model.num_experts > 0) {
    const int64_t per_rank = model.num_experts / tp_size;
    s.kind = ShardKind::kOwned;
    s.owner = per_rank > 0 ? expert / per_rank : 0;
    return s;
  }
  s.kind = ShardKind::kSplit;
  s.dim = kind == Linear::kRow ? 1 : 0;
  s.parts = tp_size;
  s.part = rank;
  if (kind == Linear::kKv && model.num_kv_heads > 0 && model.num_kv_heads < tp_size) {
    // Fewer KV heads than ranks: each head is replicated on tp/kv ranks.
    s.parts = model.num_kv_heads;
    s.part = rank * model.num_kv_heads / tp_size;
  }
  return s;
}

absl::StatusOr<ShardBlock> ShardBlockFor(std::string_view tensor_name, const ShardSpec& spec,
                                         std::span<const int64_t> shape, uint64_t byte_size) {
  ShardBlock b;
  b.rows = shape.empty() ? 1 : shape[0];
  if (b.rows < 0)
    return absl::InvalidArgumentError(absl::StrCat("tensor '", std::string(tensor_name), "' has a negative dimension"));
  b.row_bytes = b.rows == 0 ? 0 : byte_size / static_cast<uint64_t>(b.rows);
  if (b.rows != 0 && b.row_bytes * static_cast<uint64_t>(b.rows) != byte_size) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", std::string(tensor_name), "': ", byte_size,
                                                   " bytes do not divide into ", b.rows, " rows"));
  }
  b.row_begin = 0;
  b.row_end = b.rows;
  b.col_byte_begin = 0;
  b.col_byte_end = b.row_bytes;
  if (spec.kind == ShardKind::kReplicated) return b;
  if (spec.kind == ShardKind::kOwned) {
    b.held = false;  // the caller compares owner with its rank
    return b;
  }
  // A 1-D companion (bias) of a row split is replicated; a row split of a
  // tensor with more than 2 dimensions has no defined meaning here.
  if (spec.dim == 1 && shape.size() < 2) return b;
  if (spec.dim == 1 && shape.size() > 2) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", std::string(tensor_name), "' has ", shape.size(),
                                                   " dimensions; the row-parallel rule splits 2-D tensors only"));
  }
  if (spec.parts <= 0 || spec.part < 0 || spec.part >= spec.parts) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", std::string(tensor_name), "': part ", spec.part, " of ", spec.parts));
  }
  if (spec.dim == 0) {
    if (b.rows % spec.parts != 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", std::string(tensor_name), "' has ", b.rows,
                                                     " rows, which do not split into ", spec.parts,
                                                     " equal parts; use a tp size that divides them"));
    }
    const int64_t per = b.rows / spec.parts;
    b.row_begin = spec.part * per;
    b.row_end = b.row_begin + per;
    return b;
  }
  if (shape[1] % spec.parts != 0 || b.row_bytes % static_cast<uint64_t>(spec.parts) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", std::string(tensor_name), "' has rows of ", b.row_bytes,
                                                   " bytes (", shape[1], " columns), which do not split into ",
                                                   spec.parts, " equal column parts; use a tp size that divides them"));
  }
  const uint64_t per = b.row_bytes / static_cast<uint64_t>(spec.parts);
  b.col_byte_begin = static_cast<uint64_t>(spec.part) * per;
  b.col_byte_end = b.col_byte_begin + per;
  return b;
}

}  // namespace crashreplay
