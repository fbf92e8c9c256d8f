// Byte layout of the capture container: file header, frame header, record
// types, blob payload header and the reader's limits.
//
// docs/formats/capture.md is the normative description; this header is its
// executable form. All integers are little-endian. Pure functions over byte
// buffers, thread-safe, no allocation (ParseFrameHeader is usable on any
// bytes, including hostile ones: it only reads kFrameHeaderSize bytes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "crashreplay/formats/hash.h"

namespace crashreplay {

// ---- file header (32 bytes) ------------------------------------------------
//   0  8  magic "\x89CRCAP\r\n" (binary-safe, detects text-mode mangling)
//   8  2  major version
//  10  2  minor version
//  12  4  flags, reserved, must be zero
//  16  8  reserved, must be zero
//  24  8  XXH3-64 of bytes 0..23
inline constexpr char kCaptureMagic[8] = {'\x89', 'C', 'R', 'C', 'A', 'P', '\r', '\n'};
inline constexpr size_t kFileHeaderSize = 32;
// 2.0: frame flag bit 1 (zstd-compressed structured payloads). Readers
// read 1.x as well; bit 1 is refused in a 1.x file.
inline constexpr uint16_t kCaptureMajorVersion = 2;
// 2.1: fingerprint records (type 11, written skippable so 2.0 readers skip them).
// 2.2: frame flag bit 2 (step records as parts of one zstd stream); a 2.1
// reader refuses the bit with Unimplemented ("use a newer crashreplay").
// 2.3: frame flag bit 3 (a step record whose page-table rows may be
// deltas, PageTableRow.start/fromPrevious); a 2.2 reader refuses it.
// 2.4: frame flag bit 4 (a streamed step record whose position, sequence
// length and cache-slot lists are differences from the step before it);
// a 2.3 reader refuses it.
inline constexpr uint16_t kCaptureMinorVersion = 4;

// ---- frame header (24 bytes) -----------------------------------------------
//   0  4  frame marker "CRfr"
//   4  2  record type (RecordType)
//   6  2  flags: bit 0 = skippable; bit 1 = the payload is one zstd frame
//         (content size stated) holding the record's Cap'n Proto message
//         (format 2.0 on; structured records only, never a blob); bit 2 =
//         the payload is a part of a zstd stream of step records (2.2 on,
//         below; step records only, never with bit 1); bit 3 = the step
//         record holds page-table deltas (2.3 on; step records only);
//         bit 4 = the step record's lists named by kStepListDeltas
//         (capture_records.h) are
//         differences from the step record before it (2.4 on; only on a
//         zstd stream part that does not start its zstd frame);
//         other bits reserved, must be zero
//   8  8  payload length in bytes
//  16  8  XXH3-64 (seed 0) of header bytes 4..15 followed by the payload
inline constexpr char kFrameMarker[4] = {'C', 'R', 'f', 'r'};
inline constexpr size_t kFrameHeaderSize = 24;
inline constexpr uint16_t kFrameFlagSkippable = 1u << 0;
inline constexpr uint16_t kFrameFlagZstd = 1u << 1;
inline constexpr uint16_t kFrameFlagZstdStream = 1u << 2;
inline constexpr uint16_t kFrameFlagPageDeltas = 1u << 3;
inline constexpr uint16_t kFrameFlagListDeltas = 1u << 4;
// The flags a file of this version may set.
inline constexpr uint16_t FrameFlagsKnown(uint16_t major, uint16_t minor) {
  if (major < 2) return kFrameFlagSkippable;
  if (major == 2 && minor < 2) return kFrameFlagSkippable | kFrameFlagZstd;
  if (major == 2 && minor < 3) return kFrameFlagSkippable | kFrameFlagZstd | kFrameFlagZstdStream;
  if (major == 2 && minor < 4)
    return kFrameFlagSkippable | kFrameFlagZstd | kFrameFlagZstdStream | kFrameFlagPageDeltas;
  return kFrameFlagSkippable | kFrameFlagZstd | kFrameFlagZstdStream | kFrameFlagPageDeltas | kFrameFlagListDeltas;
}

// ---- zstd stream part (frame flag bit 2, format 2.2) -------------------------
// The payload of a streamed step record: an 8-byte part header, then the
// zstd bytes the compressor flushed for this record. The parts of one zstd
// frame are consecutive step frames (other records may come between);
// each decodes to exactly its record's Cap'n Proto message, given the
// parts of the same zstd frame before it.
//   0  1  1 = this part starts a new zstd frame, 0 = it continues the
//         frame of the step part before it
//   1  3  reserved, must be zero
//   4  4  the record's decoded size in bytes
inline constexpr size_t kStreamPartHeaderSize = 8;
inline constexpr uint8_t kStreamPartStart = 1;

enum class RecordType : uint16_t {
  kManifest = 1,       // SessionManifest, exactly one, the first frame
  kStep = 2,           // StepRecord
  kBlob = 3,           // binary blob payload (below)
  kSnapshot = 4,       // SnapshotRecord
  kFailure = 5,        // FailureRecord
  kWeightCheck = 6,    // WeightCheckRecord
  kDropped = 7,        // DroppedSnapshotsRecord
  kWeightHashes = 8,   // WeightHashesRecord
  kIndex = 9,          // IndexRecord, written by a clean close
  kEnd = 10,           // EndRecord, the last frame of a cleanly closed file
  kFingerprints = 11,  // FingerprintRecord (2.1), always skippable
};
inline constexpr uint16_t kMaxKnownRecordType = 11;

const char* RecordTypeName(uint16_t type);  // "step", ..., "unknown"

struct FrameHeader {
  uint16_t type = 0;
  uint16_t flags = 0;
  uint64_t payload_size = 0;
  uint64_t checksum = 0;
};

// Writes the 24 header bytes for `payload`, checksum included.
void EncodeFrameHeader(uint16_t type, uint16_t flags, const void* payload, size_t payload_size,
                       unsigned char out[kFrameHeaderSize]);
// Reads the fields; false if the marker is wrong (nothing else is checked).
bool ParseFrameHeader(const unsigned char in[kFrameHeaderSize], FrameHeader* out);
// The checksum a frame with this header and payload must carry.
uint64_t FrameChecksum(const unsigned char header[kFrameHeaderSize], const void* payload, size_t payload_size);

void EncodeFileHeader(unsigned char out[kFileHeaderSize]);
// Checks magic, checksum, reserved fields and version; the error names what
// is wrong (Unimplemented for a newer major version, DataLoss otherwise).
absl::Status CheckFileHeader(const unsigned char* data, size_t size, uint16_t* major, uint16_t* minor);

// ---- blob payload ----------------------------------------------------------
//   0  1  codec: 0 none, 1 zstd
//   1  1  transform: 0 none, 1 byte-plane shuffle
//   2  1  element size of the shuffle (2 for bf16/fp16), else 0
//   3  5  reserved, must be zero
//   8  8  raw (decoded) length
//  16 16  XXH3-128 of the raw bytes: high 8 bytes, then low 8 bytes
//  32  .  encoded bytes
inline constexpr size_t kBlobHeaderSize = 32;
enum class BlobCodec : uint8_t { kNone = 0, kZstd = 1 };
enum class BlobTransform : uint8_t { kNone = 0, kBytePlaneShuffle = 1 };

struct BlobHeader {
  BlobCodec codec = BlobCodec::kNone;
  BlobTransform transform = BlobTransform::kNone;
  uint8_t element_size = 0;
  uint64_t raw_size = 0;
  Hash128 hash;
};
void EncodeBlobHeader(const BlobHeader& h, unsigned char out[kBlobHeaderSize]);
// Validates codec/transform/reserved bytes; DataLoss naming the field.
absl::Status ParseBlobHeader(const unsigned char* data, size_t size, BlobHeader* out);

// ---- limits a reader enforces ---------------------------------------------
struct CaptureLimits {
  uint64_t max_structured_payload = 64ull << 20;   // one capnp record
  uint64_t max_blob_raw_size = 8ull << 30;         // one decoded blob
  uint64_t max_total_decoded = 256ull << 30;       // all blobs one reader decodes
  uint64_t max_records = 1ull << 26;
  uint64_t traversal_limit_words = 16ull << 20;    // capnp, per message (128 MiB)
  int nesting_limit = 16;                          // capnp; the schema needs 5
};

// The file name of a rank inside a session directory: "rank-00003.crcap".
std::string CaptureFileNameForRank(uint32_t rank);
inline constexpr std::string_view kCaptureFileSuffix = ".crcap";

// Little-endian helpers (the format is LE on every host).
inline void StoreLE16(unsigned char* p, uint16_t v) {
  p[0] = static_cast<unsigned char>(v);
  p[1] = static_cast<unsigned char>(v >> 8);
}
inline void StoreLE32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
inline void StoreLE64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
inline uint16_t LoadLE16(const unsigned char* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
inline uint32_t LoadLE32(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
inline uint64_t LoadLE64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace crashreplay
