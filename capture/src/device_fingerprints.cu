// The device fingerprint kernels (device_fingerprints.h): one summary is one
// launch of up to kDeviceFingerprintMaxBlocks blocks; each block reduces its
// grid-stride share in a fixed tree, and the last block to finish combines
// the partials in block order and writes the record straight into pinned
// host memory mapped into the device, the generation last. Every address is
// fixed at enqueue time, so the launches may be captured in a CUDA graph.
// After a sticky fault (a device-side assert, an illegal address) the host
// still reads that memory: the records of every summary that finished
// before the fault are there. Built only with CRASHREPLAY_HAVE_CUDA.
#include <cuda_runtime.h>

#include <cstring>

#include "crashreplay/formats/numeric.h"
#include "device_fingerprints_cuda.h"

namespace crashreplay::capture::internal {
namespace {

constexpr int kThreads = 256;

struct Partial {
  double sum, sum_squares, lo, hi, max_abs;
  unsigned long long nan, pos_inf, neg_inf, first, finite;
};

// Per slot in device scratch: the blocks' partials, then the counter of
// blocks done (reset to 0 by the last block, ready for the next launch).
struct SlotScratch {
  Partial partials[kDeviceFingerprintMaxBlocks];
  unsigned done;
  unsigned pad[15];
};

__device__ __forceinline__ void Clear(Partial& p) {
  p.sum = 0;
  p.sum_squares = 0;
  p.lo = __longlong_as_double(0x7ff0000000000000LL);   // +Inf
  p.hi = __longlong_as_double(0xfff0000000000000LL);   // -Inf
  p.max_abs = 0;
  p.nan = p.pos_inf = p.neg_inf = p.finite = 0;
  p.first = ~0ull;
}

__device__ __forceinline__ void Combine(Partial& a, const Partial& b) {
  a.sum += b.sum;
  a.sum_squares += b.sum_squares;
  a.lo = fmin(a.lo, b.lo);
  a.hi = fmax(a.hi, b.hi);
  a.max_abs = fmax(a.max_abs, b.max_abs);
  a.nan += b.nan;
  a.pos_inf += b.pos_inf;
  a.neg_inf += b.neg_inf;
  a.finite += b.finite;
  a.first = b.first < a.first ? b.first : a.first;
}

__device__ __forceinline__ double Element(const void* data, int kind, unsigned long long i) {
  switch (kind) {
    case kDeviceF32: return static_cast<const float*>(data)[i];
    case kDeviceBF16: return Bf16ToFloat(static_cast<const uint16_t*>(data)[i]);
    case kDeviceF16: return Fp16ToFloat(static_cast<const uint16_t*>(data)[i]);
    case kDeviceE4M3: return E4m3ToFloat(static_cast<const uint8_t*>(data)[i]);
    case kDeviceE5M2: return E5m2ToFloat(static_cast<const uint8_t*>(data)[i]);
    case kDeviceI32: return static_cast<const int32_t*>(data)[i];
    case kDeviceI64: return static_cast<double>(static_cast<const long long*>(data)[i]);
    default: return static_cast<const uint8_t*>(data)[i];
  }
}

__global__ void BeginStepKernel(DeviceFingerprintHeader* header) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  volatile uint64_t* g = &header->generation;
  *g = *g + 1;
  __threadfence_system();
}

__global__ void __launch_bounds__(kThreads)
    FingerprintKernel(const void* data, int kind, unsigned long long numel, SlotScratch* scratch,
                      DeviceFingerprintSlot* slot, const DeviceFingerprintHeader* header) {
  __shared__ Partial shared[kThreads];
  __shared__ bool last;
  Partial p;
  Clear(p);
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * kThreads;
  for (unsigned long long i = static_cast<unsigned long long>(blockIdx.x) * kThreads + threadIdx.x; i < numel;
       i += stride) {
    const double v = Element(data, kind, i);
    if (isfinite(v)) {
      p.sum += v;
      p.sum_squares += v * v;
      p.lo = fmin(p.lo, v);
      p.hi = fmax(p.hi, v);
      p.max_abs = fmax(p.max_abs, fabs(v));
      p.finite += 1;
    } else {
      if (isnan(v)) {
        p.nan += 1;
      } else if (v > 0) {
        p.pos_inf += 1;
      } else {
        p.neg_inf += 1;
      }
      if (i < p.first) p.first = i;
    }
  }
  shared[threadIdx.x] = p;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {  // a fixed tree: the same sums every launch
    if (threadIdx.x < s) Combine(shared[threadIdx.x], shared[threadIdx.x + s]);
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    scratch->partials[blockIdx.x] = shared[0];
    __threadfence();
    last = atomicAdd(&scratch->done, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last || threadIdx.x != 0) return;
  __threadfence();
  const volatile Partial* partials = scratch->partials;
  Partial total;
  Clear(total);
  for (unsigned b = 0; b < gridDim.x; ++b) {  // block order
    Partial q;
    q.sum = partials[b].sum;
    q.sum_squares = partials[b].sum_squares;
    q.lo = partials[b].lo;
    q.hi = partials[b].hi;
    q.max_abs = partials[b].max_abs;
    q.nan = partials[b].nan;
    q.pos_inf = partials[b].pos_inf;
    q.neg_inf = partials[b].neg_inf;
    q.first = partials[b].first;
    q.finite = partials[b].finite;
    Combine(total, q);
  }
  volatile DeviceFingerprintSlot* out = slot;
  out->numel = numel;
  out->nan = total.nan;
  out->pos_inf = total.pos_inf;
  out->neg_inf = total.neg_inf;
  out->min = total.lo;
  out->max = total.hi;
  out->max_abs = total.max_abs;
  out->sum = total.sum;
  out->sum_squares = total.sum_squares;
  out->first_nonfinite = total.first;
  out->finite = total.finite;
  __threadfence_system();
  out->generation = static_cast<const volatile DeviceFingerprintHeader*>(header)->generation;
  __threadfence_system();
  scratch->done = 0;
}

const char* Error(cudaError_t e) { return e == cudaSuccess ? nullptr : cudaGetErrorName(e); }

}  // namespace

unsigned DeviceFingerprintBlocks(uint64_t numel) {
  // Eight elements a thread before another block is worth its launch.
  const uint64_t per_block = static_cast<uint64_t>(kThreads) * 8;
  const uint64_t blocks = (numel + per_block - 1) / per_block;
  if (blocks < 1) return 1;
  return blocks > kDeviceFingerprintMaxBlocks ? kDeviceFingerprintMaxBlocks : static_cast<unsigned>(blocks);
}

const char* CudaFingerprintTableCreate(uint32_t slots, DeviceFingerprintHeader** host_header,
                                       DeviceFingerprintSlot** host_slots, void** device_header, void** device_slots,
                                       void** scratch) {
  const size_t bytes = sizeof(DeviceFingerprintHeader) + static_cast<size_t>(slots) * sizeof(DeviceFingerprintSlot);
  void* host = nullptr;
  if (const char* e = Error(cudaHostAlloc(&host, bytes, cudaHostAllocMapped | cudaHostAllocPortable))) return e;
  std::memset(host, 0, bytes);
  void* dev = nullptr;
  if (const char* e = Error(cudaHostGetDevicePointer(&dev, host, 0))) {
    cudaFreeHost(host);
    return e;
  }
  void* s = nullptr;
  const size_t scratch_bytes = static_cast<size_t>(slots) * sizeof(SlotScratch);
  if (const char* e = Error(cudaMalloc(&s, scratch_bytes))) {
    cudaFreeHost(host);
    return e;
  }
  if (const char* e = Error(cudaMemset(s, 0, scratch_bytes))) {
    cudaFree(s);
    cudaFreeHost(host);
    return e;
  }
  *host_header = static_cast<DeviceFingerprintHeader*>(host);
  *host_slots = reinterpret_cast<DeviceFingerprintSlot*>(static_cast<DeviceFingerprintHeader*>(host) + 1);
  *device_header = dev;
  *device_slots = static_cast<DeviceFingerprintHeader*>(dev) + 1;
  *scratch = s;
  return nullptr;
}

void CudaFingerprintTableDestroy(DeviceFingerprintHeader* host_header, void* scratch) {
  // After a sticky fault these fail; the process is going down anyway.
  if (scratch != nullptr) cudaFree(scratch);
  if (host_header != nullptr) cudaFreeHost(host_header);
}

const char* CudaEnqueueBeginStep(void* device_header, void* stream) {
  BeginStepKernel<<<1, 32, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<DeviceFingerprintHeader*>(device_header));
  return Error(cudaGetLastError());
}

const char* CudaEnqueueFingerprint(const void* data, int kind, uint64_t numel, uint32_t slot, void* device_header,
                                   void* device_slots, void* scratch, void* stream) {
  FingerprintKernel<<<DeviceFingerprintBlocks(numel), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      data, kind, numel, static_cast<SlotScratch*>(scratch) + slot,
      static_cast<DeviceFingerprintSlot*>(device_slots) + slot,
      static_cast<const DeviceFingerprintHeader*>(device_header));
  return Error(cudaGetLastError());
}

}  // namespace crashreplay::capture::internal
