#include "crashreplay/capture/chunked_hash.h"

#include <algorithm>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

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

#if !defined(CRASHREPLAY_HAVE_CUDA)
absl::StatusOr<Hash128> ChunkedHashDevice(const void*, size_t) {
  return absl::UnimplementedError(
      "device hashing needs a CUDA build (configure with -DCRASHREPLAY_CUDA=ON where nvcc is installed)");
}
bool DeviceHashAvailable() { return false; }
#endif

}  // namespace crashreplay::capture
