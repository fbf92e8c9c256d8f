// The chunked hash of device-resident weights: fixed-size chunks hashed
// independently (one GPU thread each), combined on the host.
//
// Definition (docs/capture.md "Chunked hash"): split the bytes into chunks
// of kChunkedHashChunkBytes (the last one may be shorter); h_i = XXH3-64
// (seed 0, default secret) of chunk i; the result is XXH3-128 (seed 0) of
//   LE64(total size) || LE64(kChunkedHashChunkBytes) || LE64(h_0) || ... || LE64(h_{n-1}).
// It is NOT the plain XXH3-128 of the bytes: a faithful device XXH3-128
// would be a port of the whole algorithm, while XXH3-64's long-input path is
// small enough to write once for host and device (capture/src/xxh3_long.h).
// The host computes the same value (ChunkedHashHost) for buffers in host
// memory, so a device hash can be checked on any machine.
//
// Thread safety: pure functions. Errors (device only): Unimplemented when
// the library was built without CUDA, Internal for a CUDA error (with its
// name), FailedPrecondition for a pointer that is not device memory.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "crashreplay/formats/hash.h"

namespace crashreplay::capture {

inline constexpr uint64_t kChunkedHashChunkBytes = 64 * 1024;

// XXH3-64 of each chunk (reference: libxxhash), combined as defined above.
Hash128 ChunkedHashHost(const void* data, size_t size);

// Combines per-chunk XXH3-64 values (the definition's last step).
Hash128 CombineChunkHashes(uint64_t total_size, const uint64_t* chunk_hashes, size_t num_chunks);

// The same value for `size` bytes of device memory, computed by the CUDA
// kernel (chunks over 240 bytes) and the host (a final chunk of 240 bytes
// or less is copied back and hashed there). Synchronous.
absl::StatusOr<Hash128> ChunkedHashDevice(const void* device_data, size_t size);

// Whether ChunkedHashDevice can run here (built with CUDA and a device present).
bool DeviceHashAvailable();

}  // namespace crashreplay::capture
