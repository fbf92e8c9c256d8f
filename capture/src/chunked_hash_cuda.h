// The CUDA side of the chunked hash (internal). Plain C++17 types only, so
// that chunked_hash.cu compiles under nvcc without the project's C++20
// headers. Each function returns nullptr on success or the CUDA error
// name/description (a static string).
#pragma once

#include <cstddef>
#include <cstdint>

namespace crashreplay::capture::internal {

int CudaDeviceCount();
// *is_device: the pointer is device (or managed) memory.
const char* CudaIsDevicePointer(const void* p, bool* is_device);
// XXH3-64 of `chunks` chunks of `chunk_bytes` (the last may be shorter but
// must exceed 240 bytes) of device memory data[0, size); results to host_out.
const char* CudaHashChunks(const void* data, size_t size, size_t chunk_bytes, size_t chunks, uint64_t* host_out);
const char* CudaCopyToHost(void* dst, const void* src, size_t n);

}  // namespace crashreplay::capture::internal
