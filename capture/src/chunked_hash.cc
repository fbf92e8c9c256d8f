#include "crashreplay/capture/chunked_hash.h"

#include <algorithm>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "absl/strings/str_cat.h"
#include "chunked_hash_cuda.h"
#include "xxh3_default_secret.h"

namespace crashreplay::capture {

const unsigned char* Xxh3DefaultSecret() { return XXH3_kSecret; }

Hash128 CombineChunkHashes(uint64_t total_size, const uint64_t* chunk_hashes, size_t num_chunks) {
  std::vector<unsigned char> buf(16 + 8 * num_chunks);
  auto put = [&](size_t at, uint64_t v) {
    for (int i = 0; i < 8; ++i) buf[at + i] = static_cast<unsigned char>(v >> (8 * i));
  };
  put(0, total_size);
  put(8, kChunkedHashChunkBytes);
  for (size_t i = 0; i < num_chunks; ++i) put(16 + 8 * i, chunk_hashes[i]);
  return XXH128Of(buf.data(), buf.size());
}

Hash128 ChunkedHashHost(const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::vector<uint64_t> h;
  for (size_t at = 0; at < size; at += kChunkedHashChunkBytes) {  // empty input: no chunks
    h.push_back(XXH3_64bits(p + at, std::min<size_t>(kChunkedHashChunkBytes, size - at)));
  }
  return CombineChunkHashes(size, h.data(), h.size());
}

#if defined(CRASHREPLAY_HAVE_CUDA)
bool DeviceHashAvailable() { return internal::CudaDeviceCount() > 0; }

absl::StatusOr<Hash128> ChunkedHashDevice(const void* device_data, size_t size) {
  bool is_device = false;
  if (const char* e = internal::CudaIsDevicePointer(device_data, &is_device)) {
    return absl::InternalError(absl::StrCat("cudaPointerGetAttributes: ", e));
  }
  if (!is_device) {
    return absl::FailedPreconditionError("ChunkedHashDevice: the pointer is not device memory; use ChunkedHashHost");
  }
  const size_t chunks = (size + kChunkedHashChunkBytes - 1) / kChunkedHashChunkBytes;
  const size_t tail = size % kChunkedHashChunkBytes;
  // A last chunk of 240 bytes or less takes XXH3's short-input paths: host.
  const bool host_tail = tail != 0 && tail <= 240;
  const size_t device_chunks = host_tail ? chunks - 1 : chunks;
  std::vector<uint64_t> h(chunks);
  if (device_chunks > 0) {
    if (const char* e = internal::CudaHashChunks(device_data, host_tail ? size - tail : size, kChunkedHashChunkBytes,
                                                 device_chunks, h.data())) {
      return absl::InternalError(absl::StrCat("hashing device weights: ", e));
    }
  }
  if (host_tail) {
    unsigned char buf[240];
    if (const char* e =
            internal::CudaCopyToHost(buf, static_cast<const unsigned char*>(device_data) + size - tail, tail)) {
      return absl::InternalError(absl::StrCat("copying the last chunk of device weights: ", e));
    }
    h[chunks - 1] = XXH3_64bits(buf, tail);
  }
  return CombineChunkHashes(size, h.data(), h.size());
}
#else
absl::StatusOr<Hash128> ChunkedHashDevice(const void*, size_t) {
  return absl::UnimplementedError(
      "device hashing needs a CUDA build (configure with -DCRASHREPLAY_CUDA=ON where nvcc is installed)");
}
bool DeviceHashAvailable() { return false; }
#endif

}  // namespace crashreplay::capture
