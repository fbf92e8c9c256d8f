// One engine step (one forward pass over one batch) as an explicit list of
// kernel invocations, run on any executor (executor.h: CPU or CUDA).
//
// StepProgram::Lower turns a batch into the list once (step_lower.cc: the
// one lowering of the engine): each entry has a name ("q_proj"), a layer (-1
// outside the layers), the buffers it writes and the ops (ops.h) it launches.
// Both executors run the same list with the same kernel bodies; they differ
// in how they launch the work, never in what it computes or checks (DESIGN
// decision 8). A caller can list the kernels, run them one at a time, and
// inspect any buffer after any kernel.
//
// The watcher (on by default) reads every kernel's output buffers back to the
// host after it ran (a synchronisation on the GPU), counts NaN/Inf, takes
// min/max/mean|x| and hashes the bytes (XXH3-128); the first kernel whose
// outputs are non-finite is remembered. With the watcher off (CUDA-graph
// capture, benchmarks) nothing is read back. A kernel whose check fires, or a
// device error (out of memory, a sticky CUDA error), yields a Fault and stops
// the step.
//
// Ownership: the program borrows the device model, the KV cache and the
// executor, which must outlive it; it owns its activation buffers (in the
// executor's memory) and, on a GPU, their host copies. Not thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "crashreplay/formats/dtype.h"
#include "crashreplay/formats/fingerprint.h"
#include "crashreplay/formats/hash.h"
#include "crashreplay/replay/config/fault.h"
#include "crashreplay/replay/config/toggles.h"
#include "crashreplay/replay/kernels/attention.h"
#include "crashreplay/replay/kernels/executor.h"
#include "crashreplay/replay/kernels/indexer.h"
#include "crashreplay/replay/kernels/mla.h"
#include "crashreplay/replay/kernels/sampling.h"
#include "crashreplay/replay/model/model.h"
#include "crashreplay/replay/program/device_model.h"

namespace crashreplay::replay {

enum class ForwardMode { kPrefill, kDecode };
const char* ForwardModeName(ForwardMode m);

// One request's part of a batch.
struct StepRow {
  int64_t request_id = 0;
  std::string request_name;         // the capture's id when it is not the number (a UUID, "cmpl-..."); for messages
  std::vector<int32_t> tokens;      // tokens fed this step (prompt, or the last sampled token)
  int64_t start_pos = 0;            // position of tokens[0]
  std::vector<int32_t> page_table;  // logical page -> pool page, covering start_pos + tokens.size()
  SamplingParams sampling;
  uint64_t sample_offset = 0;       // RNG counter for this draw (tokens generated so far)
};

struct StepInput {
  int64_t step = 0;
  ForwardMode mode = ForwardMode::kPrefill;
  std::vector<StepRow> rows;
};

// The paged KV cache of every layer and rank, in an executor's memory
// (zero-filled), as one or more pools of pages. Every pool of a plane has
// the same pages: page p of the pool holds positions p's tokens, so one page
// table addresses them all. Plane `layer * tp + rank` holds one layer of one
// rank. The pools by model:
//   GQA        "k", "v"   [page_size, kv_heads_per_rank, head_dim] bf16 or e4m3;
//   MLA        "latent"   [page_size, kv_lora_rank + qk_rope_head_dim] bf16, or
//                         [page_size, 656]-style bytes under fp8 (kernels/mla.h);
//                         every rank holds the whole latent (heads are split,
//                         the latent is not);
//   DSA        "index_k"  the indexer's keys, only in layers that run their own
//                         indexer (planes = those layers * tp), bf16
//                         [page_size, index_head_dim] or fp8 pages of bytes
//                         (kernels/indexer.h).
class KvCache {
 public:
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(const Model& model, const EngineConfig& config, int64_t pages,
                                                         Executor* exec);
  // One pool, as the snapshot reads and writes it.
  struct Pool {
    std::string name;                 // "k", "v", "latent", "index_k"
    DType dtype = DType::kBF16;       // element type of `page_shape` (U8 for byte layouts)
    std::vector<int64_t> page_shape;  // one page of one plane
    size_t page_bytes = 0;
    std::vector<uint8_t*> planes;     // executor memory, [pages * page_bytes] each
    // Planes that hold the same bytes: plane g * replicas + r for r < replicas
    // (MLA's latent and DSA's index keys: every rank holds the whole, so
    // replicas = tp); 1 where each plane is its own (GQA's head-split K/V).
    int replicas = 1;
  };

  // [ranks] views of one layer, in executor memory (what the ops read):
  // GQA models' K/V, MLA models' latent, DSA layers' index keys (null where
  // the layer has none).
  const KvPoolView* views(int64_t layer) const { return views_.empty() ? nullptr : views_[layer]; }
  const LatentPoolView* latent_views(int64_t layer) const {
    return latent_views_.empty() ? nullptr : latent_views_[layer];
  }
  const IndexPoolView* index_views(int64_t layer) const { return index_views_.empty() ? nullptr : index_views_[layer]; }
  int64_t pages() const { return pages_; }
  int page_size() const { return page_size_; }
  bool fp8() const { return fp8_; }
  const std::vector<Pool>& pools() const { return pools_; }
  // The bytes of `pages` of every pool (plane-major, then page order; the
  // snapshot layout), one vector per pool. Page ids must be < pages().
  absl::Status CopyPages(const std::vector<int32_t>& pages, std::vector<std::vector<uint8_t>>* out) const;
  // The inverse of CopyPages; the caller checked ids and sizes.
  absl::Status WritePages(const std::vector<int32_t>& pages, const std::vector<std::vector<uint8_t>>& in);

 private:
  explicit KvCache(Executor* exec) : mem_(exec) {}
  absl::StatusOr<uint8_t*> NewPlane(Pool* pool);
  ExecMemory mem_;
  int64_t pages_ = 0;
  int page_size_ = 16;
  bool fp8_ = false;
  std::vector<Pool> pools_;
  std::vector<const KvPoolView*> views_;
  std::vector<const LatentPoolView*> latent_views_;
  std::vector<const IndexPoolView*> index_views_;
};

// An activation buffer as the host reads it. On an executor whose memory is
// host memory (the CPU) it is a view of that memory: no copy, always the
// buffer's current contents. Elsewhere (a GPU) it views a host copy the
// program owns, refreshed by the watcher after every kernel that writes the
// buffer (as of the last such kernel; zeros while the watcher is off).
// Valid while the program lives.
struct Buffer {
  bool is_int = false;
  // Raw bytes: NVFP4-quantized activations (packed e2m1 values, e4m3 block
  // scales; kernels/act_quant.h). Hashed like the others; no value statistics.
  bool is_bytes = false;
  std::vector<int64_t> shape;
  // The elements, through the span of the buffer's kind (the others empty).
  std::span<const float> f;
  std::span<const int32_t> i;
  std::span<const uint8_t> u8;
  const void* data() const {
    return is_bytes ? static_cast<const void*>(u8.data()) : is_int ? static_cast<const void*>(i.data()) : f.data();
  }
  size_t bytes() const { return is_bytes ? u8.size() : is_int ? i.size() * 4 : f.size() * 4; }
};

// A named point of the step whose tensor is fingerprinted after the kernel
// that finishes it (boundaries.cc; docs/replay.md "Boundaries"): the names
// are the ones engines' fingerprints use ("L3.attention", "L3.mlp",
// "lm_head"), so a capture's records line up with the replay's.
struct Boundary {
  // How the buffer maps onto the engine's [tokens, columns] tensor:
  // kTokens as it is; kRankConcat [ranks, tokens, c] -> [tokens, ranks * c]
  // (heads split over ranks); kRankSum [ranks, tokens, c] summed over ranks
  // in rank order (a row-parallel projection before its all-reduce); kRank0
  // rank 0's [tokens, c] (a replicated result).
  enum class Layout { kTokens, kRankConcat, kRankSum, kRank0 };
  std::string name;
  std::string buffer;
  Layout layout = Layout::kTokens;
};

struct KernelCall {
  std::string name;
  int layer = -1;
  std::vector<std::string> outputs;  // activation buffers it writes (the KV cache is not one)
  int64_t tokens_per_rank = 0;       // > 0: work items are rank * tokens_per_rank + token
  std::vector<Op> ops;
  std::string library;               // the library kernel it stands for (kernel_archs.h); empty: none named
  std::vector<Boundary> boundaries;  // fingerprinted after it ran (watcher on)
  std::string Label() const { return layer >= 0 ? "L" + std::to_string(layer) + "." + name : name; }
};

struct KernelRecord {
  std::string label;
  std::string name;
  int layer = -1;
  int64_t nan = 0;
  int64_t inf = 0;
  int64_t numel = 0;
  double min = 0, max = 0, mean_abs = 0, max_abs = 0;
  Hash128 digest;  // of all output buffers' bytes, in output order (watcher on)
  double micros = 0;
  bool failed = false;
  std::vector<std::string> checks;  // KernelChecks of the kernel
};

// The names of the checks (kernels/check.h) kernel `k`'s ops can fire with
// their parameters, in first-seen order (replay/program/src/kernel_checks.cc).
std::vector<std::string> KernelChecks(const KernelCall& k);

nlohmann::json KernelRecordToJson(const KernelRecord& r);

class StepProgram {
 public:
  // Lowers `input` for `model` (on model.exec()) and allocates its buffers.
  // Never null: when the executor cannot allocate the buffers, the program
  // has no kernels and fault() holds an "oom" (or "error") fault.
  static std::unique_ptr<StepProgram> Lower(const DeviceModel& model, const EngineConfig& config, KvCache* kv,
                                            StepInput input);

  // A program that cannot run: no kernels, `fault` (the engine has no device
  // model or cache, e.g. its memory plan failed).
  static std::unique_ptr<StepProgram> Failed(Executor* exec, StepInput input, Fault fault);

  const std::vector<KernelCall>& kernels() const { return kernels_; }
  size_t next() const { return next_; }
  bool done() const { return next_ >= kernels_.size() || fault_.has_value(); }
  void set_watch(bool on) { watch_ = on; }
  // Fingerprints of the boundaries (on by default, with the watcher): off
  // for a step run only to rebuild state (replay's earlier steps), whose
  // fingerprints nobody compares: each is an fp64 pass over its tensor.
  void set_fingerprints(bool on) { fingerprint_ = on; }
  // Layer streaming: before each kernel, `model` (the device model the
  // program was lowered for) is made to hold the kernel's layer (-1: none),
  // after the device finished the kernels before it. A layer that cannot be
  // loaded is a fault of class "oom" (ResourceExhausted) or "error", stage
  // "load", kernel "layer_weights".
  void set_streaming(DeviceModel* model) { stream_ = model; }

  // Runs the next kernel; returns its fault if a check fired or the device
  // failed.
  std::optional<Fault> RunNext();
  // Runs the remaining kernels until a fault or the end, then synchronizes.
  std::optional<Fault> RunAll();
  // The executor's status of the failure (OK while none): Aborted for a
  // fired check, ResourceExhausted, Internal for other device errors.
  const absl::Status& status() const { return status_; }

  const std::vector<KernelRecord>& records() const { return records_; }
  // An activation buffer as the host reads it (null for an unknown name).
  const Buffer* buffer(const std::string& name) const;
  const std::map<std::string, Buffer>& buffers() const { return mirror_; }
  // The fingerprints of the boundaries whose kernels ran (watcher on), in
  // run order (formats/fingerprint.h), values as stored (activation_dtype).
  const std::vector<crashreplay::Fingerprint>& fingerprints() const { return fingerprints_; }
  // The first kernel whose outputs held a NaN or Inf ("" if none).
  const std::string& first_nonfinite() const { return first_nonfinite_; }
  const std::optional<Fault>& fault() const { return fault_; }
  const StepInput& input() const { return input_; }
  // The executor memory the step allocated: its activation buffers, the
  // batch's tables and the ops' views (the KV cache and weights are not
  // the step's). On the CPU the fast launchers' scratch comes on top
  // (cpu_kernels.h: at most CpuScratchBytes()).
  uint64_t activation_bytes() const { return mem_.bytes(); }

  // Sampled token per row (after the sampler ran).
  std::vector<int32_t> SampledTokens() const;
  // XXH3-128 of the step's outputs: the logits, then the sampled tokens.
  Hash128 Digest() const;

  // Device-level access (the GPU parity tests feed every kernel the CPU's
  // inputs this way): reads an activation buffer from executor memory, or
  // overwrites it (the size must match).
  absl::StatusOr<std::vector<float>> ReadFloats(const std::string& name) const;
  absl::StatusOr<std::vector<int32_t>> ReadInts(const std::string& name) const;
  absl::StatusOr<std::vector<uint8_t>> ReadBytes(const std::string& name) const;
  absl::Status WriteFloats(const std::string& name, const std::vector<float>& v);
  absl::Status WriteInts(const std::string& name, const std::vector<int32_t>& v);
  absl::Status WriteBytes(const std::string& name, const std::vector<uint8_t>& v);
  bool IsIntBuffer(const std::string& name) const;
  bool IsBytesBuffer(const std::string& name) const;

 private:
  struct Buf {
    void* p = nullptr;
    std::vector<int64_t> shape;
    int64_t count = 0;  // elements: 4-byte words, or bytes when is_bytes
    bool is_int = false;
    bool is_bytes = false;
    size_t size() const { return static_cast<size_t>(count) * (is_bytes ? 1 : 4); }
  };
  explicit StepProgram(Executor* exec, StepInput input) : exec_(exec), mem_(exec), input_(std::move(input)) {}
  absl::Status Build(const DeviceModel& dm, const EngineConfig& cfg, KvCache* kv);  // step_lower.cc
  void NameLibraries(const EngineConfig& cfg, const ModelSpec& spec);
  void StoreActivations(ActivationDType dtype);
  void AssignBoundaries();                                          // boundaries.cc
  crashreplay::Fingerprint Summarize(const Boundary& b) const;      // boundaries.cc
  std::optional<Fault> ArchFault(const KernelCall& k) const;
  std::optional<Fault> SlotFault(const KernelCall& k) const;
  // The lowering's pieces (step_lower.cc; MLA/DSA attention in step_lower_mla.cc).
  struct Lowering;  // step_lower_internal.h
  LinearOp MakeLinear(const Lowering& c, const LinearShardView* shards, DotKind dot, const std::string& x,
                      bool per_rank, const std::string& y, int64_t tokens, int64_t rows, int64_t cols,
                      const std::string& fp4 = "", int ranks = 0);
  RmsNormOp MakeNorm(const Lowering& c, const std::string& x, const float* w, const std::string& out, int64_t rows,
                     int64_t n);
  absl::StatusOr<std::string> ActQuant(const std::string& name, int layer, const LinearShard* first,
                                       const std::string& x, int64_t rows, int64_t cols, int64_t tpr,
                                       const std::string& out);
  absl::Status AddProjection(const Lowering& c, int layer, const std::string& name, const LinearShard* first,
                             const LinearShardView* shards, DotKind dot, const std::string& x, bool per_rank,
                             const std::string& y, int64_t tokens, int64_t rows, int64_t cols, const std::string& xq,
                             int ranks = 0);
  absl::Status Ensure(const std::string& name, std::vector<int64_t> shape, bool is_int = false);
  absl::Status LowerGqaAttention(const Lowering& c, int64_t layer);
  absl::Status LowerMlaAttention(const Lowering& c, int64_t layer);
  absl::StatusOr<Buf*> Alloc(const std::string& name, std::vector<int64_t> shape, bool is_int = false,
                             bool is_bytes = false);
  float* F(const std::string& name) { return static_cast<float*>(bufs_[name].p); }
  int32_t* I(const std::string& name) { return static_cast<int32_t*>(bufs_[name].p); }
  uint8_t* U8(const std::string& name) { return static_cast<uint8_t*>(bufs_[name].p); }
  void Add(std::string name, int layer, std::vector<std::string> outputs, int64_t tokens_per_rank, std::vector<Op> ops);
  Fault DeviceFault(const KernelCall& k, const absl::Status& s);
  // Streaming: holds kernel k's layer; the fault when it cannot.
  std::optional<Fault> HoldLayer(const KernelCall& k);
  absl::Status Mirror(const std::string& name);
  // Copies `bytes` of host data into buffer `b` (and its host copy).
  absl::Status Upload(const std::string& name, const void* data, size_t bytes);
  void Watch(const KernelCall& k, KernelRecord* rec);

  Executor* exec_;
  ExecMemory mem_;
  StepInput input_;
  std::map<std::string, Buf> bufs_;
  std::map<std::string, Buffer> mirror_;
  std::map<std::string, std::vector<uint8_t>> host_copy_;  // executors whose memory the host cannot read
  std::vector<KernelCall> kernels_;
  std::vector<KernelRecord> records_;
  size_t next_ = 0;
  bool watch_ = true;
  bool fingerprint_ = true;
  std::optional<Fault> fault_;
  DeviceModel* stream_ = nullptr;
  int arch_ = 0;  // device_arch (0: not modelled)
  int page_size_ = 0;  // the KV cache's page size, for SlotFault
  absl::Status status_;
  std::string first_nonfinite_;
  std::vector<crashreplay::Fingerprint> fingerprints_;
  DType stored_dtype_ = DType::kF32;  // activation_dtype, as fingerprints name it
};

}  // namespace crashreplay::replay
