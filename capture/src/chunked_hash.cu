// The CUDA launcher of the chunked hash (chunked_hash.h): one thread per
// chunk runs the shared XXH3-64 long-input body (xxh3_long.h). Built only
// with CRASHREPLAY_HAVE_CUDA. Not tuned: one thread reads its 64 KiB
// serially; a weight set of a few GB is tens of thousands of chunks, which
// fills the device.
#include <cuda_runtime.h>

#include "chunked_hash_cuda.h"
#include "xxh3_default_secret.h"
#include "xxh3_long.h"

namespace crashreplay::capture::internal {
namespace {

__constant__ unsigned char g_secret[xxh3::kSecretSize];

__global__ void HashChunksKernel(const unsigned char* data, size_t size, size_t chunk_bytes, size_t chunks,
                                 uint64_t* out) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= chunks) return;
  const size_t begin = i * chunk_bytes;
  const size_t n = size - begin < chunk_bytes ? size - begin : chunk_bytes;
  out[i] = xxh3::HashLong64(data + begin, n, g_secret);
}

const char* Error(cudaError_t e) { return e == cudaSuccess ? nullptr : cudaGetErrorName(e); }

}  // namespace

int CudaDeviceCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

const char* CudaIsDevicePointer(const void* p, bool* is_device) {
  cudaPointerAttributes attr{};
  const cudaError_t e = cudaPointerGetAttributes(&attr, p);
  *is_device = e == cudaSuccess && (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged);
  return Error(e);
}

const char* CudaHashChunks(const void* data, size_t size, size_t chunk_bytes, size_t chunks, uint64_t* host_out) {
  static const cudaError_t secret = cudaMemcpyToSymbol(g_secret, Xxh3DefaultSecret(), xxh3::kSecretSize);
  if (secret != cudaSuccess) return Error(secret);
  uint64_t* d_out = nullptr;
  if (const char* e = Error(cudaMalloc(&d_out, chunks * sizeof(uint64_t)))) return e;
  constexpr int kThreads = 128;
  const unsigned blocks = static_cast<unsigned>((chunks + kThreads - 1) / kThreads);
  HashChunksKernel<<<blocks, kThreads>>>(static_cast<const unsigned char*>(data), size, chunk_bytes, chunks, d_out);
  const char* e = Error(cudaGetLastError());
  if (e == nullptr) e = Error(cudaMemcpy(host_out, d_out, chunks * sizeof(uint64_t), cudaMemcpyDeviceToHost));
  cudaFree(d_out);
  return e;
}

const char* CudaCopyToHost(void* dst, const void* src, size_t n) {
  return Error(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost));
}

}  // namespace crashreplay::capture::internal
