#include "crashreplay/replay/cpu_pool.h"

#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace crashreplay::replay {

struct CpuPool::Impl {
  std::mutex mu;
  std::condition_variable cv_work, cv_done;
  std::vector<std::thread> workers;
  const std::function<void(int64_t, KernelStatus*)>* body = nullptr;
  int64_t n = 0;
  uint64_t generation = 0;
  int pending = 0;
  bool stop = false;
  std::vector<KernelStatus> status;
};

namespace {
int ThreadsFromEnv() {
  const char* e = std::getenv("CRASHREPLAY_THREADS");
  if (e == nullptr) return 1;
  const int t = std::atoi(e);
  return t >= 1 && t <= 256 ? t : 1;
}

void RunRange(const std::function<void(int64_t, KernelStatus*)>& body, int64_t begin, int64_t end,
              KernelStatus* st) {
  for (int64_t i = begin; i < end && !st->fired; ++i) body(i, st);
}
}  // namespace

CpuPool::CpuPool(int threads) : threads_(threads > 0 ? threads : ThreadsFromEnv()), impl_(new Impl) {
  impl_->status.resize(threads_);
  for (int w = 1; w < threads_; ++w) {
    impl_->workers.emplace_back([this, w] {
      uint64_t seen = 0;
      for (;;) {
        std::unique_lock<std::mutex> lock(impl_->mu);
        impl_->cv_work.wait(lock, [&] { return impl_->stop || impl_->generation != seen; });
        if (impl_->stop) return;
        seen = impl_->generation;
        const int64_t n = impl_->n;
        const auto* body = impl_->body;
        lock.unlock();
        const int64_t begin = n * w / threads_, end = n * (w + 1) / threads_;
        RunRange(*body, begin, end, &impl_->status[w]);
        lock.lock();
        if (--impl_->pending == 0) impl_->cv_done.notify_one();
      }
    });
  }
}

CpuPool::~CpuPool() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv_work.notify_all();
  for (auto& t : impl_->workers) t.join();
}

KernelStatus CpuPool::Launch(int64_t n, const std::function<void(int64_t, KernelStatus*)>& body) {
  for (auto& s : impl_->status) s = KernelStatus{};
  if (threads_ == 1 || n < 2) {
    RunRange(body, 0, n, &impl_->status[0]);
    return impl_->status[0];
  }
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->body = &body;
    impl_->n = n;
    impl_->pending = threads_ - 1;
    impl_->generation += 1;
  }
  impl_->cv_work.notify_all();
  RunRange(body, 0, n / threads_, &impl_->status[0]);
  {
    std::unique_lock<std::mutex> lock(impl_->mu);
    impl_->cv_done.wait(lock, [&] { return impl_->pending == 0; });
  }
  // Workers own contiguous ascending ranges: the first fired worker holds the
  // lowest failing item.
  for (const KernelStatus& s : impl_->status) {
    if (s.fired) return s;
  }
  return KernelStatus{};
}

}  // namespace crashreplay::replay
