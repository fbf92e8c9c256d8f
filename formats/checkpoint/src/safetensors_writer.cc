#include "crashreplay/formats/safetensors_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "crashreplay/base/status.h"
#include "crashreplay/formats/safetensors_dtype.h"

namespace crashreplay {
namespace {

// Structural UTF-8 check (no overlongs, no surrogates, <= U+10FFFF): the
// header is JSON, and readers (ours, the Python package's) reject invalid
// UTF-8 there.
bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      n = 1;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      n = 2;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;  // truncated sequence
    for (size_t k = 1; k <= n; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    static constexpr uint32_t kMin[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n + 1;
  }
  return true;
}

// JSON string literal, escaped as serde_json (the Python package's writer)
// escapes: \" \\ \b \f \n \r \t, other control characters as \u00xx, all
// else (including non-ASCII UTF-8 and '/') verbatim.
void AppendJsonString(std::string* out, std::string_view s) {
  out->push_back('"');
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      case '\b': out->append("\\b"); break;
      case '\f': out->append("\\f"); break;
      case '\n': out->append("\\n"); break;
      case '\r': out->append("\\r"); break;
      case '\t': out->append("\\t"); break;
      default:
        if (c < 0x20) {
          absl::StrAppendFormat(out, "\\u%04x", c);
        } else {
          out->push_back(ch);
        }
    }
  }
  out->push_back('"');
}

absl::Status ErrnoError(int err, const std::string& what) {
  std::string msg = absl::StrCat(what, ": ", std::strerror(err));
  if (err == EACCES || err == EPERM || err == EROFS) return absl::PermissionDeniedError(msg);
  if (err == ENOSPC || err == EDQUOT) return absl::ResourceExhaustedError(msg);
  if (err == ENOENT) return absl::NotFoundError(msg);
  return absl::FailedPreconditionError(msg);
}

}  // namespace

absl::Status SafetensorsWriter::Add(std::string name, DType dtype, std::vector<int64_t> shape,
                                    std::span<const std::byte> data) {
  if (name.empty() || name == "__metadata__") {
    return absl::InvalidArgumentError(absl::StrCat("safetensors writer: '", name, "' cannot be a tensor name"));
  }
  if (!IsValidUtf8(name)) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors writer: tensor name '", name, "' is not valid UTF-8"));
  }
  if (tensors_.contains(name)) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors writer: tensor '", name, "' was already added"));
  }
  safetensors_dtype::Extent extent;
  std::string why;
  if (!safetensors_dtype::ComputeExtent(dtype, shape, &extent, &why)) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors writer: tensor '", name, "': shape [", absl::StrJoin(shape, ", "), "]: ", why));
  }
  if (extent.bytes != data.size()) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors writer: tensor '", name, "': shape [",
                                                   absl::StrJoin(shape, ", "), "] of ", std::string(DTypeName(dtype)),
                                                   " needs ", extent.bytes, " bytes, got ", data.size()));
  }
  data_bytes_ += data.size();
  tensors_.emplace(std::move(name), Entry{dtype, std::move(shape), std::vector<std::byte>(data.begin(), data.end())});
  return absl::OkStatus();
}

void SafetensorsWriter::SetMetadata(std::string key, std::string value) {
  metadata_[std::move(key)] = std::move(value);
}

std::string SafetensorsWriter::Serialize() const {
  std::vector<const std::pair<const std::string, Entry>*> order;
  order.reserve(tensors_.size());
  for (const auto& kv : tensors_) order.push_back(&kv);
  std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    return safetensors_dtype::LayoutRank(a->second.dtype) > safetensors_dtype::LayoutRank(b->second.dtype);
  });  // stable: equal dtypes keep name order from the map

  std::string header = "{";
  bool first = true;
  if (!metadata_.empty()) {
    header.append("\"__metadata__\":{");
    bool first_key = true;
    for (const auto& [k, v] : metadata_) {
      if (!first_key) header.push_back(',');
      first_key = false;
      AppendJsonString(&header, k);
      header.push_back(':');
      AppendJsonString(&header, v);
    }
    header.push_back('}');
    first = false;
  }
  uint64_t offset = 0;
  for (const auto* kv : order) {
    const Entry& e = kv->second;
    if (!first) header.push_back(',');
    first = false;
    AppendJsonString(&header, kv->first);
    absl::StrAppend(&header, ":{\"dtype\":\"", std::string(safetensors_dtype::Name(e.dtype)), "\",\"shape\":[",
                    absl::StrJoin(e.shape, ","), "],\"data_offsets\":[", offset, ",", offset + e.data.size(), "]}");
    offset += e.data.size();
  }
  header.push_back('}');
  header.append((8 - header.size() % 8) % 8, ' ');

  std::string out;
  out.reserve(8 + header.size() + offset);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out.append(header);
  for (const auto* kv : order) {
    out.append(reinterpret_cast<const char*>(kv->second.data.data()), kv->second.data.size());
  }
  return out;
}

absl::Status SafetensorsWriter::Write(const std::string& path) const { return WriteFileAtomically(path, Serialize()); }

absl::Status SafetensorsWriter::WriteSharded(const std::string& dir, uint64_t max_shard_bytes) const {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create checkpoint directory '", dir, "': ", ec.message()));
  }
  // Greedy fill in name order.
  std::vector<std::vector<const std::pair<const std::string, Entry>*>> shards;
  uint64_t in_shard = 0;
  for (const auto& kv : tensors_) {
    const uint64_t size = kv.second.data.size();
    if (shards.empty() || (in_shard > 0 && in_shard + size > max_shard_bytes)) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(&kv);
    in_shard += size;
  }
  if (shards.empty()) shards.emplace_back();

  const std::string base = std::filesystem::path(dir).string();
  if (shards.size() == 1) return Write(base + "/model.safetensors");

  std::map<std::string, std::string> weight_map;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string file = absl::StrFormat("model-%05d-of-%05d.safetensors", i + 1, shards.size());
    SafetensorsWriter shard;
    shard.metadata_ = metadata_;
    for (const auto* kv : shards[i]) {
      CR_RETURN_IF_ERROR(shard.Add(kv->first, kv->second.dtype, kv->second.shape, kv->second.data));
      weight_map[kv->first] = file;
    }
    CR_RETURN_IF_ERROR(shard.Write(base + "/" + file));
  }
  // The index, formatted as transformers formats it (indent 2, keys sorted).
  std::string index =
      absl::StrCat("{\n  \"metadata\": {\n    \"total_size\": ", data_bytes_, "\n  },\n  \"weight_map\": {");
  bool first = true;
  for (const auto& [name, file] : weight_map) {
    index.append(first ? "\n    " : ",\n    ");
    first = false;
    AppendJsonString(&index, name);
    index.append(": ");
    AppendJsonString(&index, file);
  }
  index.append("\n  }\n}\n");
  return WriteFileAtomically(base + "/model.safetensors.index.json", index);
}

absl::Status WriteFileAtomically(const std::string& path, std::string_view bytes) {
  const std::string tmp = absl::StrCat(path, ".tmp-", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(errno, absl::StrCat("cannot create '", tmp, "'"));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return ErrnoError(err, absl::StrCat("cannot write '", tmp, "'"));
    }
    done += static_cast<size_t>(n);
  }
  const int sync_rc = ::fsync(fd);
  const int sync_err = errno;
  const int close_rc = ::close(fd);
  if (sync_rc != 0 || close_rc != 0) {
    const int err = sync_rc != 0 ? sync_err : errno;
    ::unlink(tmp.c_str());
    return ErrnoError(err, absl::StrCat("cannot flush '", tmp, "'"));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoError(err, absl::StrCat("cannot rename '", tmp, "' to '", path, "'"));
  }
  return absl::OkStatus();
}

}  // namespace crashreplay
