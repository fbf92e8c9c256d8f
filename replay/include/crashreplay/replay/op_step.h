// One engine step lowered to ops (ops.h) on any Executor: the same kernel
// list as StepProgram (step.h; same names, layers, order, work items and
// bodies), with the weights, KV cache and activations in the executor's
// memory. This is how a step runs on the CUDA backend; on the CPU executor
// it produces the same bits as StepProgram, which the tests pin down.
//
// DeviceModel  copies a Model's weight shards (data, scales, biases, norms,
//              RoPE table) into an executor and builds the per-rank view
//              arrays the ops read.
// DeviceKv     the paged KV cache of every layer and rank, zero-filled.
// OpStep       the kernel list for one StepInput; RunNext/RunAll launch it.
//              With watch on, every kernel's output buffers are read back and
//              hashed (XXH3-128, as StepProgram's records), which synchronizes.
//
// Ownership: each object owns what it allocated in the executor and frees it
// on destruction; the executor must outlive them, the model must outlive the
// DeviceModel only while it is being built. Not thread-safe.
// Errors: the executor's (executor.h); a fired check is Aborted with
// executor.fault() naming the kernel.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "crashreplay/formats/hash.h"
#include "crashreplay/replay/executor.h"
#include "crashreplay/replay/model.h"
#include "crashreplay/replay/step.h"
#include "crashreplay/replay/toggles.h"

namespace crashreplay::replay {

// Allocations in one executor, freed together.
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
  Executor* exec() const { return exec_; }

 private:
  Executor* exec_;
  std::vector<void*> owned_;
};

class DeviceModel {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceModel>> Upload(const Model& model, Executor* exec);

  struct LayerViews {
    const float *input_norm = nullptr, *post_norm = nullptr, *q_norm = nullptr, *k_norm = nullptr;
    const LinearShardView *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;  // [ranks]
    const LinearShardView *gate = nullptr, *up = nullptr, *down = nullptr;         // [ranks]
    bool moe = false;
    QWeight router;
    const float* correction_bias = nullptr;
    const ExpertView* experts = nullptr;  // [ranks, expert_stride]
    const int32_t* local_count = nullptr;
    const int64_t* expert_begin = nullptr;
    int64_t expert_stride = 0;
    bool has_shared = false;
    const ExpertView* shared = nullptr;  // [ranks]
    int64_t shared_inter = 0;
  };

  const Model& model() const { return *model_; }
  const std::vector<LayerViews>& layers() const { return layers_; }
  QWeight embed() const { return embed_; }
  const float* final_norm() const { return final_norm_; }
  const LinearShardView* lm_head() const { return lm_head_; }
  const float* inv_freq() const { return inv_freq_; }
  uint64_t bytes() const { return bytes_; }

 private:
  explicit DeviceModel(Executor* exec) : mem_(exec) {}
  absl::StatusOr<QWeight> Weight(const QWeight& w, size_t data_bytes, size_t scale_bytes);
  absl::StatusOr<LinearShardView> Shard(const LinearShard& s);
  absl::StatusOr<const LinearShardView*> Ranks(const std::vector<LinearShardView>& v);

  ExecMemory mem_;
  const Model* model_ = nullptr;
  std::vector<LayerViews> layers_;
  QWeight embed_;
  const float* final_norm_ = nullptr;
  const LinearShardView* lm_head_ = nullptr;
  const float* inv_freq_ = nullptr;
  uint64_t bytes_ = 0;
};

class DeviceKv {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceKv>> Create(const Model& model, const EngineConfig& config,
                                                          int64_t pages, Executor* exec);
  // [ranks] views of one layer, in executor memory.
  const KvPoolView* views(int64_t layer) const { return views_[layer]; }
  int64_t pages() const { return pages_; }

 private:
  explicit DeviceKv(Executor* exec) : mem_(exec) {}
  ExecMemory mem_;
  std::vector<const KvPoolView*> views_;
  int64_t pages_ = 0;
};

struct OpKernel {
  std::string name;
  int layer = -1;
  std::vector<std::string> outputs;
  std::vector<Op> ops;
  std::string Label() const { return layer >= 0 ? "L" + std::to_string(layer) + "." + name : name; }
};

class OpStep {
 public:
  static absl::StatusOr<std::unique_ptr<OpStep>> Build(const DeviceModel& model, const EngineConfig& config,
                                                        DeviceKv* kv, Executor* exec, const StepInput& input);

  const std::vector<OpKernel>& kernels() const { return kernels_; }
  size_t next() const { return next_; }
  bool done() const { return next_ >= kernels_.size(); }
  void set_watch(bool on) { watch_ = on; }

  absl::Status RunNext();
  absl::Status RunAll();
  // Output digests of the kernels run so far with watch on (else empty).
  const std::vector<Hash128>& digests() const { return digests_; }

  // Reads an activation buffer back to the host.
  absl::StatusOr<std::vector<float>> ReadFloats(const std::string& name) const;
  absl::StatusOr<std::vector<int32_t>> ReadInts(const std::string& name) const;
  absl::StatusOr<Hash128> BufferDigest(const std::string& name) const;
  // Overwrites a buffer (the GPU parity tests feed every kernel the CPU's
  // inputs this way); the size must match.
  absl::Status WriteFloats(const std::string& name, const std::vector<float>& v);
  absl::Status WriteInts(const std::string& name, const std::vector<int32_t>& v);
  // Byte buffers: NVFP4-quantized activations (values, scales).
  absl::StatusOr<std::vector<uint8_t>> ReadBytes(const std::string& name) const;
  absl::Status WriteBytes(const std::string& name, const std::vector<uint8_t>& v);
  bool IsIntBuffer(const std::string& name) const;
  bool IsBytesBuffer(const std::string& name) const;
  // XXH3-128 of the logits then the sampled tokens, as StepProgram::Digest.
  absl::StatusOr<Hash128> Digest() const;

 private:
  struct Buf {
    void* p = nullptr;
    int64_t count = 0;      // elements: 4-byte words, or bytes when is_bytes
    bool is_int = false;
    bool is_bytes = false;
    size_t size() const { return static_cast<size_t>(count) * (is_bytes ? 1 : 4); }
  };
  explicit OpStep(Executor* exec) : exec_(exec), mem_(exec) {}
  absl::Status Lower(const DeviceModel& dm, const EngineConfig& cfg, DeviceKv* kv, const StepInput& in);
  absl::StatusOr<Buf*> Alloc(const std::string& name, int64_t count, bool is_int = false, bool is_bytes = false);
  float* F(const std::string& name) { return static_cast<float*>(bufs_[name].p); }
  int32_t* I(const std::string& name) { return static_cast<int32_t*>(bufs_[name].p); }
  uint8_t* U8(const std::string& name) { return static_cast<uint8_t*>(bufs_[name].p); }

  Executor* exec_;
  ExecMemory mem_;
  std::map<std::string, Buf> bufs_;
  std::vector<OpKernel> kernels_;
  std::vector<Hash128> digests_;
  size_t next_ = 0;
  bool watch_ = false;
};

}  // namespace crashreplay::replay
