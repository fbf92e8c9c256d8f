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
  std::span<const std::byte> bytes() const override { return {static_cast<const std::byte*>(addr_), size_}; }

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

static const char* FileTypeName(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

absl::StatusOr<int> OpenRegularFile(const std::string& path, uint64_t* size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    const int err = errno;
    if (err == EISDIR) return absl::NotFoundError(absl::StrCat("'", path, "' is a directory, not a regular file"));
    return ErrnoStatus(err, absl::StrCat("cannot open '", path, "'"));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus(err, absl::StrCat("cannot stat '", path, "'"));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::NotFoundError(absl::StrCat("'", path, "' is ", FileTypeName(st.st_mode), ", not a regular file"));
  }
  // Regular files ignore O_NONBLOCK; clear it anyway so reads mean what they say.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  if (size != nullptr) *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

absl::StatusOr<std::string> ReadRegularFile(const std::string& path, uint64_t max_bytes) {
  uint64_t size = 0;
  absl::StatusOr<int> fd = OpenRegularFile(path, &size);
  if (!fd.ok()) return fd.status();
  if (size > max_bytes) {
    ::close(*fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("'", path, "' is ", size, " bytes; the limit for this file is ", max_bytes));
  }
  std::string text(static_cast<size_t>(size), '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(*fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(*fd);
  if (got != text.size()) return absl::DataLossError(absl::StrCat("short read on '", path, "'"));
  return text;
}

absl::StatusOr<std::unique_ptr<ByteSource>> MapFile(const std::string& path) {
  uint64_t file_size = 0;
  absl::StatusOr<int> opened = OpenRegularFile(path, &file_size);
  if (!opened.ok()) return opened.status();
  const int fd = *opened;
  const size_t size = static_cast<size_t>(file_size);
  if (size == 0) {
    ::close(fd);
    return std::unique_ptr<ByteSource>(new MappedFile(nullptr, 0));
  }
  void* addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (addr == MAP_FAILED && err == ENOMEM) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot mmap the ", size, " bytes of '", path, "': out of address space (ulimit -v?)"));
  }
  if (addr == MAP_FAILED) return ErrnoStatus(err, absl::StrCat("cannot mmap '", path, "'"));
  return std::unique_ptr<ByteSource>(new MappedFile(addr, size));
}

std::unique_ptr<ByteSource> CopyBytes(std::span<const std::byte> bytes) { return std::make_unique<OwnedBytes>(bytes); }

namespace {

int64_t MtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

// Part of a file mapped from a page boundary: `bytes()` starts `skip` bytes in.
class MappedRange final : public ByteSource {
 public:
  MappedRange(void* addr, size_t mapped, size_t skip, size_t size)
      : addr_(addr), mapped_(mapped), skip_(skip), size_(size) {}
  ~MappedRange() override {
    if (addr_ != nullptr) munmap(addr_, mapped_);
  }
  MappedRange(const MappedRange&) = delete;
  MappedRange& operator=(const MappedRange&) = delete;
  std::span<const std::byte> bytes() const override {
    if (addr_ == nullptr) return {};
    return {static_cast<const std::byte*>(addr_) + skip_, size_};
  }

 private:
  void* addr_;
  size_t mapped_, skip_, size_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<OpenFile>> OpenFile::Open(const std::string& path) {
  uint64_t size = 0;
  absl::StatusOr<int> fd = OpenRegularFile(path, &size);
  if (!fd.ok()) return fd.status();
  std::unique_ptr<OpenFile> f(new OpenFile(path, *fd, size));
  struct stat st;
  if (::fstat(*fd, &st) == 0) f->mtime_ns_ = MtimeNs(st);
  return f;
}

OpenFile::~OpenFile() {
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<std::vector<std::byte>> OpenFile::Read(uint64_t offset, uint64_t n) const {
  std::vector<std::byte> out(static_cast<size_t>(n));
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t r = ::pread(fd_, out.data() + got, out.size() - got, static_cast<off_t>(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return ErrnoStatus(errno, absl::StrCat("cannot read '", path_, "'"));
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  if (got != out.size()) {
    return absl::DataLossError(absl::StrCat("'", path_, "': read ", got, " of ", n, " bytes at offset ", offset,
                                            " (the file ends early: truncated?)"));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<ByteSource>> OpenFile::Map(uint64_t offset, uint64_t n) const {
  struct stat st;
  if (::fstat(fd_, &st) != 0) return ErrnoStatus(errno, absl::StrCat("cannot stat '", path_, "'"));
  const uint64_t now = static_cast<uint64_t>(st.st_size);
  if (now != size_ || offset + n > now) {
    return absl::DataLossError(absl::StrCat("'", path_, "' is ", now, " bytes now; it was ", size_,
                                            " when it was opened: the file changed while it was in use"));
  }
  if (MtimeNs(st) != mtime_ns_) {
    return absl::DataLossError(absl::StrCat("'", path_,
                                            "' was modified after it was opened (its modification time "
                                            "changed): the file changed while it was in use"));
  }
  if (n == 0) return std::unique_ptr<ByteSource>(new MappedRange(nullptr, 0, 0, 0));
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t start = offset / page * page;
  const size_t skip = static_cast<size_t>(offset - start);
  const size_t len = skip + static_cast<size_t>(n);
  void* addr = ::mmap(nullptr, len, PROT_READ, MAP_PRIVATE, fd_, static_cast<off_t>(start));
  if (addr == MAP_FAILED) {
    const int err = errno;
    if (err == ENOMEM) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot map ", n, " bytes of '", path_, "' at offset ", offset,
                                                       ": out of address space (ulimit -v?)"));
    }
    return ErrnoStatus(err, absl::StrCat("cannot mmap ", n, " bytes of '", path_, "' at offset ", offset));
  }
  return std::unique_ptr<ByteSource>(new MappedRange(addr, len, skip, static_cast<size_t>(n)));
}

}  // namespace crashreplay
