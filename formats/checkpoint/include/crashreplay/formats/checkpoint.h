// A HF checkpoint directory: config.json plus one or more safetensors shards.
//
// Open(dir) finds the tensors in this order of preference:
//   1. model.safetensors.index.json: its "weight_map" names, per tensor, the
//      shard file that holds it. Shard names must be relative paths that
//      stay inside `dir` (no absolute paths, no ".." components). Every
//      listed shard is opened and validated, and every listed tensor must be
//      in the shard the index names. Tensors a shard holds but the index
//      does not list are not visible.
//   2. model.safetensors.
//   3. every *.safetensors file in `dir` (not recursive); a tensor name may
//      appear in only one of them.
// config.json is not parsed here (see hf_config.h); config_path() says where
// it is, or is empty when the directory has none.
//
// Errors: NotFound (no directory, no shards, a missing shard, a shard or
// index that is not a regular file: a FIFO or a device is refused at once,
// never read), DataLoss (a corrupt shard or index, a tensor missing from its
// shard, a name in two shards), InvalidArgument (a shard path escaping the
// directory). Messages name the file and tensor.
//
// Open(dir, kDeferred) opens every shard with SafetensorsFile::OpenDeferred:
// headers are read and checked as above, nothing is mapped; MapTensor maps
// one tensor at a time (one open descriptor per shard file meanwhile).
//
// Ownership: the Checkpoint owns its open shards; pointers and spans it
// returns live as long as it does. Immutable after Open; concurrent reads
// are safe.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "crashreplay/formats/safetensors_file.h"

namespace crashreplay {

struct CheckpointTensor {
  const SafetensorsFile* file = nullptr;
  const TensorInfo* info = nullptr;
};

class Checkpoint {
 public:
  // Limit on model.safetensors.index.json (real ones are well under 1 MiB
  // even for 1000-shard models).
  static constexpr uint64_t kMaxIndexBytes = 64ull << 20;

  enum class Mode { kMapped, kDeferred };
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& dir, Mode mode = Mode::kMapped);

  const std::string& dir() const { return dir_; }
  // "<dir>/config.json" when it exists, else empty.
  const std::string& config_path() const { return config_path_; }
  // The shards, sorted by path.
  const std::vector<std::unique_ptr<SafetensorsFile>>& shards() const { return shards_; }
  // All tensor names, sorted.
  const std::vector<std::string>& names() const { return names_; }
  // nullptr when absent.
  const CheckpointTensor* Find(std::string_view name) const;
  // The tensor's bytes; NotFound naming the tensor when absent. Empty in a
  // deferred checkpoint (use MapTensor).
  absl::StatusOr<std::span<const std::byte>> Data(std::string_view name) const;
  // The tensor's bytes held by the returned object (SafetensorsFile::MapTensor).
  absl::StatusOr<std::shared_ptr<const TensorMapping>> MapTensor(std::string_view name) const;
  bool deferred() const { return mode_ == Mode::kDeferred; }
  // Sum of the shard files' sizes.
  uint64_t file_bytes() const;

 private:
  Checkpoint() = default;
  absl::Status OpenIndexed(const std::string& index_path);
  absl::Status OpenFiles(const std::vector<std::string>& files);
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> OpenShard(const std::string& path) const;

  std::string dir_;
  Mode mode_ = Mode::kMapped;
  std::string config_path_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, CheckpointTensor, std::less<>> tensors_;
  std::vector<std::string> names_;
};

}  // namespace crashreplay
