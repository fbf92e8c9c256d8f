// The CPU executor: ops run on a CpuPool in host memory, always kernel by
// kernel (a fired check is reported by the Launch that ran it). Projections,
// MoE experts, attention (GQA reference, expanded MLA, DSA's sparse latent)
// and MLA's absorbed query go through the SIMD launchers of cpu_kernels.h
// (same bits as the work items), DSA's indexer once for ranks that agree; every other op, and an op those launchers
// do not cover, runs its work items.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "crashreplay/base/text.h"
#include "crashreplay/replay/cpu/cpu_kernels.h"
#include "crashreplay/replay/cpu/cpu_pool.h"
#include "crashreplay/replay/kernels/executor.h"

namespace crashreplay::replay {
namespace {

using text::Cat;

// Item runs per thread and launch (see Launch).
constexpr int64_t kRunsPerThread = 16;

float* ThreadScratch(int64_t n) {
  thread_local std::vector<float> s;
  if (static_cast<int64_t>(s.size()) < n) s.resize(static_cast<size_t>(n));
  return s.data();
}

class CpuExecutor final : public Executor {
 public:
  explicit CpuExecutor(int threads) : pool_(threads), isa_(DefaultCpuIsa()) {}

  std::string_view name() const override { return "cpu"; }
  ExecMode mode() const override { return ExecMode::kKernelByKernel; }
  bool host_visible() const override { return true; }

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    if (p == nullptr) return absl::ResourceExhaustedError(Cat("host allocation of ", bytes, " bytes failed"));
    return p;
  }
  void Free(void* p) override { std::free(p); }
  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status Fill(void* dst, int byte, size_t bytes) override {
    if (bytes) std::memset(dst, byte, bytes);
    return absl::OkStatus();
  }

  absl::Status Launch(const Op& op, const LaunchTag& tag) override {
    const uint32_t seq = launches_++;
    KernelStatus st;
    if (!LaunchFast(op, &st)) {
      st = std::visit(
          [this](const auto& o) {
            const int64_t scratch = ScratchFloats(o), items = Items(o);
            // Contiguous runs of items per pool call: an elementwise op
            // (a tensor-parallel reduction is one item per element) would
            // otherwise spend more in the call than in the item. A run stops
            // at its first fault, and runs go in item order, so the first
            // failing item is still the one reported.
            const int64_t run = std::max<int64_t>(1, items / (int64_t{pool_.threads()} * kRunsPerThread));
            return pool_.Launch((items + run - 1) / run, [&o, scratch, items, run](int64_t c, KernelStatus* s) {
              float* sc = scratch > 0 ? ThreadScratch(scratch) : nullptr;
              const int64_t end = std::min(items, (c + 1) * run);
              for (int64_t i = c * run; i < end && !s->fired; ++i) RunItem(o, i, sc, s);
            });
          },
          op);
    }
    if (!st.fired) return absl::OkStatus();
    ExecFault f;
    f.launch = seq;
    f.tag = tag;
    f.op = KindOf(op);
    f.status = st;
    f.surfaced_in = "Launch";
    f.surfaced_after_launch = launches_;
    fault_ = f;
    return absl::AbortedError(f.Describe());
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }
  const std::optional<ExecFault>& fault() const override { return fault_; }
  uint32_t launches() const override { return launches_; }

 private:
  bool LaunchFast(const Op& op, KernelStatus* st) {
    if (const auto* l = std::get_if<LinearOp>(&op)) return LaunchLinearFast(*l, pool_, isa_, st);
    if (const auto* e = std::get_if<ExpertsOp>(&op)) return LaunchExpertsFast(*e, pool_, isa_, st);
    if (const auto* s = std::get_if<SharedExpertOp>(&op)) return LaunchSharedExpertFast(*s, pool_, isa_, st);
    if (const auto* a = std::get_if<AttentionOp>(&op)) return LaunchAttentionFast(*a, pool_, isa_, st);
    if (const auto* m = std::get_if<MlaAttentionOp>(&op)) return LaunchMlaAttentionFast(*m, pool_, isa_, st);
    if (const auto* q = std::get_if<MlaQAbsorbOp>(&op)) return LaunchMlaQAbsorbFast(*q, pool_, isa_, st);
    if (const auto* l = std::get_if<LatentAttentionOp>(&op)) return LaunchLatentAttentionFast(*l, pool_, isa_, st);
    if (const auto* x = std::get_if<IndexerOp>(&op)) return LaunchIndexerFast(*x, pool_, isa_, st);
    return false;
  }

  CpuPool pool_;
  CpuIsa isa_;
  uint32_t launches_ = 0;
  std::optional<ExecFault> fault_;
};

}  // namespace

std::unique_ptr<Executor> MakeCpuExecutor(int threads) { return std::make_unique<CpuExecutor>(threads); }

}  // namespace crashreplay::replay
