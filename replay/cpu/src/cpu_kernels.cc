#include "crashreplay/replay/cpu/cpu_kernels.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "cpu_dot.h"

namespace crashreplay::replay {
namespace {

using cpu::DotJob;
using cpu::PaddedCols;

// Rows per work item: a multiple of every tile height (packed 2 and 6,
// direct 2, 4 and 8).
constexpr int64_t kRowBlock = 48;

// Splits `rows` into items of at most kRowBlock rows.
int64_t RowBlocks(int64_t rows) { return (rows + kRowBlock - 1) / kRowBlock; }

// Scratch of the launching thread (the executor's), reused across launches.
std::vector<float>& Arena() {
  thread_local std::vector<float> a;
  return a;
}

bool Covered(const QWeight& w, DotKind kind, bool q) {
  return cpu::DotCovered(w, kind, q) && !cpu::DotMayFail(w, kind, q);
}

}  // namespace

const char* CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kReference: return "reference";
    case CpuIsa::kGeneric: return "generic";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
  }
  return "unknown";
}

bool CpuIsaSupported(CpuIsa isa) {
  if (isa != CpuIsa::kAvx2 && isa != CpuIsa::kAvx512) return true;
#if defined(__x86_64__)
  // The kernels are built with FMA (cpu_dot.h: fused where exact) and F16C
  // (cpu_simd.h: fp16 and e4m3 codes) too: CR_TARGET_AVX2/AVX512.
  if (!__builtin_cpu_supports("fma") || !__builtin_cpu_supports("f16c")) return false;
  if (isa == CpuIsa::kAvx2) return __builtin_cpu_supports("avx2");
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
#else
  return false;
#endif
}

CpuIsa DefaultCpuIsa() {
  const CpuIsa best = CpuIsaSupported(CpuIsa::kAvx512) ? CpuIsa::kAvx512
                      : CpuIsaSupported(CpuIsa::kAvx2) ? CpuIsa::kAvx2
                                                       : CpuIsa::kGeneric;
  const char* e = std::getenv("CRASHREPLAY_CPU_KERNELS");
  if (e == nullptr) return best;
  const std::string_view v(e);
  if (v == "reference") return CpuIsa::kReference;
  if (v == "generic") return CpuIsa::kGeneric;
  if (v == "avx2" && CpuIsaSupported(CpuIsa::kAvx2)) return CpuIsa::kAvx2;
  if (v == "avx512" && CpuIsaSupported(CpuIsa::kAvx512)) return CpuIsa::kAvx512;
  return best;
}

bool CpuFusedMulAdd() {
  static const bool on = [] {
    const char* e = std::getenv("CRASHREPLAY_CPU_FMA");
    return e == nullptr || std::string_view(e) != "off";
  }();
  return on;
}

namespace {
std::atomic<size_t> scratch_bytes{size_t{512} << 20};
}  // namespace

size_t CpuScratchBytes() { return scratch_bytes.load(std::memory_order_relaxed); }
void SetCpuScratchBytes(size_t bytes) { scratch_bytes.store(bytes, std::memory_order_relaxed); }

bool LaunchLinearFast(const LinearOp& o, CpuPool& pool, CpuIsa isa, KernelStatus* status) {
  *status = KernelStatus{};
  if (isa == CpuIsa::kReference || o.ranks <= 0 || o.tokens <= 0 || o.rows <= 0) return false;
  const int64_t R = o.ranks, T = o.tokens, cols = o.cols, pc = PaddedCols(cols);
  std::vector<char> quantized(static_cast<size_t>(R));
  bool any_q = false;
  for (int64_t r = 0; r < R; ++r) {
    const QWeight& w = o.shards[r].w;
    quantized[r] = o.xq != nullptr && w.act_fp4;
    any_q = any_q || quantized[r];
    if (w.rows != o.rows || w.cols != cols || !Covered(w, o.dot, quantized[r])) return false;
  }
  // Inputs as the dot engine reads them: in place where the rows already are
  // padded float rows, else copied (odd widths) or decoded (w4a4), in chunks
  // of tokens whose copies fit the scratch bound.
  const bool copy = any_q || cols % 8 != 0;
  const int64_t nbq = (cols + kActBlock - 1) / kActBlock;
  const int64_t chunk =
      copy ? std::clamp<int64_t>(static_cast<int64_t>(CpuScratchBytes()) / (R * (pc + nbq) * 4), 1, T) : T;
  std::vector<float>& arena = Arena();
  const int64_t blocks = RowBlocks(o.rows);
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t C = std::min(T, t0 + chunk) - t0;
    if (copy) arena.resize(static_cast<size_t>(R * C * (pc + nbq)));
    // Item rc = r * C + (t - t0) of the chunk.
    std::vector<const float*> x(R * C), xs(R * C);
    std::vector<float*> y(R * C);
    for (int64_t rc = 0; rc < R * C; ++rc) {
      const int64_t rt = rc / C * T + t0 + rc % C;
      x[rc] = copy ? arena.data() + rc * pc : LinearInput(o, rt);
      xs[rc] = copy ? arena.data() + R * C * pc + rc * nbq : nullptr;
      y[rc] = o.y + rt * o.rows;
    }
    if (copy) {
      pool.Launch(R * C, [&](int64_t rc, KernelStatus*) {
        float* dst = arena.data() + rc * pc;
        const int64_t r = rc / C, t = t0 + rc % C, xr = o.x_per_rank ? r * T + t : t;
        if (quantized[r]) {
          const QWeight xq = Fp4Row(o.xq, o.xq_scales, xr, cols, o.shards[r].w.act_scale);
          cpu::PrepareQRow(xq, o.dot, dst, arena.data() + R * C * pc + rc * nbq);
        } else {
          cpu::PadRow(o.x + xr * cols, cols, dst);
        }
      });
    }
    // What the rows hold, for the fused multiply-adds (cpu_dot.h): scanned
    // once when every rank reads the same rows.
    const int64_t distinct = o.x_per_rank || any_q ? R : 1;
    std::vector<cpu::ValueRange> ranges(static_cast<size_t>(distinct * C));
    if (CpuFusedMulAdd()) {
      pool.Launch(distinct * C, [&](int64_t rc, KernelStatus*) { ranges[rc] = cpu::ScanRange(x[rc], cols, isa); });
    }
    std::vector<DotJob> jobs(R);
    for (int64_t r = 0; r < R; ++r) {
      DotJob& j = jobs[r];
      const cpu::ValueRange* rr = ranges.data() + (distinct == R ? r : 0) * C;
      j.x_range = rr[0];
      for (int64_t c = 1; c < C; ++c) j.x_range = cpu::Merge(j.x_range, rr[c]);
      j.w = &o.shards[r].w;
      j.kind = o.dot;
      j.q = quantized[r];
      j.tokens = C;
      j.x = x.data() + r * C;
      j.xs = xs.data() + r * C;
      j.x_global = o.shards[r].w.act_scale;
      j.y = y.data() + r * C;
      j.bias = o.shards[r].bias;
    }
    pool.Launch(R * blocks, [&](int64_t i, KernelStatus*) {
      const int64_t r = i / blocks, r0 = (i % blocks) * kRowBlock;
      cpu::RunRows(jobs[r], r0, std::min(o.rows, r0 + kRowBlock), isa);
    });
  }
  // Kept for the next op up to a decode step's size; a prefill's is released.
  if (arena.capacity() > (size_t{16} << 20)) std::vector<float>().swap(arena);
  return true;
}

}  // namespace crashreplay::replay
