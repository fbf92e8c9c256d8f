// A Model's weights as an executor reads them.
//
// ExecMemory   allocations in one executor, freed together.
// DeviceModel  the per-rank view arrays the ops read (ops.h: LinearShardView,
//              ExpertView, QWeight), built over a Model's shards. On an
//              executor whose memory is host memory (the CPU executor:
//              Executor::host_visible()) the views point at the Model's own
//              bytes: nothing is copied, so a CPU replay holds each weight
//              once. On the CUDA executor the data, scales, biases and norms
//              are uploaded to device memory.
//
// Layer streaming (UploadStreaming): the per-layer view arrays are allocated
// once, at fixed addresses (the lowered ops point at them), holding empty
// views; Hold(l) makes layer l's weights resident (the host Model's
// LoadLayerWeights when the host streams too, then an upload of that layer
// alone on the CUDA executor) and writes its views into the arrays, after
// releasing the layer held before. Norms, routers, the embedding and
// lm_head stay resident. StepProgram calls Hold before each kernel of a
// layer, so one layer's weights are resident at a time.
//
// Ownership: a DeviceModel owns what it allocated in the executor (views,
// uploads) and frees it on destruction; the executor must outlive it. It
// borrows the Model, which must outlive it too (the CPU views point into
// it). Not thread-safe.
// Errors: the executor's (executor.h): ResourceExhausted when device memory
// runs out, Internal for other device errors.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "crashreplay/replay/kernels/executor.h"
#include "crashreplay/replay/model/model.h"

namespace crashreplay::replay {

class ExecMemory {
 public:
  explicit ExecMemory(Executor* exec) : exec_(exec) {}
  ~ExecMemory();
  ExecMemory(const ExecMemory&) = delete;
  ExecMemory& operator=(const ExecMemory&) = delete;
  absl::StatusOr<void*> Alloc(size_t bytes);
  absl::StatusOr<void*> Copy(const void* host, size_t bytes);
  template <typename T>
  absl::StatusOr<T*> Copy(const std::vector<T>& v) {
    auto p = Copy(v.data(), v.size() * sizeof(T));
    if (!p.ok()) return p.status();
    return static_cast<T*>(*p);
  }
  // `host` itself when the executor reads host memory (no copy), else an
  // upload owned by this object.
  absl::StatusOr<const void*> Share(const void* host, size_t bytes);
  template <typename T>
  absl::StatusOr<const T*> Share(const std::vector<T>& v) {
    auto p = Share(v.data(), v.size() * sizeof(T));
    if (!p.ok()) return p.status();
    return static_cast<const T*>(*p);
  }
  Executor* exec() const { return exec_; }
  // Bytes allocated so far (Alloc, Copy, and Share where it copied).
  uint64_t bytes() const { return bytes_; }

 private:
  Executor* exec_;
  std::vector<void*> owned_;
  uint64_t bytes_ = 0;
};

class DeviceModel {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceModel>> Upload(const Model& model, Executor* exec);
  // Layer streaming over `model` (which may itself stream: Model::streaming()).
  static absl::StatusOr<std::unique_ptr<DeviceModel>> UploadStreaming(Model& model, Executor* exec);

  struct LayerViews {
    const float *input_norm = nullptr, *post_norm = nullptr, *q_norm = nullptr, *k_norm = nullptr;
    const LinearShardView *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;  // [ranks]
    const LinearShardView *gate = nullptr, *up = nullptr, *down = nullptr;         // [ranks]
    bool moe = false;
    QWeight router;
    const float* router_bias = nullptr;   // gpt_oss
    const float* correction_bias = nullptr;
    const float* sinks = nullptr;         // gpt_oss: [num_attention_heads] attention sinks
    const ExpertView* experts = nullptr;  // [ranks, expert_stride]
    const int32_t* local_count = nullptr;
    const int64_t* expert_begin = nullptr;
    int64_t expert_stride = 0;
    bool has_shared = false;
    const ExpertView* shared = nullptr;  // [ranks]
    int64_t shared_inter = 0;
    // MLA: kv_b_proj per rank; the replicated projections as one-element
    // arrays (they run once, for every rank); null where the model has none.
    const LinearShardView* kv_b = nullptr;  // [ranks]
    const LinearShardView *q_a = nullptr, *kv_a = nullptr;
    const float *q_a_norm = nullptr, *kv_a_norm = nullptr;
    const LinearShardView *index_wq_b = nullptr, *index_wk = nullptr, *index_weights = nullptr;
    const float *index_k_norm = nullptr, *index_k_norm_bias = nullptr;
  };

  const Model& model() const { return *model_; }
  Executor* exec() const { return mem_.exec(); }
  const std::vector<LayerViews>& layers() const { return layers_; }
  QWeight embed() const { return embed_; }
  const float* final_norm() const { return final_norm_; }
  const LinearShardView* lm_head() const { return lm_head_; }
  // The weight format of the shards behind a view array of this object (its
  // layers' projections, lm_head), known on the host; kF32 for another pointer.
  WFormat FormatOf(const LinearShardView* views) const;
  const float* inv_freq() const { return inv_freq_; }
  // Weight bytes this object copied into the executor and holds for the
  // whole run (0 on the CPU; streaming: the resident part).
  uint64_t uploaded_bytes() const { return uploaded_; }

  bool streaming() const { return streaming_; }
  // Streaming: makes layer `l`'s weights resident, releasing the previous
  // one; l < 0 releases only. No-op without streaming or when `l` is held.
  // Errors: the host Model's LoadLayerWeights, the executor's.
  absl::Status Hold(int64_t l);
  int64_t held() const { return held_; }
  // Streaming: the most weight bytes one layer uploaded (0 on the CPU).
  uint64_t layer_upload_peak() const { return layer_peak_; }

 private:
  explicit DeviceModel(Executor* exec) : mem_(exec) {}
  // One layer's view arrays as host vectors, in Arrays()'s fixed order.
  struct LayerArrays;
  static absl::StatusOr<std::unique_ptr<DeviceModel>> Make(const Model& model, Executor* exec, bool stream);
  absl::StatusOr<QWeight> Weight(ExecMemory& mem, const QWeight& w, size_t data_bytes, size_t scale_bytes);
  absl::StatusOr<LinearShardView> Shard(ExecMemory& mem, const LinearShard& s);
  absl::StatusOr<const float*> Floats(const std::vector<float>& v);
  // `fill`: the views point at the weights (uploaded into `mem`); else they
  // are empty, of the same count (a streamed layer not held).
  absl::StatusOr<LayerArrays> Arrays(const Layer& L, ExecMemory& mem, int64_t stride, bool fill);

  ExecMemory mem_;
  const Model* model_ = nullptr;
  bool streaming_ = false;
  Model* host_ = nullptr;                       // streaming: the model whose layers Hold loads
  std::vector<std::vector<void*>> slots_;       // streaming: per layer, the arrays (Arrays() order; null: none)
  std::vector<int64_t> strides_;                // per layer, experts per rank in the experts array
  std::unique_ptr<ExecMemory> layer_mem_;       // streaming: the held layer's uploads
  int64_t held_ = -1;
  uint64_t layer_peak_ = 0;
  std::vector<LayerViews> layers_;
  QWeight embed_;
  const float* final_norm_ = nullptr;
  const LinearShardView* lm_head_ = nullptr;
  std::map<const void*, WFormat> formats_;  // view array -> its shards' format
  const float* inv_freq_ = nullptr;
  uint64_t uploaded_ = 0;
};

}  // namespace crashreplay::replay
