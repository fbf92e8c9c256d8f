// Read-only views of file bytes: an mmap of a file on disk, or an owned
// in-memory copy. Private to formats/.
//
// The mapping is PROT_READ + MAP_PRIVATE: nothing we do can write through to
// the file. If another process truncates the file while it is mapped, reads
// past the new end raise SIGBUS; checkpoints are treated as immutable while
// open, as every loader does. Not copyable; movable. Thread-safe for reads.
#pragma once

#include <cstddef>
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

// Maps `path` read-only. NotFound if absent, FailedPrecondition if it is not
// a regular file or cannot be mapped. An empty file yields an empty span.
absl::StatusOr<std::unique_ptr<ByteSource>> MapFile(const std::string& path);

// Takes a copy of `bytes`.
std::unique_ptr<ByteSource> CopyBytes(std::span<const std::byte> bytes);

}  // namespace crashreplay
