// What a part of the model builder outside model_builder.cc (mla_builder.cc)
// needs from it: loading one rank's shard of a linear layer, a vector, and
// an NVFP4 group's input scale, with the shard hashing and byte accounting
// BuildModel does for every tensor. Private to replay/src.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "crashreplay/replay/model/model.h"

namespace crashreplay::replay {

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // Rank `rank`'s shard of `base`.weight (with its scales and bias), cut by
  // formats/sharding.h's rule for the name; a replicated tensor is whole.
  // Hashes it and counts its bytes for that rank.
  virtual absl::StatusOr<LinearShard> Linear(const std::string& base, int rank) = 0;
  // A 1-D tensor of n elements as floats, hashed for every rank.
  virtual absl::StatusOr<std::vector<float>> Vector(const std::string& name, int64_t n) = 0;
  // The max input_scale over NVFP4 layers that quantize one shared input.
  virtual absl::StatusOr<float> GroupInputScale(const std::vector<std::string>& bases) = 0;
};

// w4a4: the NVFP4 linears of one group (`shards`, named by `bases`) quantize
// their shared input with the group's max input_scale; the others are left
// as they are. (model_builder.cc)
absl::Status SetGroupActivationScale(WeightSource& b, const std::vector<LinearShard*>& shards,
                                     const std::vector<std::string>& bases);

// mla_builder.cc: the MLA attention (and DSA indexer) weights of layer `l`:
// every rank's q (q_b_proj or q_proj), kv_b and o shards into
// layer->ranks[r] (which must exist), and the replicated parts into
// layer->mla. Under w4a4 the NVFP4 ones get their activation scales.
absl::Status LoadMlaAttention(WeightSource& b, const ModelSpec& spec, const EngineConfig& cfg, int64_t l, Layer* layer);

}  // namespace crashreplay::replay
