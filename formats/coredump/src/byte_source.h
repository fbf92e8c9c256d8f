// Bounded reads of a dump's bytes: from memory, from a regular file with
// pread (nothing mapped, so a file cut under the reader is a Status, not
// SIGBUS), or from a range of another source (a module image embedded in
// the dump). Private to formats/coredump. Thread-safe for reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace crashreplay::coredump {

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual uint64_t size() const = 0;
  // Copies [offset, offset + n) into `out` (resized to n). The caller
  // checks the range against size() first; a read past the end, or a short
  // read (the file shrank), is DataLoss naming `what`.
  virtual absl::Status Read(uint64_t offset, uint64_t n, std::vector<unsigned char>* out,
                            const std::string& what) const = 0;
};

// Over `bytes`, which must outlive the source.
std::unique_ptr<ByteSource> MemorySource(std::span<const std::byte> bytes);
// The regular file at `path`, opened non-blocking with its type checked on
// the descriptor (NotFound for a directory, FIFO, device or missing file).
absl::StatusOr<std::unique_ptr<ByteSource>> FileSource(const std::string& path);
// [offset, offset + size) of `base` (checked by the caller to lie inside
// it); `base` must outlive the slice.
std::unique_ptr<ByteSource> SliceSource(const ByteSource& base, uint64_t offset, uint64_t size);

// Whether [offset, offset + n) lies inside [0, size), without overflow.
inline bool InRange(uint64_t offset, uint64_t n, uint64_t size) { return offset <= size && n <= size - offset; }

}  // namespace crashreplay::coredump
