#include "crashreplay/capture/device_fingerprints.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "device_fingerprints_cuda.h"
#if CRASHREPLAY_HAVE_CUDA
#include "chunked_hash_cuda.h"
#endif

namespace crashreplay::capture {
namespace {

// The kernel's element decoder for `dtype`, or -1 when it has none.
int KindOf(DType dtype) {
  switch (dtype) {
    case DType::kF32: return internal::kDeviceF32;
    case DType::kBF16: return internal::kDeviceBF16;
    case DType::kF16: return internal::kDeviceF16;
    case DType::kF8E4M3: return internal::kDeviceE4M3;
    case DType::kF8E5M2: return internal::kDeviceE5M2;
    case DType::kI32: return internal::kDeviceI32;
    case DType::kI64: return internal::kDeviceI64;
    case DType::kU8: return internal::kDeviceU8;
    default: return -1;
  }
}

}  // namespace

namespace internal {

Fingerprint FingerprintFromSlot(const DeviceFingerprintSlot& slot, std::string_view name, DType dtype,
                                uint64_t columns) {
  Fingerprint f;
  f.name = std::string(name);
  f.dtype = std::string(DTypeName(dtype));
  f.numel = slot.numel;
  f.columns = columns > 0 ? columns : 1;
  f.is_int = !IsFloat(dtype);
  f.nan = slot.nan;
  f.pos_inf = slot.pos_inf;
  f.neg_inf = slot.neg_inf;
  if (slot.finite > 0) {
    f.min = slot.min;
    f.max = slot.max;
    f.max_abs = slot.max_abs;
    f.sum = slot.sum;
    f.sum_squares = slot.sum_squares;
  }
  if (slot.first_nonfinite != std::numeric_limits<uint64_t>::max()) {
    f.first_nonfinite_token = static_cast<int64_t>(slot.first_nonfinite / f.columns);
    f.first_nonfinite_column = static_cast<int64_t>(slot.first_nonfinite % f.columns);
  }
  return f;
}

}  // namespace internal

absl::StatusOr<std::unique_ptr<DeviceFingerprints>> DeviceFingerprints::Create(uint32_t max_boundaries) {
#if CRASHREPLAY_HAVE_CUDA
  if (internal::CudaDeviceCount() == 0) {
    return absl::FailedPreconditionError("device fingerprints: no CUDA device");
  }
  if (max_boundaries == 0) return absl::InvalidArgumentError("device fingerprints: max_boundaries is 0");
  std::unique_ptr<DeviceFingerprints> t(new DeviceFingerprints());
  if (const char* e = internal::CudaFingerprintTableCreate(max_boundaries, &t->host_header_, &t->host_slots_,
                                                           &t->device_header_, &t->device_slots_, &t->scratch_)) {
    return absl::InternalError(absl::StrCat("device fingerprints: ", e));
  }
  t->capacity_ = max_boundaries;
  return t;
#else
  (void)max_boundaries;
  return absl::UnimplementedError("device fingerprints: this build has no CUDA backend");
#endif
}

DeviceFingerprints::~DeviceFingerprints() {
#if CRASHREPLAY_HAVE_CUDA
  internal::CudaFingerprintTableDestroy(host_header_, scratch_);
#endif
}

absl::Status DeviceFingerprints::BeginStep(uint64_t step, void* stream) {
#if CRASHREPLAY_HAVE_CUDA
  if (const char* e = internal::CudaEnqueueBeginStep(device_header_, stream)) {
    return absl::InternalError(absl::StrCat("device fingerprints: step ", step, ": ", e));
  }
#else
  (void)stream;
#endif
  NoteGraphStep(step);
  return absl::OkStatus();
}

void DeviceFingerprints::NoteGraphStep(uint64_t step) {
  generation_ += 1;
  step_of_generation_.erase(generation_ - 1 > 8 ? generation_ - 9 : 0);  // keep the last few
  step_of_generation_[generation_] = step;
}

absl::Status DeviceFingerprints::Enqueue(const TensorView& t, void* stream) {
  const std::string name(t.name);
  uint64_t numel = 1;
  for (int64_t d : t.shape) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat("device fingerprint ", name, ": negative dimension"));
    numel *= static_cast<uint64_t>(d);
  }
  if (DTypeBytes(t.dtype, numel) != t.byte_size) {
    return absl::InvalidArgumentError(absl::StrCat("device fingerprint ", name, ": ", t.byte_size, " bytes for ", numel,
                                                   " elements of ", std::string(DTypeName(t.dtype))));
  }
  const int kind = KindOf(t.dtype);
  if (kind < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("device fingerprint ", name, ": the kernel does not decode ", std::string(DTypeName(t.dtype))));
  }
  if (t.data == nullptr && numel > 0) {
    return absl::InvalidArgumentError(absl::StrCat("device fingerprint ", name, ": no data"));
  }
  uint32_t slot;
  if (auto it = slot_of_.find(name); it != slot_of_.end()) {
    slot = it->second;
    const SlotInfo& s = slots_[slot];
    if (s.dtype != t.dtype || s.numel != numel) {
      return absl::InvalidArgumentError(
          absl::StrCat("device fingerprint ", name, ": ", numel, " elements of ", std::string(DTypeName(t.dtype)),
                       " where its slot holds ", s.numel, " of ", std::string(DTypeName(s.dtype)),
                       " (a boundary keeps its shape: use another name, or another table per shape)"));
    }
  } else {
    if (slots_.size() >= capacity_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("device fingerprint ", name, ": all ", capacity_, " slots are taken"));
    }
    slot = static_cast<uint32_t>(slots_.size());
    slots_.push_back(SlotInfo{name, t.dtype, numel, t.shape.empty() ? 1 : static_cast<uint64_t>(t.shape.back()), kind});
    slot_of_[name] = slot;
  }
#if CRASHREPLAY_HAVE_CUDA
  if (const char* e = internal::CudaEnqueueFingerprint(t.data, kind, numel, slot, device_header_, device_slots_,
                                                       scratch_, stream)) {
    return absl::InternalError(absl::StrCat("device fingerprint ", name, ": ", e));
  }
  return absl::OkStatus();
#else
  (void)stream;
  return absl::UnimplementedError("device fingerprints: this build has no CUDA backend");
#endif
}

FingerprintRecord DeviceFingerprints::Collect(bool complete) const {
  FingerprintRecord r;
  r.complete = complete;
  r.source = "device";
  if (host_header_ == nullptr) return r;
  const uint64_t generation = static_cast<const volatile internal::DeviceFingerprintHeader*>(host_header_)->generation;
  if (auto it = step_of_generation_.find(generation); it != step_of_generation_.end()) r.step = it->second;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const volatile internal::DeviceFingerprintSlot* v = host_slots_ + i;
    if (v->generation != generation || generation == 0) continue;
    internal::DeviceFingerprintSlot copy{};
    copy.numel = v->numel;
    copy.nan = v->nan;
    copy.pos_inf = v->pos_inf;
    copy.neg_inf = v->neg_inf;
    copy.min = v->min;
    copy.max = v->max;
    copy.max_abs = v->max_abs;
    copy.sum = v->sum;
    copy.sum_squares = v->sum_squares;
    copy.first_nonfinite = v->first_nonfinite;
    copy.finite = v->finite;
    copy.generation = v->generation;
    r.fingerprints.push_back(internal::FingerprintFromSlot(copy, slots_[i].name, slots_[i].dtype, slots_[i].columns));
  }
  return r;
}

std::vector<std::string> DeviceFingerprints::boundaries() const {
  std::vector<std::string> out;
  out.reserve(slots_.size());
  for (const SlotInfo& s : slots_) out.push_back(s.name);
  return out;
}

}  // namespace crashreplay::capture
