#include "tensor_intake.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace nb = nanobind;

namespace crashreplay::python {
namespace {

using Code = nb::dlpack::dtype_code;

bool IsHostReadable(int device_type) {
  return device_type == nb::device::cpu::value || device_type == nb::device::cuda_host::value ||
         device_type == nb::device::cuda_managed::value || device_type == nb::device::rocm_host::value;
}

// Row-major contiguity; dimensions of extent 1 may carry any stride (torch
// and numpy disagree on what to put there).
bool IsRowMajor(const AnyTensor& t) {
  int64_t expected = 1;
  for (size_t i = t.ndim(); i-- > 0;) {
    if (t.shape(i) != 1 && t.stride(i) != expected) return false;
    expected *= t.shape(i);
  }
  return true;
}

}  // namespace

absl::StatusOr<DType> DTypeFromDLPack(nb::dlpack::dtype dt, const std::string& tensor_name) {
  if (dt.lanes != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", tensor_name, "': vector dtypes (lanes=", dt.lanes, ") are not supported"));
  }
  const Code code = static_cast<Code>(dt.code);
  switch (code) {
    case Code::Bool:
      if (dt.bits == 8) return DType::kBool;
      break;
    case Code::Int:
      if (dt.bits == 8) return DType::kI8;
      if (dt.bits == 16) return DType::kI16;
      if (dt.bits == 32) return DType::kI32;
      if (dt.bits == 64) return DType::kI64;
      break;
    case Code::UInt:
      if (dt.bits == 8) return DType::kU8;
      if (dt.bits == 16) return DType::kU16;
      if (dt.bits == 32) return DType::kU32;
      if (dt.bits == 64) return DType::kU64;
      break;
    case Code::Float:
      if (dt.bits == 16) return DType::kF16;
      if (dt.bits == 32) return DType::kF32;
      if (dt.bits == 64) return DType::kF64;
      break;
    case Code::Bfloat:
      if (dt.bits == 16) return DType::kBF16;
      break;
    case Code::Float8_E4M3FN:
      if (dt.bits == 8) return DType::kF8E4M3;
      break;
    case Code::Float8_E5M2:
      if (dt.bits == 8) return DType::kF8E5M2;
      break;
    case Code::Float8_E8M0FNU:
      if (dt.bits == 8) return DType::kF8E8M0;
      break;
    case Code::Float4_E2M1FN:
      if (dt.bits == 4) return DType::kF4E2M1;
      break;
    default: break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("tensor '", tensor_name, "': DLPack dtype (code ", dt.code, ", ", dt.bits,
                   " bits) has no capture dtype; supported: bool, int/uint 8-64, float 16/32/64, "
                   "bfloat16, float8 e4m3fn/e5m2/e8m0fnu, float4 e2m1fn"));
}

std::string DeviceName(int device_type, int device_id) {
  switch (device_type) {
    case nb::device::cpu::value: return "cpu";
    case nb::device::cuda::value: return absl::StrCat("cuda:", device_id);
    case nb::device::cuda_host::value: return "cuda_host";
    case nb::device::cuda_managed::value: return absl::StrCat("cuda_managed:", device_id);
    case nb::device::rocm::value: return absl::StrCat("rocm:", device_id);
    case nb::device::rocm_host::value: return "rocm_host";
    default: return absl::StrCat("dlpack_device_", device_type, ":", device_id);
  }
}

absl::StatusOr<std::optional<DType>> ParseDTypeOverride(const std::string& name) {
  if (name.empty()) return std::optional<DType>();
  std::optional<DType> d = ParseDType(name);
  if (!d) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown dtype name '", name, "'; use a safetensors spelling such as BF16, F8_E4M3, F32"));
  }
  return d;
}

absl::StatusOr<HostTensorView> DeviceView(const AnyTensor& t, const std::string& tensor_name,
                                          std::optional<DType> dtype_override) {
  if (t.device_type() != nb::device::cuda::value) {
    return absl::FailedPreconditionError(absl::StrCat("tensor '", tensor_name, "' is not in CUDA device memory (",
                                                      DeviceName(t.device_type(), t.device_id()), ")"));
  }
  return ViewOf(t, tensor_name, dtype_override);
}

absl::StatusOr<HostTensorView> HostView(const AnyTensor& t, const std::string& tensor_name,
                                        std::optional<DType> dtype_override) {
  if (!IsHostReadable(t.device_type())) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor '", tensor_name, "' is in device memory (", DeviceName(t.device_type(), t.device_id()),
                     "); the recorder copies only host memory. Pass it through crashreplay.Recorder.snapshot, "
                     "which stages CUDA tensors into pinned host memory on a side stream before the step runs"));
  }
  return ViewOf(t, tensor_name, dtype_override);
}

absl::StatusOr<HostTensorView> ViewOf(const AnyTensor& t, const std::string& tensor_name,
                                      std::optional<DType> dtype_override) {
  const std::string device = DeviceName(t.device_type(), t.device_id());
  if (!IsRowMajor(t)) {
    std::vector<int64_t> strides;
    for (size_t i = 0; i < t.ndim(); ++i) strides.push_back(t.stride(i));
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", tensor_name, "' is not contiguous (strides [", absl::StrJoin(strides, ", "),
                     "] elements); pass a contiguous tensor (numpy.ascontiguousarray / .contiguous())"));
  }
  absl::StatusOr<DType> native = DTypeFromDLPack(t.dtype(), tensor_name);
  HostTensorView v;
  if (dtype_override) {
    // The raw view must have the override's element width, so shapes agree.
    const int bits = DTypeBits(*dtype_override);
    if (bits != t.dtype().bits || t.dtype().lanes != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", tensor_name, "': dtype override ", std::string(DTypeName(*dtype_override)), " has ", bits,
          "-bit elements but the array's elements have ", static_cast<int>(t.dtype().bits), " bits"));
    }
    v.dtype = *dtype_override;
  } else {
    if (!native.ok()) return native.status();
    v.dtype = *native;
  }
  v.data = static_cast<const std::byte*>(t.data());
  v.nbytes = t.nbytes();
  v.shape.reserve(t.ndim());
  for (size_t i = 0; i < t.ndim(); ++i) v.shape.push_back(t.shape(i));
  v.device = device;
  return v;
}

}  // namespace crashreplay::python
