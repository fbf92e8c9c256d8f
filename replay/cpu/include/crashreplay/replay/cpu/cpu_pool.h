// The CPU backend's launcher: runs a kernel body over work items [0, n) on a
// fixed number of threads with a static partition (Launch) or taken one by
// one (LaunchDynamic).
//
// Determinism: every work item is computed entirely by one thread with the
// same code, so outputs do not depend on the thread count. Each worker has its
// own KernelStatus; Launch returns the failure with the lowest work item, which
// is also what one thread would have reported first.
// Thread safety: a CpuPool runs one Launch at a time (the engine is serial).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "crashreplay/replay/kernels/check.h"

namespace crashreplay::replay {

class CpuPool {
 public:
  // threads <= 0: CRASHREPLAY_THREADS from the environment, else 1.
  explicit CpuPool(int threads = 0);
  ~CpuPool();
  CpuPool(const CpuPool&) = delete;
  CpuPool& operator=(const CpuPool&) = delete;

  int threads() const { return threads_; }

  // body(item, status) for every item; returns the first failure by item order.
  KernelStatus Launch(int64_t n, const std::function<void(int64_t, KernelStatus*)>& body);
  // The same, but threads take the next item as they finish one instead of
  // a fixed range: for items of uneven cost (a MoE layer's experts). Which
  // thread runs an item varies from run to run, so items must not depend on
  // it (scratch aside); the first failure by item order is still the one
  // returned (items after a known failure are skipped, items before it run).
  KernelStatus LaunchDynamic(int64_t n, const std::function<void(int64_t, KernelStatus*)>& body);

 private:
  KernelStatus Run(int64_t n, const std::function<void(int64_t, KernelStatus*)>& body, bool dynamic);

  struct Impl;
  int threads_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace crashreplay::replay
