// The CUDA launcher of the chunked hash (chunked_hash.h): one thread per
// chunk runs the shared XXH3-64 long-input body (xxh3_long.h); the host
// hashes a final chunk of 240 bytes or less and combines. Built only with
// CRASHREPLAY_HAVE_CUDA. Not tuned: one thread reads its 64 KiB serially;
// a weight set of a few GB is thousands of chunks, which fills the device.
#include <cuda_runtime.h>

#include <string>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "absl/strings/str_cat.h"
#include "crashreplay/capture/chunked_hash.h"
#include "xxh3_default_secret.h"
#include "xxh3_long.h"

namespace crashreplay::capture {
namespace {

__constant__ unsigned char g_secret[xxh3::kSecretSize];

__global__ void HashChunksKernel(const unsigned char* data, size_t size, size_t chunks, uint64_t* out) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= chunks) return;
  const size_t begin = i * kChunkedHashChunkBytes;
  const size_t n = size - begin < kChunkedHashChunkBytes ? size - begin : kChunkedHashChunkBytes;
  out[i] = xxh3::HashLong64(data + begin, n, g_secret);
}

absl::Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

}  // namespace

bool DeviceHashAvailable() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

absl::StatusOr<Hash128> ChunkedHashDevice(const void* device_data, size_t size) {
  cudaPointerAttributes attr{};
  if (absl::Status s = CudaStatus(cudaPointerGetAttributes(&attr, device_data), "cudaPointerGetAttributes"); !s.ok()) {
    return s;
  }
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
    return absl::FailedPreconditionError("ChunkedHashDevice: the pointer is not device memory; use ChunkedHashHost");
  }
  static const cudaError_t secret_copied =
      cudaMemcpyToSymbol(g_secret, Xxh3DefaultSecret(), xxh3::kSecretSize);
  if (absl::Status s = CudaStatus(secret_copied, "copying the XXH3 secret"); !s.ok()) return s;

  const auto* data = static_cast<const unsigned char*>(device_data);
  size_t chunks = (size + kChunkedHashChunkBytes - 1) / kChunkedHashChunkBytes;
  const size_t tail = size % kChunkedHashChunkBytes;
  // A short last chunk (<= 240 bytes) takes XXH3's short-input paths: host.
  const bool host_tail = tail != 0 && tail <= xxh3::kMidSizeMax;
  const size_t device_chunks = host_tail ? chunks - 1 : chunks;
  std::vector<uint64_t> h(chunks);
  if (device_chunks > 0) {
    uint64_t* d_out = nullptr;
    if (absl::Status s = CudaStatus(cudaMalloc(&d_out, device_chunks * sizeof(uint64_t)), "cudaMalloc"); !s.ok()) {
      return s;
    }
    constexpr int kThreads = 128;
    const unsigned blocks = static_cast<unsigned>((device_chunks + kThreads - 1) / kThreads);
    HashChunksKernel<<<blocks, kThreads>>>(data, host_tail ? size - tail : size, device_chunks, d_out);
    absl::Status s = CudaStatus(cudaGetLastError(), "launching the hash kernel");
    if (s.ok()) {
      s = CudaStatus(cudaMemcpy(h.data(), d_out, device_chunks * sizeof(uint64_t), cudaMemcpyDeviceToHost),
                     "copying chunk hashes");
    }
    cudaFree(d_out);
    if (!s.ok()) return s;
  }
  if (host_tail) {
    unsigned char buf[xxh3::kMidSizeMax];
    if (absl::Status s = CudaStatus(cudaMemcpy(buf, data + size - tail, tail, cudaMemcpyDeviceToHost), "copying the tail");
        !s.ok()) {
      return s;
    }
    h[chunks - 1] = XXH3_64bits(buf, tail);
  }
  return CombineChunkHashes(size, h.data(), h.size());
}

}  // namespace crashreplay::capture
