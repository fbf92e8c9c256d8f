#include "streamed_safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "crashreplay/base/status.h"
#include "crashreplay/base/text.h"
#include "crashreplay/formats/safetensors_dtype.h"
#include "crashreplay/formats/safetensors_writer.h"

namespace crashreplay::replay {
namespace {

using text::Cat;

absl::Status ErrnoError(int err, const std::string& what) {
  std::string msg = Cat(what, ": ", std::strerror(err));
  if (err == EACCES || err == EPERM || err == EROFS) return absl::PermissionDeniedError(msg);
  if (err == ENOSPC || err == EDQUOT) return absl::ResourceExhaustedError(msg);
  return absl::FailedPreconditionError(msg);
}

bool PlainJson(const std::string& s) {
  return std::none_of(s.begin(), s.end(),
                      [](char c) { return c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20; });
}

std::string JoinDims(const std::vector<int64_t>& shape) {
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s;
}

}  // namespace

// An open shard file; mappings of it keep it open.
struct StreamedSafetensors::File {
  explicit File(int fd) : fd(fd) {}
  ~File() {
    if (fd >= 0) ::close(fd);
  }
  int fd;
};

namespace {

// One tensor's bytes in a shard file, mapped when read.
class FileRangeSource final : public TensorSource {
 public:
  FileRangeSource(std::shared_ptr<const void> file, int fd, uint64_t offset, uint64_t size, std::string what)
      : file_(std::move(file)), fd_(fd), offset_(offset), size_(size), what_(std::move(what)) {}
  absl::StatusOr<TensorBytes> Read() const override {
    struct Mapping {
      ~Mapping() {
        if (base != nullptr) ::munmap(base, length);
      }
      void* base = nullptr;
      size_t length = 0;
      std::shared_ptr<const void> file;
    };
    auto m = std::make_shared<Mapping>();
    m->file = file_;
    if (size_ == 0) return TensorBytes::View({}, m);
    const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    const uint64_t begin = offset_ / page * page;
    m->length = offset_ + size_ - begin;
    void* p = ::mmap(nullptr, m->length, PROT_READ, MAP_SHARED, fd_, static_cast<off_t>(begin));
    if (p == MAP_FAILED) {
      const int err = errno;
      return err == ENOMEM ? absl::ResourceExhaustedError(Cat("cannot map ", what_, ": ", std::strerror(err)))
                           : ErrnoError(err, Cat("cannot map ", what_));
    }
    m->base = p;
    return TensorBytes::View({static_cast<const uint8_t*>(p) + (offset_ - begin), size_}, m);
  }

 private:
  std::shared_ptr<const void> file_;
  int fd_;
  uint64_t offset_, size_;
  std::string what_;
};

absl::Status PwriteAll(int fd, const void* data, size_t n, uint64_t offset, const std::string& path) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, Cat("cannot write '", path, "'"));
    }
    p += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<StreamedSafetensors>> StreamedSafetensors::Create(
    const std::string& dir, const std::vector<PlannedTensor>& tensors, uint64_t max_shard_bytes,
    const std::map<std::string, std::string>& metadata) {
  std::unique_ptr<StreamedSafetensors> w(new StreamedSafetensors());
  w->dir_ = std::filesystem::path(dir).string();
  // Name order, as the in-memory writer's std::map holds them.
  std::map<std::string, const PlannedTensor*> by_name;
  for (const PlannedTensor& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__" || !PlainJson(t.name)) {
      return absl::InvalidArgumentError(Cat("streamed safetensors: '", t.name, "' cannot be a tensor name here"));
    }
    if (!by_name.emplace(t.name, &t).second) {
      return absl::InvalidArgumentError(Cat("streamed safetensors: tensor '", t.name, "' planned twice"));
    }
  }
  for (const auto& [k, v] : metadata) {
    if (!PlainJson(k) || !PlainJson(v))
      return absl::InvalidArgumentError("streamed safetensors: metadata needs escaping");
  }
  // The greedy fill of SafetensorsWriter::WriteSharded.
  std::vector<std::vector<const PlannedTensor*>> groups;
  uint64_t in_shard = 0;
  for (const auto& [name, t] : by_name) {
    int64_t elements = 1;
    for (int64_t d : t->shape) {
      if (d < 0 || __builtin_mul_overflow(elements, d, &elements)) {
        return absl::InvalidArgumentError(Cat("streamed safetensors: tensor '", name, "' has a bad shape"));
      }
    }
    const uint64_t size = DTypeBytes(t->dtype, static_cast<uint64_t>(elements));
    if (groups.empty() || (in_shard > 0 && in_shard + size > max_shard_bytes)) {
      groups.emplace_back();
      in_shard = 0;
    }
    groups.back().push_back(t);
    in_shard += size;
    w->data_bytes_ += size;
    w->places_[name] = Place{0, 0, size, t->dtype, t->shape};
  }
  if (groups.empty()) groups.emplace_back();

  std::error_code ec;
  std::filesystem::create_directories(w->dir_, ec);
  if (ec) return absl::FailedPreconditionError(Cat("cannot create checkpoint directory '", dir, "': ", ec.message()));
  for (size_t i = 0; i < groups.size(); ++i) {
    Shard s;
    if (groups.size() == 1) {
      s.name = "model.safetensors";
    } else {
      char buf[64];
      std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, groups.size());
      s.name = buf;
    }
    s.path = w->dir_ + "/" + s.name;
    s.tmp = Cat(s.path, ".tmp-", ::getpid());
    // The header of SafetensorsWriter::Serialize.
    std::vector<const PlannedTensor*> order = groups[i];
    std::stable_sort(order.begin(), order.end(), [](const PlannedTensor* a, const PlannedTensor* b) {
      return safetensors_dtype::LayoutRank(a->dtype) > safetensors_dtype::LayoutRank(b->dtype);
    });
    std::string header = "{";
    if (!metadata.empty()) {
      header += "\"__metadata__\":{";
      bool first = true;
      for (const auto& [k, v] : metadata) {
        header += Cat(first ? "" : ",", "\"", k, "\":\"", v, "\"");
        first = false;
      }
      header += "}";
    }
    uint64_t offset = 0;
    for (const PlannedTensor* t : order) {
      Place& p = w->places_[t->name];
      if (header.size() > 1) header += ",";
      header += Cat("\"", t->name, "\":{\"dtype\":\"", safetensors_dtype::Name(t->dtype), "\",\"shape\":[",
                    JoinDims(t->shape), "],\"data_offsets\":[", offset, ",", offset + p.bytes, "]}");
      p.shard = i;
      p.offset = offset;  // made absolute below
      offset += p.bytes;
    }
    header += "}";
    header.append((8 - header.size() % 8) % 8, ' ');
    const uint64_t data_start = 8 + header.size();
    for (const PlannedTensor* t : order) w->places_[t->name].offset += data_start;
    s.size = data_start + offset;

    const int fd = ::open(s.tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoError(errno, Cat("cannot create '", s.tmp, "'"));
    s.file = std::make_shared<File>(fd);
    w->shards_.push_back(s);  // from here on the destructor removes it
    // Reserve the space now, so a full disk is an error before the work.
    if (::fallocate(fd, 0, 0, static_cast<off_t>(s.size)) != 0) {
      const int err = errno;
      if (err == ENOSPC || err == EDQUOT) {
        return absl::ResourceExhaustedError(
            Cat("no space for '", s.path, "' (", s.size, " bytes): ", std::strerror(err)));
      }
      if (::ftruncate(fd, static_cast<off_t>(s.size)) != 0) return ErrnoError(errno, Cat("cannot size '", s.tmp, "'"));
    }
    char len[8];
    const uint64_t n = header.size();
    for (int b = 0; b < 8; ++b) len[b] = static_cast<char>((n >> (8 * b)) & 0xff);
    CR_RETURN_IF_ERROR(PwriteAll(fd, len, 8, 0, s.tmp));
    CR_RETURN_IF_ERROR(PwriteAll(fd, header.data(), header.size(), 8, s.tmp));
  }
  return w;
}

StreamedSafetensors::~StreamedSafetensors() {
  if (committed_) return;
  for (const Shard& s : shards_) ::unlink(s.tmp.c_str());
}

absl::Status StreamedSafetensors::Check(const std::string& name, DType dtype, const std::vector<int64_t>& shape) const {
  auto it = places_.find(name);
  if (it == places_.end())
    return absl::InvalidArgumentError(Cat("streamed safetensors: tensor '", name, "' was not planned"));
  if (it->second.dtype != dtype || it->second.shape != shape) {
    return absl::InvalidArgumentError(Cat("streamed safetensors: tensor '", name, "' was planned as ",
                                          DTypeName(it->second.dtype), " [", JoinDims(it->second.shape),
                                          "], written as ", DTypeName(dtype), " [", JoinDims(shape), "]"));
  }
  return absl::OkStatus();
}

absl::Status StreamedSafetensors::Write(const std::string& name, uint64_t offset, std::span<const uint8_t> bytes) {
  if (committed_) return absl::FailedPreconditionError("streamed safetensors: written after Commit");
  auto it = places_.find(name);
  if (it == places_.end())
    return absl::InvalidArgumentError(Cat("streamed safetensors: tensor '", name, "' was not planned"));
  const Place& p = it->second;
  if (offset > p.bytes || bytes.size() > p.bytes - offset) {
    return absl::InvalidArgumentError(Cat("streamed safetensors: bytes [", offset, ", ", offset + bytes.size(),
                                          ") are outside tensor '", name, "' (", p.bytes, " bytes)"));
  }
  const Shard& s = shards_[p.shard];
  return PwriteAll(s.file->fd, bytes.data(), bytes.size(), p.offset + offset, s.tmp);
}

TensorSet StreamedSafetensors::Tensors() const {
  TensorSet out;
  for (const auto& [name, p] : places_) {
    const Shard& s = shards_[p.shard];
    HostTensor t;
    t.dtype = p.dtype;
    t.shape = p.shape;
    t.bytes = TensorBytes::Deferred(p.bytes, std::make_shared<FileRangeSource>(s.file, s.file->fd, p.offset, p.bytes,
                                                                               Cat("'", name, "' in ", s.tmp)));
    out.emplace(name, std::move(t));
  }
  return out;
}

absl::Status StreamedSafetensors::Commit() {
  if (committed_) return absl::FailedPreconditionError("streamed safetensors: committed twice");
  for (const Shard& s : shards_) {
    if (::fsync(s.file->fd) != 0) return ErrnoError(errno, Cat("cannot flush '", s.tmp, "'"));
  }
  for (const Shard& s : shards_) {
    if (::rename(s.tmp.c_str(), s.path.c_str()) != 0)
      return ErrnoError(errno, Cat("cannot rename '", s.tmp, "' to '", s.path, "'"));
  }
  committed_ = true;
  if (shards_.size() == 1) return absl::OkStatus();
  // The index, as SafetensorsWriter::WriteSharded formats it.
  std::string index = Cat("{\n  \"metadata\": {\n    \"total_size\": ", data_bytes_, "\n  },\n  \"weight_map\": {");
  bool first = true;
  for (const auto& [name, p] : places_) {
    index += Cat(first ? "\n    " : ",\n    ", "\"", name, "\": \"", shards_[p.shard].name, "\"");
    first = false;
  }
  index += "\n  }\n}\n";
  return WriteFileAtomically(dir_ + "/model.safetensors.index.json", index);
}

}  // namespace crashreplay::replay
