#include "crashreplay/replay/cuda/device_pool.h"

#include <algorithm>
#include <cmath>

#include <cuda_runtime.h>

#include "crashreplay/base/status.h"
#include "crashreplay/base/text.h"
#include "cuda_error.h"

namespace crashreplay::replay::cuda {

using text::Cat;

namespace {
absl::StatusOr<void*> Malloc(size_t bytes, const std::string& what) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return CudaStatus(e, Cat("cudaMalloc(", bytes, " bytes, ", what, ")"));
  }
  return p;
}
}  // namespace

absl::StatusOr<std::unique_ptr<DevicePool>> DevicePool::Create(const MemoryPlan& plan, int device) {
  CR_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  std::unique_ptr<DevicePool> pool(new DevicePool);
  pool->plan_ = plan;
  size_t free_bytes = 0, total = 0;
  CR_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total));
  if (free_bytes < plan.capacity) {
    return absl::FailedPreconditionError(
        Cat("the device has ", free_bytes, " bytes free but the recorded device had ", plan.capacity,
            " (device_memory_gb * 1e9 * device_memory_scale); replay on a larger device or lower "
            "device_memory_scale"));
  }
  pool->ballast_bytes_ = free_bytes - plan.capacity;
  if (pool->ballast_bytes_ > 0) {
    auto b = Malloc(pool->ballast_bytes_, "ballast capping the device at the recorded capacity");
    if (!b.ok()) return b.status();
    pool->ballast_ = *b;
  }
  auto s = Malloc(plan.static_budget, "static arena: weights + KV pool");
  if (!s.ok()) return absl::ResourceExhaustedError(Cat("out of memory at load: ", s.status().message()));
  pool->static_ = static_cast<uint8_t*>(*s);
  auto w = Malloc(plan.workspace, "workspace");
  if (!w.ok()) return absl::ResourceExhaustedError(Cat("out of memory at load: ", w.status().message()));
  pool->workspace_ = *w;
  return pool;
}

DevicePool::~DevicePool() {
  for (void* p : owned_) cudaFree(p);
  if (workspace_ != nullptr) cudaFree(workspace_);
  if (static_ != nullptr) cudaFree(static_);
  if (ballast_ != nullptr) cudaFree(ballast_);
}

absl::StatusOr<void*> DevicePool::AllocStatic(size_t bytes) {
  const uint64_t aligned = (static_used_ + 255) / 256 * 256;
  if (aligned + bytes > plan_.static_budget) {
    return absl::ResourceExhaustedError(Cat("out of memory at load: the static budget of ", plan_.static_budget,
                                            " bytes (mem_fraction_static of the recorded capacity) has ",
                                            plan_.static_budget - std::min<uint64_t>(aligned, plan_.static_budget),
                                            " bytes left, ", bytes, " requested"));
  }
  static_used_ = aligned + bytes;
  return static_ + aligned;
}

absl::StatusOr<void*> DevicePool::AllocOwned(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return CudaStatus(e, Cat("cudaMalloc(", bytes, " bytes)"));
  }
  owned_.push_back(p);
  return p;
}

DecodeGraphs::~DecodeGraphs() {
  for (cudaGraphExec_t g : graphs) cudaGraphExecDestroy(g);
}

absl::StatusOr<std::unique_ptr<DecodeGraphs>> CaptureDecodeGraphs(CudaExecutor& exec, DevicePool& pool,
                                                                  const EngineConfig& config,
                                                                  const std::function<absl::Status(int)>& record) {
  auto out = std::make_unique<DecodeGraphs>();
  const MemoryPlan& plan = pool.plan();
  std::vector<int> sizes = plan.graph_batch_sizes;
  std::sort(sizes.rbegin(), sizes.rend());
  // The planner's reservation split back into its parts (planner.h):
  // per-graph private memory, and one pool shared by all graphs.
  const uint64_t per_graph = static_cast<uint64_t>(std::llround(kPerGraphBytes * config.device_memory_scale));
  const uint64_t shared_pool =
      plan.graph_reservation - std::min<uint64_t>(plan.graph_reservation, per_graph * sizes.size());
  bool first = true;
  for (int bs : sizes) {
    CR_RETURN_IF_ERROR(exec.BeginCapture());
    const uint64_t bytes = per_graph + (first ? shared_pool : 0);
    auto mem = pool.AllocOwned(bytes);
    if (!mem.ok()) {
      exec.AbortCapture();
      if (mem.status().code() != absl::StatusCode::kResourceExhausted) return mem.status();
      Fault f;
      f.klass = "oom";
      f.stage = "graph_capture";
      f.kernel = "cuda_graph_capture";
      f.check = "cudaMalloc";
      f.index = bs;
      f.value = static_cast<double>(bytes);
      f.message = Cat("out of memory at graph_capture: capturing the decode graph for batch size ", bs, ": ",
                      mem.status().message(), " (capacity ", plan.capacity, ", mem_fraction_static ",
                      config.mem_fraction_static, ")");
      out->fault = f;
      return out;
    }
    first = false;
    absl::Status s = record(bs);
    if (!s.ok()) {
      exec.AbortCapture();
      return s;
    }
    auto g = exec.EndCapture();
    if (!g.ok()) return g.status();
    out->batch_sizes.push_back(bs);
    out->graphs.push_back(*g);
  }
  return out;
}

}  // namespace crashreplay::replay::cuda
