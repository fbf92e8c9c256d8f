#include "crashreplay/formats/capture_encoder.h"

#include <zstd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"

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

// Step records, the bulk of a capture, go compressed (zstd level 1, content
// size stated) when that saves bytes: a decode step of 256 requests shrinks
// about 4x (docs/formats/capture.md). Each frame is compressed on its own, so
// every frame still decodes alone (a crash may cut the file anywhere).
constexpr size_t kCompressFrom = 512;

// Frame flag bit 3 on a step whose rows are not all whole (2.3 readers
// resolve them; an older reader refuses the frame instead of misreading it).
uint16_t StepFlags(const StepRecord& r) {
  for (const PageTableRow& row : r.page_table) {
    if (!row.complete()) return kFrameFlagPageDeltas;
  }
  return 0;
}

EncodedFrame EncodeStep(std::vector<unsigned char> payload, uint64_t step, bool compress, uint16_t flags) {
  struct Free {
    void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
  };
  thread_local std::unique_ptr<ZSTD_CCtx, Free> cctx(ZSTD_createCCtx());
  if (compress && payload.size() >= kCompressFrom && cctx != nullptr) {
    EncodedFrame f;
    f.type = static_cast<uint16_t>(RecordType::kStep);
    f.step = step;
    f.bytes.resize(kFrameHeaderSize + ZSTD_compressBound(payload.size()));
    const size_t z = ZSTD_compressCCtx(cctx.get(), f.bytes.data() + kFrameHeaderSize, f.bytes.size() - kFrameHeaderSize,
                                       payload.data(), payload.size(), 1);
    if (!ZSTD_isError(z) && z < payload.size()) {
      f.bytes.resize(kFrameHeaderSize + z);
      EncodeFrameHeader(f.type, kFrameFlagZstd | flags, f.bytes.data() + kFrameHeaderSize, z, f.bytes.data());
      return f;
    }
  }
  EncodedFrame f = Frame(RecordType::kStep, flags, payload.data(), payload.size());
  f.step = step;
  return f;
}

}  // namespace

// Level 3, not 1: on a stream of decode steps its search finds more of the
// step before, so zstd has fewer literals to code and is faster as well as
// smaller (bench decode step that changes like a real one: 27 against
// 34 us a step, 1395 against 1727 bytes; a constant step: 57 bytes and
// ~4 us either way). Its 2 MiB window is what a reader needs.
constexpr int kLevel = 3;
constexpr size_t kWindowBytes = size_t{1} << 21;  // zstd level 3's window (windowLog 21)

struct StepStreamEncoder::Stream {
  struct Free {
    void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
  };
  std::unique_ptr<ZSTD_CCtx, Free> cctx{ZSTD_createCCtx()};
  // zstd's output, kept from record to record: a vector of the bound's
  // size would be zero-filled for every record (as large as the record,
  // for a part a few dozen times smaller).
  std::unique_ptr<unsigned char[]> out;
  size_t out_size = 0;
  // The kStepListDeltas lists of the record before, for the next part's
  // differences (format 2.4).
  StepRecord base;
};

StepStreamEncoder::StepStreamEncoder() : stream_(std::make_unique<Stream>()) {}
StepStreamEncoder::~StepStreamEncoder() = default;

absl::StatusOr<EncodedFrame> StepStreamEncoder::Encode(const StepRecord& record) {
  ZSTD_CCtx* c = stream_->cctx.get();
  const bool start = parts_ == 0 || parts_ >= kRestartEvery;
  // A part that continues a zstd frame holds its lists as differences from
  // the record of the part before (format 2.4, frame flag bit 4), which
  // every reader of this part has decoded; where none is as long as its
  // counterpart there, the record is written as it is (and unflagged).
  bool deltas = false;
  if (list_deltas_ && !start && c != nullptr) {
    for (std::vector<int64_t> StepRecord::* list : kStepListDeltas) {
      const size_t n = (record.*list).size();
      deltas = deltas || (n > 0 && (stream_->base.*list).size() == n);
    }
  }
  absl::StatusOr<std::vector<unsigned char>> payload =
      deltas ? internal::ToPayloadListDeltas(record, stream_->base) : internal::ToPayload(record);
  if (!payload.ok()) return payload.status();
  if (c == nullptr || payload->size() > UINT32_MAX) {  // on its own, as FrameEncoder would
    parts_ = 0;
    if (deltas) payload = internal::ToPayload(record);
    if (!payload.ok()) return payload.status();
    return EncodeStep(*std::move(payload), record.step, /*compress=*/true, StepFlags(record));
  }
  if (start) {
    ZSTD_CCtx_reset(c, ZSTD_reset_session_and_parameters);
    ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, kLevel);
    parts_ = 0;
  }
  // A flush emits at most the bound plus block headers; grown if not.
  const size_t want = ZSTD_compressBound(payload->size()) + 64;
  if (stream_->out_size < want) {
    stream_->out.reset(new unsigned char[want]);  // default-initialised: not zero-filled
    stream_->out_size = want;
  }
  ZSTD_inBuffer in{payload->data(), payload->size(), 0};
  ZSTD_outBuffer out{stream_->out.get(), stream_->out_size, 0};
  std::vector<unsigned char> spill;  // only if a flush ever passed the bound
  for (;;) {
    const size_t left = ZSTD_compressStream2(c, &out, &in, ZSTD_e_flush);
    if (ZSTD_isError(left)) {
      parts_ = 0;
      return absl::InternalError(
          absl::StrFormat("zstd cannot compress step %d: %s", record.step, ZSTD_getErrorName(left)));
    }
    if (left == 0) break;
    spill.insert(spill.end(), stream_->out.get(), stream_->out.get() + out.pos);
    out.pos = 0;
  }
  ++parts_;
  // After a part larger than level 3's window (2 MiB: the first whole rows
  // of a long-context batch), the parts that follow compressed about half
  // as well for as long as the frame lasted (recorder_bench: 64 requests'
  // decode deltas 155 B a step after 2 MiB of rows, 345 B after 4 MiB or
  // more). The next part starts a new frame instead, as after kRestartEvery
  // parts (not a Restart(): nothing was lost, so restarted() stays false).
  if (payload->size() > kWindowBytes) parts_ = kRestartEvery;
  EncodedFrame f;
  f.type = static_cast<uint16_t>(RecordType::kStep);
  f.step = record.step;
  constexpr size_t kFront = kFrameHeaderSize + kStreamPartHeaderSize;
  f.bytes.reserve(kFront + spill.size() + out.pos);
  f.bytes.resize(kFront);
  f.bytes.insert(f.bytes.end(), spill.begin(), spill.end());
  f.bytes.insert(f.bytes.end(), stream_->out.get(), stream_->out.get() + out.pos);
  unsigned char* part = f.bytes.data() + kFrameHeaderSize;
  std::memset(part, 0, kStreamPartHeaderSize);
  part[0] = start ? kStreamPartStart : 0;
  StoreLE32(part + 4, static_cast<uint32_t>(payload->size()));
  EncodeFrameHeader(f.type, kFrameFlagZstdStream | StepFlags(record) | (deltas ? kFrameFlagListDeltas : 0), part,
                    f.bytes.size() - kFrameHeaderSize, f.bytes.data());
  for (std::vector<int64_t> StepRecord::* list : kStepListDeltas) stream_->base.*list = record.*list;
  return f;
}

absl::StatusOr<EncodedFrame> FrameEncoder::Encode(const SessionManifest& m) {
  return EncodeRecord(RecordType::kManifest, m, 0);
}
absl::StatusOr<EncodedFrame> FrameEncoder::Encode(const WeightHashesRecord& r) {
  return EncodeRecord(RecordType::kWeightHashes, r, 0);
}
absl::StatusOr<EncodedFrame> FrameEncoder::Encode(const StepRecord& r, bool compress) {
  absl::StatusOr<std::vector<unsigned char>> payload = internal::ToPayload(r);
  if (!payload.ok()) return payload.status();
  return EncodeStep(*std::move(payload), r.step, compress, StepFlags(r));
}
absl::StatusOr<EncodedFrame> FrameEncoder::Encode(const SnapshotRecord& r) {
  return EncodeRecord(RecordType::kSnapshot, r, r.step);
}
absl::StatusOr<EncodedFrame> FrameEncoder::Encode(const WeightCheckRecord& r) {
  return EncodeRecord(RecordType::kWeightCheck, r, r.step);
}
// Fingerprints are new in 2.1 and nothing a reader needs to replay: skippable,
// so a 2.0 reader passes over them.
absl::StatusOr<EncodedFrame> FrameEncoder::Encode(const FingerprintRecord& r) {
  absl::StatusOr<std::vector<unsigned char>> payload = internal::ToPayload(r);
  if (!payload.ok()) return payload.status();
  EncodedFrame f = Frame(RecordType::kFingerprints, kFrameFlagSkippable, payload->data(), payload->size());
  f.step = r.step;
  return f;
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
absl::StatusOr<EncodedFrame> FrameEncoder::Encode(const EndRecord& r) { return EncodeRecord(RecordType::kEnd, r, 0); }

namespace {

// The payload is built in place after room for the frame header, so a
// 64 MiB tensor is not copied a second time.
EncodedFrame BlobFrame(const Hash128& hash, size_t raw_size, std::vector<unsigned char> bytes) {
  EncodedFrame f;
  f.type = static_cast<uint16_t>(RecordType::kBlob);
  f.blob_hash = hash;
  f.raw_size = raw_size;
  f.bytes = std::move(bytes);
  EncodeFrameHeader(f.type, 0, f.bytes.data() + kFrameHeaderSize, f.bytes.size() - kFrameHeaderSize, f.bytes.data());
  return f;
}

}  // namespace

EncodedFrame FrameEncoder::EncodeBlob(std::span<const std::byte> raw, const Hash128& hash, size_t element_size,
                                      const BlobEncodeOptions& options) {
  return BlobFrame(hash, raw.size(), EncodeBlobPayload(raw, hash, element_size, options, kFrameHeaderSize));
}

EncodedFrame FrameEncoder::EncodeBlob(std::span<const std::byte> raw, size_t element_size,
                                      const BlobEncodeOptions& options, std::vector<unsigned char> storage) {
  Hash128 hash;
  std::vector<unsigned char> bytes =
      EncodeBlobPayloadHashing(raw, element_size, options, kFrameHeaderSize, &hash, std::move(storage));
  return BlobFrame(hash, raw.size(), std::move(bytes));
}

size_t FrameEncoder::BlobFrameCapacity(size_t raw_size) {
  return kFrameHeaderSize + kBlobHeaderSize + ZSTD_compressBound(raw_size);
}

EncodedFrame FrameEncoder::EncodeRaw(uint16_t type, uint16_t flags, std::span<const unsigned char> payload) {
  return Frame(static_cast<RecordType>(type), flags, payload.data(), payload.size());
}

namespace {

// The only position of `pattern` in the frame's payload, or npos when it
// occurs zero or several times.
size_t FindUnique(const std::vector<unsigned char>& bytes, const unsigned char* pattern, size_t n) {
  size_t found = std::string::npos;
  for (size_t i = kFrameHeaderSize; i + n <= bytes.size(); ++i) {
    if (std::memcmp(bytes.data() + i, pattern, n) == 0) {
      if (found != std::string::npos) return std::string::npos;
      found = i;
    }
  }
  return found;
}

}  // namespace

absl::StatusOr<PreparedFailureFrame> PreparedFailureFrame::Create(const FailureRecord& base) {
  // Sentinels no real record carries; their positions in the encoding are
  // the positions of the fields (Cap'n Proto data sections are fixed-layout).
  constexpr int32_t kSignal = 0x5167a1ed;
  constexpr uint64_t kStep = 0x57e9c0de57e9c0deull;
  constexpr int64_t kTime = 0x71e571e571e571e5ll;
  FailureRecord r = base;
  r.signal = kSignal;
  r.step = kStep;
  r.timestamp_nanos = kTime;
  absl::StatusOr<EncodedFrame> with_step = FrameEncoder::Encode(r);
  if (!with_step.ok()) return with_step.status();
  r.step.reset();
  r.timestamp_nanos = kTime;
  absl::StatusOr<EncodedFrame> without_step = FrameEncoder::Encode(r);
  if (!without_step.ok()) return without_step.status();

  PreparedFailureFrame p;
  p.bytes_ = std::move(with_step->bytes);
  unsigned char buf[8];
  StoreLE32(buf, static_cast<uint32_t>(kSignal));
  p.signal_at_ = FindUnique(p.bytes_, buf, 4);
  StoreLE64(buf, kStep);
  p.step_at_ = FindUnique(p.bytes_, buf, 8);
  StoreLE64(buf, static_cast<uint64_t>(kTime));
  p.timestamp_at_ = FindUnique(p.bytes_, buf, 8);
  if (p.signal_at_ == std::string::npos || p.step_at_ == std::string::npos || p.timestamp_at_ == std::string::npos ||
      without_step->bytes.size() != p.bytes_.size()) {
    return absl::InternalError("cannot locate the fields of a failure record in its encoding");
  }
  // hasStep is one bit: the only difference besides the step's own bytes
  // (and the checksum).
  int diffs = 0;
  for (size_t i = kFrameHeaderSize; i < p.bytes_.size(); ++i) {
    if (i >= p.step_at_ && i < p.step_at_ + 8) continue;
    const unsigned char d = p.bytes_[i] ^ without_step->bytes[i];
    if (d != 0) {
      ++diffs;
      p.has_step_byte_ = i;
      p.has_step_mask_ = d;
    }
  }
  if (diffs != 1 || (p.has_step_mask_ & (p.has_step_mask_ - 1)) != 0) {
    return absl::InternalError("cannot locate the hasStep bit of a failure record in its encoding");
  }
  return p;
}

std::span<const unsigned char> PreparedFailureFrame::Fill(int32_t signal, int64_t step,
                                                          int64_t timestamp_nanos) noexcept {
  unsigned char* b = bytes_.data();
  StoreLE32(b + signal_at_, static_cast<uint32_t>(signal));
  StoreLE64(b + step_at_, step < 0 ? 0 : static_cast<uint64_t>(step));
  if (step < 0) {
    b[has_step_byte_] = static_cast<unsigned char>(b[has_step_byte_] & ~has_step_mask_);
  } else {
    b[has_step_byte_] = static_cast<unsigned char>(b[has_step_byte_] | has_step_mask_);
  }
  StoreLE64(b + timestamp_at_, static_cast<uint64_t>(timestamp_nanos));
  StoreLE64(b + 16, FrameChecksum(b, b + kFrameHeaderSize, bytes_.size() - kFrameHeaderSize));
  return {b, bytes_.size()};
}

}  // namespace crashreplay
