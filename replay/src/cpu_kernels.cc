#include "crashreplay/replay/cpu_kernels.h"

#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "cpu_dot.h"

namespace crashreplay::replay {
namespace {

using cpu::DotJob;
using cpu::PaddedCols;

// Rows per work item: a multiple of both tile heights (3 packed, 4 direct).
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
  // padded float rows, else copied (odd widths) or decoded (w4a4).
  const bool copy = any_q || cols % 8 != 0;
  const int64_t nbq = (cols + kActBlock - 1) / kActBlock;
  std::vector<float>& arena = Arena();
  if (copy) arena.resize(static_cast<size_t>(R * T * (pc + nbq)));
  std::vector<const float*> x(R * T), xs(R * T);
  std::vector<float*> y(R * T);
  for (int64_t rt = 0; rt < R * T; ++rt) {
    const float* src = LinearInput(o, rt);
    x[rt] = copy ? arena.data() + rt * pc : src;
    xs[rt] = copy ? arena.data() + R * T * pc + rt * nbq : nullptr;
    y[rt] = o.y + rt * o.rows;
  }
  if (copy) {
    pool.Launch(R * T, [&](int64_t rt, KernelStatus*) {
      float* dst = arena.data() + rt * pc;
      const int64_t r = rt / T, xr = o.x_per_rank ? rt : rt % T;
      if (quantized[r]) {
        const QWeight xq = Fp4Row(o.xq, o.xq_scales, xr, cols, o.shards[r].w.act_scale);
        cpu::PrepareQRow(xq, o.dot, dst, arena.data() + R * T * pc + rt * nbq);
      } else {
        cpu::PadRow(o.x + xr * cols, cols, dst);
      }
    });
  }
  std::vector<DotJob> jobs(R);
  for (int64_t r = 0; r < R; ++r) {
    DotJob& j = jobs[r];
    j.w = &o.shards[r].w;
    j.kind = o.dot;
    j.q = quantized[r];
    j.tokens = T;
    j.x = x.data() + r * T;
    j.xs = xs.data() + r * T;
    j.x_global = o.shards[r].w.act_scale;
    j.y = y.data() + r * T;
    j.bias = o.shards[r].bias;
  }
  const int64_t blocks = RowBlocks(o.rows);
  pool.Launch(R * blocks, [&](int64_t i, KernelStatus*) {
    const int64_t r = i / blocks, r0 = (i % blocks) * kRowBlock;
    cpu::RunRows(jobs[r], r0, std::min(o.rows, r0 + kRowBlock), isa);
  });
  return true;
}

}  // namespace crashreplay::replay
