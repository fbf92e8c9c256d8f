#include "cuda_error.h"

#include "crashreplay/base/text.h"

namespace crashreplay::replay::cuda {

using text::Cat;

std::string CudaErrorText(cudaError_t e) {
  return Cat(cudaGetErrorName(e), " (", static_cast<int>(e), "): ", cudaGetErrorString(e));
}

bool IsNoDevice(cudaError_t e) {
  return e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver || e == cudaErrorInvalidDevice ||
         e == cudaErrorDevicesUnavailable || e == cudaErrorStubLibrary || e == cudaErrorSystemNotReady;
}

absl::Status CudaStatus(cudaError_t e, std::string_view what) {
  if (e == cudaSuccess) return absl::OkStatus();
  const std::string msg = Cat(what, " failed: ", CudaErrorText(e));
  if (e == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(msg);
  if (IsNoDevice(e)) {
    return absl::InvalidArgumentError(
        Cat("no CUDA device: ", msg,
            "; use the CPU backend instead (device=cpu, the default: `--set device=cpu`, or `devices --device cpu`)"));
  }
  return absl::InternalError(msg);
}

}  // namespace crashreplay::replay::cuda
