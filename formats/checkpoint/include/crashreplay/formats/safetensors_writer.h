// Writes safetensors files, and sharded HF checkpoints, byte for byte as
// the Python `safetensors` package (>= 0.4) writes them.
//
// Layout written: 8-byte LE header length; compact JSON header with
// "__metadata__" first (when set; its keys sorted), then the tensors in data
// order; the header padded with spaces to a multiple of 8 bytes; tensor bytes
// packed back to back, no gaps. Data order is the Python package's: by dtype
// (its enum order, descending: U64 I64 F64 F32 U32 I32 BF16 F16 U16 I16
// F8_E8M0 F8_E4M3 F8_E5M2 I8 U8 F4 BOOL), then by name. With at most one
// metadata key the output equals the Python package's byte for byte; with
// more, Python's order of metadata keys is that of a hash map (it varies
// between runs), ours is sorted.
//
// Write() is atomic: bytes go to "<path>.tmp-<pid>", are flushed and
// fsync'ed, then renamed over `path`; a crash leaves either the old file or
// the new one, never a torn one.
//
// The writer copies tensor bytes at Add(). Not thread-safe; one writer per
// thread. Errors: InvalidArgument for a bad Add (size mismatch, duplicate or
// reserved name), FailedPrecondition/PermissionDenied for I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "crashreplay/formats/dtype.h"

namespace crashreplay {

class SafetensorsWriter {
 public:
  // Adds a tensor. `data` must hold exactly shape x dtype-size bytes
  // (little-endian element bytes; 4-bit types packed two per byte).
  absl::Status Add(std::string name, DType dtype, std::vector<int64_t> shape, std::span<const std::byte> data);
  void SetMetadata(std::string key, std::string value);

  size_t num_tensors() const { return tensors_.size(); }
  // Total tensor bytes added so far.
  uint64_t data_bytes() const { return data_bytes_; }

  // The whole file in memory.
  std::string Serialize() const;
  // Writes the file atomically.
  absl::Status Write(const std::string& path) const;

  // Writes a HF-style checkpoint into directory `dir` (created if missing):
  // tensors in name order, filled greedily into shards of at most
  // `max_shard_bytes` tensor bytes (a larger tensor gets a shard of its
  // own). One shard is written as "model.safetensors" with no index; more as
  // "model-00001-of-0000N.safetensors" plus "model.safetensors.index.json"
  // ({"metadata": {"total_size": bytes}, "weight_map": {tensor: shard}}).
  // Every shard carries this writer's metadata.
  absl::Status WriteSharded(const std::string& dir, uint64_t max_shard_bytes) const;

 private:
  struct Entry {
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<std::byte> data;
  };
  std::map<std::string, Entry> tensors_;
  std::map<std::string, std::string> metadata_;
  uint64_t data_bytes_ = 0;
};

// Writes `bytes` to `path` atomically (temp file, fsync, rename).
absl::Status WriteFileAtomically(const std::string& path, std::string_view bytes);

}  // namespace crashreplay
