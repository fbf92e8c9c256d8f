// One engine step (one forward pass over one batch) as an explicit list of
// kernel invocations.
//
// StepProgram builds the list for a model, a configuration and a batch: each
// entry has a name ("q_proj"), a layer (-1 outside the layers), the buffers it
// reads and writes, and a launch. A caller can list the kernels, run them one
// at a time, and inspect any buffer after any kernel. After every kernel the
// watcher counts NaN/Inf in its outputs, takes min/max/mean|x|, and hashes the
// output bytes (XXH3-128); the first kernel whose outputs are non-finite is
// remembered. A kernel whose check fires yields a Fault and stops the step.
//
// Ownership: the program borrows the model, the KV cache and the CPU pool,
// which must outlive it; it owns its activation buffers. Not thread-safe (it
// uses the pool's threads internally).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "crashreplay/formats/hash.h"
#include "crashreplay/replay/cpu_pool.h"
#include "crashreplay/replay/fault.h"
#include "crashreplay/replay/kernels/attention.h"
#include "crashreplay/replay/kernels/sampling.h"
#include "crashreplay/replay/model.h"
#include "crashreplay/replay/toggles.h"

namespace crashreplay::replay {

enum class ForwardMode { kPrefill, kDecode };
const char* ForwardModeName(ForwardMode m);

// One request's part of a batch.
struct StepRow {
  int64_t request_id = 0;
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

// The paged KV cache of every layer and rank.
class KvCache {
 public:
  KvCache(const Model& model, const EngineConfig& config, int64_t pages);
  KvPoolView View(int64_t layer, int rank);
  int64_t pages() const { return pages_; }
  int page_size() const { return page_size_; }
  bool fp8() const { return fp8_; }
  int64_t kv_heads() const { return kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t planes() const { return static_cast<int64_t>(k_.size()); }  // layers * tp; plane layer * tp + rank
  size_t page_bytes() const;  // one page of one plane
  // K and V of `pages` in every plane, plane-major then page order
  // (step_state.h's layout). Page ids must be < pages().
  void CopyPages(const std::vector<int32_t>& pages, std::vector<uint8_t>* k, std::vector<uint8_t>* v) const;
  // The inverse of CopyPages; the caller checked ids and sizes.
  void WritePages(const std::vector<int32_t>& pages, const std::vector<uint8_t>& k, const std::vector<uint8_t>& v);

 private:
  int64_t pages_;
  int page_size_;
  bool fp8_;
  int64_t kv_heads_, head_dim_;
  int tp_;
  std::vector<std::vector<uint8_t>> k_, v_;  // [layer * tp + rank]
};

struct Buffer {
  bool is_int = false;
  // Raw bytes: NVFP4-quantized activations (packed e2m1 values, e4m3 block
  // scales; kernels/act_quant.h). Hashed like the others; no value statistics.
  bool is_bytes = false;
  std::vector<int64_t> shape;
  std::vector<float> f;
  std::vector<int32_t> i;
  std::vector<uint8_t> u8;
  const void* data() const {
    return is_bytes ? static_cast<const void*>(u8.data()) : is_int ? static_cast<const void*>(i.data()) : f.data();
  }
  size_t bytes() const { return is_bytes ? u8.size() : is_int ? i.size() * 4 : f.size() * 4; }
};

struct KernelCall {
  std::string name;
  int layer = -1;
  std::vector<std::string> inputs;
  std::vector<std::string> outputs;
  int64_t tokens_per_rank = 0;  // > 0: work items are rank * tokens_per_rank + token
  std::function<KernelStatus()> launch;
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
  Hash128 digest;  // of all output buffers' bytes, in output order
  double micros = 0;
  bool failed = false;
};

nlohmann::json KernelRecordToJson(const KernelRecord& r);

class StepProgram {
 public:
  StepProgram(const Model& model, const EngineConfig& config, KvCache* kv, CpuPool* pool, StepInput input);

  const std::vector<KernelCall>& kernels() const { return kernels_; }
  size_t next() const { return next_; }
  bool done() const { return next_ >= kernels_.size() || fault_.has_value(); }

  // Runs the next kernel; returns its fault if a check fired.
  std::optional<Fault> RunNext();
  // Runs the remaining kernels until a fault or the end.
  std::optional<Fault> RunAll();

  const std::vector<KernelRecord>& records() const { return records_; }
  const Buffer* buffer(const std::string& name) const;
  const std::map<std::string, Buffer>& buffers() const { return buffers_; }
  // The first kernel whose outputs held a NaN or Inf ("" if none).
  const std::string& first_nonfinite() const { return first_nonfinite_; }
  const std::optional<Fault>& fault() const { return fault_; }
  const StepInput& input() const { return input_; }

  // Sampled token per row (after the sampler ran).
  std::vector<int32_t> SampledTokens() const;
  // XXH3-128 of the step's outputs: the logits, then the sampled tokens.
  Hash128 Digest() const;

 private:
  void Build();
  Buffer& Alloc(const std::string& name, std::vector<int64_t> shape, bool is_int = false);
  float* F(const std::string& name) { return buffers_[name].f.data(); }
  int32_t* I(const std::string& name) { return buffers_[name].i.data(); }
  uint8_t* U8(const std::string& name) { return buffers_[name].u8.data(); }
  Buffer& AllocBytes(const std::string& name, std::vector<int64_t> shape);
  void Add(std::string name, int layer, std::vector<std::string> in, std::vector<std::string> out,
           int64_t tokens_per_rank, std::function<KernelStatus()> launch);
  KernelStatus LaunchLinear(const std::vector<const LinearShard*>& shards, DotKind dot, const std::string& in,
                            bool in_per_rank, const std::string& out, int64_t tokens, const std::string& in_fp4 = "");
  // w4a4: a kernel `name` that quantizes `in` ([rows, cols]) into `out` and
  // `out`_scale with the group's input_scale, when `shards` take a quantized
  // input; returns the name of the quantized buffer ("" when they do not).
  std::string AddActQuant(const std::string& name, int layer, const std::vector<const LinearShard*>& shards,
                          const std::string& in, int64_t rows, int64_t cols, int64_t tokens_per_rank,
                          const std::string& out);

  const Model& m_;
  EngineConfig cfg_;
  KvCache* kv_;
  CpuPool* pool_;
  StepInput input_;
  int64_t T_ = 0;  // tokens in the batch
  int64_t R_ = 0;  // rows
  std::vector<int64_t> token_row_, token_pos_, row_last_;
  std::map<std::string, Buffer> buffers_;
  std::vector<KernelCall> kernels_;
  std::vector<KernelRecord> records_;
  size_t next_ = 0;
  std::optional<Fault> fault_;
  std::string first_nonfinite_;
};

}  // namespace crashreplay::replay
