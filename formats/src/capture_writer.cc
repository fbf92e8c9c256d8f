#include "crashreplay/formats/capture_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

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

absl::Status CaptureWriter::WriteLocked(const EncodedFrame& frame) {
  if (closed_) return absl::FailedPreconditionError(absl::StrFormat("capture %s is already closed", path_));
  if (failed_.load()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("capture %s had a write error; no further records are appended", path_));
  }
  const uint64_t offset = offset_.fetch_add(frame.bytes.size());
  const size_t n = WriteAll(fd_.load(), frame.bytes.data(), frame.bytes.size());
  if (n != frame.bytes.size()) {
    failed_ = true;
    return absl::ErrnoToStatus(errno, absl::StrFormat("write of a %s record to %s failed at offset %d",
                                                      RecordTypeName(frame.type), path_, offset + n));
  }
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
      frame.type == static_cast<uint16_t>(RecordType::kIndex) || frame.type == static_cast<uint16_t>(RecordType::kEnd)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s records are written by Create() and Close(), not appended", RecordTypeName(frame.type)));
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
  const size_t n = WriteAll(fd, static_cast<const unsigned char*>(data), size);
  offset_.fetch_add(n, std::memory_order_relaxed);
  if (n != size) {
    failed_.store(true, std::memory_order_relaxed);
    return false;
  }
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
  absl::StatusOr<EncodedFrame> index_frame = FrameEncoder::Encode(index);
  if (!index_frame.ok()) return index_frame.status();
  absl::StatusOr<EncodedFrame> end_frame = FrameEncoder::Encode(end);
  if (!end_frame.ok()) return end_frame.status();
  CR_RETURN_IF_ERROR(WriteLocked(*index_frame));
  CR_RETURN_IF_ERROR(WriteLocked(*end_frame));
  closed_ = true;
  if (options_.fsync_on_close && ::fsync(fd_.load()) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrFormat("fsync of capture %s failed", path_));
  }
  const int fd = fd_.exchange(-1);
  if (::close(fd) != 0) return absl::ErrnoToStatus(errno, absl::StrFormat("close of capture %s failed", path_));
  return absl::OkStatus();
}

}  // namespace crashreplay
