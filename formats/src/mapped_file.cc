#include "mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace crashreplay {
namespace {

class MappedFile final : public ByteSource {
 public:
  MappedFile(void* addr, size_t size) : addr_(addr), size_(size) {}
  ~MappedFile() override {
    if (addr_ != nullptr) munmap(addr_, size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  std::span<const std::byte> bytes() const override {
    return {static_cast<const std::byte*>(addr_), size_};
  }

 private:
  void* addr_;
  size_t size_;
};

class OwnedBytes final : public ByteSource {
 public:
  explicit OwnedBytes(std::span<const std::byte> bytes) : data_(bytes.begin(), bytes.end()) {}
  std::span<const std::byte> bytes() const override { return data_; }

 private:
  std::vector<std::byte> data_;
};

absl::Status ErrnoStatus(int err, const std::string& what) {
  std::string msg = absl::StrCat(what, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  return absl::FailedPreconditionError(msg);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ByteSource>> MapFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("cannot open '", path, "'"));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus(err, absl::StrCat("cannot stat '", path, "'"));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat("'", path, "' is not a regular file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    return std::unique_ptr<ByteSource>(new MappedFile(nullptr, 0));
  }
  void* addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (addr == MAP_FAILED) return ErrnoStatus(err, absl::StrCat("cannot mmap '", path, "'"));
  return std::unique_ptr<ByteSource>(new MappedFile(addr, size));
}

std::unique_ptr<ByteSource> CopyBytes(std::span<const std::byte> bytes) {
  return std::make_unique<OwnedBytes>(bytes);
}

}  // namespace crashreplay
