// A sharded safetensors checkpoint written tensor by tensor, in any order,
// without holding it in memory: what `make-model` writes a large checkpoint
// with (random_checkpoint.h WriteRandomCheckpoint). Private to replay/.
//
// The files are byte for byte what SafetensorsWriter::WriteSharded
// (formats/safetensors_writer.h) writes for the same tensors: the same greedy
// fill of shards in name order, the same file names and index, and in each
// shard the same header (metadata first, tensors by safetensors' dtype rank,
// then name; padded with spaces to 8 bytes) and data order. Everything but
// the tensor bytes is known from names, dtypes and shapes, so Create()
// computes every header and every tensor's file offset up front, creates
// each shard as "<file>.tmp-<pid>" at its final size (space reserved with
// fallocate where the file system has it) and writes its header; Write()
// then puts any range of a tensor's bytes at its place with pwrite, and
// Commit() fsyncs every shard, renames it to its name and writes the index,
// as WriteFileAtomically does for each file of the in-memory writer.
// (This mirrors formats/checkpoint/src/safetensors_writer.cc's layout rules because
// formats/ offers no writer that takes bytes later;
// random_checkpoint_files_test compares the two byte for byte.)
//
// Reading back: Tensors() gives every tensor as TensorBytes::Deferred,
// mapped from the temporary files one tensor at a time when resolved, so
// the engine can run over a checkpoint still being finished (make-model's
// NVFP4 calibration) with layer streaming.
//
// A writer that is destroyed without a successful Commit() removes its
// temporary files. Not thread-safe: one thread writes. Errors:
// FailedPrecondition when the directory cannot be made, PermissionDenied /
// ResourceExhausted (no space: reserved up front where fallocate works) /
// FailedPrecondition for other I/O, each naming the file; InvalidArgument
// for a tensor that was not planned or a write outside its bytes.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "crashreplay/formats/dtype.h"
#include "crashreplay/replay/model/model_spec.h"

namespace crashreplay::replay {

struct PlannedTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};

class StreamedSafetensors {
 public:
  // Plans the shards of `tensors` (names unique, plain JSON: no quote,
  // backslash or control character) in `dir` and creates their files.
  static absl::StatusOr<std::unique_ptr<StreamedSafetensors>> Create(
      const std::string& dir, const std::vector<PlannedTensor>& tensors, uint64_t max_shard_bytes,
      const std::map<std::string, std::string>& metadata);
  ~StreamedSafetensors();
  StreamedSafetensors(const StreamedSafetensors&) = delete;
  StreamedSafetensors& operator=(const StreamedSafetensors&) = delete;

  // InvalidArgument unless `name` was planned with this dtype and shape.
  absl::Status Check(const std::string& name, DType dtype, const std::vector<int64_t>& shape) const;
  // Writes bytes [offset, offset + bytes.size()) of tensor `name`.
  absl::Status Write(const std::string& name, uint64_t offset, std::span<const uint8_t> bytes);
  // Every tensor, deferred (see above). The files must outlive no reader:
  // each mapping keeps its file open.
  TensorSet Tensors() const;
  // fsync, rename, index. Once only.
  absl::Status Commit();

  size_t num_tensors() const { return places_.size(); }
  uint64_t data_bytes() const { return data_bytes_; }
  size_t num_shards() const { return shards_.size(); }

 private:
  struct File;
  struct Place {
    size_t shard = 0;
    uint64_t offset = 0;  // in the shard file
    uint64_t bytes = 0;
    DType dtype = DType::kF32;
    std::vector<int64_t> shape;
  };
  struct Shard {
    std::string name;  // "model.safetensors" or "model-0000i-of-0000N.safetensors"
    std::string path, tmp;
    std::shared_ptr<File> file;
    uint64_t size = 0;
  };
  StreamedSafetensors() = default;

  std::string dir_;
  std::map<std::string, Place> places_;
  std::vector<Shard> shards_;
  uint64_t data_bytes_ = 0;
  bool committed_ = false;
};

}  // namespace crashreplay::replay
