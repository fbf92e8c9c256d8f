#include "byte_source.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"

namespace crashreplay::coredump {
namespace {

absl::Status OutOfBounds(uint64_t offset, uint64_t n, uint64_t size, const std::string& what) {
  return absl::DataLossError(
      absl::StrFormat("%s: bytes [%d, %d + %d) lie past the end of the %d bytes there", what, offset, offset, n, size));
}

class Memory final : public ByteSource {
 public:
  explicit Memory(std::span<const std::byte> bytes) : bytes_(bytes) {}
  uint64_t size() const override { return bytes_.size(); }
  absl::Status Read(uint64_t offset, uint64_t n, std::vector<unsigned char>* out,
                    const std::string& what) const override {
    if (!InRange(offset, n, bytes_.size())) return OutOfBounds(offset, n, bytes_.size(), what);
    out->resize(static_cast<size_t>(n));
    if (n > 0) std::memcpy(out->data(), bytes_.data() + offset, static_cast<size_t>(n));
    return absl::OkStatus();
  }

 private:
  std::span<const std::byte> bytes_;
};

class File final : public ByteSource {
 public:
  File(std::string path, int fd, uint64_t size) : path_(std::move(path)), fd_(fd), size_(size) {}
  ~File() override { ::close(fd_); }
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  uint64_t size() const override { return size_; }
  absl::Status Read(uint64_t offset, uint64_t n, std::vector<unsigned char>* out,
                    const std::string& what) const override {
    if (!InRange(offset, n, size_)) return OutOfBounds(offset, n, size_, what);
    out->resize(static_cast<size_t>(n));
    uint64_t done = 0;
    while (done < n) {
      const ssize_t got =
          ::pread(fd_, out->data() + done, static_cast<size_t>(n - done), static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) {
        return absl::DataLossError(
            absl::StrFormat("%s: cannot read %s at offset %d: %s", what, path_, offset + done, std::strerror(errno)));
      }
      if (got == 0) {
        return absl::DataLossError(absl::StrFormat(
            "%s: %s ends at byte %d, before the %d bytes it had when opened (the file shrank while being read)", what,
            path_, offset + done, size_));
      }
      done += static_cast<uint64_t>(got);
    }
    return absl::OkStatus();
  }

 private:
  std::string path_;
  int fd_;
  uint64_t size_;
};

class Slice final : public ByteSource {
 public:
  Slice(const ByteSource& base, uint64_t offset, uint64_t size) : base_(base), offset_(offset), size_(size) {}
  uint64_t size() const override { return size_; }
  absl::Status Read(uint64_t offset, uint64_t n, std::vector<unsigned char>* out,
                    const std::string& what) const override {
    if (!InRange(offset, n, size_)) return OutOfBounds(offset, n, size_, what);
    return base_.Read(offset_ + offset, n, out, what);
  }

 private:
  const ByteSource& base_;
  uint64_t offset_;
  uint64_t size_;
};

const char* FileTypeName(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

absl::Status ErrnoStatus(int err, const std::string& what) {
  const std::string msg = absl::StrFormat("%s: %s", what, std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  return absl::FailedPreconditionError(msg);
}

}  // namespace

std::unique_ptr<ByteSource> MemorySource(std::span<const std::byte> bytes) { return std::make_unique<Memory>(bytes); }

absl::StatusOr<std::unique_ptr<ByteSource>> FileSource(const std::string& path) {
  // Non-blocking: a FIFO without a writer or a tty must not hang the reader.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    const int err = errno;
    if (err == EISDIR) return absl::NotFoundError(absl::StrFormat("'%s' is a directory, not a regular file", path));
    return ErrnoStatus(err, absl::StrFormat("cannot open '%s'", path));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus(err, absl::StrFormat("cannot stat '%s'", path));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::NotFoundError(absl::StrFormat("'%s' is %s, not a regular file", path, FileTypeName(st.st_mode)));
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return std::unique_ptr<ByteSource>(new File(path, fd, static_cast<uint64_t>(st.st_size)));
}

std::unique_ptr<ByteSource> SliceSource(const ByteSource& base, uint64_t offset, uint64_t size) {
  return std::make_unique<Slice>(base, offset, size);
}

}  // namespace crashreplay::coredump
