// cpu_kernels_bench: the fast CPU launchers (replay/cpu_kernels.h) beside the
// work items they replace, OpenBLAS, and the machine's memory bandwidth.
//
//   cpu_kernels_bench [--threads N] [--reps R] [--no-reference] [--cpu-time]
//                     [--only linear|experts|indexer] [--format F] [--dot fused|dequant|both]
//                     [--experts-shape small|glm5|both] [--bf16-inputs] [--indexer-tokens T] [--json]
//
// --cpu-time times the process's CPU time (all threads) instead of wall
// time: on a loaded machine, what the code costs rather than what the
// scheduler gave it. The figures in docs/replay.md are wall time.
// Linear: the projections of the llama bench/decode_vs_torch.py writes
// (hidden 1024, GQA 16/4 x 64, intermediate 2816; per layer q, k, v, o,
// gate, up, down) in bf16, for 1 token (a decode step) and 128 tokens (a
// prefill): ms for one layer's seven projections with the work items
// (ops.h RunItem on the CpuPool: what the CPU executor ran before), the
// generic and AVX2 fast kernels, and OpenBLAS sgemm over float32 copies
// (cblas_sgemm, same threads; OpenBLAS picks its own summation order, which
// is why the engine does not call it: docs/replay.md). Each twice: fp32
// inputs, and inputs rounded to bf16 (activation_dtype=bf16), where every
// product is exact and the AVX2/AVX-512 kernels fuse multiply and add
// (cpu_dot.h; CRASHREPLAY_CPU_FMA=off turns that off to compare).
//
// Experts: one MoE layer's routed experts at decode (1 token, top-8 of 64
// experts, hidden 2048, moe_intermediate 768; each step routes to 8 other
// experts, so the weights come from DRAM) in NVFP4 (w4a4 and w4a16), MXFP4
// (w4a16), FP8 block and bf16, under each dot kind: `fused` (gemm_backend/moe_backend
// fused_blockscaled, the engine's default: a sum per scale block, then times
// the scale) and `dequant` (dequant_matmul: bf16(value * scale) terms).
// --format keeps the rows whose format starts with F. --bf16-inputs rounds
// the token's row to bf16 (activation_dtype=bf16: the w4a16 fused dot's raw
// e2m1 terms then fuse multiply and add, cpu_dot.h). Figures: bytes of the routed experts' weights (values and
// scales) per second, and params per second, beside a read-only stream and
// memcpy over 512 MiB on the same threads. A step reads each routed weight
// byte once, so the stream rate is its bound.
//
// Indexer: DSA's lightning indexer at GLM-5's dimensions (32 heads x 128,
// top-2048) for one prefill row of --indexer-tokens tokens (default 1024)
// at tp 8, bf16 and fp8 index keys: the work items (every rank's items:
// what the CPU executor ran before) beside the launcher (rank 0's items,
// the other ranks' pages compared and their ids copied), with the
// arithmetic the items do (2 * heads * dim flops per query and key, per
// rank computed) beside the arithmetic bound of the engine's mix on the
// same threads (8-wide multiply then add, measured: ArithmeticBoundGflops).
//
// Figures only; nothing here is asserted. Medians of --reps runs (default 7).
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "crashreplay/formats/block_quant.h"
#include "crashreplay/formats/numeric.h"
#include "crashreplay/replay/cpu/cpu_kernels.h"
#include "crashreplay/replay/cpu/cpu_pool.h"
#include "crashreplay/replay/kernels/ops.h"

extern "C" void openblas_set_num_threads(int);

namespace {

using namespace crashreplay;
using namespace crashreplay::replay;
using Clock = std::chrono::steady_clock;

bool g_cpu_time = false;      // --cpu-time: process CPU time instead of wall time
bool g_bf16_inputs = false;  // --bf16-inputs: the experts' token row rounded to bf16

double NowMs() {
  if (g_cpu_time) {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
  }
  return std::chrono::duration<double, std::milli>(Clock::now().time_since_epoch()).count();
}

template <typename Fn>
double MedianMs(int reps, Fn fn) {
  fn();  // warm-up
  std::vector<double> v;
  for (int i = 0; i < reps; ++i) {
    const double t0 = NowMs();
    fn();
    v.push_back(NowMs() - t0);
  }
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

float* ThreadScratch(int64_t n) {
  thread_local std::vector<float> s;
  if (static_cast<int64_t>(s.size()) < n) s.resize(static_cast<size_t>(n));
  return s.data();
}

// The CPU executor's launch: the fast path for `isa`, the work items for
// kReference (or an op the fast path does not cover).
template <typename Op>
void Launch(const Op& op, CpuPool& pool, CpuIsa isa) {
  KernelStatus st;
  bool fast = false;
  if constexpr (std::is_same_v<Op, LinearOp>) fast = LaunchLinearFast(op, pool, isa, &st);
  if constexpr (std::is_same_v<Op, ExpertsOp>) fast = LaunchExpertsFast(op, pool, isa, &st);
  if constexpr (std::is_same_v<Op, IndexerOp>) fast = LaunchIndexerFast(op, pool, isa, &st);
  if constexpr (std::is_same_v<Op, MlaAttentionOp>) fast = LaunchMlaAttentionFast(op, pool, isa, &st);
  if (fast) return;
  if (isa != CpuIsa::kReference) {
    std::fprintf(stderr, "cpu_kernels_bench: the fast path did not take an op\n");
    std::exit(1);
  }
  const int64_t scratch = ScratchFloats(op);
  pool.Launch(Items(op),
              [&](int64_t i, KernelStatus* s) { RunItem(op, i, scratch > 0 ? ThreadScratch(scratch) : nullptr, s); });
}

std::vector<float> Normal(int64_t n, uint32_t seed, float scale) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(g);
  return v;
}

// ---- weights -------------------------------------------------------------

struct Weight {
  std::vector<uint8_t> data, scales;
  QWeight w;
  size_t bytes() const { return data.size() + scales.size(); }
};

Weight MakeBf16(int64_t rows, int64_t cols, uint32_t seed) {
  Weight t;
  const std::vector<float> f = Normal(rows * cols, seed, 1.0f / std::sqrt(static_cast<float>(cols)));
  t.data.resize(f.size() * 2);
  for (size_t i = 0; i < f.size(); ++i) {
    const uint16_t h = FloatToBf16(f[i]);
    std::memcpy(t.data.data() + 2 * i, &h, 2);
  }
  t.w = QWeight{WFormat::kBF16, SFormat::kNone, t.data.data(), rows, cols, nullptr, 1, 1, 0, 1.0f};
  return t;
}

Weight MakeFp8(int64_t rows, int64_t cols, uint32_t seed) {
  Weight t;
  std::mt19937 g(seed);
  t.data.resize(rows * cols);
  for (auto& b : t.data) {
    b = static_cast<uint8_t>(g());
    if ((b & 0x7f) == 0x7f) b = 0x30;
  }
  const int64_t sc = (cols + 127) / 128, sr = (rows + 127) / 128;
  t.scales.resize(sr * sc * 4);
  for (int64_t i = 0; i < sr * sc; ++i) {
    const float s = 0.001f * (1 + i % 7);
    std::memcpy(t.scales.data() + 4 * i, &s, 4);
  }
  t.w = QWeight{WFormat::kE4m3, SFormat::kF32, t.data.data(), rows, cols, t.scales.data(), 128, 128, sc, 1.0f};
  return t;
}

// MXFP4 as gpt-oss stores it: e2m1 values, one e8m0 scale per 32 columns.
Weight MakeMxfp4(int64_t rows, int64_t cols, uint32_t seed) {
  Weight t;
  std::mt19937 g(seed);
  t.data.resize(rows * cols / 2);
  for (auto& b : t.data) b = static_cast<uint8_t>(g());
  t.scales.resize(rows * cols / 32);
  for (auto& b : t.scales) b = static_cast<uint8_t>(118 + g() % 8);  // 2^-9 .. 2^-2
  t.w = QWeight{WFormat::kE2m1, SFormat::kE8m0, t.data.data(), rows, cols, t.scales.data(), 1, 32, cols / 32, 1.0f};
  return t;
}

Weight MakeNvfp4(int64_t rows, int64_t cols, uint32_t seed, bool w4a4, float act_scale) {
  Weight t;
  std::mt19937 g(seed);
  t.data.resize(rows * cols / 2);
  for (auto& b : t.data) b = static_cast<uint8_t>(g());
  t.scales.resize(rows * cols / 16);
  for (auto& b : t.scales) b = static_cast<uint8_t>(0x28 + g() % 24);
  t.w = QWeight{WFormat::kE2m1, SFormat::kE4m3, t.data.data(), rows, cols, t.scales.data(), 1, 16, cols / 16, 0.01f};
  t.w.act_fp4 = w4a4;
  t.w.act_scale = act_scale;
  return t;
}

// ---- linear ----------------------------------------------------------------

struct LinearFigures {
  double ref_ms = 0, generic_ms = 0, avx2_ms = 0, avx512_ms = 0, blas_ms = 0, gflop = 0;
};

bool g_reference = true;
std::string g_only;    // --only linear|experts  // --no-reference: skip the (slow) work-item timings
std::string g_format;  // --format: expert rows whose format starts with this
std::string g_dot = "both";

LinearFigures BenchLayer(int64_t tokens, bool bf16_x, CpuPool& pool, int threads, int reps) {
  const int64_t H = 1024, qd = 1024, kvd = 256, I = 2816;
  struct Shape {
    int64_t rows, cols;
  };
  const Shape shapes[] = {{qd, H}, {kvd, H}, {kvd, H}, {H, qd}, {I, H}, {I, H}, {H, I}};
  std::vector<Weight> ws;
  std::vector<std::vector<float>> f32;
  std::vector<LinearShardView> views(7);
  LinearFigures fig;
  for (int i = 0; i < 7; ++i) {
    ws.push_back(MakeBf16(shapes[i].rows, shapes[i].cols, 10 + i));
    views[i].w = ws.back().w;
    std::vector<float> f(shapes[i].rows * shapes[i].cols);
    for (size_t e = 0; e < f.size(); ++e) {
      uint16_t h;
      std::memcpy(&h, ws.back().data.data() + 2 * e, 2);
      f[e] = Bf16ToFloat(h);
    }
    f32.push_back(std::move(f));
    fig.gflop += 2.0 * static_cast<double>(shapes[i].rows * shapes[i].cols * tokens) * 1e-9;
  }
  std::vector<float> x = Normal(tokens * I, 3, 1.0f);
  if (bf16_x) {
    for (float& v : x) v = Bf16ToFloat(FloatToBf16(v));
  }
  std::vector<float> y(tokens * I);
  auto run = [&](CpuIsa isa) {
    for (int i = 0; i < 7; ++i) {
      LinearOp op;
      op.shards = &views[i];
      op.x = x.data();
      op.y = y.data();
      op.ranks = 1;
      op.tokens = tokens;
      op.rows = shapes[i].rows;
      op.cols = shapes[i].cols;
      Launch(op, pool, isa);
    }
  };
  if (g_reference) fig.ref_ms = MedianMs(std::max(1, reps / 3), [&] { run(CpuIsa::kReference); });
  fig.generic_ms = MedianMs(reps, [&] { run(CpuIsa::kGeneric); });
  fig.avx2_ms = CpuIsaSupported(CpuIsa::kAvx2) ? MedianMs(reps, [&] { run(CpuIsa::kAvx2); }) : 0;
  fig.avx512_ms = CpuIsaSupported(CpuIsa::kAvx512) ? MedianMs(reps, [&] { run(CpuIsa::kAvx512); }) : 0;
  openblas_set_num_threads(threads);
  fig.blas_ms = MedianMs(reps, [&] {
    for (int i = 0; i < 7; ++i) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(tokens), static_cast<int>(shapes[i].rows),
                  static_cast<int>(shapes[i].cols), 1.0f, x.data(), static_cast<int>(shapes[i].cols), f32[i].data(),
                  static_cast<int>(shapes[i].cols), 0.0f, y.data(), static_cast<int>(shapes[i].rows));
    }
  });
  return fig;
}

// ---- experts ---------------------------------------------------------------

// The routed experts' shape: `small` (64 experts, hidden 2048,
// moe_intermediate 768) or GLM-5's (`glm5`: hidden 6144, moe_intermediate
// 2048, top-8 of 256; 16 of them allocated, routed in a cycle whose two
// alternating sets of 8 (170 MB of NVFP4 weights) do not stay in cache, as
// 256 would not; the whole intermediate, which tp 8 splits into 8 x 256).
struct ExpertShape {
  const char* name;
  int64_t experts, top_k, hidden, inter;
};
constexpr ExpertShape kSmallExperts{"small", 64, 8, 2048, 768};
constexpr ExpertShape kGlm5Experts{"glm5", 16, 8, 6144, 2048};

struct MoeFigures {
  std::string name, dot, shape;
  double ref_ms = 0, fast_ms = 0, bytes_per_step = 0, params_per_step = 0;
};

MoeFigures BenchExperts(const std::string& name, DotKind dot, const ExpertShape& shape, CpuPool& pool, CpuIsa isa,
                        int reps) {
  const int64_t E = shape.experts, K = shape.top_k, H = shape.hidden, mi = shape.inter;
  const bool nvfp4 = name.rfind("nvfp4", 0) == 0, w4a4 = name == "nvfp4 w4a4";
  const float in_scale = 0.004f, mid_scale = 0.002f;
  std::vector<Weight> store;
  store.reserve(3 * E);
  std::vector<ExpertView> experts(E);
  auto make = [&](int64_t rows, int64_t cols, uint32_t seed, float act) {
    if (nvfp4)
      store.push_back(MakeNvfp4(rows, cols, seed, w4a4, act));
    else if (name == "fp8 block")
      store.push_back(MakeFp8(rows, cols, seed));
    else if (name == "mxfp4")
      store.push_back(MakeMxfp4(rows, cols, seed));
    else
      store.push_back(MakeBf16(rows, cols, seed));
    return store.back().w;
  };
  for (int64_t e = 0; e < E; ++e) {
    experts[e].gate = make(mi, H, static_cast<uint32_t>(3 * e), in_scale);
    experts[e].up = make(mi, H, static_cast<uint32_t>(3 * e + 1), in_scale);
    experts[e].down = make(H, mi, static_cast<uint32_t>(3 * e + 2), mid_scale);
  }
  std::vector<float> x = Normal(H, 1, 1.0f);
  if (g_bf16_inputs) {
    for (float& v : x) v = Bf16ToFloat(FloatToBf16(v));
  }
  std::vector<uint8_t> xq(Nvfp4ActValueBytes(H)), xs(Nvfp4ActScaleBytes(H));
  KernelStatus st;
  QuantizeNvfp4ActRow(x.data(), H, in_scale, xq.data(), xs.data(), 0, &st);
  const int32_t count = static_cast<int32_t>(E);
  const int64_t begin = 0;
  std::vector<int32_t> ids(K);
  std::vector<float> weights(K, 1.0f / K), out(H);
  ExpertsOp op;
  op.experts = experts.data();
  op.local_count = &count;
  op.expert_begin = &begin;
  op.x = x.data();
  op.xq = w4a4 ? xq.data() : nullptr;
  op.xq_scales = w4a4 ? xs.data() : nullptr;
  op.ids = ids.data();
  op.weights = weights.data();
  op.partial = out.data();
  op.ranks = op.tokens = 1;
  op.hidden = H;
  op.k = K;
  op.stride = E;
  op.inter = mi;
  op.dot = dot;
  int64_t step = 0;
  auto route = [&] {  // 8 other experts each step, in a fixed cycle
    for (int64_t k = 0; k < K; ++k) ids[k] = static_cast<int32_t>((step * K + k * 7) % E);
    ++step;
  };
  MoeFigures f;
  f.name = name;
  f.dot = dot == DotKind::kDequant ? "dequant" : "fused";
  f.shape = shape.name;
  f.bytes_per_step = 3.0 * K * static_cast<double>(store[0].bytes());
  f.params_per_step = 3.0 * K * static_cast<double>(mi * H);
  if (g_reference)
    f.ref_ms = MedianMs(std::max(1, reps / 3), [&] {
      route();
      Launch(op, pool, CpuIsa::kReference);
    });
  f.fast_ms = MedianMs(reps, [&] {
    route();
    Launch(op, pool, isa);
  });
  return f;
}

// Read-only stream and memcpy over 512 MiB split across the pool's threads.
void Bandwidth(CpuPool& pool, int reps, double* read_gbs, double* copy_gbs) {
  const size_t n = size_t{512} << 20;
  std::vector<uint64_t> a(n / 8, 1), b(n / 8, 0);
  std::vector<uint64_t> sums(static_cast<size_t>(pool.threads()) * 8);
  const int64_t parts = pool.threads();
  const double read_ms = MedianMs(reps, [&] {
    pool.Launch(parts, [&](int64_t p, KernelStatus*) {
      const size_t lo = a.size() * p / parts, hi = a.size() * (p + 1) / parts;
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (size_t i = lo; i + 4 <= hi; i += 4) {
        s0 += a[i];
        s1 += a[i + 1];
        s2 += a[i + 2];
        s3 += a[i + 3];
      }
      sums[p * 8] = s0 + s1 + s2 + s3;
    });
  });
  const double copy_ms = MedianMs(reps, [&] {
    pool.Launch(parts, [&](int64_t p, KernelStatus*) {
      const size_t lo = a.size() * p / parts, hi = a.size() * (p + 1) / parts;
      std::memcpy(b.data() + lo, a.data() + lo, (hi - lo) * 8);
    });
  });
  *read_gbs = static_cast<double>(n) / read_ms * 1e-6;
  *copy_gbs = static_cast<double>(n) / copy_ms * 1e-6;  // bytes copied (each read once and written once)
}

// ---- arithmetic bound ---------------------------------------------------------
// The engine's dots are 8-float vectors, a multiply then an add (no FMA:
// -ffp-contract=off, docs/replay.md). The bound of that mix on this machine:
// N independent chains acc = acc + acc * y per thread, N as many as the
// ISA's registers hold (14 of AVX2's 16, 28 of AVX-512's 32), in GFLOP/s
// (2 flops a lane) over the pool's threads.
typedef float BoundVec __attribute__((vector_size(32)));

template <int N>
inline __attribute__((always_inline)) float BoundLoop(int64_t iters) {
  BoundVec acc[N];
  for (int k = 0; k < N; ++k) acc[k] = BoundVec{} + (1.0f + 0.001f * static_cast<float>(k));
  const BoundVec y = BoundVec{} + 1e-9f;
  for (int64_t i = 0; i < iters; ++i) {
    for (int k = 0; k < N; ++k) acc[k] = acc[k] + acc[k] * y;
  }
  float s = 0;
  for (int k = 0; k < N; ++k) s += acc[k][0];
  return s;
}
__attribute__((noinline)) float BoundGeneric(int64_t n) { return BoundLoop<6>(n); }
#if defined(__x86_64__)
__attribute__((target("avx2"), noinline)) float BoundAvx2(int64_t n) { return BoundLoop<14>(n); }
__attribute__((target("avx512f,avx512vl,avx512bw,avx512dq"), noinline)) float BoundAvx512(int64_t n) {
  return BoundLoop<28>(n);
}
#endif

double ArithmeticBoundGflops(CpuPool& pool, CpuIsa isa, int reps) {
  constexpr int64_t kIters = 20'000'000;
  int chains = 6;
  float (*fn)(int64_t) = BoundGeneric;
#if defined(__x86_64__)
  if (isa == CpuIsa::kAvx2) fn = BoundAvx2, chains = 14;
  if (isa == CpuIsa::kAvx512) fn = BoundAvx512, chains = 28;
#endif
  std::vector<float> sink(static_cast<size_t>(pool.threads()) * 16);
  const double ms = MedianMs(
      reps, [&] { pool.Launch(pool.threads(), [&](int64_t p, KernelStatus*) { sink[p * 16] = fn(kIters); }); });
  return 2.0 * 8 * chains * static_cast<double>(kIters) * pool.threads() / ms * 1e-6;
}

// ---- DSA indexer ------------------------------------------------------------

struct IndexerFigures {
  std::string keys;
  int64_t tokens = 0;
  double ref_ms = 0, fast_ms = 0, gflop_per_rank = 0;
};

int64_t g_indexer_tokens = 1024;
std::string g_experts_shape = "small";  // --experts-shape small|glm5|both
double g_bound_gflops = 0;

IndexerFigures BenchIndexer(bool fp8, CpuPool& pool, CpuIsa isa, int reps) {
  constexpr int32_t kDim = 128, kPageSize = 64;
  constexpr int64_t kHeads = 32, kTopk = 2048, kRanks = 8;
  const int64_t T = g_indexer_tokens, pages = (T + kPageSize - 1) / kPageSize;
  std::vector<std::vector<uint8_t>> pools(kRanks, std::vector<uint8_t>(pages * IndexPageBytes(fp8, kPageSize, kDim)));
  std::vector<IndexPoolView> views;
  const std::vector<float> keys = Normal(T * kDim, 71, 1.0f);
  std::vector<float> tmp(kDim);
  for (int64_t r = 0; r < kRanks; ++r) {
    IndexPoolView v{pools[r].data(), fp8, pages, kPageSize, kDim};
    views.push_back(v);
    for (int64_t t = 0; t < T; ++t) IndexKStore(v, t / kPageSize, t % kPageSize, keys.data() + t * kDim, tmp.data());
  }
  std::vector<int32_t> positions(T), token_row(T, 0), table(pages);
  for (int64_t t = 0; t < T; ++t) positions[t] = static_cast<int32_t>(t);
  for (int64_t p = 0; p < pages; ++p) table[p] = static_cast<int32_t>(p);
  const std::vector<int64_t> offsets = {0, pages};
  const std::vector<float> q = Normal(T * kHeads * kDim, 72, 1.0f), w = Normal(T * kHeads, 73, 1.0f);
  std::vector<int32_t> ids(kRanks * T * kTopk);
  IndexerOp op;
  op.views = views.data();
  op.q = q.data();
  op.w = w.data();
  op.ids = ids.data();
  op.batch.positions = positions.data();
  op.batch.token_row = token_row.data();
  op.batch.page_tables = table.data();
  op.batch.table_offset = offsets.data();
  op.batch.tokens = T;
  op.ranks = kRanks;
  op.heads = kHeads;
  op.dim = kDim;
  op.topk = kTopk;
  op.max_len = T;
  op.fp8 = fp8;
  IndexerFigures f;
  f.keys = fp8 ? "fp8" : "bf16";
  f.tokens = T;
  f.gflop_per_rank = 2.0 * kHeads * kDim * (static_cast<double>(T) * (T + 1) / 2) * 1e-9;
  f.fast_ms = MedianMs(reps, [&] { Launch(op, pool, isa); });
  if (g_reference) f.ref_ms = MedianMs(1, [&] { Launch(op, pool, CpuIsa::kReference); });
  return f;
}

// ---- DSA sparse attention -----------------------------------------------------
// DSA prefill's attention (MlaAttentionOp over the indexer's top-k, the
// expanded form: MlaAttendExpanded) for one rank at GLM-5's dimensions (64
// heads at tp 8: 8 a rank; nope 192 + rope 64, v 256, top-2048) over the
// same --indexer-tokens row: each token attends min(pos + 1, 2048) of its
// positions, picked at random (the indexer's choice reads the latent rows
// in no order). Flops: 2 * (nope + rope + v) per attended position and head,
// plus one expf each (glibc's, as the work item calls it); bytes: the
// position's fp32 k, rope and v rows, 4 * (nope + rope + v) a head: half a
// flop a byte, so the bound is the memory's, not the arithmetic's.

struct SparseFigures {
  int64_t tokens = 0, attended = 0;
  double ref_ms = 0, fast_ms = 0, gflop = 0, gbytes = 0;
};

SparseFigures BenchSparseAttention(CpuPool& pool, CpuIsa isa, int reps) {
  constexpr int64_t kHeads = 8, kNope = 192, kRope = 64, kV = 256, kTopk = 2048;
  const int64_t T = g_indexer_tokens, qk = kNope + kRope, kvw = kHeads * (kNope + kV);
  const std::vector<float> q = Normal(T * kHeads * qk, 81, 1.0f), kv = Normal(T * kvw, 82, 1.0f),
                           rot = Normal(T * kRope, 83, 1.0f);
  std::vector<int32_t> ids(T * kTopk, -1), positions(T), token_row(T, 0), row_begin = {0};
  std::vector<int32_t> order;
  std::mt19937 g(84);
  SparseFigures f;
  f.tokens = T;
  for (int64_t t = 0; t < T; ++t) {
    positions[t] = static_cast<int32_t>(t);
    order.push_back(static_cast<int32_t>(t));
    std::shuffle(order.begin(), order.end(), g);
    const int64_t k = std::min<int64_t>(t + 1, kTopk);
    std::copy(order.begin(), order.begin() + k, ids.begin() + t * kTopk);
    f.attended += k;
  }
  std::vector<float> out(T * kHeads * kV);
  MlaAttentionOp op;
  op.q = q.data();
  op.kv = kv.data();
  op.rot = rot.data();
  op.row_begin = row_begin.data();
  op.topk = ids.data();
  op.out = out.data();
  op.batch.positions = positions.data();
  op.batch.token_row = token_row.data();
  op.batch.tokens = T;
  op.ranks = 1;
  op.n = T;
  op.heads = kHeads;
  op.nope = kNope;
  op.rope = kRope;
  op.v_dim = kV;
  op.topk_width = kTopk;
  op.max_len = T;
  op.scale = 1.0f / std::sqrt(static_cast<float>(qk));
  f.gflop = 2.0 * (qk + kV) * kHeads * static_cast<double>(f.attended) * 1e-9;
  f.gbytes = 4.0 * (qk + kV) * kHeads * static_cast<double>(f.attended) * 1e-9;  // the rows gathered
  f.fast_ms = MedianMs(reps, [&] { Launch(op, pool, isa); });
  if (g_reference) f.ref_ms = MedianMs(1, [&] { Launch(op, pool, CpuIsa::kReference); });
  return f;
}

int Usage(const char* msg) {
  std::fprintf(
      stderr,
      "cpu_kernels_bench: %s\nusage: cpu_kernels_bench [--threads N] [--reps R] [--no-reference] [--cpu-time] [--only "
      "linear|experts|indexer] [--format F] [--dot fused|dequant|both] [--experts-shape small|glm5|both] "
      "[--bf16-inputs] [--indexer-tokens T] "
      "[--json]\n",
      msg);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1, reps = 7;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") {
      json = true;
    } else if (a == "--no-reference") {
      g_reference = false;
    } else if (a == "--only" && i + 1 < argc) {
      g_only = argv[++i];
      if (g_only != "linear" && g_only != "experts" && g_only != "indexer") {
        return Usage("--only takes linear, experts or indexer");
      }
    } else if (a == "--indexer-tokens" && i + 1 < argc) {
      g_indexer_tokens = std::atoll(argv[++i]);
      if (g_indexer_tokens < 1) return Usage("--indexer-tokens: expected a positive integer");
    } else if (a == "--experts-shape" && i + 1 < argc) {
      g_experts_shape = argv[++i];
      if (g_experts_shape != "small" && g_experts_shape != "glm5" && g_experts_shape != "both") {
        return Usage("--experts-shape takes small, glm5 or both");
      }
    } else if (a == "--format" && i + 1 < argc) {
      g_format = argv[++i];
    } else if (a == "--dot" && i + 1 < argc) {
      g_dot = argv[++i];
      if (g_dot != "fused" && g_dot != "dequant" && g_dot != "both") return Usage("--dot takes fused, dequant or both");
    } else if (a == "--cpu-time") {
      g_cpu_time = true;
    } else if (a == "--bf16-inputs") {
      g_bf16_inputs = true;
    } else if ((a == "--threads" || a == "--reps") && i + 1 < argc) {
      const int v = std::atoi(argv[++i]);
      if (v < 1) return Usage((a + ": expected a positive integer").c_str());
      (a == "--threads" ? threads : reps) = v;
    } else {
      return Usage(("unknown argument " + a).c_str());
    }
  }
  CpuPool pool(threads);
  // The executor's choice (CRASHREPLAY_CPU_KERNELS=avx2 compares the AVX2
  // build's experts on an AVX-512 host); the reference is never "best".
  const CpuIsa best = DefaultCpuIsa() == CpuIsa::kReference ? CpuIsa::kGeneric : DefaultCpuIsa();
  LinearFigures dec, pre, dec16, pre16;
  if (g_only.empty() || g_only == "linear") {
    dec = BenchLayer(1, false, pool, threads, reps * 4);
    pre = BenchLayer(128, false, pool, threads, reps);
    dec16 = BenchLayer(1, true, pool, threads, reps * 4);
    pre16 = BenchLayer(128, true, pool, threads, reps);
  }
  double read_gbs = 0, copy_gbs = 0;
  Bandwidth(pool, reps, &read_gbs, &copy_gbs);
  std::vector<MoeFigures> moe;
  if (g_only.empty() || g_only == "experts") {
    for (const ExpertShape* shape : {&kSmallExperts, &kGlm5Experts}) {
      if (g_experts_shape != "both" && g_experts_shape != shape->name) continue;
      for (const char* name : {"nvfp4 w4a4", "nvfp4 w4a16", "mxfp4", "fp8 block", "bf16"}) {
        if (std::string(name).rfind(g_format, 0) != 0) continue;
        // GLM-5's experts in bf16 would be 2.4 GB of random weights to make; its checkpoints are NVFP4/FP8.
        if (shape == &kGlm5Experts && std::string(name) == "bf16") continue;
        for (DotKind dot : {DotKind::kFused, DotKind::kDequant}) {
          if (g_dot != "both" && g_dot != (dot == DotKind::kFused ? "fused" : "dequant")) continue;
          if (dot == DotKind::kDequant && std::string(name) == "bf16") continue;  // unscaled: the same dot
          moe.push_back(BenchExperts(name, dot, *shape, pool, best, shape == &kGlm5Experts ? reps : reps * 3));
        }
      }
    }
  }
  std::vector<IndexerFigures> indexer;
  SparseFigures sparse;
  if (g_only.empty() || g_only == "indexer") {
    g_bound_gflops = ArithmeticBoundGflops(pool, best, 3);
    for (bool fp8 : {false, true}) indexer.push_back(BenchIndexer(fp8, pool, best, std::max(1, reps / 3)));
    sparse = BenchSparseAttention(pool, best, std::max(1, reps / 3));
  }
  if (json) {
    auto lin = [](const LinearFigures& f) {
      char b[256];
      std::snprintf(b, sizeof b,
                    "{\"reference_ms\":%.3f,\"generic_ms\":%.3f,\"avx2_ms\":%.3f,\"avx512_ms\":%.3f,\"openblas_ms\":%."
                    "3f,\"gflop\":%.4f}",
                    f.ref_ms, f.generic_ms, f.avx2_ms, f.avx512_ms, f.blas_ms, f.gflop);
      return std::string(b);
    };
    std::printf(
        "{\"threads\":%d,\"isa\":\"%s\",\"linear_decode\":%s,\"linear_prefill\":%s,\"linear_decode_bf16_in\":%s,"
        "\"linear_prefill_bf16_in\":%s,\"read_gbs\":%.2f,\"memcpy_gbs\":%.2f,\"experts\":[",
        threads, CpuIsaName(best), lin(dec).c_str(), lin(pre).c_str(), lin(dec16).c_str(), lin(pre16).c_str(), read_gbs,
        copy_gbs);
    for (size_t i = 0; i < moe.size(); ++i) {
      const MoeFigures& m = moe[i];
      std::printf(
          "%s{\"shape\":\"%s\",\"format\":\"%s\",\"dot\":\"%s\",\"reference_ms\":%.3f,\"fast_ms\":%.3f,"
          "\"bytes\":%.0f,\"params\":%.0f}",
          i ? "," : "", m.shape.c_str(), m.name.c_str(), m.dot.c_str(), m.ref_ms, m.fast_ms, m.bytes_per_step,
          m.params_per_step);
    }
    std::printf("],\"indexer\":[");
    for (size_t i = 0; i < indexer.size(); ++i) {
      const IndexerFigures& x = indexer[i];
      std::printf("%s{\"keys\":\"%s\",\"tokens\":%lld,\"reference_ms\":%.3f,\"fast_ms\":%.3f,\"gflop_per_rank\":%.3f}",
                  i ? "," : "", x.keys.c_str(), static_cast<long long>(x.tokens), x.ref_ms, x.fast_ms,
                  x.gflop_per_rank);
    }
    std::printf("]}\n");
    return 0;
  }
  std::printf("cpu_kernels_bench: %d thread(s), fast kernels: %s\n", threads, CpuIsaName(best));
  if (g_only.empty() || g_only == "linear") {
    std::printf("one llama layer's 7 bf16 projections (hidden 1024, intermediate 2816), ms (GFLOP/s):\n");
    std::printf("  %-16s %16s %16s %16s %16s %16s\n", "", "work items", "generic", "avx2", "avx512", "OpenBLAS sgemm");
    for (const auto& [label, f] : {std::pair<const char*, const LinearFigures&>{"1 token", dec},
                                   {"128 tokens", pre},
                                   {"1 token, bf16 in", dec16},
                                   {"128 tok, bf16 in", pre16}}) {
      auto cell = [&](double ms) {
        char b[32];
        if (ms <= 0) return std::string("n/a");
        std::snprintf(b, sizeof b, "%.3f (%.1f)", ms, f.gflop / ms * 1e3);
        return std::string(b);
      };
      std::printf("  %-16s %16s %16s %16s %16s %16s\n", label, cell(f.ref_ms).c_str(), cell(f.generic_ms).c_str(),
                  cell(f.avx2_ms).c_str(), cell(f.avx512_ms).c_str(), cell(f.blas_ms).c_str());
    }
  }
  std::printf("memory: read-only stream %.2f GB/s, memcpy %.2f GB/s copied\n", read_gbs, copy_gbs);
  if (g_only.empty() || g_only == "experts") {
    std::printf(
        "MoE decode step, routed experts, 1 token (small: top-8 of 64, hidden 2048, moe_intermediate 768; glm5: "
        "top-8 of 256, hidden 6144, moe_intermediate 2048); the bound is the read-only stream:\n");
    std::printf("  %-6s %-12s %-8s %10s %14s %14s %12s %12s %9s\n", "shape", "format", "dot", "MB/step", "work items",
                "fast", "GB/s", "M params/s", "of bound");
    for (const MoeFigures& m : moe) {
      const double gbs = m.bytes_per_step / m.fast_ms * 1e-6;
      char ref[32] = "n/a";
      if (m.ref_ms > 0) std::snprintf(ref, sizeof ref, "%.2f ms", m.ref_ms);
      std::printf("  %-6s %-12s %-8s %10.2f %14s %11.2f ms %12.2f %12.0f %8.0f%%\n", m.shape.c_str(), m.name.c_str(),
                  m.dot.c_str(), m.bytes_per_step * 1e-6, ref, m.fast_ms, gbs, m.params_per_step / m.fast_ms * 1e-3,
                  100 * gbs / read_gbs);
    }
  }
  if (!indexer.empty()) {
    std::printf(
        "DSA indexer, one %lld-token prefill row at tp 8 (32 heads x 128, top-2048; GFLOP/s per rank computed):\n",
        static_cast<long long>(indexer[0].tokens));
    std::printf("  arithmetic bound (8-wide multiply then add, %d thread(s), measured): %.1f GFLOP/s\n", pool.threads(),
                g_bound_gflops);
    std::printf("  %-6s %22s %22s %8s %9s\n", "keys", "work items (8 ranks)", "launcher (1 rank)", "speedup",
                "of bound");
    for (const IndexerFigures& x : indexer) {
      char a[48] = "n/a", b[48];
      if (x.ref_ms > 0) std::snprintf(a, sizeof a, "%.0f ms (%.2f)", x.ref_ms, 8 * x.gflop_per_rank / x.ref_ms * 1e3);
      std::snprintf(b, sizeof b, "%.0f ms (%.2f)", x.fast_ms, x.gflop_per_rank / x.fast_ms * 1e3);
      char speedup[16] = "n/a";
      if (x.ref_ms > 0) std::snprintf(speedup, sizeof speedup, "%.1fx", x.ref_ms / x.fast_ms);
      const double share = g_bound_gflops > 0 ? x.gflop_per_rank / x.fast_ms * 1e3 / g_bound_gflops : 0;
      std::printf("  %-6s %22s %22s %8s %8.0f%%\n", x.keys.c_str(), a, b, speedup, 100 * share);
    }
    const SparseFigures& s = sparse;
    std::printf(
        "DSA sparse attention (prefill, expanded), the same row, one rank of tp 8 (8 heads, nope 192 + rope 64, v "
        "256, top-2048 at random; %lld positions attended a head):\n",
        static_cast<long long>(s.attended));
    char a[48] = "n/a";
    if (s.ref_ms > 0) std::snprintf(a, sizeof a, "%.0f ms (%.2f)", s.ref_ms, s.gflop / s.ref_ms * 1e3);
    std::printf("  %22s %22s %12s %16s %18s\n", "work items", "launcher", "rows GB/s", "of read stream",
                "of arithmetic");
    std::printf("  %22s %15.0f ms (%.2f) %12.2f %15.0f%% %17.0f%%\n", a, s.fast_ms, s.gflop / s.fast_ms * 1e3,
                s.gbytes / s.fast_ms * 1e3, 100 * s.gbytes / s.fast_ms * 1e3 / read_gbs,
                100 * s.gflop / s.fast_ms * 1e3 / g_bound_gflops);
  }
  return 0;
}
