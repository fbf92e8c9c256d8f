// A CPU stand-in for a device executor, for tests on machines without a GPU:
// host_visible() is false, so the engine uploads every weight and reads every
// buffer back through CopyToDevice/CopyToHost, exactly as it does for CUDA;
// and its memory is mapped PROT_NONE except inside Launch, Copy* and Fill, so
// host code that dereferences "device" memory directly (which on a GPU is a
// segfault or garbage) faults here too. Kernels run on the real CPU executor,
// so a replay on it must give the CPU's bits.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>

#include "crashreplay/replay/kernels/executor.h"
#include "crashreplay/replay/session/backends.h"

namespace crashreplay::replay::testing {

class GuardedDeviceExecutor final : public Executor {
 public:
  explicit GuardedDeviceExecutor(int threads) {
    auto cpu = MakeExecutor("cpu", ExecMode::kKernelByKernel, threads);
    cpu_ = std::move(*cpu);
    // One reserved range, handed out page by page (never reused), so a
    // launch opens and closes all of it with two calls.
    void* p = mmap(nullptr, kReserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    base_ = p == MAP_FAILED ? nullptr : static_cast<char*>(p);
  }
  ~GuardedDeviceExecutor() override {
    if (base_ != nullptr) munmap(base_, kReserve);
  }

  std::string_view name() const override { return "guarded_device"; }
  ExecMode mode() const override { return ExecMode::kKernelByKernel; }
  bool host_visible() const override { return false; }

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t size = (bytes == 0 ? 1 : bytes + page - 1) / page * page;
    if (base_ == nullptr || used_ + size > kReserve) return absl::ResourceExhaustedError("guarded device memory full");
    char* p = base_ + used_;
    used_ += size;
    regions_[p] = size;
    return p;
  }
  void Free(void* p) override {
    auto it = regions_.find(static_cast<char*>(p));
    if (it == regions_.end()) return;
    madvise(it->first, it->second, MADV_DONTNEED);  // stays PROT_NONE: a later use faults
    regions_.erase(it);
  }
  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    Open(dst, true);
    std::memcpy(dst, src, bytes);
    Open(dst, false);
    return absl::OkStatus();
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    Open(src, true);
    std::memcpy(dst, src, bytes);
    Open(src, false);
    return absl::OkStatus();
  }
  absl::Status Fill(void* dst, int byte, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    Open(dst, true);
    std::memset(dst, byte, bytes);
    Open(dst, false);
    return absl::OkStatus();
  }
  absl::Status Launch(const Op& op, const LaunchTag& tag) override {
    OpenAll(true);
    absl::Status s = cpu_->Launch(op, tag);
    OpenAll(false);
    return s;
  }
  absl::Status Synchronize() override { return cpu_->Synchronize(); }
  const std::optional<ExecFault>& fault() const override { return cpu_->fault(); }
  uint32_t launches() const override { return cpu_->launches(); }

  // Whether `p` lies in one of this executor's allocations.
  bool Owns(const void* p) const { return Region(p) != regions_.end(); }

 private:
  std::map<char*, size_t>::const_iterator Region(const void* p) const {
    const char* c = static_cast<const char*>(p);
    auto it = regions_.upper_bound(const_cast<char*>(c));
    if (it == regions_.begin()) return regions_.end();
    --it;
    return c < it->first + it->second ? it : regions_.end();
  }
  // A copy whose device side is not ours is a bug of the caller: the CUDA
  // executor's copies would fail or read the wrong memory. Let it crash.
  void Open(const void* p, bool open) {
    auto it = Region(p);
    if (it == regions_.end()) std::abort();
    mprotect(it->first, it->second, open ? PROT_READ | PROT_WRITE : PROT_NONE);
  }
  // Freed pages are opened too (they read as zeros, not as a fault): the
  // CUDA executor would read stale device memory there.
  void OpenAll(bool open) {
    if (used_ > 0) mprotect(base_, used_, open ? PROT_READ | PROT_WRITE : PROT_NONE);
  }

  static constexpr size_t kReserve = size_t{16} << 30;
  std::unique_ptr<Executor> cpu_;
  char* base_ = nullptr;
  size_t used_ = 0;
  std::map<char*, size_t> regions_;
};

}  // namespace crashreplay::replay::testing
