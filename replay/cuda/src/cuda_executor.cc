#include "crashreplay/replay/cuda/cuda_executor.h"

#include <cstring>

#include <cuda_runtime.h>

#include "crashreplay/base/text.h"
#include "crashreplay/replay/cuda/device_pool.h"
#include "cuda_error.h"
#include "op_kernels.h"

namespace crashreplay::replay {

absl::StatusOr<std::unique_ptr<Executor>> MakeCudaExecutor(ExecMode mode) {
  auto e = cuda::CudaExecutor::Create(mode, 0);
  if (!e.ok()) return e.status();
  return std::unique_ptr<Executor>(std::move(*e));
}

namespace cuda {

using text::Cat;

absl::StatusOr<int> DeviceCount() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return CudaStatus(e, "cudaGetDeviceCount");
  if (n == 0)
    return absl::InvalidArgumentError(
        "no CUDA device: cudaGetDeviceCount found 0 devices; use the CPU backend instead (device=cpu, the default: "
        "`--set device=cpu`, or `devices --device cpu`)");
  return n;
}

absl::StatusOr<DeviceInfo> QueryDevice(int ordinal) {
  cudaDeviceProp p;
  CR_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&p, ordinal));
  DeviceInfo d;
  d.ordinal = ordinal;
  d.name = p.name;
  d.sm_major = p.major;
  d.sm_minor = p.minor;
  d.total_bytes = p.totalGlobalMem;
  CR_CUDA_RETURN_IF_ERROR(cudaDriverGetVersion(&d.driver_version));
  CR_CUDA_RETURN_IF_ERROR(cudaRuntimeGetVersion(&d.runtime_version));
  return d;
}

absl::StatusOr<std::unique_ptr<CudaExecutor>> CudaExecutor::Create(ExecMode mode, int device) {
  auto count = DeviceCount();
  if (!count.ok()) return count.status();
  if (device < 0 || device >= *count) {
    return absl::InvalidArgumentError(Cat("CUDA device ", device, " does not exist (", *count, " present)"));
  }
  std::unique_ptr<CudaExecutor> ex(new CudaExecutor(mode, device));
  CR_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  CR_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&ex->stream_, cudaStreamNonBlocking));
  void* host = nullptr;
  CR_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&host, sizeof(DeviceFaultRecord), cudaHostAllocMapped));
  std::memset(host, 0, sizeof(DeviceFaultRecord));
  ex->host_record_ = static_cast<DeviceFaultRecord*>(host);
  void* dev = nullptr;
  CR_CUDA_RETURN_IF_ERROR(cudaHostGetDevicePointer(&dev, host, 0));
  ex->device_record_ = static_cast<DeviceFaultRecord*>(dev);
  return ex;
}

CudaExecutor::~CudaExecutor() {
  // After a sticky error these calls fail; there is nothing more to do then.
  if (capturing_) AbortCapture();
  if (scratch_ != nullptr) cudaFree(scratch_);
  for (void* p : retired_scratch_) cudaFree(p);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  if (host_record_ != nullptr) cudaFreeHost(host_record_);
}

absl::Status CudaExecutor::Fail(cudaError_t e, const char* where) {
  if (!dead_.ok()) return dead_;
  if (e == cudaErrorMemoryAllocation) return CudaStatus(e, where);  // not sticky
  const volatile DeviceFaultRecord* r = host_record_;
  if (r->complete == 1u && r->launch < tags_.size()) {
    ExecFault f;
    f.launch = r->launch;
    f.tag = tags_[r->launch];
    f.op = static_cast<OpKind>(r->op);
    f.status.fired = 1;
    f.status.check = static_cast<Check>(r->check);
    f.status.item = r->item;
    f.status.index = r->index;
    f.status.value = r->value;
    f.surfaced_in = where;
    f.surfaced_after_launch = static_cast<uint32_t>(tags_.size());
    f.device_error = CudaErrorText(e);
    fault_ = f;
    dead_ = absl::AbortedError(f.Describe());
  } else {
    dead_ = CudaStatus(e, where);
  }
  return dead_;
}

absl::StatusOr<void*> CudaExecutor::Allocate(size_t bytes) {
  if (!dead_.ok()) return dead_;
  if (arena_ != nullptr) return arena_->AllocStatic(bytes);
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // an allocation failure is not sticky; clear it
    return CudaStatus(e, Cat("cudaMalloc(", bytes, " bytes)").c_str());
  }
  if (e != cudaSuccess) return Fail(e, "Allocate");
  return p;
}

void CudaExecutor::set_arena(DevicePool* pool) {
  arena_ = pool;
  if (pool != nullptr) arena_ranges_.push_back(pool->static_range());
}

void CudaExecutor::Free(void* p) {
  if (p == nullptr) return;
  for (const auto& [begin, end] : arena_ranges_) {
    if (p >= begin && p < end) return;
  }
  cudaFree(p);
}

absl::Status CudaExecutor::CopyToDevice(void* dst, const void* src, size_t bytes) {
  if (!dead_.ok()) return dead_;
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_);
  if (e == cudaSuccess && !capturing_) e = cudaStreamSynchronize(stream_);
  return e == cudaSuccess ? absl::OkStatus() : Fail(e, "CopyToDevice");
}

absl::Status CudaExecutor::CopyToHost(void* dst, const void* src, size_t bytes) {
  if (!dead_.ok()) return dead_;
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream_);
  return e == cudaSuccess ? absl::OkStatus() : Fail(e, "CopyToHost");
}

absl::Status CudaExecutor::Fill(void* dst, int byte, size_t bytes) {
  if (!dead_.ok()) return dead_;
  const cudaError_t e = cudaMemsetAsync(dst, byte, bytes, stream_);
  return e == cudaSuccess ? absl::OkStatus() : Fail(e, "Fill");
}

absl::Status CudaExecutor::EnsureScratch(size_t bytes) {
  if (bytes <= scratch_bytes_) return absl::OkStatus();
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return CudaStatus(e, Cat("cudaMalloc(", bytes, " bytes of kernel scratch)").c_str());
  }
  if (scratch_ != nullptr) {
    // cudaFree synchronizes the device and is illegal inside a capture, and
    // a captured graph keeps using the scratch it was captured with.
    if (capturing_ || graphs_captured_) {
      retired_scratch_.push_back(scratch_);
    } else {
      cudaFree(scratch_);
    }
  }
  scratch_ = static_cast<float*>(p);
  scratch_bytes_ = bytes;
  return absl::OkStatus();
}

namespace {

// The scratch floats a launch of `op` needs in all (op_kernels.h).
int64_t LaunchScratchFloats(const Op& op) {
  if (const auto* e = std::get_if<ExpertsOp>(&op)) return ExpertStageItems(*e, 1) * ExpertSlotFloats(e->inter);
  if (const auto* e = std::get_if<SharedExpertOp>(&op)) return ExpertStageItems(*e, 1) * ExpertSlotFloats(e->inter);
  return std::visit(
      [](const auto& o) {
        const int64_t floats = ScratchFloats(o);
        return floats > 0 ? ScratchThreads(Items(o), floats) * floats : int64_t{0};
      },
      op);
}

}  // namespace

absl::Status CudaExecutor::Launch(const Op& op, const LaunchTag& tag) {
  if (!dead_.ok()) return dead_;
  const uint32_t seq = static_cast<uint32_t>(tags_.size());
  tags_.push_back(tag);
  kinds_.push_back(KindOf(op));
  LaunchArgs args;
  args.fault = device_record_;
  args.launch = seq;
  args.layer = tag.layer;
  const auto [items, floats] =
      std::visit([](const auto& o) { return std::pair<int64_t, int64_t>(Items(o), ScratchFloats(o)); }, op);
  const int64_t total = items > 0 ? LaunchScratchFloats(op) : 0;
  if (total > 0) {
    absl::Status s = EnsureScratch(static_cast<size_t>(total) * sizeof(float));
    if (!s.ok()) return s;
    args.scratch = scratch_;
    args.scratch_stride = floats;
  }
  cudaError_t e = std::visit([&](const auto& o) { return Enqueue(o, args, stream_); }, op);
  if (e == cudaSuccess && mode_ == ExecMode::kKernelByKernel && !capturing_) e = cudaStreamSynchronize(stream_);
  return e == cudaSuccess ? absl::OkStatus() : Fail(e, "Launch");
}

absl::Status CudaExecutor::Synchronize() {
  if (!dead_.ok()) return dead_;
  if (capturing_) return absl::OkStatus();  // nothing runs while capturing
  const cudaError_t e = cudaStreamSynchronize(stream_);
  return e == cudaSuccess ? absl::OkStatus() : Fail(e, "Synchronize");
}

absl::Status CudaExecutor::BeginCapture() {
  if (!dead_.ok()) return dead_;
  CR_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
  capturing_ = true;
  return absl::OkStatus();
}

absl::StatusOr<cudaGraphExec_t> CudaExecutor::EndCapture() {
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  CR_CUDA_RETURN_IF_ERROR(cudaStreamEndCapture(stream_, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (e != cudaSuccess) return CudaStatus(e, "cudaGraphInstantiate");
  graphs_captured_ = true;
  return exec;
}

void CudaExecutor::AbortCapture() {
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  if (cudaStreamEndCapture(stream_, &graph) == cudaSuccess && graph != nullptr) cudaGraphDestroy(graph);
  cudaGetLastError();
}

absl::Status CudaExecutor::LaunchGraph(cudaGraphExec_t graph, const LaunchTag& tag) {
  if (!dead_.ok()) return dead_;
  (void)tag;  // the graph's kernels carry the launch numbers they were captured with
  cudaError_t e = cudaGraphLaunch(graph, stream_);
  if (e == cudaSuccess && mode_ == ExecMode::kKernelByKernel) e = cudaStreamSynchronize(stream_);
  return e == cudaSuccess ? absl::OkStatus() : Fail(e, "LaunchGraph");
}

}  // namespace cuda
}  // namespace crashreplay::replay
