// A model as the engine runs it: every rank's weight shards, converted for the
// configuration's scale format, plus the RoPE table.
//
// BuildModel shards the HF tensors by tensor-parallel rank: q/k/v, gate/up and
// lm_head are column parallel (split along the output rows; KV heads are
// replicated when there are fewer than ranks), o_proj and down_proj are row
// parallel (split along the input columns, each rank computing a partial sum
// that the engine all-gathers and sums in rank order). Experts are either
// split along their intermediate dimension (moe_parallel=tensor) or assigned
// whole to ranks (moe_parallel=expert). Embeddings, norms and the router are
// replicated.
//
// Ownership: the Model owns every byte its QWeight views point into; it is
// move-only and must not be copied. Errors: InvalidArgument for a checkpoint
// that cannot be sharded as asked (naming the tensor and dimension),
// NotFound for a missing tensor, DataLoss for a tensor whose size does not
// match its shape.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "crashreplay/formats/hash.h"
#include "crashreplay/replay/config/toggles.h"
#include "crashreplay/replay/kernels/linear.h"
#include "crashreplay/replay/model/model_spec.h"
#include "crashreplay/replay/model/tensor_bytes.h"

namespace crashreplay::replay {

struct ShardHash {
  Hash128 hash;
  uint64_t bytes = 0;
  friend bool operator==(const ShardHash&, const ShardHash&) = default;
};

// data and scales view the checkpoint's mapping (and keep it alive) where
// nothing rewrites them: a whole tensor, a row range of a split along dim 0,
// or (data only) a column range of a split along dim 1, read in place with
// w.row_stride set to the full tensor's width; `data` then spans from the
// shard's first element to its last, other ranks' columns between. A tensor
// made in memory, a column split's scales and a scale_format conversion own
// their bytes.
struct LinearShard {
  QWeight w;                    // views data/scales below
  TensorBytes data;
  TensorBytes scales;
  std::vector<float> bias;      // empty: no bias
  bool nvfp4 = false;           // e2m1 weight with e4m3 block scales in the checkpoint
  // The shard's own weight bytes (for a strided view, less than data.size()).
  size_t data_bytes() const;
  size_t bytes() const { return data_bytes() + scales.size() + bias.size() * 4; }
};

// True when w's rows lie further apart than its width: a column split read
// in place.
inline bool StridedRows(const QWeight& w) { return w.row_stride > 0 && w.row_stride != w.cols; }
// The weight's rows packed densely (row_stride cols), as the capture side
// hashed the shard: for uploads to an executor that cannot read host memory.
std::vector<uint8_t> DenseRows(const QWeight& w);
// Bytes of one row of `cols` elements (whole bytes: rows of a strided e2m1
// view start on a byte).
uint64_t RowStorageBytes(WFormat f, int64_t cols);
// A strided shard's rows copied into bytes of its own (row_stride 0): for
// transforms that rewrite the weight in place.
void CompactRows(LinearShard* s);

struct ExpertShard {
  LinearShard gate, up, down;
};

struct RankLayer {
  // GQA: q/k/v/o_proj. MLA: q is q_b_proj (or q_proj without q_lora), o is
  // o_proj, k and v are empty and kv_b is kv_b_proj, all split by heads.
  LinearShard q, k, v, o;
  LinearShard kv_b;
  LinearShard gate, up, down;       // dense MLP
  std::vector<ExpertShard> experts; // moe: local experts (all, sliced, in tensor mode)
  int64_t expert_begin = 0;         // global id of experts[0]
  bool has_shared = false;
  ExpertShard shared;
};

// MLA's and the DSA indexer's weights that every rank holds whole (they are
// computed once per token: q_a_proj and kv_a_proj_with_mqa, the indexer).
struct MlaLayer {
  LinearShard q_a, kv_a;                     // q_a empty without q_lora
  std::vector<float> q_a_norm, kv_a_norm;
  bool has_indexer = false;                  // DSA layer running its own indexer
  LinearShard index_wq_b, index_wk, index_weights;
  std::vector<float> index_k_norm, index_k_norm_bias;
};

struct Layer {
  std::vector<float> input_norm, post_norm, q_norm, k_norm;
  MlaLayer mla;
  bool moe = false;
  LinearShard router;               // [experts, hidden], replicated (gpt_oss: with its bias)
  std::vector<float> sinks;         // gpt_oss: [num_attention_heads] attention sinks, replicated
  std::vector<float> correction_bias;
  std::vector<RankLayer> ranks;
};

struct RopeTable {
  std::vector<float> inv_freq;  // rotary_dim / 2
  int64_t rotary_dim = 0;
  float mscale = 1.0f;          // YaRN attention factor on cos/sin
  RopeSpec used;                // what the engine read
  bool from_default = false;    // the selected config form was absent
};

// Which RoPE the engine uses for `spec` under the rope_config toggle:
// kCheckpoint reads the file as transformers 5 does (spec.FileRope());
// kLegacy / kRopeParameters read only that form, falling back to the
// defaults (theta 10000, no scaling) when the file lacks it, as an engine
// that knows only those keys does. `note` is non-empty when what is used
// differs from what some key present in the file says: the toggle made the
// engine ignore keys that matter, or the file's two forms disagree.
struct RopeChoice {
  RopeSpec rope;
  bool from_default = false;
  std::string note;
};
RopeChoice ChooseRope(const ModelSpec& spec, RopeConfig toggle);

struct LayerStream;  // model_builder.cc

struct Model {
  ModelSpec spec;
  int tp = 1;
  int64_t heads_local = 0, kv_heads_local = 0, intermediate_local = 0, moe_intermediate_local = 0;
  int64_t vocab_local = 0;
  LinearShard embed;                    // full table, replicated
  std::vector<float> final_norm;
  std::vector<LinearShard> lm_head;     // per rank, rows [r*vocab_local, ...)
  std::vector<Layer> layers;
  RopeTable rope;
  DotKind dense_dot = DotKind::kDequant;
  DotKind moe_dot = DotKind::kDequant;
  // Per rank: tensor name -> XXH3-128 of the rank's shard bytes and their
  // count, as formats/sharding.h cuts them (the capture side's definition).
  std::vector<std::map<std::string, ShardHash>> shard_hashes;
  std::vector<uint64_t> rank_weight_bytes;
  // What the build decided that the user should know (the RoPE choice when
  // it ignores keys the file has, ...): `run` and `replay` print each on
  // stderr as "note: ..." and list them under "notes" in --json.
  std::vector<std::string> notes;
  // Layer streaming (BuildOptions::stream): set when the layers' weights are
  // not resident (see LoadLayerWeights).
  std::shared_ptr<LayerStream> stream;
  bool streaming() const { return stream != nullptr; }
};

// stream: layer streaming. Every layer is built once (read, sharded,
// hashed: shard_hashes and rank_weight_bytes are complete as without
// streaming), then its streamed shards (every LinearShard of its RankLayers
// and of its MlaLayer) release their bytes, keeping shape, format and
// activation scale; norms, routers, biases, the embedding, final norm and
// lm_head stay resident. LoadLayerWeights brings one layer's shards back.
// With deferred tensors (checkpoint_io.h LoadOptions) a released layer
// holds no mapping at all, so peak memory is the resident part plus one
// layer's shards.
//
// hash: false leaves shard_hashes empty and reads no weight at build (make-model's
// calibration, which compares no hashes); the model computes the same bits.
struct BuildOptions {
  bool stream = false;
  bool hash = true;
};

absl::StatusOr<std::unique_ptr<Model>> BuildModel(const ModelSpec& spec, const TensorSet& tensors,
                                                  const EngineConfig& config, BuildOptions options = {});

// Layer streaming: makes layer `l`'s streamed shards resident, releasing the
// layer loaded before (l < 0: releases it only); a no-op on a model built
// without streaming or when `l` is already loaded. The layer is built again
// from the checkpoint, exactly as BuildModel built it, without hashing it
// again (that would read all of a layer's experts when a decode step uses a
// few); a shard file whose size or modification time changed since it was
// opened is DataLoss naming the file and tensor (the checkpoint changed
// during the replay). Other errors as BuildModel's (address space
// exhausted: ResourceExhausted).
absl::Status LoadLayerWeights(Model& model, int64_t l);
// Drops layer `l`'s streamed shards (no-op without streaming).
void ReleaseLayerWeights(Model& model, int64_t l);

// Checks the model's per-rank shard hashes against recorded ones (a capture
// manifest's). DataLoss naming the rank, tensor and both hashes on the first
// mismatch; FailedPrecondition when the rank counts differ (the recording used
// another tp_size); NotFound for a recorded tensor the model lacks.
absl::Status VerifyShardHashes(const Model& model, const std::vector<std::map<std::string, Hash128>>& recorded);

// inv_freq and attention factor for default/linear/llama3/yarn RoPE.
RopeTable ComputeRope(const RopeSpec& rope, int64_t head_dim, double partial_rotary_factor);

}  // namespace crashreplay::replay
