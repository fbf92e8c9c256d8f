#include "crashreplay/formats/capture_encoder.h"

#include <cstring>

#include "capture_schema_codec.h"

namespace crashreplay {
namespace {

EncodedFrame Frame(RecordType type, uint16_t flags, const unsigned char* payload, size_t size) {
  EncodedFrame f;
  f.type = static_cast<uint16_t>(type);
  f.bytes.resize(kFrameHeaderSize + size);
  if (size > 0) std::memcpy(f.bytes.data() + kFrameHeaderSize, payload, size);
  EncodeFrameHeader(f.type, flags, f.bytes.data() + kFrameHeaderSize, size, f.bytes.data());
  return f;
}

template <typename T>
absl::StatusOr<EncodedFrame> EncodeRecord(RecordType type, const T& record, uint64_t step) {
  absl::StatusOr<std::vector<unsigned char>> payload = internal::ToPayload(record);
  if (!payload.ok()) return payload.status();
  EncodedFrame f = Frame(type, 0, payload->data(), payload->size());
  f.step = step;
  return f;
}

}  // namespace

absl::StatusOr<EncodedFrame> FrameEncoder::Encode(const SessionManifest& m) {
  return EncodeRecord(RecordType::kManifest, m, 0);
}
absl::StatusOr<EncodedFrame> FrameEncoder::Encode(const WeightHashesRecord& r) {
  return EncodeRecord(RecordType::kWeightHashes, r, 0);
}
absl::StatusOr<EncodedFrame> FrameEncoder::Encode(const StepRecord& r) {
  return EncodeRecord(RecordType::kStep, r, r.step);
}
absl::StatusOr<EncodedFrame> FrameEncoder::Encode(const SnapshotRecord& r) {
  return EncodeRecord(RecordType::kSnapshot, r, r.step);
}
absl::StatusOr<EncodedFrame> FrameEncoder::Encode(const WeightCheckRecord& r) {
  return EncodeRecord(RecordType::kWeightCheck, r, r.step);
}
absl::StatusOr<EncodedFrame> FrameEncoder::Encode(const DroppedSnapshotsRecord& r) {
  return EncodeRecord(RecordType::kDropped, r, r.step);
}
absl::StatusOr<EncodedFrame> FrameEncoder::Encode(const FailureRecord& r) {
  return EncodeRecord(RecordType::kFailure, r, r.step.value_or(0));
}
absl::StatusOr<EncodedFrame> FrameEncoder::Encode(const IndexRecord& r) {
  return EncodeRecord(RecordType::kIndex, r, 0);
}
absl::StatusOr<EncodedFrame> FrameEncoder::Encode(const EndRecord& r) {
  return EncodeRecord(RecordType::kEnd, r, 0);
}

EncodedFrame FrameEncoder::EncodeBlob(std::span<const std::byte> raw, const Hash128& hash, size_t element_size,
                                      const BlobEncodeOptions& options) {
  // The payload is built in place after room for the frame header, so a
  // 64 MiB tensor is not copied a second time.
  EncodedFrame f;
  f.type = static_cast<uint16_t>(RecordType::kBlob);
  f.blob_hash = hash;
  f.raw_size = raw.size();
  f.bytes = EncodeBlobPayload(raw, hash, element_size, options, kFrameHeaderSize);
  EncodeFrameHeader(f.type, 0, f.bytes.data() + kFrameHeaderSize, f.bytes.size() - kFrameHeaderSize,
                    f.bytes.data());
  return f;
}

EncodedFrame FrameEncoder::EncodeBlob(std::span<const std::byte> raw, size_t element_size,
                                      const BlobEncodeOptions& options) {
  return EncodeBlob(raw, XXH128Of(raw), element_size, options);
}

EncodedFrame FrameEncoder::EncodeRaw(uint16_t type, uint16_t flags, std::span<const unsigned char> payload) {
  return Frame(static_cast<RecordType>(type), flags, payload.data(), payload.size());
}

}  // namespace crashreplay
