#include "crashreplay/formats/capture_format.h"

#include <cstdio>
#include <cstring>

#include "absl/strings/str_format.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace crashreplay {

const char* RecordTypeName(uint16_t type) {
  switch (static_cast<RecordType>(type)) {
    case RecordType::kManifest: return "manifest";
    case RecordType::kStep: return "step";
    case RecordType::kBlob: return "blob";
    case RecordType::kSnapshot: return "snapshot";
    case RecordType::kFailure: return "failure";
    case RecordType::kWeightCheck: return "weight-check";
    case RecordType::kDropped: return "dropped";
    case RecordType::kWeightHashes: return "weight-hashes";
    case RecordType::kIndex: return "index";
    case RecordType::kEnd: return "end";
    case RecordType::kFingerprints: return "fingerprints";
  }
  return "unknown";
}

uint64_t FrameChecksum(const unsigned char header[kFrameHeaderSize], const void* payload, size_t payload_size) {
  // One-shot hashing needs the covered bytes contiguous; a stack state keeps
  // this allocation-free (XXH3_state_t is plain data, 64-byte aligned).
  alignas(64) XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_64bits_reset(&state);
  XXH3_64bits_update(&state, header + 4, 12);
  if (payload_size > 0) XXH3_64bits_update(&state, payload, payload_size);
  return XXH3_64bits_digest(&state);
}

void EncodeFrameHeader(uint16_t type, uint16_t flags, const void* payload, size_t payload_size,
                       unsigned char out[kFrameHeaderSize]) {
  std::memcpy(out, kFrameMarker, 4);
  StoreLE16(out + 4, type);
  StoreLE16(out + 6, flags);
  StoreLE64(out + 8, payload_size);
  StoreLE64(out + 16, FrameChecksum(out, payload, payload_size));
}

bool ParseFrameHeader(const unsigned char in[kFrameHeaderSize], FrameHeader* out) {
  if (std::memcmp(in, kFrameMarker, 4) != 0) return false;
  out->type = LoadLE16(in + 4);
  out->flags = LoadLE16(in + 6);
  out->payload_size = LoadLE64(in + 8);
  out->checksum = LoadLE64(in + 16);
  return true;
}

void EncodeFileHeader(unsigned char out[kFileHeaderSize]) {
  std::memset(out, 0, kFileHeaderSize);
  std::memcpy(out, kCaptureMagic, 8);
  StoreLE16(out + 8, kCaptureMajorVersion);
  StoreLE16(out + 10, kCaptureMinorVersion);
  StoreLE64(out + 24, XXH3_64bits(out, 24));
}

absl::Status CheckFileHeader(const unsigned char* data, size_t size, uint16_t* major, uint16_t* minor) {
  if (size < kFileHeaderSize) {
    if (size >= 8 && std::memcmp(data, kCaptureMagic, 8) != 0) {
      return absl::DataLossError("not a crashreplay capture (wrong magic at byte offset 0)");
    }
    return absl::DataLossError(
        absl::StrFormat("file is %d bytes, shorter than the %d-byte capture header: the recorder died while "
                        "creating it, or this is not a capture",
                        size, kFileHeaderSize));
  }
  if (std::memcmp(data, kCaptureMagic, 8) != 0) {
    return absl::DataLossError("not a crashreplay capture (wrong magic at byte offset 0)");
  }
  if (LoadLE64(data + 24) != XXH3_64bits(data, 24)) {
    return absl::DataLossError("capture header checksum mismatch at byte offset 24: the file header is corrupt");
  }
  *major = LoadLE16(data + 8);
  *minor = LoadLE16(data + 10);
  if (*major > kCaptureMajorVersion) {
    return absl::UnimplementedError(
        absl::StrFormat("capture format version %d.%d is newer than this crashreplay reads (major %d); "
                        "use a newer crashreplay",
                        *major, *minor, kCaptureMajorVersion));
  }
  if (*major == 0) return absl::DataLossError("capture header has major version 0, which was never written");
  if (LoadLE32(data + 12) != 0 || LoadLE64(data + 16) != 0) {
    // Checksummed but nonzero: a writer from a future minor version would
    // have bumped the major version to set these, so refuse.
    return absl::UnimplementedError("capture header sets reserved fields (offset 12..23) this version does not know");
  }
  return absl::OkStatus();
}

void EncodeBlobHeader(const BlobHeader& h, unsigned char out[kBlobHeaderSize]) {
  std::memset(out, 0, kBlobHeaderSize);
  out[0] = static_cast<unsigned char>(h.codec);
  out[1] = static_cast<unsigned char>(h.transform);
  out[2] = h.element_size;
  StoreLE64(out + 8, h.raw_size);
  StoreLE64(out + 16, h.hash.high);
  StoreLE64(out + 24, h.hash.low);
}

absl::Status ParseBlobHeader(const unsigned char* data, size_t size, BlobHeader* out) {
  if (size < kBlobHeaderSize) {
    return absl::DataLossError(
        absl::StrFormat("blob payload is %d bytes, shorter than its %d-byte header", size, kBlobHeaderSize));
  }
  if (data[0] > static_cast<unsigned char>(BlobCodec::kZstd)) {
    return absl::DataLossError(absl::StrFormat("blob codec %d is unknown", data[0]));
  }
  if (data[1] > static_cast<unsigned char>(BlobTransform::kBytePlaneShuffle)) {
    return absl::DataLossError(absl::StrFormat("blob transform %d is unknown", data[1]));
  }
  const bool shuffled = data[1] == static_cast<unsigned char>(BlobTransform::kBytePlaneShuffle);
  if (shuffled ? (data[2] < 2 || data[2] > 16) : data[2] != 0) {
    return absl::DataLossError(absl::StrFormat("blob element size %d does not fit transform %d", data[2], data[1]));
  }
  if (data[0] == 0 && data[1] != 0) {
    return absl::DataLossError("uncompressed blob declares a byte-plane transform");
  }
  for (int i = 3; i < 8; ++i) {
    if (data[i] != 0) return absl::DataLossError("blob header reserved bytes 3..7 are not zero");
  }
  out->codec = static_cast<BlobCodec>(data[0]);
  out->transform = static_cast<BlobTransform>(data[1]);
  out->element_size = data[2];
  out->raw_size = LoadLE64(data + 8);
  out->hash = Hash128{LoadLE64(data + 16), LoadLE64(data + 24)};
  if (out->codec == BlobCodec::kNone && out->raw_size != size - kBlobHeaderSize) {
    return absl::DataLossError(
        absl::StrFormat("uncompressed blob declares %d bytes but carries %d", out->raw_size, size - kBlobHeaderSize));
  }
  return absl::OkStatus();
}

std::string CaptureFileNameForRank(uint32_t rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05u.crcap", rank);
  return buf;
}

}  // namespace crashreplay
