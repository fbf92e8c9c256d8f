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

}  // namespace crashreplay
