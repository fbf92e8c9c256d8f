// The CUDA side of the device fingerprints (internal; device_fingerprints.h
// is the interface). Plain C++17 types only, so that device_fingerprints.cu
// compiles under nvcc without the project's C++20 headers. Each function
// returns nullptr on success or the CUDA error's name (a static string).
#pragma once

#include <cstddef>
#include <cstdint>

namespace crashreplay::capture::internal {

// One boundary's record as the kernel leaves it in pinned host memory
// mapped into the device. `generation` is written last, after a system-wide
// fence: a slot whose generation equals the table's is complete for the step
// now running, and its other fields are that step's.
struct DeviceFingerprintSlot {
  uint64_t numel;
  uint64_t nan;
  uint64_t pos_inf;
  uint64_t neg_inf;
  double min;
  double max;
  double max_abs;
  double sum;
  double sum_squares;
  uint64_t first_nonfinite;  // element index; UINT64_MAX when all are finite
  uint64_t finite;           // finite elements (0: min/max are meaningless)
  uint64_t generation;
};

// The table's header, also in mapped memory: the begin-step kernel adds one
// to `generation`, so a step's kernels stamp its slots with the step's
// number in stream order (inside CUDA graphs too: no host write per step).
struct DeviceFingerprintHeader {
  uint64_t generation;
  uint64_t reserved[7];
};

// How the kernel decodes elements (FingerprintKernel's switch).
enum DeviceElementKind : int {
  kDeviceF32 = 0,
  kDeviceBF16 = 1,
  kDeviceF16 = 2,
  kDeviceE4M3 = 3,
  kDeviceE5M2 = 4,
  kDeviceI32 = 5,
  kDeviceI64 = 6,
  kDeviceU8 = 7,
};

// The most blocks one summary uses: partials are combined in block order by
// the last block to finish, so the result does not depend on scheduling.
inline constexpr unsigned kDeviceFingerprintMaxBlocks = 128;

// Pinned, mapped host memory for the header and `slots` slots (zeroed), and
// device scratch for the per-block partials and completion counters.
const char* CudaFingerprintTableCreate(uint32_t slots, DeviceFingerprintHeader** host_header,
                                       DeviceFingerprintSlot** host_slots, void** device_header, void** device_slots,
                                       void** scratch);
void CudaFingerprintTableDestroy(DeviceFingerprintHeader* host_header, void* scratch);

// Enqueues the begin-step kernel on `stream` (a cudaStream_t, or null).
const char* CudaEnqueueBeginStep(void* device_header, void* stream);

// Enqueues the summary of `numel` elements of `kind` at device address
// `data` into slot `slot` on `stream`. Launch errors only: a fault of the
// kernel itself surfaces, sticky, at the next synchronisation.
const char* CudaEnqueueFingerprint(const void* data, int kind, uint64_t numel, uint32_t slot, void* device_header,
                                   void* device_slots, void* scratch, void* stream);

// Blocks of the launch for `numel` elements (1..kDeviceFingerprintMaxBlocks).
unsigned DeviceFingerprintBlocks(uint64_t numel);

}  // namespace crashreplay::capture::internal
