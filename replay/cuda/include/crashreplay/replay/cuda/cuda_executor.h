// The CUDA executor: ops on one non-blocking stream of one device, in device
// memory (cudaMalloc; never managed memory), with the fault record in mapped
// pinned host memory (cudaHostAlloc(cudaHostAllocMapped)).
//
// Kernel-by-kernel mode synchronizes the stream after every launch, so the
// Launch that ran a failing kernel returns its error. Async mode only
// enqueues; the device-side assert surfaces at whichever later call first
// sees the sticky error, and the fault then says both where it surfaced and,
// from the pinned record, which launch it happened in.
// While a stream capture is open (BeginCapture), launches are recorded, never
// synchronized, and scratch grows without freeing (cudaFree is illegal there).
//
// Only in builds with CRASHREPLAY_HAVE_CUDA. Errors: see executor.h. Not
// thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "absl/status/statusor.h"
#include "crashreplay/replay/cuda/fault_record.h"
#include "crashreplay/replay/kernels/executor.h"

namespace crashreplay::replay::cuda {

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int sm_major = 0, sm_minor = 0;
  uint64_t total_bytes = 0;
  int driver_version = 0, runtime_version = 0;
};

// Number of usable devices; InvalidArgument "no CUDA device ..." when none.
absl::StatusOr<int> DeviceCount();
absl::StatusOr<DeviceInfo> QueryDevice(int ordinal);

class DevicePool;  // device_pool.h

class CudaExecutor final : public Executor {
 public:
  static absl::StatusOr<std::unique_ptr<CudaExecutor>> Create(ExecMode mode, int device = 0);
  ~CudaExecutor() override;

  std::string_view name() const override { return "cuda"; }
  ExecMode mode() const override { return mode_; }
  absl::StatusOr<void*> Allocate(size_t bytes) override;
  void Free(void* p) override;
  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) override;
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override;
  absl::Status Fill(void* dst, int byte, size_t bytes) override;
  absl::Status Launch(const Op& op, const LaunchTag& tag) override;
  absl::Status Synchronize() override;
  const std::optional<ExecFault>& fault() const override { return fault_; }
  uint32_t launches() const override { return static_cast<uint32_t>(tags_.size()); }

  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }
  // The host view of the fault record (readable after the context died).
  const volatile DeviceFaultRecord* fault_record() const { return host_record_; }

  // Stream capture (relaxed mode: allocations inside the capture are allowed,
  // as a caching allocator's are). EndCapture instantiates the graph.
  absl::Status BeginCapture();
  absl::StatusOr<cudaGraphExec_t> EndCapture();
  // Ends an open capture after a failure, discarding the graph.
  void AbortCapture();
  absl::Status LaunchGraph(cudaGraphExec_t graph, const LaunchTag& tag);
  bool capturing() const { return capturing_; }

  // While set, Allocate hands out pieces of the pool's static arena (weights
  // and the KV pool, as the planner budgets them); Free ignores pointers into
  // any arena ever set, also after it is unset.
  void set_arena(DevicePool* pool);

 private:
  CudaExecutor(ExecMode mode, int device) : mode_(mode), device_(device) {}
  // Turns a CUDA error seen in `where` into the Status every later call
  // returns; reads the fault record for device-side asserts.
  absl::Status Fail(cudaError_t e, const char* where);
  absl::Status EnsureScratch(size_t bytes);

  ExecMode mode_;
  int device_;
  cudaStream_t stream_ = nullptr;
  DeviceFaultRecord* host_record_ = nullptr;
  DeviceFaultRecord* device_record_ = nullptr;
  float* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  std::vector<void*> retired_scratch_;
  std::vector<LaunchTag> tags_;
  std::vector<OpKind> kinds_;
  bool capturing_ = false;
  DevicePool* arena_ = nullptr;
  std::vector<std::pair<const void*, const void*>> arena_ranges_;
  bool graphs_captured_ = false;  // captured graphs hold scratch pointers
  absl::Status dead_;
  std::optional<ExecFault> fault_;
};

}  // namespace crashreplay::replay::cuda
