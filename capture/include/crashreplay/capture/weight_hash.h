// Weight-shard hashes: what each tensor-parallel rank holds, as hashes.
//
// Definitions (docs/capture.md "Weight hashes" is normative):
//   tensor hash = XXH3-128 (seed 0) of the rank's shard bytes: the tensor's
//     rows/columns the sharding rule (formats/sharding.h) gives the rank,
//     laid out row-major and contiguous, exactly what the rank would hold;
//     a replicated tensor hashes its whole bytes.
//   rank root   = XXH3-128 of, for each tensor in byte-wise ascending name
//     order: LE64(len(name)) || name bytes || hash.high as LE64 ||
//     hash.low as LE64 || LE64(shard byte size).
// Tensors a rank does not hold (another rank's experts) are not listed.
// The hashes are independent of the thread count: each tensor is hashed
// whole by one thread, and the root is computed in name order.
//
// Thread safety: the functions are reentrant; they start and join their own
// worker threads. Errors: NotFound/DataLoss from the checkpoint reader,
// InvalidArgument for a tensor the rule cannot split (naming it) or a
// malformed view.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "crashreplay/capture/recorder.h"
#include "crashreplay/formats/capture_records.h"
#include "crashreplay/formats/sharding.h"

namespace crashreplay::capture {

// The rank root over `tensors` (sorted here; the input order is free).
Hash128 WeightRoot(std::vector<TensorHash>* tensors);

// threads <= 0: hardware concurrency (capped at 16).
struct HashOptions {
  int threads = 0;
};

// Hashes one rank's in-memory tensors as they are (already sharded: DLPack
// from the engine's own parameters). Result sorted by name, root set.
absl::StatusOr<WeightShardHashes> HashTensors(uint32_t rank, std::span<const TensorView> tensors,
                                              const HashOptions& options = {});

// Reads `config.json` of a checkpoint directory for the sharding rules
// (num_key_value_heads, num_local_experts / num_experts / n_routed_experts).
// A missing config.json gives the defaults (K/V split like Q, dense).
absl::StatusOr<ShardingModel> ReadShardingModel(const std::string& checkpoint_dir, bool expert_parallel);

// Hashes every rank's shard of a safetensors checkpoint directory for
// tp_size ranks. Result: one entry per rank, rank order.
absl::StatusOr<std::vector<WeightShardHashes>> HashCheckpoint(const std::string& checkpoint_dir, int64_t tp_size,
                                                              const ShardingModel& model,
                                                              const HashOptions& options = {});

}  // namespace crashreplay::capture
