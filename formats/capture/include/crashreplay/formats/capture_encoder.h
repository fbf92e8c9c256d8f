// FrameEncoder: turns one record into a self-contained, ready-to-append frame.
//
// An EncodedFrame's `bytes` are the frame exactly as it goes on disk (24-byte
// header with checksum, then the payload), so appending it needs nothing but
// write(2) — see CaptureWriter::AppendEncodedFrame, which a fatal-signal
// handler may call. Encoding allocates and may take long (zstd on a large
// tensor), so the recorder does it on a background thread, off the serving
// step. Stateless and thread-safe: any thread may encode at any time.
// Errors: record encoding returns InvalidArgument when Cap'n Proto refuses
// the record (a list over 2^29 elements); blob encoding cannot fail.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "crashreplay/formats/blob_codec.h"
#include "crashreplay/formats/capture_format.h"
#include "crashreplay/formats/capture_records.h"
#include "crashreplay/formats/hash.h"

namespace crashreplay {

struct EncodedFrame {
  uint16_t type = 0;
  std::vector<unsigned char> bytes;  // header + payload
  Hash128 blob_hash;                 // blob frames: the content address
  uint64_t raw_size = 0;             // blob frames: decoded bytes
  uint64_t step = 0;                 // step/snapshot/weight-check frames (for the index)
};

class FrameEncoder {
 public:
  static absl::StatusOr<EncodedFrame> Encode(const SessionManifest& manifest);  // sets the format version
  static absl::StatusOr<EncodedFrame> Encode(const WeightHashesRecord& record);
  // compress: a step record of 512 bytes or more is stored zstd-compressed
  // (frame flag kFrameFlagZstd) when that is smaller; false stores it as is
  // (the recorder's writer does so to catch up when it falls behind).
  static absl::StatusOr<EncodedFrame> Encode(const StepRecord& record, bool compress = true);
  static absl::StatusOr<EncodedFrame> Encode(const SnapshotRecord& record);
  static absl::StatusOr<EncodedFrame> Encode(const WeightCheckRecord& record);
  static absl::StatusOr<EncodedFrame> Encode(const FingerprintRecord& record);
  static absl::StatusOr<EncodedFrame> Encode(const DroppedSnapshotsRecord& record);
  static absl::StatusOr<EncodedFrame> Encode(const FailureRecord& record);
  static absl::StatusOr<EncodedFrame> Encode(const IndexRecord& record);
  static absl::StatusOr<EncodedFrame> Encode(const EndRecord& record);

  // A blob frame for `raw`, whose XXH3-128 the caller computed (XXH128Of) to
  // look for a duplicate first. element_size: 2 for bf16/fp16 enables the
  // byte-plane shuffle; 0 or 1 disables it.
  static EncodedFrame EncodeBlob(std::span<const std::byte> raw, const Hash128& hash, size_t element_size,
                                 const BlobEncodeOptions& options = {});
  // The same, hashing while it encodes (EncodeBlobPayloadHashing): the
  // frame's blob_hash is the hash. `storage`: as EncodeBlobPayload's (the
  // snapshot ring passes the bytes of a frame it evicted).
  static EncodedFrame EncodeBlob(std::span<const std::byte> raw, size_t element_size,
                                 const BlobEncodeOptions& options = {}, std::vector<unsigned char> storage = {});
  // The capacity EncodeBlob reserves for a blob of `raw_size` bytes
  // (frame header, blob header, zstd's bound): storage of at least this
  // capacity is written in place.
  static size_t BlobFrameCapacity(size_t raw_size);

  // Any payload under any type and flags; for record types added later and
  // for tests of the forward-compatibility rule.
  static EncodedFrame EncodeRaw(uint16_t type, uint16_t flags, std::span<const unsigned char> payload);
};

// Step records as parts of one zstd stream (format 2.2, frame flag bit 2,
// docs/formats/capture.md): each record is compressed with the records
// before it in view, so a decode step that repeats most of the step before
// costs little in time and bytes (zstd level 1 on whole frames: ~7x on the
// bench's decode step and ~40 us; as a stream part: a few hundred times
// smaller and ~4 us). Every frame is still one complete frame, so a crash
// cuts a file only between parts; but a part decodes only after the parts
// before it back to the one that starts its zstd frame. A new zstd frame
// starts every kRestartEvery records and after Restart(): the writer calls
// it whenever a frame it encoded does not reach the file next (the disk
// refused it and it is held in memory, or may be dropped from there), so
// no part ever follows a missing one.
//
// Output depends only on the sequence of records and Restart() calls (no
// threads, no clock). Not thread-safe: one per writing thread.
class StepStreamEncoder {
 public:
  static constexpr uint32_t kRestartEvery = 1024;

  StepStreamEncoder();
  ~StepStreamEncoder();
  StepStreamEncoder(const StepStreamEncoder&) = delete;
  StepStreamEncoder& operator=(const StepStreamEncoder&) = delete;

  // InvalidArgument as FrameEncoder::Encode; Internal if zstd fails (the
  // next record then starts a new zstd frame).
  absl::StatusOr<EncodedFrame> Encode(const StepRecord& record);
  void Restart() { parts_ = 0; }
  // Whether parts after the first of a zstd frame hold kStepListDeltas as
  // differences (format 2.4, frame flag bit 4; on unless set off). Off, the
  // stream is one a 2.3 reader reads.
  void set_list_deltas(bool on) { list_deltas_ = on; }
  // Whether the stream was restarted (or never started): the next record
  // starts a zstd frame after a Restart(), not after kRestartEvery parts.
  bool restarted() const { return parts_ == 0; }

 private:
  struct Stream;
  std::unique_ptr<Stream> stream_;
  uint32_t parts_ = 0;  // parts in the current zstd frame; 0: the next starts one
  bool list_deltas_ = true;
};

// A failure frame encoded ahead of time whose signal number, step and
// timestamp can be filled in from a fatal-signal handler. Create() encodes
// `base` (reason, stage, rank, class ...) off the hot path and finds where
// those fields sit in the bytes by encoding sentinels; Fill() is
// async-signal-safe: it stores integers into the buffer and recomputes the
// frame checksum with a stack-allocated hash state. No lock, no allocation.
// One buffer: a handler that may run on several threads at once must guard
// Fill() with an atomic flag of its own.
class PreparedFailureFrame {
 public:
  static absl::StatusOr<PreparedFailureFrame> Create(const FailureRecord& base);

  // Sets the fields and returns the complete frame (valid until the next
  // Fill). step < 0 records "step unknown".
  std::span<const unsigned char> Fill(int32_t signal, int64_t step, int64_t timestamp_nanos) noexcept;

 private:
  std::vector<unsigned char> bytes_;
  size_t signal_at_ = 0, step_at_ = 0, timestamp_at_ = 0, has_step_byte_ = 0;
  unsigned char has_step_mask_ = 0;
};

}  // namespace crashreplay
