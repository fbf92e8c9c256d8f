// CaptureWriter: appends frames to one capture file (one rank of a session).
//
// Create() opens the file (O_APPEND), writes the file header and the
// manifest frame. Frames are then appended whole; a process that dies at
// any moment leaves a file whose complete frames are all readable (the
// reader reports the missing end record as ok=false and a partial last
// frame as truncated). Close() writes the index and the end record with
// ok=true, fsyncs and closes: only a clean close makes a capture "ok".
//
// Ownership: the writer owns its descriptor; the destructor closes it
// without writing the end record (the file then reads like a crash capture,
// which is the truth if Close() was never reached).
//
// Thread safety: every method except AppendEncodedFrame, fd() and
// bytes_written() takes an internal mutex, so several threads may append.
// Frame encoding (compression) is done by FrameEncoder outside the writer.
//
// Async-signal safety: AppendEncodedFrame(), fd() and bytes_written() are
// async-signal-safe: they use write(2) and lock-free atomics only, take no
// lock and allocate nothing. A fatal-signal handler may therefore append
// frames encoded earlier (a FailureRecord encoded in advance, the ring's
// already-compressed blobs). Frames appended that way are not listed in the
// index (the process is dying; Close() will not run anyway). Each frame goes
// out in one write(2) on an O_APPEND descriptor, so frames from different
// threads do not interleave on local Linux filesystems.
//
// Errors: I/O errors carry errno's meaning (absl::ErrnoToStatus) and the
// path. A failed or partial write (ENOSPC, EDQUOT, EFBIG, EIO) is cut off
// with ftruncate(2) back to the end of the last complete frame, so the file
// stays a valid capture and a later append (when space returns) may follow
// it; the failed frame is not listed in the index. Close() writes the index
// and end record in one write and may likewise be tried again after it
// failed. Only when the cut itself fails does the writer refuse further
// appends (FailedPrecondition), since a torn frame in the middle would hide
// every frame after it from readers.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "crashreplay/formats/capture_encoder.h"
#include "crashreplay/formats/capture_records.h"

namespace crashreplay {

struct CaptureWriterOptions {
  BlobEncodeOptions blob;
  bool overwrite = false;        // replace an existing file instead of failing
  bool fsync_on_close = true;
};

class CaptureWriter {
 public:
  static absl::StatusOr<std::unique_ptr<CaptureWriter>> Create(const std::string& path, const SessionManifest& manifest,
                                                               const CaptureWriterOptions& options = {});
  ~CaptureWriter();
  CaptureWriter(const CaptureWriter&) = delete;
  CaptureWriter& operator=(const CaptureWriter&) = delete;

  // Appends an encoded frame and lists it in the index. A blob frame whose
  // hash is already in the file is not written again (OK is returned).
  absl::Status Append(const EncodedFrame& frame);

  // Encode + Append, for callers without a background encoder.
  absl::Status Append(const StepRecord& record);
  absl::Status Append(const SnapshotRecord& record);
  absl::Status Append(const WeightHashesRecord& record);
  absl::Status Append(const WeightCheckRecord& record);
  absl::Status Append(const FingerprintRecord& record);
  absl::Status Append(const DroppedSnapshotsRecord& record);
  absl::Status Append(const FailureRecord& record);

  // Hashes `raw`; writes a blob frame unless that content is already in the
  // file. Returns the content hash, the blob's reference.
  absl::StatusOr<Hash128> AppendBlob(std::span<const std::byte> raw, size_t element_size);

  // Whether a blob with this hash was appended through Append/AppendBlob.
  bool HasBlob(const Hash128& hash) const;

  // Async-signal-safe. Writes `size` bytes of one or more complete encoded
  // frames with write(2), retrying on EINTR and short writes. Returns false
  // on error (errno preserved for the caller). Not listed in the index.
  bool AppendEncodedFrame(const void* data, size_t size) noexcept;

  // Writes the index and the end record (ok = true), fsyncs, closes.
  // Appends after Close() fail with FailedPrecondition.
  absl::Status Close();

  int fd() const noexcept { return fd_.load(std::memory_order_relaxed); }
  const std::string& path() const { return path_; }
  uint64_t bytes_written() const noexcept { return offset_.load(std::memory_order_relaxed); }
  // Failed writes so far (each cut back, or the writer is broken()).
  uint64_t write_errors() const noexcept { return write_errors_.load(std::memory_order_relaxed); }
  // True when a torn frame could not be cut off: nothing more is appended.
  bool broken() const noexcept { return failed_.load(std::memory_order_relaxed); }

 private:
  CaptureWriter(std::string path, int fd, CaptureWriterOptions options);
  absl::Status WriteLocked(const EncodedFrame& frame);
  // write(2)s whole frames at the end; on failure cuts them off again.
  absl::Status WriteBytesLocked(const unsigned char* data, size_t size, const char* what);
  template <typename T>
  absl::Status EncodeAndAppend(const T& record);

  const std::string path_;
  std::atomic<int> fd_;
  const CaptureWriterOptions options_;
  std::atomic<uint64_t> offset_{0};
  std::atomic<uint64_t> frames_{0};        // every frame, tracked or not
  std::atomic<uint64_t> write_errors_{0};
  std::atomic<bool> failed_{false};  // a torn frame could not be cut off
  mutable std::mutex mu_;
  bool closed_ = false;
  uint64_t steps_ = 0;
  uint64_t snapshots_dropped_ = 0;
  uint64_t bytes_dropped_ = 0;
  uint64_t steps_dropped_ = 0;
  uint64_t records_dropped_ = 0;
  std::vector<IndexEntry> entries_;
  absl::flat_hash_map<Hash128, uint64_t, Hash128Hasher> blob_offsets_;
};

}  // namespace crashreplay
