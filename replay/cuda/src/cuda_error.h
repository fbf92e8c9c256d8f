// cudaError_t -> absl::Status at the edge that calls CUDA (STYLE rule 3).
//
// cudaErrorMemoryAllocation -> ResourceExhausted; no device / no driver ->
// InvalidArgument "no CUDA device" (the user chose --device cuda on a machine
// without one); everything else -> Internal, naming the call, the error's
// enum name and number, and CUDA's description.
#pragma once

#include <string>
#include <string_view>

#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace crashreplay::replay::cuda {

// "cudaErrorAssert (710): device-side assert triggered"
std::string CudaErrorText(cudaError_t e);
absl::Status CudaStatus(cudaError_t e, std::string_view what);
bool IsNoDevice(cudaError_t e);

}  // namespace crashreplay::replay::cuda

#define CR_CUDA_RETURN_IF_ERROR(call)                                                                     \
  do {                                                                                                    \
    const cudaError_t cr_cuda_err_ = (call);                                                              \
    if (cr_cuda_err_ != cudaSuccess) return ::crashreplay::replay::cuda::CudaStatus(cr_cuda_err_, #call); \
  } while (0)
