// Encoding and decoding of tensor blob payloads: byte-plane shuffle + zstd.
//
// Why the shuffle: in bf16/fp16 data the high byte (sign, exponent, top of
// the mantissa) is highly repetitive while the low byte is close to noise.
// Interleaved, zstd sees neither pattern well; split into two planes it
// compresses the high plane hard and gives up quickly on the low one (about
// 1.29x -> 1.46x at level 1 on bf16-like data, bench/capture_bench.cc).
//
// Shuffled planes are compressed at `plane_level` (a negative zstd level)
// with zstd's Huffman coding of literals forced on: on bf16-like data that is
// 2.3x faster than level 1 and a little smaller (1.46x -> 1.49x,
// docs/formats/capture.md).
//
// Pure functions; thread-safe (each thread reuses its own zstd context and
// two 256 KiB buffers; nothing of the blob's own size besides the result).
// DecodeBlobPayload treats its input as hostile: the declared raw size is
// checked against `max_raw_size` before any allocation, zstd's own frame
// size must agree with it, and the decoded bytes must hash to the header's
// XXH3-128. Errors are DataLoss (corrupt) or ResourceExhausted (over a cap).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "crashreplay/formats/capture_format.h"
#include "crashreplay/formats/hash.h"

namespace crashreplay {

struct BlobEncodeOptions {
  // Unshuffled data (element size 0 or 1, or byte_plane_shuffle off).
  int zstd_level = 1;
  // Shuffled planes: this level with literal coding forced on; 0 uses
  // zstd_level as for other data. -100: look for a match every ~100 bytes
  // when none is found (long runs and repeats are still found).
  int plane_level = -100;
  // Shuffle byte planes when element_size > 1 (the caller passes the
  // dtype's element size; 2 for bf16/fp16). Off: plain zstd.
  bool byte_plane_shuffle = true;
  // Store uncompressed when zstd saves less than this fraction (incompressible
  // data costs a second copy on read otherwise for nothing).
  double min_saving = 0.02;
};

// out[p * n + i] = in[i * k + p] for the n = size / k whole elements; the
// size % k tail bytes are copied as they are. k in [2, 16].
void ShuffleBytePlanes(const unsigned char* in, size_t size, size_t k, unsigned char* out);
void UnshuffleBytePlanes(const unsigned char* in, size_t size, size_t k, unsigned char* out);

// The full blob payload (kBlobHeaderSize header + encoded bytes) for `raw`.
// `hash` must be XXH128Of(raw) (callers usually computed it already to
// check for duplicates). element_size: bytes per element (0 or 1: none).
// The result starts with `headroom` zero bytes before the payload, room for
// a frame header without copying the payload again. `storage`, when given,
// is written into instead of a new allocation where its capacity suffices
// (a buffer of a blob nobody needs any more; its contents are discarded).
std::vector<unsigned char> EncodeBlobPayload(std::span<const std::byte> raw, const Hash128& hash, size_t element_size,
                                             const BlobEncodeOptions& options, size_t headroom = 0,
                                             std::vector<unsigned char> storage = {});

// As EncodeBlobPayload, computing the hash (into *hash) at the same time:
// on a second thread for blobs of 4 MiB or more, so that hashing and
// compressing a large tensor overlap (the snapshot encoder). Callers that
// must know the hash before deciding to encode (a duplicate is skipped)
// hash first and call EncodeBlobPayload.
std::vector<unsigned char> EncodeBlobPayloadHashing(std::span<const std::byte> raw, size_t element_size,
                                                    const BlobEncodeOptions& options, size_t headroom, Hash128* hash,
                                                    std::vector<unsigned char> storage = {});

// Decodes and verifies a blob payload; `max_raw_size` caps the allocation.
absl::StatusOr<std::vector<std::byte>> DecodeBlobPayload(const unsigned char* payload, size_t size,
                                                         uint64_t max_raw_size);

}  // namespace crashreplay
