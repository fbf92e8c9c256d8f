// DLPack intake: any tensor that speaks DLPack (numpy arrays, torch tensors,
// anything nanobind's ndarray caster accepts) as a read-only byte view.
//
// The view borrows the tensor's memory: it is valid while the nb::ndarray it
// came from is alive (the caller holds it across the copy). Nothing here
// copies; the recorder's memcpy into its ring is the one copy a snapshot
// costs on the caller's thread.
//
// Only host-readable memory is accepted (DLPack CPU, CUDA pinned host,
// CUDA managed). A tensor in device memory is refused with
// FailedPrecondition: device tensors go through the Python layer's CUDA
// staging (crashreplay/cuda_staging.py), which copies them asynchronously
// into pinned host memory before the step's own kernels run, because after a
// device fault device memory can no longer be read.
//
// Errors: InvalidArgument for a dtype the capture format has no name for, a
// non-contiguous layout (make it contiguous first), or a dtype override whose
// element size does not match the bytes. Thread-safe (pure functions).
#pragma once

#include <nanobind/ndarray.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "crashreplay/formats/dtype.h"

namespace crashreplay::python {

using AnyTensor = nanobind::ndarray<nanobind::ro>;

struct HostTensorView {
  const std::byte* data = nullptr;
  size_t nbytes = 0;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;  // elements
  std::string device;          // "cpu", "cuda_host", "cuda_managed"
};

// The capture dtype of a DLPack element type; InvalidArgument if it has none.
absl::StatusOr<DType> DTypeFromDLPack(nanobind::dlpack::dtype dt, const std::string& tensor_name);

// The DLPack device name ("cpu", "cuda", "cuda_host", ...).
std::string DeviceName(int device_type, int device_id);

// Checks `t` and describes its bytes. `dtype_override` names the real dtype
// of a raw-bytes view (numpy has no bf16/fp8 in DLPack; the Python layer
// passes ml_dtypes arrays as unsigned views of the same width plus the name).
absl::StatusOr<HostTensorView> HostView(const AnyTensor& t, const std::string& tensor_name,
                                        std::optional<DType> dtype_override = std::nullopt);

// The same checks for a tensor in CUDA device memory (`data` is a device
// pointer; nothing reads it here). FailedPrecondition for other memory.
absl::StatusOr<HostTensorView> DeviceView(const AnyTensor& t, const std::string& tensor_name,
                                          std::optional<DType> dtype_override = std::nullopt);

// Describes any tensor's bytes without checking where they live.
absl::StatusOr<HostTensorView> ViewOf(const AnyTensor& t, const std::string& tensor_name,
                                      std::optional<DType> dtype_override = std::nullopt);

// Parses a dtype override name ("BF16"); nullopt for "" and InvalidArgument
// for an unknown name.
absl::StatusOr<std::optional<DType>> ParseDTypeOverride(const std::string& name);

}  // namespace crashreplay::python
