// Device memory as the recorded deployment saw it: a cudaMalloc-backed pool
// sized by the CPU planner's MemoryPlan (planner.h; nothing here recomputes
// its arithmetic), and decode CUDA-graph capture that allocates the graph
// memory for real.
//
// DevicePool::Create
//   1. caps the device at the recorded capacity: a ballast allocation of
//      (free bytes now - plan.capacity), so a replay on a 141 GB H200 runs
//      out of memory where the recorded 96 GB card did (FailedPrecondition
//      if the device has less free memory than the recorded capacity);
//   2. allocates the static arena, plan.static_budget bytes (weights, then
//      the KV pool: plan.pool_pages * plan.page_bytes), handed out by
//      AllocStatic in 256-byte aligned pieces; exceeding it is
//      ResourceExhausted at stage "load", as the planner's load OOM;
//   3. allocates the workspace, plan.workspace bytes.
// What remains of the capacity is the dynamic budget minus the workspace,
// which graph capture then uses.
//
// CaptureDecodeGraphs captures one graph per batch size of
// plan.graph_batch_sizes, largest first as sglang does, in relaxed stream
// capture. The first capture allocates the shared graph memory pool, the
// rest of plan.graph_reservation after the per-graph parts; every capture
// allocates its own per-graph memory (kPerGraphBytes * scale). A cudaMalloc
// that fails there is a real cudaErrorMemoryAllocation and comes back as a
// Fault {class "oom", stage "graph_capture", kernel "cuda_graph_capture",
// check "cudaMalloc", index = batch size, value = bytes}.
// cudaMalloc rounds to 2 MiB pages, so capacities of a few MiB (tiny
// device_memory_scale) do not reproduce the planner's decisions on a GPU.
//
// Only with CRASHREPLAY_HAVE_CUDA. Never managed memory. Not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "absl/status/statusor.h"
#include "crashreplay/replay/config/fault.h"
#include "crashreplay/replay/config/toggles.h"
#include "crashreplay/replay/cuda/cuda_executor.h"
#include "crashreplay/replay/model/planner.h"

namespace crashreplay::replay::cuda {

class DevicePool {
 public:
  static absl::StatusOr<std::unique_ptr<DevicePool>> Create(const MemoryPlan& plan, int device);
  ~DevicePool();
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  absl::StatusOr<void*> AllocStatic(size_t bytes);
  std::pair<const void*, const void*> static_range() const { return {static_, static_ + plan_.static_budget}; }
  void* workspace() const { return workspace_; }
  uint64_t ballast_bytes() const { return ballast_bytes_; }
  uint64_t static_used() const { return static_used_; }
  const MemoryPlan& plan() const { return plan_; }

  // Device memory owned by the pool until it dies (graph memory).
  absl::StatusOr<void*> AllocOwned(size_t bytes);

 private:
  DevicePool() = default;
  MemoryPlan plan_;
  void* ballast_ = nullptr;
  uint64_t ballast_bytes_ = 0;
  uint8_t* static_ = nullptr;
  uint64_t static_used_ = 0;
  void* workspace_ = nullptr;
  std::vector<void*> owned_;
};

struct DecodeGraphs {
  std::vector<int> batch_sizes;        // captured, in capture order
  std::vector<cudaGraphExec_t> graphs;
  std::optional<Fault> fault;          // the OOM that stopped capture
  ~DecodeGraphs();
};

// record(bs) enqueues the decode step for batch size bs on `exec` (it runs
// while the stream is being captured).
absl::StatusOr<std::unique_ptr<DecodeGraphs>> CaptureDecodeGraphs(CudaExecutor& exec, DevicePool& pool,
                                                                  const EngineConfig& config,
                                                                  const std::function<absl::Status(int)>& record);

}  // namespace crashreplay::replay::cuda
