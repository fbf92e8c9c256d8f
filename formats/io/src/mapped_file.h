// Read-only views of file bytes: an mmap of a file on disk, or an owned
// in-memory copy. Private to formats/.
//
// The mapping is PROT_READ + MAP_PRIVATE: nothing we do can write through to
// the file. If another process truncates the file while it is mapped, reads
// past the new end raise SIGBUS; checkpoints are treated as immutable while
// open, as every loader does. Not copyable; movable. Thread-safe for reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace crashreplay {

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual std::span<const std::byte> bytes() const = 0;
};

// Opens `path` for reading, only if it is a regular file, and never blocks:
// the open is non-blocking (a FIFO without a writer, a tty or a device must
// not hang the reader) and the file type is checked on the open descriptor
// (no window between check and open). NotFound when there is no regular file
// there ("'x' is a FIFO, not a regular file" too: exit 3 in the CLI, like a
// missing file), PermissionDenied or FailedPrecondition for other errors.
// The caller owns the descriptor; `size` receives the file's size.
absl::StatusOr<int> OpenRegularFile(const std::string& path, uint64_t* size = nullptr);

// Reads a whole regular file of at most `max_bytes` (ResourceExhausted over
// it), through OpenRegularFile.
absl::StatusOr<std::string> ReadRegularFile(const std::string& path, uint64_t max_bytes);

// Maps `path` read-only, through OpenRegularFile. FailedPrecondition if it
// cannot be mapped. An empty file yields an empty span.
absl::StatusOr<std::unique_ptr<ByteSource>> MapFile(const std::string& path);

// Takes a copy of `bytes`.
std::unique_ptr<ByteSource> CopyBytes(std::span<const std::byte> bytes);

// A regular file kept open to map parts of it on demand (a deferred
// safetensors file): the header is read with pread, each tensor mapped on
// its own when asked for and unmapped when its last holder lets go, so the
// process never maps the whole file.
class OpenFile {
 public:
  // Through OpenRegularFile; records the size at open.
  static absl::StatusOr<std::unique_ptr<OpenFile>> Open(const std::string& path);
  ~OpenFile();
  OpenFile(const OpenFile&) = delete;
  OpenFile& operator=(const OpenFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  // Reads [offset, offset + n) (DataLoss on a short read).
  absl::StatusOr<std::vector<std::byte>> Read(uint64_t offset, uint64_t n) const;
  // Maps [offset, offset + n) read-only. The file must still have the size
  // and modification time it had at open: DataLoss naming the file when it
  // changed since (a file rewritten under a running replay), rather than
  // other bytes than those hashed at load, or the SIGBUS a read past a new
  // end would raise.
  absl::StatusOr<std::unique_ptr<ByteSource>> Map(uint64_t offset, uint64_t n) const;

 private:
  OpenFile(std::string path, int fd, uint64_t size) : path_(std::move(path)), fd_(fd), size_(size) {}
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
  int64_t mtime_ns_ = 0;
};

}  // namespace crashreplay
