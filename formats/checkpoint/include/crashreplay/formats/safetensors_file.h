// One safetensors file, validated as hostile input, read over mmap.
//
// Layout (see docs/formats/safetensors.md): 8-byte little-endian header
// length N, N bytes of UTF-8 JSON, then the data region. The JSON maps each
// tensor name to {dtype, shape, data_offsets: [begin, end]} (offsets relative
// to the data region) and may hold "__metadata__": {string: string}.
//
// Open() checks every rule before returning: header length against the cap
// and the file size, JSON well-formed (depth-limited, no duplicate keys),
// every dtype known, shapes non-negative and not overflowing, every tensor's
// byte range inside the data region, begin <= end, ranges pairwise disjoint,
// and range length == elements x dtype size. After a successful Open, Data()
// cannot read outside the file.
//
// Errors: DataLoss for a corrupt or inconsistent file, ResourceExhausted for
// a header over kMaxHeaderBytes, Unimplemented for a dtype safetensors knows
// but crashreplay does not (C64, F6_*, F8_*FNUZ), NotFound when there is no
// regular file at the path (a directory, FIFO or device is refused without
// reading or blocking), PermissionDenied/FailedPrecondition for other I/O.
// Every message names the file and, where there is one, the tensor. The
// header parse is linear in its size (safetensors_header.h): 100,000
// tensors take well under a second.
//
// Deferred opening (OpenDeferred) reads and validates only the header (with
// pread) and keeps the file open; nothing is mapped until MapTensor maps one
// tensor's bytes on their own, unmapped when the last holder of that mapping
// lets go. A replay that streams layers (replay/docs: weights=stream) reads
// a checkpoint larger than its address space this way.
//
// Ownership: the object owns its mapping (or its copy of the buffer, or its
// open descriptor); spans from Data() live as long as the object. Immutable
// after construction, so concurrent reads are safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "crashreplay/formats/dtype.h"

namespace crashreplay {

class ByteSource;
class OpenFile;

struct TensorInfo {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  uint64_t data_offset = 0;  // absolute byte offset in the file
  uint64_t byte_size = 0;

  // Product of `shape` (1 for a scalar). Validated not to overflow at Open.
  int64_t NumElements() const;
};

// One tensor's bytes as MapTensor gives them: valid while this object lives.
class TensorMapping {
 public:
  virtual ~TensorMapping() = default;
  virtual std::span<const std::byte> bytes() const = 0;
};

class SafetensorsFile {
 public:
  // Largest header accepted. The Python package refuses headers over
  // 100,000,000 bytes; we use 100 MiB, a little more, so anything it writes
  // we read. Real headers are a few hundred KiB at most.
  static constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
  // Deepest JSON nesting accepted in a header. A valid header nests 3 deep.
  static constexpr int kMaxJsonDepth = 16;
  // Most dimensions a tensor may have.
  static constexpr size_t kMaxRank = 32;

  // Maps `path` read-only (MAP_PRIVATE) and validates it.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  // Reads and validates the header only (the same checks as Open, against
  // the file's size); the data stays on disk until MapTensor.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> OpenDeferred(const std::string& path);

  // Validates a copy of `bytes`; `name` stands in for the path in messages.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> FromBuffer(std::string name,
                                                                     std::span<const std::byte> bytes);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // Sorted by name.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // nullptr when absent.
  const TensorInfo* Find(std::string_view name) const;
  // The tensor's bytes. `info` must come from this file's tensors(). Empty
  // for a deferred file (use MapTensor).
  std::span<const std::byte> Data(const TensorInfo& info) const;
  bool deferred() const { return file_ != nullptr; }
  // The tensor's bytes held by the returned object: on a deferred file a
  // mapping of their own (DataLoss when the file shrank since it was opened,
  // ResourceExhausted when the address space is full); otherwise a view of
  // the whole-file mapping, which needs this object alive.
  absl::StatusOr<std::shared_ptr<const TensorMapping>> MapTensor(const TensorInfo& info) const;
  // The "__metadata__" map (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Size of the header JSON (without the 8-byte length) and of the file.
  uint64_t header_size() const { return header_size_; }
  uint64_t file_size() const;

 private:
  SafetensorsFile(std::string path, std::unique_ptr<ByteSource> source);
  // `source` holds the file's first bytes, at least the header (the whole
  // file unless deferred); `file_size` is the whole file's size.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Parse(std::string path, std::unique_ptr<ByteSource> source,
                                                                uint64_t file_size);

  std::string path_;
  std::unique_ptr<ByteSource> source_;
  std::unique_ptr<OpenFile> file_;  // deferred: the open file
  uint64_t file_size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
  uint64_t header_size_ = 0;
};

}  // namespace crashreplay
