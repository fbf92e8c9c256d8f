#include "crashreplay/formats/safetensors_file.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "crashreplay/base/status.h"
#include "crashreplay/formats/safetensors_dtype.h"
#include "json_util.h"
#include "mapped_file.h"
#include "safetensors_header.h"

namespace crashreplay {
namespace {

constexpr char kFixHint[] = "; the file is corrupt or was written by a broken tool: re-download or re-convert it";

absl::Status Corrupt(const std::string& file, const std::string& what) {
  return absl::DataLossError(absl::StrCat("safetensors file '", file, "': ", what, kFixHint));
}

absl::Status CorruptTensor(const std::string& file, const std::string& tensor, const std::string& what) {
  return absl::DataLossError(absl::StrCat("safetensors file '", file, "': tensor '", tensor, "': ", what, kFixHint));
}

// Reads one tensor entry of the header into `info` (data_offset relative to
// the data region for now).
absl::Status ParseTensorEntry(const std::string& file, const std::string& name, const nlohmann::json& entry,
                              uint64_t data_size, TensorInfo* info) {
  if (!entry.is_object()) {
    return CorruptTensor(file, name,
                         absl::StrCat("entry is a JSON ", json_util::TypeName(entry), ", expected an object"));
  }
  const auto dtype_it = entry.find("dtype");
  const auto shape_it = entry.find("shape");
  const auto offsets_it = entry.find("data_offsets");
  if (dtype_it == entry.end()) return CorruptTensor(file, name, "no \"dtype\"");
  if (shape_it == entry.end()) return CorruptTensor(file, name, "no \"shape\"");
  if (offsets_it == entry.end()) return CorruptTensor(file, name, "no \"data_offsets\"");

  if (!dtype_it->is_string()) {
    return CorruptTensor(file, name,
                         absl::StrCat("\"dtype\" is a JSON ", json_util::TypeName(*dtype_it), ", expected a string"));
  }
  const std::string& dtype_name = dtype_it->get_ref<const std::string&>();
  const std::optional<DType> dtype = safetensors_dtype::Parse(dtype_name);
  if (!dtype) {
    if (safetensors_dtype::IsKnownUnsupported(dtype_name)) {
      return absl::UnimplementedError(absl::StrCat("safetensors file '", file, "': tensor '", name, "': dtype ",
                                                   dtype_name,
                                                   " is valid safetensors but crashreplay does not support it"));
    }
    return CorruptTensor(file, name, absl::StrCat("unknown dtype \"", dtype_name, "\""));
  }
  info->dtype = *dtype;

  if (!shape_it->is_array()) {
    return CorruptTensor(file, name,
                         absl::StrCat("\"shape\" is a JSON ", json_util::TypeName(*shape_it), ", expected an array"));
  }
  if (shape_it->size() > SafetensorsFile::kMaxRank) {
    return CorruptTensor(file, name,
                         absl::StrCat("shape has ", shape_it->size(), " dimensions; at most ",
                                      SafetensorsFile::kMaxRank, " are accepted"));
  }
  info->shape.clear();
  for (size_t i = 0; i < shape_it->size(); ++i) {
    const nlohmann::json& d = (*shape_it)[i];
    if (d.is_number_unsigned()) {
      const uint64_t v = d.get<uint64_t>();
      if (v > static_cast<uint64_t>(INT64_MAX)) {
        return CorruptTensor(file, name, absl::StrCat("dimension ", i, " (", v, ") does not fit in 64-bit signed"));
      }
      info->shape.push_back(static_cast<int64_t>(v));
    } else if (d.is_number_integer()) {
      return CorruptTensor(file, name, absl::StrCat("dimension ", i, " is negative (", d.get<int64_t>(), ")"));
    } else {
      return CorruptTensor(
          file, name,
          absl::StrCat("dimension ", i, " is a JSON ", json_util::TypeName(d), ", expected a non-negative integer"));
    }
  }
  safetensors_dtype::Extent extent;
  std::string why;
  if (!safetensors_dtype::ComputeExtent(info->dtype, info->shape, &extent, &why)) {
    return CorruptTensor(file, name, absl::StrCat("shape [", absl::StrJoin(info->shape, ", "), "]: ", why));
  }

  const nlohmann::json& offsets = *offsets_it;
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    return CorruptTensor(file, name,
                         absl::StrCat("\"data_offsets\" must be [begin, end] with non-negative "
                                      "integers, found ",
                                      offsets.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)));
  }
  const uint64_t begin = offsets[0].get<uint64_t>();
  const uint64_t end = offsets[1].get<uint64_t>();
  if (begin > end) {
    return CorruptTensor(file, name, absl::StrCat("data_offsets [", begin, ", ", end, "] end before they begin"));
  }
  if (end > data_size) {
    return CorruptTensor(file, name,
                         absl::StrCat("data_offsets [", begin, ", ", end, "] reach past the data region, which holds ",
                                      data_size, " bytes (file truncated?)"));
  }
  if (end - begin != extent.bytes) {
    return CorruptTensor(file, name,
                         absl::StrCat("data_offsets [", begin, ", ", end, "] hold ", end - begin, " bytes but shape [",
                                      absl::StrJoin(info->shape, ", "), "] of ", dtype_name, " needs ", extent.bytes));
  }
  info->data_offset = begin;
  info->byte_size = extent.bytes;
  return absl::OkStatus();
}

absl::Status ParseMetadata(const std::string& file, const nlohmann::json& value,
                           std::map<std::string, std::string>* out) {
  if (!value.is_object()) {
    return Corrupt(file, absl::StrCat("\"__metadata__\" is a JSON ", json_util::TypeName(value),
                                      ", expected an object of strings"));
  }
  for (const auto& [key, v] : value.items()) {
    if (!v.is_string()) {
      return Corrupt(file, absl::StrCat("\"__metadata__\" entry '", key, "' is a JSON ", json_util::TypeName(v),
                                        ", expected a string"));
    }
    (*out)[key] = v.get<std::string>();
  }
  return absl::OkStatus();
}

}  // namespace

int64_t TensorInfo::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsFile::SafetensorsFile(std::string path, std::unique_ptr<ByteSource> source)
    : path_(std::move(path)), source_(std::move(source)) {}

SafetensorsFile::~SafetensorsFile() = default;

uint64_t SafetensorsFile::file_size() const { return file_size_; }

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  auto source = MapFile(path);
  if (!source.ok()) {
    return absl::Status(source.status().code(),
                        absl::StrCat("cannot open safetensors file: ", source.status().message()));
  }
  const uint64_t size = (*source)->bytes().size();
  return Parse(path, *std::move(source), size);
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::OpenDeferred(const std::string& path) {
  auto opened = OpenFile::Open(path);
  if (!opened.ok()) {
    return absl::Status(opened.status().code(),
                        absl::StrCat("cannot open safetensors file: ", opened.status().message()));
  }
  std::unique_ptr<OpenFile> f = *std::move(opened);
  const uint64_t size = f->size();
  // The 8-byte length, then the header it announces (Parse checks both
  // against the file's size and the cap; read no more than they allow).
  uint64_t prefix = std::min<uint64_t>(size, 8);
  CR_ASSIGN_OR_RETURN(std::vector<std::byte> head, f->Read(0, prefix));
  if (head.size() == 8) {
    uint64_t header_size = 0;
    for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | static_cast<uint8_t>(head[static_cast<size_t>(i)]);
    if (header_size <= size - 8 && header_size <= kMaxHeaderBytes) {
      CR_ASSIGN_OR_RETURN(head, f->Read(0, 8 + header_size));
    }
  }
  CR_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> out, Parse(path, CopyBytes(head), size));
  out->file_ = std::move(f);
  return out;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromBuffer(std::string name,
                                                                             std::span<const std::byte> bytes) {
  return Parse(std::move(name), CopyBytes(bytes), bytes.size());
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Parse(std::string path,
                                                                        std::unique_ptr<ByteSource> source,
                                                                        uint64_t file_size) {
  const std::span<const std::byte> bytes = source->bytes();
  const std::string& file = path;
  if (file_size < 8) {
    return Corrupt(file, absl::StrCat("the file is ", file_size, " bytes, shorter than the 8-byte header length"));
  }
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) {
    header_size = (header_size << 8) | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
  }
  const uint64_t after_length = file_size - 8;
  if (header_size > after_length) {
    return Corrupt(file, absl::StrCat("header length ", header_size, " is more than the ", after_length,
                                      " bytes that follow it (file truncated?)"));
  }
  if (header_size > kMaxHeaderBytes) {
    return absl::ResourceExhaustedError(absl::StrCat("safetensors file '", file, "': header is ", header_size,
                                                     " bytes, over this reader's limit of ", kMaxHeaderBytes));
  }
  const std::string_view header(reinterpret_cast<const char*>(bytes.data()) + 8, static_cast<size_t>(header_size));
  if (header.empty() || header.front() != '{') {
    return Corrupt(file, "the header does not start with '{'");
  }
  // One linear pass and a sort (safetensors_header.h); the entries are
  // checked in name order, so the first error reported does not depend on
  // the order of the file.
  auto entries = safetensors_header::Parse(header, absl::StrCat("safetensors file '", file, "' header"), kMaxJsonDepth);
  if (!entries.ok()) return entries.status();

  auto result = std::unique_ptr<SafetensorsFile>(new SafetensorsFile(path, std::move(source)));
  result->header_size_ = header_size;
  result->file_size_ = file_size;
  const uint64_t data_start = 8 + header_size;
  const uint64_t data_size = file_size - data_start;
  result->tensors_.reserve(entries->size());
  for (const auto& [key, value] : *entries) {
    if (key == "__metadata__") {
      CR_RETURN_IF_ERROR(ParseMetadata(file, value, &result->metadata_));
      continue;
    }
    TensorInfo info;
    info.name = key;
    CR_RETURN_IF_ERROR(ParseTensorEntry(file, key, value, data_size, &info));
    result->tensors_.push_back(std::move(info));
  }

  // Disjointness: sort by range and compare neighbours. Empty tensors own no
  // bytes and cannot overlap anything.
  std::vector<const TensorInfo*> by_offset;
  by_offset.reserve(result->tensors_.size());
  for (const TensorInfo& t : result->tensors_) {
    if (t.byte_size > 0) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->data_offset != b->data_offset ? a->data_offset < b->data_offset : a->name < b->name;
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo& prev = *by_offset[i - 1];
    const TensorInfo& cur = *by_offset[i];
    if (cur.data_offset < prev.data_offset + prev.byte_size) {
      return CorruptTensor(
          file, cur.name,
          absl::StrCat("data_offsets [", cur.data_offset, ", ", cur.data_offset + cur.byte_size, "] overlap tensor '",
                       prev.name, "' at [", prev.data_offset, ", ", prev.data_offset + prev.byte_size, "]"));
    }
  }

  for (TensorInfo& t : result->tensors_) t.data_offset += data_start;
  // Already in name order: the entries were sorted above.
  return result;
}

const TensorInfo* SafetensorsFile::Find(std::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorInfo& t, std::string_view n) { return t.name < n; });
  if (it == tensors_.end() || it->name != name) return nullptr;
  return &*it;
}

absl::StatusOr<std::shared_ptr<const TensorMapping>> SafetensorsFile::MapTensor(const TensorInfo& info) const {
  if (info.data_offset > file_size_ || info.byte_size > file_size_ - info.data_offset) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors file '", path_, "': tensor '", info.name, "' is not one of this file's"));
  }
  class Held final : public TensorMapping {
   public:
    Held(std::unique_ptr<ByteSource> owned, std::span<const std::byte> view) : owned_(std::move(owned)), view_(view) {}
    std::span<const std::byte> bytes() const override { return owned_ ? owned_->bytes() : view_; }

   private:
    std::unique_ptr<ByteSource> owned_;
    std::span<const std::byte> view_;
  };
  if (!file_) return std::shared_ptr<const TensorMapping>(std::make_shared<Held>(nullptr, Data(info)));
  auto mapped = file_->Map(info.data_offset, info.byte_size);
  if (!mapped.ok()) {
    return absl::Status(mapped.status().code(), absl::StrCat("tensor '", info.name, "': ", mapped.status().message()));
  }
  return std::shared_ptr<const TensorMapping>(std::make_shared<Held>(*std::move(mapped), std::span<const std::byte>{}));
}

std::span<const std::byte> SafetensorsFile::Data(const TensorInfo& info) const {
  // A TensorInfo from another file could point anywhere; refuse rather than
  // read out of bounds.
  if (file_) return {};
  const uint64_t size = source_->bytes().size();
  if (info.data_offset > size || info.byte_size > size - info.data_offset) return {};
  return source_->bytes().subspan(static_cast<size_t>(info.data_offset), static_cast<size_t>(info.byte_size));
}

}  // namespace crashreplay
