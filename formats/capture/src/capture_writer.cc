#include "crashreplay/formats/capture_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"
#include "crashreplay/base/status.h"

namespace crashreplay {
namespace {

// write(2) until done; async-signal-safe. Returns bytes written before an
// error (== size on success).
size_t WriteAll(int fd, const unsigned char* p, size_t size) noexcept {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd, p + done, size - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return done;
    }
    if (n == 0) return done;
    done += static_cast<size_t>(n);
  }
  return done;
}

}  // namespace

CaptureWriter::CaptureWriter(std::string path, int fd, CaptureWriterOptions options)
    : path_(std::move(path)), fd_(fd), options_(options) {}

CaptureWriter::~CaptureWriter() {
  const int fd = fd_.load();
  if (fd >= 0) ::close(fd);
}

absl::StatusOr<std::unique_ptr<CaptureWriter>> CaptureWriter::Create(const std::string& path,
                                                                     const SessionManifest& manifest,
                                                                     const CaptureWriterOptions& options) {
  absl::StatusOr<EncodedFrame> manifest_frame = FrameEncoder::Encode(manifest);
  if (!manifest_frame.ok()) return manifest_frame.status();
  const int flags = O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (options.overwrite ? O_TRUNC : O_EXCL);
  const int fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0) {
    return absl::ErrnoToStatus(errno, absl::StrFormat("cannot create capture file %s", path));
  }
  std::unique_ptr<CaptureWriter> writer(new CaptureWriter(path, fd, options));
  unsigned char header[kFileHeaderSize];
  EncodeFileHeader(header);
  if (WriteAll(fd, header, sizeof header) != sizeof header) {
    return absl::ErrnoToStatus(errno, absl::StrFormat("cannot write the header of %s", path));
  }
  writer->offset_ = kFileHeaderSize;
  std::lock_guard<std::mutex> lock(writer->mu_);
  if (absl::Status s = writer->WriteLocked(*manifest_frame); !s.ok()) return s;
  return writer;
}

absl::Status CaptureWriter::WriteBytesLocked(const unsigned char* data, size_t size, const char* what) {
  if (closed_) return absl::FailedPreconditionError(absl::StrFormat("capture %s is already closed", path_));
  if (failed_.load()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "capture %s has a torn frame at its end that could not be cut off; no further records are appended", path_));
  }
  const int fd = fd_.load();
  const uint64_t offset = offset_.load();
  const size_t n = WriteAll(fd, data, size);
  if (n == size) {
    offset_.fetch_add(size);
    return absl::OkStatus();
  }
  const int err = errno;
  write_errors_.fetch_add(1);
  absl::Status status =
      absl::ErrnoToStatus(err, absl::StrFormat("write of %s to %s failed at offset %d", what, path_, offset + n));
  // Cut the partial frame off: the file stays its complete frames, and a
  // later append (when space returns) follows them instead of being hidden
  // behind a torn frame.
  if (n > 0 && ::ftruncate(fd, static_cast<off_t>(offset)) != 0) {
    failed_ = true;
    return absl::Status(status.code(),
                        absl::StrFormat("%s; cutting the torn frame off at offset %d failed too (%s), so no further "
                                        "records are appended",
                                        status.message(), offset, strerror(errno)));
  }
  return status;
}

absl::Status CaptureWriter::WriteLocked(const EncodedFrame& frame) {
  const uint64_t offset = offset_.load();
  CR_RETURN_IF_ERROR(WriteBytesLocked(frame.bytes.data(), frame.bytes.size(),
                                      absl::StrFormat("a %s record", RecordTypeName(frame.type)).c_str()));
  frames_.fetch_add(1);
  if (frame.type == static_cast<uint16_t>(RecordType::kBlob)) {
    blob_offsets_.emplace(frame.blob_hash, offset);
  } else {
    entries_.push_back(IndexEntry{frame.type, offset, frame.step});
    if (frame.type == static_cast<uint16_t>(RecordType::kStep)) ++steps_;
  }
  return absl::OkStatus();
}

absl::Status CaptureWriter::Append(const EncodedFrame& frame) {
  if (frame.type == static_cast<uint16_t>(RecordType::kManifest) ||
      frame.type == static_cast<uint16_t>(RecordType::kIndex) ||
      frame.type == static_cast<uint16_t>(RecordType::kEnd)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s records are written by Create() and Close(), not appended", RecordTypeName(frame.type)));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (frame.type == static_cast<uint16_t>(RecordType::kBlob) && blob_offsets_.contains(frame.blob_hash)) {
    return absl::OkStatus();
  }
  return WriteLocked(frame);
}

template <typename T>
absl::Status CaptureWriter::EncodeAndAppend(const T& record) {
  absl::StatusOr<EncodedFrame> frame = FrameEncoder::Encode(record);
  if (!frame.ok()) return frame.status();
  return Append(*frame);
}

absl::Status CaptureWriter::Append(const StepRecord& r) { return EncodeAndAppend(r); }
absl::Status CaptureWriter::Append(const SnapshotRecord& r) { return EncodeAndAppend(r); }
absl::Status CaptureWriter::Append(const WeightHashesRecord& r) { return EncodeAndAppend(r); }
absl::Status CaptureWriter::Append(const WeightCheckRecord& r) { return EncodeAndAppend(r); }
absl::Status CaptureWriter::Append(const FingerprintRecord& r) { return EncodeAndAppend(r); }
absl::Status CaptureWriter::Append(const FailureRecord& r) { return EncodeAndAppend(r); }
absl::Status CaptureWriter::Append(const DroppedSnapshotsRecord& r) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    snapshots_dropped_ = r.snapshots_dropped;
    bytes_dropped_ = r.bytes_dropped;
    steps_dropped_ = r.steps_dropped;
    records_dropped_ = r.records_dropped;
  }
  return EncodeAndAppend(r);
}

absl::StatusOr<Hash128> CaptureWriter::AppendBlob(std::span<const std::byte> raw, size_t element_size) {
  const Hash128 hash = XXH128Of(raw);
  if (HasBlob(hash)) return hash;  // skip the compression, not only the write
  if (absl::Status s = Append(FrameEncoder::EncodeBlob(raw, hash, element_size, options_.blob)); !s.ok()) {
    return s;
  }
  return hash;
}

bool CaptureWriter::HasBlob(const Hash128& hash) const {
  std::lock_guard<std::mutex> lock(mu_);
  return blob_offsets_.contains(hash);
}

bool CaptureWriter::AppendEncodedFrame(const void* data, size_t size) noexcept {
  const int fd = fd_.load(std::memory_order_relaxed);
  if (fd < 0 || failed_.load(std::memory_order_relaxed)) return false;
  const uint64_t offset = offset_.load(std::memory_order_relaxed);
  const size_t n = WriteAll(fd, static_cast<const unsigned char*>(data), size);
  if (n != size) {
    const int err = errno;
    write_errors_.fetch_add(1, std::memory_order_relaxed);
    // As WriteBytesLocked: cut a partial frame off (ftruncate is
    // async-signal-safe), or refuse every later append.
    if (n > 0 && ::ftruncate(fd, static_cast<off_t>(offset)) != 0) failed_.store(true, std::memory_order_relaxed);
    errno = err;
    return false;
  }
  offset_.fetch_add(n, std::memory_order_relaxed);
  // Counted as one frame: the caller passes whole frames, usually one.
  frames_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

absl::Status CaptureWriter::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return absl::FailedPreconditionError(absl::StrFormat("capture %s is already closed", path_));
  IndexRecord index;
  index.entries = entries_;
  index.blobs.reserve(blob_offsets_.size());
  for (const auto& [hash, offset] : blob_offsets_) index.blobs.push_back(BlobIndexEntry{hash, offset});
  // Sorted by offset: same input -> same bytes, whatever the hash map's order.
  std::sort(index.blobs.begin(), index.blobs.end(),
            [](const BlobIndexEntry& a, const BlobIndexEntry& b) { return a.offset < b.offset; });
  EndRecord end;
  end.ok = true;
  end.records = frames_.load();
  end.steps = steps_;
  end.blobs = blob_offsets_.size();
  end.index_offset = offset_.load();
  end.snapshots_dropped = snapshots_dropped_;
  end.bytes_dropped = bytes_dropped_;
  end.steps_dropped = steps_dropped_;
  end.records_dropped = records_dropped_;
  end.write_errors = write_errors_.load();
  absl::StatusOr<EncodedFrame> index_frame = FrameEncoder::Encode(index);
  if (!index_frame.ok()) return index_frame.status();
  absl::StatusOr<EncodedFrame> end_frame = FrameEncoder::Encode(end);
  if (!end_frame.ok()) return end_frame.status();
  // Index and end record in one write: a failed write is cut off whole, so
  // Close() may be tried again (when space returns) without leaving a
  // stray index frame behind.
  std::vector<unsigned char> tail = std::move(index_frame->bytes);
  tail.insert(tail.end(), end_frame->bytes.begin(), end_frame->bytes.end());
  CR_RETURN_IF_ERROR(WriteBytesLocked(tail.data(), tail.size(), "the index and end record"));
  frames_.fetch_add(2);
  closed_ = true;
  // EINVAL: a pipe or other file that cannot be synced (nothing to wait for).
  if (options_.fsync_on_close && ::fsync(fd_.load()) != 0 && errno != EINVAL) {
    return absl::ErrnoToStatus(errno, absl::StrFormat("fsync of capture %s failed", path_));
  }
  const int fd = fd_.exchange(-1);
  if (::close(fd) != 0) return absl::ErrnoToStatus(errno, absl::StrFormat("close of capture %s failed", path_));
  return absl::OkStatus();
}

}  // namespace crashreplay
