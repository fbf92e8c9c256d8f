#include "crashreplay/replay/cpu/cpu_pool.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace crashreplay::replay {

struct CpuPool::Impl {
  std::mutex mu;
  std::condition_variable cv_work, cv_done;
  std::vector<std::thread> workers;
  // Written under mu before `generation` is bumped (release); read by a
  // worker after it sees the new generation (acquire).
  const std::function<void(int64_t, KernelStatus*)>* body = nullptr;
  int64_t n = 0;
  bool dynamic = false;
  // Dynamic launches: the next item to take, and the lowest item that
  // failed so far (n when none).
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> lowest_fault{0};
  std::atomic<uint64_t> generation{0};
  std::atomic<int> pending{0};
  std::atomic<bool> stop{false};
  std::vector<KernelStatus> status;
  std::vector<int64_t> fault_item;  // dynamic: the item of status[w]
};

namespace {
int ThreadsFromEnv() {
  const char* e = std::getenv("CRASHREPLAY_THREADS");
  if (e == nullptr) return 1;
  const int t = std::atoi(e);
  return t >= 1 && t <= 256 ? t : 1;
}

void RunRange(const std::function<void(int64_t, KernelStatus*)>& body, int64_t begin, int64_t end, KernelStatus* st) {
  for (int64_t i = begin; i < end && !st->fired; ++i) body(i, st);
}

// A dynamic launch on one thread: take items in order until none is left.
// Items above a fault already seen are skipped (they cannot be the first);
// items below it still run, so the lowest failing item is always found. A
// thread takes increasing items, so the one fault it can keep is its lowest.
void RunTaken(const std::function<void(int64_t, KernelStatus*)>& body, int64_t n, std::atomic<int64_t>& next,
              std::atomic<int64_t>& lowest, KernelStatus* st, int64_t* fault_item) {
  for (;;) {
    const int64_t i = next.fetch_add(1, std::memory_order_relaxed);
    if (i >= n) return;
    if (i > lowest.load(std::memory_order_relaxed)) continue;
    KernelStatus item;
    body(i, &item);
    if (!item.fired) continue;
    *st = item;
    *fault_item = i;
    int64_t cur = lowest.load(std::memory_order_relaxed);
    while (i < cur && !lowest.compare_exchange_weak(cur, i, std::memory_order_relaxed)) {
    }
  }
}

// How long a thread polls for the next launch (a worker) or for the others
// to finish (the launcher) before it blocks: a decode step is a few hundred
// launches of tens of microseconds each, and waking a blocked thread costs
// about as much as one (a 2-thread llama decode step spent ~8% of its time
// in the scheduler).
constexpr auto kSpin = std::chrono::microseconds(50);

void Relax() {
#if defined(__x86_64__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Polls `ready` until it holds or kSpin has passed; returns whether it holds.
template <class Ready>
bool SpinFor(const Ready& ready) {
  const auto until = std::chrono::steady_clock::now() + kSpin;
  for (int i = 0;; ++i) {
    if (ready()) return true;
    Relax();
    if ((i & 63) == 63 && std::chrono::steady_clock::now() >= until) return ready();
  }
}
}  // namespace

CpuPool::CpuPool(int threads) : threads_(threads > 0 ? threads : ThreadsFromEnv()), impl_(new Impl) {
  impl_->status.resize(threads_);
  impl_->fault_item.resize(threads_);
  for (int w = 1; w < threads_; ++w) {
    impl_->workers.emplace_back([this, w] {
      Impl& im = *impl_;
      uint64_t seen = 0;
      for (;;) {
        auto launched = [&] {
          return im.stop.load(std::memory_order_acquire) || im.generation.load(std::memory_order_acquire) != seen;
        };
        if (!SpinFor(launched)) {
          std::unique_lock<std::mutex> lock(im.mu);
          im.cv_work.wait(lock, launched);
        }
        if (im.stop.load(std::memory_order_acquire)) return;
        seen = im.generation.load(std::memory_order_acquire);
        const int64_t n = im.n;
        const auto* body = im.body;
        if (im.dynamic) {
          RunTaken(*body, n, im.next, im.lowest_fault, &im.status[w], &im.fault_item[w]);
        } else {
          const int64_t begin = n * w / threads_, end = n * (w + 1) / threads_;
          RunRange(*body, begin, end, &im.status[w]);
        }
        if (im.pending.fetch_sub(1, std::memory_order_acq_rel) == 1) {
          std::lock_guard<std::mutex> lock(im.mu);  // the launcher may be between its check and its wait
          im.cv_done.notify_one();
        }
      }
    });
  }
}

CpuPool::~CpuPool() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop.store(true, std::memory_order_release);
  }
  impl_->cv_work.notify_all();
  for (auto& t : impl_->workers) t.join();
}

KernelStatus CpuPool::Launch(int64_t n, const std::function<void(int64_t, KernelStatus*)>& body) {
  return Run(n, body, false);
}

KernelStatus CpuPool::LaunchDynamic(int64_t n, const std::function<void(int64_t, KernelStatus*)>& body) {
  return Run(n, body, true);
}

KernelStatus CpuPool::Run(int64_t n, const std::function<void(int64_t, KernelStatus*)>& body, bool dynamic) {
  Impl& im = *impl_;
  for (auto& s : im.status) s = KernelStatus{};
  if (threads_ == 1 || n < 2) {
    RunRange(body, 0, n, &im.status[0]);
    return im.status[0];
  }
  {
    std::lock_guard<std::mutex> lock(im.mu);
    im.body = &body;
    im.n = n;
    im.dynamic = dynamic;
    im.next.store(0, std::memory_order_relaxed);
    im.lowest_fault.store(n, std::memory_order_relaxed);
    im.pending.store(threads_ - 1, std::memory_order_relaxed);
    im.generation.fetch_add(1, std::memory_order_release);
  }
  im.cv_work.notify_all();
  if (dynamic) {
    RunTaken(body, n, im.next, im.lowest_fault, &im.status[0], &im.fault_item[0]);
  } else {
    RunRange(body, 0, n / threads_, &im.status[0]);
  }
  auto done = [&] { return im.pending.load(std::memory_order_acquire) == 0; };
  if (!SpinFor(done)) {
    std::unique_lock<std::mutex> lock(im.mu);
    im.cv_done.wait(lock, done);
  }
  if (dynamic) {
    // Each thread kept the status of the lowest failing item it ran; the
    // lowest over all threads is the launch's.
    const int64_t lowest = im.lowest_fault.load(std::memory_order_relaxed);
    if (lowest == n) return KernelStatus{};
    for (int w = 0; w < threads_; ++w) {
      if (im.status[w].fired && im.fault_item[w] == lowest) return im.status[w];
    }
  }
  // Workers own contiguous ascending ranges: the first fired worker holds the
  // lowest failing item.
  for (const KernelStatus& s : im.status) {
    if (s.fired) return s;
  }
  return KernelStatus{};
}

}  // namespace crashreplay::replay
