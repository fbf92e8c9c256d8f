#include "crashreplay/formats/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "crashreplay/base/status.h"
#include "json_util.h"
#include "mapped_file.h"

namespace crashreplay {
namespace fs = std::filesystem;
namespace {

constexpr int kMaxIndexDepth = 8;

// A shard name from an index must be a plain relative path inside the
// checkpoint directory: anything else could make us map arbitrary files.
bool IsSafeRelativePath(std::string_view p) {
  if (p.empty() || p.front() == '/' || p.find('\0') != std::string_view::npos) return false;
  for (const auto& part : fs::path(std::string(p))) {
    if (part == "..") return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir, Mode mode) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    const bool exists = fs::exists(fs::symlink_status(dir, ec));
    return absl::NotFoundError(
        absl::StrCat("checkpoint directory '", dir, "' ", exists ? "is not a directory" : "does not exist"));
  }
  auto ckpt = std::unique_ptr<Checkpoint>(new Checkpoint());
  ckpt->dir_ = dir;
  ckpt->mode_ = mode;
  const fs::path base(dir);
  if (fs::is_regular_file(base / "config.json", ec)) {
    ckpt->config_path_ = (base / "config.json").string();
  }
  const fs::path index = base / "model.safetensors.index.json";
  const fs::path single = base / "model.safetensors";
  if (fs::exists(index, ec)) {
    CR_RETURN_IF_ERROR(ckpt->OpenIndexed(index.string()));
  } else if (fs::exists(single, ec)) {
    CR_RETURN_IF_ERROR(ckpt->OpenFiles({single.string()}));
  } else {
    std::vector<std::string> files;
    for (const auto& entry : fs::directory_iterator(base, ec)) {
      if (entry.path().extension() == ".safetensors" && entry.is_regular_file(ec)) {
        files.push_back(entry.path().string());
      }
    }
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot list checkpoint directory '", dir, "': ", ec.message()));
    }
    if (files.empty()) {
      return absl::NotFoundError(absl::StrCat(
          "checkpoint directory '", dir, "' has no model.safetensors.index.json, model.safetensors or *.safetensors"));
    }
    std::sort(files.begin(), files.end());
    CR_RETURN_IF_ERROR(ckpt->OpenFiles(files));
  }
  ckpt->names_.reserve(ckpt->tensors_.size());
  for (const auto& [name, t] : ckpt->tensors_) ckpt->names_.push_back(name);
  return ckpt;
}

absl::Status Checkpoint::OpenFiles(const std::vector<std::string>& files) {
  for (const std::string& path : files) {
    CR_ASSIGN_OR_RETURN(auto file, OpenShard(path));
    for (const TensorInfo& info : file->tensors()) {
      auto [it, inserted] = tensors_.emplace(info.name, CheckpointTensor{file.get(), &info});
      if (!inserted) {
        return absl::DataLossError(absl::StrCat("checkpoint '", dir_, "': tensor '", info.name, "' is in both '",
                                                it->second.file->path(), "' and '", path,
                                                "'; remove the stale shard or add a model.safetensors.index.json"));
      }
    }
    shards_.push_back(std::move(file));
  }
  return absl::OkStatus();
}

absl::Status Checkpoint::OpenIndexed(const std::string& index_path) {
  // Read through OpenRegularFile: an index that is a FIFO or a device is
  // refused at once instead of blocking the reader.
  CR_ASSIGN_OR_RETURN(std::string text, ReadRegularFile(index_path, kMaxIndexBytes));
  CR_ASSIGN_OR_RETURN(nlohmann::json index, json_util::ParseStrict(text, absl::StrCat("index '", index_path, "'"),
                                                                   kMaxIndexDepth, absl::StatusCode::kDataLoss));
  const auto corrupt = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat("index '", index_path, "': ", what));
  };
  if (!index.is_object()) return corrupt("expected a JSON object");
  const auto wm = index.find("weight_map");
  if (wm == index.end()) return corrupt("no \"weight_map\"");
  if (!wm->is_object()) return corrupt("\"weight_map\" is not a JSON object");

  std::map<std::string, std::vector<std::string>> by_shard;  // shard -> tensors
  for (const auto& [tensor, shard] : wm->items()) {
    if (!shard.is_string()) {
      return corrupt(
          absl::StrCat("tensor '", tensor, "' maps to a JSON ", json_util::TypeName(shard), ", expected a file name"));
    }
    const std::string& rel = shard.get_ref<const std::string&>();
    if (!IsSafeRelativePath(rel)) {
      return absl::InvalidArgumentError(
          absl::StrCat("index '", index_path, "': tensor '", tensor, "' maps to shard '", rel,
                       "', which is not a relative path inside the checkpoint directory; refusing it"));
    }
    by_shard[rel].push_back(tensor);
  }
  for (const auto& [rel, names] : by_shard) {
    const std::string path = (fs::path(dir_) / rel).string();
    auto file = OpenShard(path);
    if (!file.ok()) {
      return absl::Status(file.status().code(), absl::StrCat("index '", index_path, "' lists shard '", rel, "' for '",
                                                             names.front(), "': ", file.status().message()));
    }
    for (const std::string& name : names) {
      const TensorInfo* info = (*file)->Find(name);
      if (info == nullptr) {
        return absl::DataLossError(absl::StrCat("index '", index_path, "' says tensor '", name, "' is in '", path,
                                                "', but that shard has no such "
                                                "tensor; the checkpoint is incomplete or mixed"));
      }
      tensors_.emplace(name, CheckpointTensor{file->get(), info});
    }
    shards_.push_back(*std::move(file));
  }
  return absl::OkStatus();
}

const CheckpointTensor* Checkpoint::Find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

absl::StatusOr<std::span<const std::byte>> Checkpoint::Data(std::string_view name) const {
  const CheckpointTensor* t = Find(name);
  if (t == nullptr) {
    return absl::NotFoundError(absl::StrCat("checkpoint '", dir_, "' has no tensor '", json_util::Sv(name), "'"));
  }
  return t->file->Data(*t->info);
}

absl::StatusOr<std::shared_ptr<const TensorMapping>> Checkpoint::MapTensor(std::string_view name) const {
  const CheckpointTensor* t = Find(name);
  if (t == nullptr) {
    return absl::NotFoundError(absl::StrCat("checkpoint '", dir_, "' has no tensor '", json_util::Sv(name), "'"));
  }
  return t->file->MapTensor(*t->info);
}

uint64_t Checkpoint::file_bytes() const {
  uint64_t n = 0;
  for (const auto& s : shards_) n += s->file_size();
  return n;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> Checkpoint::OpenShard(const std::string& path) const {
  return mode_ == Mode::kDeferred ? SafetensorsFile::OpenDeferred(path) : SafetensorsFile::Open(path);
}

}  // namespace crashreplay
