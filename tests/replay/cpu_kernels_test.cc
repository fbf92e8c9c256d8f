// The fast CPU launchers (cpu_kernels.h) give the bits of the work items
// (ops.h RunItem, i.e. LinearElement / LinearElementQ / ExpertMlp) for every
// weight format, dot variant, odd shape and tail, both instruction sets this
// CPU runs, and 1 or 2 threads; and they leave to the work items what they
// do not cover, a failing UE8M0 scale among it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu_dot.h"
#include "crashreplay/formats/numeric.h"
#include "crashreplay/replay/cpu/cpu_kernels.h"
#include "crashreplay/replay/cpu/cpu_pool.h"
#include "crashreplay/replay/kernels/ops.h"
#include "lanes_test_util.h"

namespace crashreplay::replay {
namespace {

enum class Fmt { kF32, kBF16, kF16, kFp8, kNvfp4, kNvfp4F32Scales, kMxfp4 };

const char* FmtName(Fmt f) {
  switch (f) {
    case Fmt::kF32: return "f32";
    case Fmt::kBF16: return "bf16";
    case Fmt::kF16: return "f16";
    case Fmt::kFp8: return "fp8_block128";
    case Fmt::kNvfp4: return "nvfp4";
    case Fmt::kNvfp4F32Scales: return "nvfp4_fp32_scales";
    case Fmt::kMxfp4: return "mxfp4";
  }
  return "?";
}
const Fmt kAllFmts[] = {Fmt::kF32, Fmt::kBF16, Fmt::kF16, Fmt::kFp8, Fmt::kNvfp4, Fmt::kNvfp4F32Scales, Fmt::kMxfp4};
const DotKind kAllKinds[] = {DotKind::kDequant, DotKind::kFused, DotKind::kUe8m0};
const char* KindName(DotKind k) {
  return k == DotKind::kDequant ? "dequant" : k == DotKind::kFused ? "fused" : "ue8m0";
}
bool IsFp4(Fmt f) { return f == Fmt::kNvfp4 || f == Fmt::kNvfp4F32Scales || f == Fmt::kMxfp4; }

std::vector<CpuIsa> Isas() {
  std::vector<CpuIsa> v{CpuIsa::kGeneric};
  if (CpuIsaSupported(CpuIsa::kAvx2)) v.push_back(CpuIsa::kAvx2);
  if (CpuIsaSupported(CpuIsa::kAvx512)) v.push_back(CpuIsa::kAvx512);
  return v;
}

// A weight with its storage. pow2: every scale a power of two (so that the
// UE8M0 variants pass their check). specials: NaN, Inf, -0 and subnormal
// codes among the values.
struct TestWeight {
  std::vector<uint8_t> data, scales;
  QWeight w;
};

TestWeight MakeWeight(Fmt f, int64_t rows, int64_t cols, uint32_t seed, bool pow2, bool specials) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  TestWeight t;
  QWeight& w = t.w;
  w.rows = rows;
  w.cols = cols;
  const int64_t n = rows * cols;
  auto special = [&](int64_t i) { return specials && (i % 37 == 5 || i % 101 == 7); };
  // Scale specials (NaN, the e8m0 subnormal) would fail the UE8M0 check.
  auto special_scale = [&](int64_t i) { return !pow2 && special(i); };
  switch (f) {
    case Fmt::kF32: {
      w.format = WFormat::kF32;
      t.data.resize(n * 4);
      const float sp[] = {NAN, INFINITY, -INFINITY, -0.0f, 1e-40f, -3e-39f};
      for (int64_t i = 0; i < n; ++i) {
        const float v = special(i) ? sp[g() % 6] : nd(g);
        std::memcpy(t.data.data() + 4 * i, &v, 4);
      }
      break;
    }
    case Fmt::kBF16:
    case Fmt::kF16: {
      w.format = f == Fmt::kBF16 ? WFormat::kBF16 : WFormat::kF16;
      t.data.resize(n * 2);
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h =
            special(i) ? static_cast<uint16_t>(g()) : (f == Fmt::kBF16 ? FloatToBf16(nd(g)) : FloatToFp16(nd(g)));
        std::memcpy(t.data.data() + 2 * i, &h, 2);
      }
      break;
    }
    case Fmt::kFp8: {
      w.format = WFormat::kE4m3;
      w.scale_format = SFormat::kF32;
      w.block_rows = w.block_cols = 128;
      t.data.resize(n);
      for (int64_t i = 0; i < n; ++i) {
        uint8_t b = static_cast<uint8_t>(g());
        if (!special(i) && (b & 0x7f) == 0x7f) b = 0x3c;
        t.data[i] = b;
      }
      w.scale_cols = (cols + 127) / 128;
      const int64_t ns = ((rows + 127) / 128) * w.scale_cols;
      t.scales.resize(ns * 4);
      // Special scales on a third of the blocks: NaNs with payloads (one
      // signaling), Infs, zeros, a subnormal, and magnitudes on both sides
      // of 2^120 (the decode tiles move 2^8 into scales below it).
      const uint32_t sp[] = {0x7fa00001u, 0xffc00123u, 0x7f800000u, 0xff800000u, 0x00000000u,
                             0x80000000u, 0x0000ff00u, 0x7c000000u, 0x7b7fffffu, 0xfb000000u};
      for (int64_t i = 0; i < ns; ++i) {
        float s = pow2 ? std::ldexp(1.0f, -static_cast<int>(g() % 8)) : 0.001f + 0.01f * (g() % 100);
        if (specials && !pow2 && i % 3 == 1) s = BitsToFloat(sp[g() % std::size(sp)]);
        std::memcpy(t.scales.data() + 4 * i, &s, 4);
      }
      break;
    }
    case Fmt::kNvfp4:
    case Fmt::kNvfp4F32Scales:
    case Fmt::kMxfp4: {
      w.format = WFormat::kE2m1;
      const bool mx = f == Fmt::kMxfp4, f32s = f == Fmt::kNvfp4F32Scales;
      w.scale_format = mx ? SFormat::kE8m0 : f32s ? SFormat::kF32 : SFormat::kE4m3;
      w.block_rows = 1;
      w.block_cols = mx ? 32 : 16;
      w.global_scale = mx ? 1.0f : pow2 ? 0.25f : 0.37f;
      t.data.resize((n + 1) / 2);
      for (auto& b : t.data) b = static_cast<uint8_t>(g());
      w.scale_cols = (cols + w.block_cols - 1) / w.block_cols;
      const int64_t ns = rows * w.scale_cols;
      t.scales.resize(ns * (f32s ? 4 : 1));
      for (int64_t i = 0; i < ns; ++i) {
        if (mx) {
          t.scales[i] = special_scale(i) ? (i % 2 ? 0xff : 0x00) : static_cast<uint8_t>(118 + g() % 12);
        } else if (f32s) {
          const float s = pow2 ? std::ldexp(1.0f, -static_cast<int>(g() % 6)) : 0.05f + 0.01f * (g() % 50);
          std::memcpy(t.scales.data() + 4 * i, &s, 4);
        } else {
          // e4m3 codes 0x20..0x5f; powers of two have a zero mantissa.
          uint8_t c = static_cast<uint8_t>(0x20 + g() % 0x40);
          if (pow2) c &= 0xf8;
          if (special_scale(i)) c = i % 2 ? 0x7f : 0x01;
          t.scales[i] = c;
        }
      }
      break;
    }
  }
  w.data = t.data.data();
  w.scales = t.scales.empty() ? nullptr : t.scales.data();
  return t;
}

std::vector<float> RandomFloats(int64_t n, uint32_t seed, bool specials) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(n);
  const float sp[] = {NAN, INFINITY, -0.0f, 0.0f};
  for (int64_t i = 0; i < n; ++i) v[i] = specials && i % 53 == 11 ? sp[g() % 4] : nd(g);
  return v;
}

// Rows of x quantized as ActQuantOp does, with input_scale `scale`.
struct QuantRows {
  std::vector<uint8_t> values, scales;
};
QuantRows Quantize(const std::vector<float>& x, int64_t rows, int64_t cols, float scale) {
  QuantRows q;
  q.values.resize(rows * Nvfp4ActValueBytes(cols));
  q.scales.resize(rows * Nvfp4ActScaleBytes(cols));
  KernelStatus st;
  for (int64_t r = 0; r < rows; ++r) {
    QuantizeNvfp4ActRow(x.data() + r * cols, cols, scale, q.values.data() + r * Nvfp4ActValueBytes(cols),
                        q.scales.data() + r * Nvfp4ActScaleBytes(cols), r, &st);
  }
  EXPECT_FALSE(st.fired);
  return q;
}

// The work items, one thread: the definition of right.
template <typename Op>
KernelStatus RunReference(const Op& op) {
  KernelStatus st;
  std::vector<float> scratch(static_cast<size_t>(ScratchFloats(op) + 1));
  for (int64_t i = 0; i < Items(op) && !st.fired; ++i) RunItem(op, i, scratch.data(), &st);
  return st;
}

// Index of the first element whose bits differ, or -1. A NaN matches any
// NaN: when two NaNs meet in an addition, x86 returns the first operand's
// and the compiler may commute a + b, so which sign and payload come out is
// not fixed by the C++ source, in the scalar kernel bodies either (the
// reference built in another translation unit can differ the same way).
// Every other value, -0 and Inf included, must match bit for bit.
int64_t FirstDiff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (FloatBits(a[i]) != FloatBits(b[i])) return static_cast<int64_t>(i);
  }
  return -1;
}

std::string Show(const std::vector<float>& ref, const std::vector<float>& got, int64_t i) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "element %lld: reference %a (0x%08x), fast %a (0x%08x)", static_cast<long long>(i),
                ref[i], FloatBits(ref[i]), got[i], FloatBits(got[i]));
  return buf;
}

// ---- vector primitives ------------------------------------------------------

TEST(CpuKernels, DecodersMatchTheScalarConversionForEveryCode) {
  std::vector<uint16_t> all16(65536 + 16);
  for (uint32_t i = 0; i < 65536; ++i) all16[i] = static_cast<uint16_t>(i);
  std::vector<uint8_t> all8(256 + 16);
  for (uint32_t i = 0; i < 256; ++i) all8[i] = static_cast<uint8_t>(i);
  float round_in[8] = {}, lanes_in[64] = {}, out[40];
  for (CpuIsa isa : Isas()) {
    SCOPED_TRACE(CpuIsaName(isa));
    for (int64_t i0 = 0; i0 < 65536; i0 += 8) {
      cpu::VectorPrimitivesForTest(WFormat::kBF16, all16.data(), i0, round_in, lanes_in, out, isa);
      for (int j = 0; j < 8; ++j) ASSERT_EQ(FloatBits(out[j]), FloatBits(Bf16ToFloat(all16[i0 + j]))) << i0 + j;
      for (int j = 0; j < 16; ++j) ASSERT_EQ(FloatBits(out[24 + j]), FloatBits(Bf16ToFloat(all16[i0 + j]))) << i0 + j;
      cpu::VectorPrimitivesForTest(WFormat::kF16, all16.data(), i0, round_in, lanes_in, out, isa);
      for (int j = 0; j < 8; ++j) ASSERT_EQ(FloatBits(out[j]), FloatBits(Fp16ToFloat(all16[i0 + j]))) << i0 + j;
      for (int j = 0; j < 16; ++j) ASSERT_EQ(FloatBits(out[24 + j]), FloatBits(Fp16ToFloat(all16[i0 + j]))) << i0 + j;
    }
    // e4m3: each code in both halves of the two-group decoder too.
    for (int64_t i0 = 0; i0 < 256; i0 += 8) {
      cpu::VectorPrimitivesForTest(WFormat::kE4m3, all8.data(), i0, round_in, lanes_in, out, isa);
      for (int j = 0; j < 8; ++j) ASSERT_EQ(FloatBits(out[j]), FloatBits(E4m3ToFloat(all8[i0 + j]))) << i0 + j;
      for (int j = 0; j < 16; ++j) ASSERT_EQ(FloatBits(out[24 + j]), FloatBits(E4m3ToFloat(all8[i0 + j]))) << i0 + j;
    }
    // e2m1: every byte holds two codes; 512 nibbles cover each pair.
    for (int64_t i0 = 0; i0 < 512; i0 += 8) {
      cpu::VectorPrimitivesForTest(WFormat::kE2m1, all8.data(), i0, round_in, lanes_in, out, isa);
      for (int j = 0; j < 8; ++j) {
        ASSERT_EQ(FloatBits(out[j]), FloatBits(E2m1ToFloat(GetNibble(all8.data(), i0 + j)))) << i0 + j;
      }
      for (int j = 0; j < 16; ++j) {
        ASSERT_EQ(FloatBits(out[24 + j]), FloatBits(E2m1ToFloat(GetNibble(all8.data(), i0 + j)))) << i0 + j;
      }
    }
  }
}

TEST(CpuKernels, Bf16RoundingAndLaneTreeMatchTheScalarCode) {
  std::mt19937 g(7);
  const uint32_t edge[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00001u, 0xff800001u,
                           0x7f7fffffu, 0x3f808000u, 0x3f818000u, 0x00008000u, 0x00018000u, 0x7fffffffu};
  std::vector<float> in;
  for (uint32_t e : edge) in.push_back(BitsToFloat(e));
  for (int i = 0; i < 20000; ++i) in.push_back(BitsToFloat(g()));
  while (in.size() % 64 != 0) in.push_back(1.0f);
  uint16_t dummy[8] = {};
  float out[40];
  for (CpuIsa isa : Isas()) {
    SCOPED_TRACE(CpuIsaName(isa));
    for (size_t k = 0; k + 64 <= in.size(); k += 64) {
      cpu::VectorPrimitivesForTest(WFormat::kBF16, dummy, 0, &in[k], &in[k], out, isa);
      for (int j = 0; j < 8; ++j) {
        ASSERT_EQ(FloatBits(out[8 + j]), FloatBits(Bf16ToFloat(FloatToBf16(in[k + j])))) << FloatBits(in[k + j]);
        ASSERT_EQ(FloatBits(out[16 + j]), FloatBits(LaneSum8(&in[k + 8 * j])));
      }
    }
    // Values where the order of the additions shows.
    float lanes[64];
    for (int j = 0; j < 64; ++j) lanes[j] = (j % 3 == 0 ? 1e8f : j % 3 == 1 ? -1e8f : 1.5f) * (1 + j);
    cpu::VectorPrimitivesForTest(WFormat::kBF16, dummy, 0, in.data(), lanes, out, isa);
    for (int j = 0; j < 8; ++j) ASSERT_EQ(FloatBits(out[16 + j]), FloatBits(LaneSum8(&lanes[8 * j])));
  }
}

// ---- LinearOp -------------------------------------------------------------

struct LinearCase {
  Fmt fmt;
  DotKind kind;
  bool q;           // w4a4 input
  int64_t ranks, tokens, rows, cols;
  bool per_rank;    // x is [ranks, tokens, cols]
  bool bias;
  bool specials;
  bool finite_x = false;  // specials in the weights and scales only
  bool bf16_x = false;    // x values rounded to bf16 (activation_dtype=bf16): the fused path may run
};

std::string Describe(const LinearCase& c) {
  return std::string(FmtName(c.fmt)) + " " + KindName(c.kind) + (c.q ? " w4a4" : "") +
         " ranks=" + std::to_string(c.ranks) + " tokens=" + std::to_string(c.tokens) +
         " rows=" + std::to_string(c.rows) + " cols=" + std::to_string(c.cols) + (c.per_rank ? " x_per_rank" : "") +
         (c.bias ? " bias" : "") + (c.specials ? " specials" : "") + (c.bf16_x ? " bf16_x" : "");
}

// Runs the case through the work items and through the fast launcher for
// every ISA and thread count; every run must give the reference's bits.
void CheckLinear(const LinearCase& c) {
  SCOPED_TRACE(Describe(c));
  const bool pow2 = c.kind == DotKind::kUe8m0;
  std::vector<TestWeight> weights;
  std::vector<std::vector<float>> biases;
  std::vector<LinearShardView> shards(c.ranks);
  for (int64_t r = 0; r < c.ranks; ++r) {
    weights.push_back(MakeWeight(c.fmt, c.rows, c.cols, 100 + r, pow2, c.specials));
    biases.push_back(RandomFloats(c.rows, 200 + r, false));
  }
  const int64_t x_rows = c.per_rank ? c.ranks * c.tokens : c.tokens;
  std::vector<float> x = RandomFloats(x_rows * c.cols, 300, c.specials && !c.finite_x);
  if (c.bf16_x) {
    for (float& v : x) v = Bf16ToFloat(FloatToBf16(v));
  }
  const float act_scale = 0.0021f;
  QuantRows xq;
  if (c.q) xq = Quantize(x, x_rows, c.cols, act_scale);
  for (int64_t r = 0; r < c.ranks; ++r) {
    shards[r].w = weights[r].w;
    shards[r].w.act_fp4 = c.q;
    shards[r].w.act_scale = act_scale * (1 + r);
    shards[r].bias = c.bias ? biases[r].data() : nullptr;
  }
  LinearOp op;
  op.shards = shards.data();
  op.dot = c.kind;
  op.x = x.data();
  op.xq = c.q ? xq.values.data() : nullptr;
  op.xq_scales = c.q ? xq.scales.data() : nullptr;
  op.x_per_rank = c.per_rank;
  op.ranks = c.ranks;
  op.tokens = c.tokens;
  op.rows = c.rows;
  op.cols = c.cols;
  std::vector<float> ref(c.ranks * c.tokens * c.rows, -7.0f);
  op.y = ref.data();
  ASSERT_FALSE(RunReference(op).fired);
  for (CpuIsa isa : Isas()) {
    for (int threads : {1, 2}) {
      SCOPED_TRACE(std::string(CpuIsaName(isa)) + " threads=" + std::to_string(threads));
      CpuPool pool(threads);
      std::vector<float> got(ref.size(), -7.0f);
      op.y = got.data();
      KernelStatus st;
      ASSERT_TRUE(LaunchLinearFast(op, pool, isa, &st));
      EXPECT_FALSE(st.fired);
      const int64_t d = FirstDiff(ref, got);
      ASSERT_EQ(d, -1) << Show(ref, got, d);
    }
  }
}

TEST(CpuKernels, LinearMatchesTheWorkItemsForEveryFormatAndVariant) {
  // Shapes: single rows and tails of the 3- and 4-row tiles, columns that
  // end mid-group, mid-block and span several 512-column chunks; token
  // counts on both sides of the direct/packed switch and of the 4-token tile.
  struct Shape {
    int64_t rows, cols;
  };
  const Shape shapes[] = {{1, 32}, {7, 48}, {50, 80}, {13, 264}, {5, 1056}};
  const int64_t token_counts[] = {1, 2, 3, 5, 9};
  int cases = 0;
  for (Fmt f : kAllFmts) {
    for (DotKind k : kAllKinds) {
      for (bool q : {false, true}) {
        if (q && !IsFp4(f)) continue;
        for (const Shape& s : shapes) {
          for (int64_t t : token_counts) {
            CheckLinear({f, k, q, 1, t, s.rows, s.cols, false, cases % 2 == 0, false});
            // bf16 inputs: products exact where both operands are narrow, so
            // the fused multiply-adds run (where the specials allow).
            CheckLinear({f, k, q, 1, t, s.rows, s.cols, false, cases % 2 == 0, cases % 4 == 0, true, true});
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 300);
}

// ---- fused multiply-adds where the products are exact -------------------------

// The range of v computed another way: each value's significant bits from
// frexp (the significand scaled to an integer, its trailing zeros dropped).
cpu::ValueRange NaiveRange(const std::vector<float>& v) {
  cpu::ValueRange r{1, INFINITY, 0.0f, true};
  for (float e : v) {
    if (!std::isfinite(e)) {
      r.finite = false;
      continue;
    }
    const float a = std::fabs(e);
    if (a == 0.0f) continue;
    r.lo = std::min(r.lo, a);
    r.hi = std::max(r.hi, a);
    int ex = 0;
    const double f = std::frexp(static_cast<double>(a), &ex);  // [0.5, 1)
    // In units of the lowest bit fp32 can hold at this magnitude.
    const int lsb_exp = std::max(ex - 24, -149);
    uint64_t m = static_cast<uint64_t>(std::ldexp(f, ex - lsb_exp));
    int bits = 0;
    while (m != 0 && (m & 1) == 0) m >>= 1;
    while (m != 0) {
      m >>= 1;
      ++bits;
    }
    r.bits = std::max(r.bits, bits);
  }
  return r;
}

TEST(CpuDot, ScanRangeAgreesWithAScalarScan) {
  std::mt19937 g(5);
  for (int64_t n : {0, 1, 7, 8, 9, 64, 301}) {
    for (int kind = 0; kind < 5; ++kind) {
      std::vector<float> v = RandomFloats(n, 40 + static_cast<uint32_t>(kind), kind == 4);
      for (size_t i = 0; i < v.size(); ++i) {
        if (kind == 1) v[i] = Bf16ToFloat(FloatToBf16(v[i]));                       // bf16: 8 bits
        if (kind == 2) v[i] = Fp16ToFloat(FloatToFp16(v[i]));                       // fp16: 11 bits
        if (kind == 3) v[i] = i % 5 == 0 ? BitsToFloat(0x00010000u * (g() % 128)) : 0.0f;  // bf16 subnormals
      }
      SCOPED_TRACE("n=" + std::to_string(n) + " kind=" + std::to_string(kind));
      const cpu::ValueRange want = NaiveRange(v);
      for (CpuIsa isa : Isas()) {
        SCOPED_TRACE(CpuIsaName(isa));
        const cpu::ValueRange got = cpu::ScanRange(v.data(), n, isa);
        EXPECT_EQ(got.finite, want.finite);
        if (!want.finite) continue;
        // A bound: exact for normal values; a subnormal's (no hidden bit)
        // may be counted one or more bits high, which only refuses more.
        if (kind == 3) {
          EXPECT_GE(got.bits, want.bits);
        } else {
          EXPECT_EQ(got.bits, want.bits);
        }
        EXPECT_EQ(FloatBits(got.lo), FloatBits(want.lo));
        EXPECT_EQ(FloatBits(got.hi), FloatBits(want.hi));
        if (kind == 1 || kind == 3) {
          EXPECT_LE(got.bits, 8);
        }
        if (kind == 2) {
          EXPECT_LE(got.bits, 11);
        }
      }
    }
  }
}

// Separately rounded, as the reference kernels compute (volatile: never
// contracted).
float MulThenAdd(float a, float b, float c) {
  volatile float p = a * b;
  return c + p;
}

TEST(CpuDot, WhereProductsExactHoldsFmaGivesTheBitsOfMultiplyThenAdd) {
  // Random bf16 x bf16, bf16 x e2m1 and fp16 x bf16 pairs over the whole
  // exponent range, against accumulators near the product (where a second
  // rounding would show). Whenever ProductsExact says so for the ranges of
  // the two values, std::fma must equal the separate multiply and add; and
  // the pairs it refuses must include ones where they differ (the gate is
  // needed, not merely safe).
  std::mt19937 g(11);
  int64_t fused = 0, refused_and_different = 0;
  for (int i = 0; i < 400000; ++i) {
    const int kind = i % 3;
    float a = BitsToFloat(static_cast<uint32_t>(g()) & 0xffff0000u);  // any bf16
    float b = kind == 1 ? E2m1ToFloat(static_cast<uint8_t>(g() % 16)) : BitsToFloat(g() & 0xffff0000u);
    if (kind == 2) a = Fp16ToFloat(static_cast<uint16_t>(g()));
    if (!std::isfinite(a) || !std::isfinite(b)) continue;
    const float p = a * b;
    const float cs[] = {0.0f, -0.0f, -p, p * 0x1p-20f, BitsToFloat(g()), 1.0f};
    const cpu::ValueRange ra = cpu::ScanRange(&a, 1), rb = cpu::ScanRange(&b, 1);
    const bool exact = cpu::ProductsExact(ra, rb);
    for (float c : cs) {
      if (!std::isfinite(c)) continue;
      const bool same = FloatBits(std::fma(a, b, c)) == FloatBits(MulThenAdd(a, b, c)) ||
                        (std::isnan(std::fma(a, b, c)) && std::isnan(MulThenAdd(a, b, c)));
      if (exact) {
        ASSERT_TRUE(same) << std::hexfloat << a << " * " << b << " + " << c;
        ++fused;
      } else if (!same) {
        ++refused_and_different;
      }
    }
  }
  EXPECT_GT(fused, 100000);
  EXPECT_GT(refused_and_different, 0);
  // The finding that shaped the gate: a bf16 subnormal times a small value
  // underflows; multiply-then-add gives +0, the fused form -0.
  const float w = BitsToFloat(0x00010000u), x = -0x1p-20f;
  EXPECT_NE(FloatBits(std::fma(w, x, 0.0f)), FloatBits(MulThenAdd(w, x, 0.0f)));
  EXPECT_FALSE(cpu::ProductsExact(cpu::ScanRange(&w, 1), cpu::ScanRange(&x, 1)));
}

// A one-rank linear of `shard` over the `tokens` rows of x.
LinearOp OneShardLinear(const LinearShardView& shard, const std::vector<float>& x, int64_t tokens,
                        DotKind dot = DotKind::kDequant) {
  LinearOp op;
  op.shards = &shard;
  op.x = x.data();
  op.ranks = 1;
  op.tokens = tokens;
  op.rows = shard.w.rows;
  op.cols = shard.w.cols;
  op.dot = dot;
  return op;
}

// LaunchLinearFast of op on every ISA (2 threads) gives ref's bits; with
// `unfused`, no fused-path run is counted.
void ExpectFastGivesReference(LinearOp op, const std::vector<float>& ref, bool unfused = false) {
  for (CpuIsa isa : Isas()) {
    SCOPED_TRACE(CpuIsaName(isa));
    CpuPool pool(2);
    std::vector<float> got(ref.size(), -7.0f);
    op.y = got.data();
    KernelStatus st;
    const uint64_t fused_before = cpu::FusedRunsForTest();
    ASSERT_TRUE(LaunchLinearFast(op, pool, isa, &st));
    if (unfused) {
      EXPECT_EQ(cpu::FusedRunsForTest(), fused_before);
    }
    const int64_t d = FirstDiff(ref, got);
    ASSERT_EQ(d, -1) << Show(ref, got, d);
  }
}

// A bf16 linear whose weights and bf16 inputs are chosen so that fusing
// would change the output's bits: products that underflow (a subnormal
// weight times a small input: fused -0, separate +0) or overflow (a lane of
// -2^127 then +2^128: fused 2^127, separate +Inf). The launcher must see it
// from the ranges and give the work items' bits on every ISA.
TEST(CpuKernels, FusedPathStaysOffWhereAProductWouldRound) {
  for (int which = 0; which < 2; ++which) {
    SCOPED_TRACE(which == 0 ? "underflow" : "overflow");
    const int64_t rows = 10, cols = 64, tokens = 9;
    std::vector<uint16_t> wdata(rows * cols, 0);
    std::vector<float> x(tokens * cols, 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        if (which == 0) {
          wdata[r * cols + c] = 0x0001;  // 2^-133
          x[(r % tokens) * cols + c] = -0x1p-20f;
        } else if (c == 0 || c == 8) {
          wdata[r * cols + c] = FloatToBf16(c == 0 ? -0x1p64f : 0x1p64f);
        }
      }
    }
    if (which == 1) {
      for (int64_t t = 0; t < tokens; ++t) {
        x[t * cols + 0] = 0x1p63f;
        x[t * cols + 8] = 0x1p64f;
      }
    }
    LinearShardView shard;
    shard.w.format = WFormat::kBF16;
    shard.w.data = wdata.data();
    shard.w.rows = rows;
    shard.w.cols = cols;
    LinearOp op = OneShardLinear(shard, x, tokens);
    std::vector<float> ref(tokens * rows, -7.0f);
    op.y = ref.data();
    ASSERT_FALSE(RunReference(op).fired);
    // The data does what it is meant to: a fused lane would differ.
    const float w0 = Bf16ToFloat(wdata[0]), w8 = Bf16ToFloat(wdata[8]);
    if (which == 0) {
      EXPECT_NE(FloatBits(std::fma(w0, x[0], 0.0f)), FloatBits(MulThenAdd(w0, x[0], 0.0f)));
    } else {
      const float lane = MulThenAdd(w0, x[0], 0.0f);
      EXPECT_NE(FloatBits(std::fma(w8, x[8], lane)), FloatBits(MulThenAdd(w8, x[8], lane)));
    }
    ExpectFastGivesReference(op, ref, /*unfused=*/true);
  }
}

// The blocks shape's first group of a block is stored, not added to zeros
// (DirectSpan's kFresh): only a zero's sign differs there. Token 0's inputs
// are all +0, token 1's all -0.25; rows: negative weights (token 0: every
// product -0, every block sum a zero), zero weights in the first group of
// each block and positive ones after (token 1: -0 lanes, then nonzero), all
// zero weights (token 1: every product -0); and blocks whose scale is Inf
// or NaN under a zero sum (NaN). NVFP4 (its blocks of two groups take the
// stored first group; an accumulator started at -0 instead of +0 fails here)
// and FP8 block (128 x 128 scales, lanes zeroed first), the work items' bits
// on every ISA, 1 and 2 tokens.
TEST(CpuKernels, BlocksOfZeroProductsGiveTheWorkItemsBits) {
  for (int nvfp4 = 0; nvfp4 < 2; ++nvfp4) {
    SCOPED_TRACE(nvfp4 ? "nvfp4" : "fp8 block");
    const int64_t rows = nvfp4 ? 16 : 256, cols = 256, block = nvfp4 ? 16 : 128;
    std::vector<uint8_t> wdata(nvfp4 ? rows * cols / 2 : rows * cols, 0);
    const int64_t scale_rows = nvfp4 ? rows : rows / 128, scale_cols = cols / block;
    std::vector<float> fscales(scale_rows * scale_cols, 0.5f);
    std::vector<uint8_t> e4m3_scales(scale_rows * scale_cols, 0x38);  // 1.0
    const uint8_t neg = nvfp4 ? 0x9 : 0xb8, pos = nvfp4 ? 0x2 : 0x38;  // -0.5 / -1.0, 1.0
    auto set = [&](int64_t r, int64_t c, uint8_t code) {
      if (!nvfp4) {
        wdata[r * cols + c] = code;
        return;
      }
      uint8_t& b = wdata[(r * cols + c) / 2];
      b = c % 2 == 0 ? static_cast<uint8_t>((b & 0xf0) | code) : static_cast<uint8_t>((b & 0x0f) | (code << 4));
    };
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        if (r % 3 == 0) set(r, c, neg);
        if (r % 3 == 1 && c % block >= 8) set(r, c, pos);
      }
    }
    if (nvfp4) {
      e4m3_scales[3 * scale_cols + 1] = 0x7f;  // row 3, block 1: NaN
    } else {
      fscales[1 * scale_cols + 1] = std::numeric_limits<float>::infinity();  // rows 128-255, block 1
    }
    for (int tokens = 1; tokens <= 2; ++tokens) {
      SCOPED_TRACE(tokens);
      std::vector<float> x(tokens * cols, 0.0f);
      for (int64_t c = 0; c < cols && tokens == 2; ++c) x[cols + c] = -0.25f;
      LinearShardView shard;
      shard.w.format = nvfp4 ? WFormat::kE2m1 : WFormat::kE4m3;
      shard.w.scale_format = nvfp4 ? SFormat::kE4m3 : SFormat::kF32;
      shard.w.scales = nvfp4 ? static_cast<const void*>(e4m3_scales.data()) : fscales.data();
      shard.w.block_rows = nvfp4 ? 1 : 128;
      shard.w.block_cols = static_cast<int32_t>(block);
      shard.w.scale_cols = scale_cols;
      shard.w.data = wdata.data();
      shard.w.rows = rows;
      shard.w.cols = cols;
      LinearOp op = OneShardLinear(shard, x, tokens, DotKind::kFused);
      std::vector<float> ref(tokens * rows, -7.0f);
      op.y = ref.data();
      ASSERT_FALSE(RunReference(op).fired);
      // The data does what it is meant to: the zero rows give +0, token 1's
      // row 1 is nonzero, the zero row with an Inf or NaN block scale NaN.
      EXPECT_EQ(FloatBits(ref[0]), 0u);
      EXPECT_TRUE(std::isnan(ref[nvfp4 ? 3 : 129]));
      if (tokens == 2) {
        EXPECT_NE(ref[rows + 1], 0.0f);
        EXPECT_EQ(FloatBits(ref[rows + 2]), 0u);
      }
      ExpectFastGivesReference(op, ref);
    }
  }
}

// Narrow weights against bf16 inputs of ordinary magnitudes: the fused path
// runs (packed path: every format; direct path: raw e2m1 terms) and gives
// the work items' bits.
TEST(CpuKernels, Fp8DequantScalesNear2To128GiveTheWorkItemsBits) {
  // The FP8 decode tiles move 2^8 from the e4m3 decode into block scales
  // below 2^120 (E4m3WideLoop). At 2^120 and above that product would
  // overflow where value * scale does not: small inputs keep every output
  // finite, so a scale moved past its limit shows as Inf. Every value 1.0,
  // one value per row a subnormal code (2^-9).
  const int64_t rows = 16, cols = 512;
  std::vector<uint8_t> wdata(rows * cols, 0x38);
  for (int64_t r = 0; r < rows; ++r) wdata[r * cols + 130 + r] = 0x01;
  const float big[] = {0x1p119f, 0x1p120f, 0x1.fffffep120f, 0x1p127f};
  std::vector<float> scales(std::begin(big), std::end(big));
  for (int tokens = 1; tokens <= 2; ++tokens) {
    SCOPED_TRACE(tokens);
    std::vector<float> x(tokens * cols, 0x1p-30f);
    LinearShardView shard;
    shard.w.format = WFormat::kE4m3;
    shard.w.scale_format = SFormat::kF32;
    shard.w.scales = scales.data();
    shard.w.block_rows = shard.w.block_cols = 128;
    shard.w.scale_cols = 4;
    shard.w.data = wdata.data();
    shard.w.rows = rows;
    shard.w.cols = cols;
    for (DotKind k : {DotKind::kDequant, DotKind::kFused}) {
      LinearOp op = OneShardLinear(shard, x, tokens, k);
      std::vector<float> ref(tokens * rows, -7.0f);
      op.y = ref.data();
      ASSERT_FALSE(RunReference(op).fired);
      for (float v : ref) ASSERT_TRUE(std::isfinite(v)) << v;  // the data does what it is meant to
      ExpectFastGivesReference(op, ref);
    }
  }
}

TEST(CpuKernels, FusedPathRunsOnBf16InputsWithTheWorkItemsBits) {
  if (!CpuIsaSupported(CpuIsa::kAvx2)) GTEST_SKIP() << "no AVX2 + FMA + F16C on this CPU: nothing fuses";
  const uint64_t before = cpu::FusedRunsForTest();
  CheckLinear({Fmt::kBF16, DotKind::kDequant, false, 1, 9, 50, 600, false, true, false, false, true});
  const uint64_t after_packed = cpu::FusedRunsForTest();
  EXPECT_GT(after_packed, before);
  CheckLinear({Fmt::kNvfp4, DotKind::kFused, false, 1, 1, 50, 544, false, false, false, false, true});
  EXPECT_GT(cpu::FusedRunsForTest(), after_packed);
  // Two ranks reading the same rows (scanned once) and their own rows.
  CheckLinear({Fmt::kBF16, DotKind::kDequant, false, 2, 9, 50, 600, false, true, false, false, true});
  CheckLinear({Fmt::kBF16, DotKind::kDequant, false, 2, 9, 50, 600, true, true, false, false, true});
  // fp32 inputs never fuse.
  const uint64_t before_f32 = cpu::FusedRunsForTest();
  CheckLinear({Fmt::kBF16, DotKind::kDequant, false, 1, 9, 50, 600, false, true, false, false, false});
  EXPECT_EQ(cpu::FusedRunsForTest(), before_f32);
}

TEST(CpuKernels, LinearOddWidthsRanksAndSpecialValues) {
  for (Fmt f : {Fmt::kF32, Fmt::kBF16, Fmt::kF16, Fmt::kFp8}) {
    for (DotKind k : kAllKinds) {
      for (int64_t cols : {1, 7, 13, 131, 523}) {
        for (int64_t t : {1, 2, 4, 6}) CheckLinear({f, k, false, 2, t, 11, cols, t % 2 == 0, true, true});
      }
    }
  }
  for (Fmt f : {Fmt::kNvfp4, Fmt::kMxfp4, Fmt::kNvfp4F32Scales}) {
    for (DotKind k : kAllKinds) {
      for (bool q : {false, true}) {
        for (int64_t t : {1, 2, 5}) CheckLinear({f, k, q, 2, t, 9, 96, t == 2, true, true});
        CheckLinear({f, k, q, 1, 3, 9, 38, false, false, true});  // e2m1 row ends mid-group, mid-block
      }
    }
  }
}

TEST(CpuKernels, SpecialScaleCodesThroughTheVectorRowScales) {
  // Rows of 17 to 34 scale blocks: the decode tiles read block scales 8 at a
  // time (e4m3 NaN and subnormal codes, e8m0 0x00 and 0xff among them), the
  // rest one by one; 1 token (8-row tiles, transposed multipliers) and 2.
  // Finite inputs, so that a wrong special scale shows in the outputs.
  for (Fmt f : {Fmt::kNvfp4, Fmt::kMxfp4, Fmt::kNvfp4F32Scales}) {
    for (DotKind k : kAllKinds) {
      for (bool q : {false, true}) {
        for (int64_t t : {1, 2}) CheckLinear({f, k, q, 1, t, 19, 544, false, false, true, true});
      }
    }
  }
  // FP8 block: 3 x 9 blocks of 128 x 128, a third with a special scale
  // (MakeWeight), against NaN codes among the values.
  for (DotKind k : kAllKinds) {
    for (int64_t t : {1, 2}) CheckLinear({Fmt::kFp8, k, false, 1, t, 300, 1100, false, false, true, true});
  }
}

TEST(CpuKernels, LinearManyTokensSpanSeveralTokenChunks) {
  CheckLinear({Fmt::kBF16, DotKind::kDequant, false, 1, 200, 7, 600, false, true, false});
  CheckLinear({Fmt::kFp8, DotKind::kFused, false, 1, 197, 4, 1030, false, false, false});
  CheckLinear({Fmt::kNvfp4, DotKind::kFused, true, 1, 195, 5, 544, false, false, false});
}

// A one-rank ue8m0 linear over an FP8 weight of 20 x 256 whose block scales
// are not powers of two (every work item fires ue8m0_scale_layout), for
// `tokens` random inputs; y starts at -7.
struct FailingUe8m0 {
  TestWeight tw = MakeWeight(Fmt::kFp8, 20, 256, 1, /*pow2=*/false, false);
  LinearShardView shard;
  std::vector<float> x, y;
  LinearOp op;
  explicit FailingUe8m0(int64_t tokens) : x(RandomFloats(tokens * 256, 2, false)), y(tokens * 20, -7.0f) {
    shard.w = tw.w;
    op.shards = &shard;
    op.dot = DotKind::kUe8m0;
    op.x = x.data();
    op.ranks = 1;
    op.tokens = tokens;
    op.rows = 20;
    op.cols = 256;
    op.y = y.data();
  }
  FailingUe8m0(const FailingUe8m0&) = delete;
  FailingUe8m0& operator=(const FailingUe8m0&) = delete;
};

TEST(CpuKernels, AFailingUe8m0ScaleLeavesTheOpToTheWorkItems) {
  // Fp8 block scales that are not powers of two: the reference fires
  // ue8m0_scale_layout; the fast launcher must not run (nor write) at all.
  FailingUe8m0 f(3);
  LinearOp& op = f.op;
  const std::vector<float>& y = f.y;
  for (CpuIsa isa : Isas()) {
    CpuPool pool(2);
    KernelStatus st;
    EXPECT_FALSE(LaunchLinearFast(op, pool, isa, &st));
    for (float v : y) ASSERT_EQ(v, -7.0f);
  }
  const KernelStatus ref = RunReference(op);
  EXPECT_TRUE(ref.fired);
  EXPECT_EQ(ref.check, Check::kUe8m0ScaleLayout);
  // The same weight under the fused variant reads the scales as they are.
  op.dot = DotKind::kFused;
  CpuPool pool(1);
  KernelStatus st;
  EXPECT_TRUE(
      LaunchLinearFast(op, pool, DefaultCpuIsa() == CpuIsa::kReference ? CpuIsa::kGeneric : DefaultCpuIsa(), &st));
}

// ---- the GPU linear kernel's decomposition ----------------------------------
// Eight threads, one per lane, run LinearRowsLane in step and exchange their
// partial sums as the CUDA kernel's shuffles do (lanes_test_util.h), one
// token at a time (the kernel's GEMV) or in chunks of kLinearTokens-like 8
// (its GEMM). Every element must have LinearRow's bits (NaN as NaN) and a
// failing UE8M0 scale the same fault.

// Runs `op` on eight lane threads in chunks of kT tokens; returns lane 0's
// status per (rank, chunk, row), in that order.
template <int kT>
std::vector<KernelStatus> RunOnLanes(const LinearOp& op) {
  const int64_t chunks = (op.tokens + kT - 1) / kT, n = op.ranks * chunks * op.rows;
  std::vector<KernelStatus> st(static_cast<size_t>(n) * 8);
  testing::OnEightLanes([&](int j, const testing::BarrierLanes& l) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t rc = i / op.rows, rank = rc / chunks, t0 = (rc % chunks) * kT;
      const int nt = static_cast<int>(std::min<int64_t>(kT, op.tokens - t0));
      LinearRowsLane<kT>(op, rank, t0, nt, i % op.rows, LinearInput(op, rank * op.tokens + t0), j, l, &st[i * 8 + j]);
    }
  });
  std::vector<KernelStatus> lane0(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    for (int j = 1; j < 8; ++j) EXPECT_EQ(st[i * 8 + j].fired, st[i * 8].fired) << "lanes disagree, element " << i;
    lane0[i] = st[i * 8];
  }
  return lane0;
}

bool SameOrBothNan(float a, float b) { return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, 4) == 0; }

TEST(LinearLanes, EightLanesGiveTheBitsOfLinearRow) {
  int cases = 0;
  for (Fmt f : kAllFmts) {
    for (DotKind k : kAllKinds) {
      for (int64_t cols : {1, 7, 13, 38, 96, 131, 264}) {
        for (int variant : {0, 1, 2}) {  // 0: dense, 1: strided rows, 2: w4a4 (quantized input)
          const bool strided = variant == 1, q = variant == 2;
          if (strided && (IsFp4(f) || f == Fmt::kFp8)) continue;  // scaled formats: packed shards (model.h)
          if (q && (!IsFp4(f) || cols % 2 != 0)) continue;
          SCOPED_TRACE(std::string(FmtName(f)) + " " + KindName(k) + " cols=" + std::to_string(cols) +
                       (strided ? " strided"
                        : q     ? " w4a4"
                                : ""));
          // Two ranks with their own weights and per-rank inputs; 11 tokens:
          // one whole chunk of 8 and a partial one.
          const int64_t ranks = 2, rows = 5, tokens = 11;
          std::vector<TestWeight> tw;
          std::vector<LinearShardView> shards(ranks);
          std::vector<std::vector<float>> bias;
          for (int64_t r = 0; r < ranks; ++r) {
            tw.push_back(MakeWeight(f, rows, strided ? 2 * cols + 3 : cols, 7 + r, k == DotKind::kUe8m0, true));
            if (strided) {  // the middle `cols` columns of each wider row
              const int64_t esize = f == Fmt::kF32 ? 4 : 2;
              tw[r].w.row_stride = tw[r].w.cols;
              tw[r].w.cols = cols;
              tw[r].w.data = tw[r].data.data() + 2 * esize;
            }
            bias.push_back(RandomFloats(rows, 10 + r, false));
            shards[r].w = tw[r].w;
            shards[r].bias = r == 0 ? bias[r].data() : nullptr;
          }
          const std::vector<float> x = RandomFloats(ranks * tokens * cols, 9, true);
          LinearOp op;
          op.shards = shards.data();
          op.dot = k;
          op.x = x.data();
          op.x_per_rank = true;
          QuantRows xq;
          if (q) {
            xq = Quantize(x, ranks * tokens, cols, 0.0021f);
            for (LinearShardView& sv : shards) {
              sv.w.act_fp4 = true;
              sv.w.act_scale = 0.0021f;
            }
            op.xq = xq.values.data();
            op.xq_scales = xq.scales.data();
          }
          op.ranks = ranks;
          op.tokens = tokens;
          op.rows = rows;
          op.cols = cols;
          const int64_t n = ranks * tokens * rows;
          std::vector<float> want(n, -7.0f), one(n, -7.0f), eight(n, -7.0f);
          op.y = want.data();
          for (int64_t i = 0; i < n; ++i) {
            KernelStatus st;
            RunItem(op, i, nullptr, &st);
            ASSERT_FALSE(st.fired);
          }
          op.y = one.data();
          for (const KernelStatus& st : RunOnLanes<1>(op)) ASSERT_FALSE(st.fired);
          op.y = eight.data();
          for (const KernelStatus& st : RunOnLanes<8>(op)) ASSERT_FALSE(st.fired);
          for (int64_t i = 0; i < n; ++i) {
            ASSERT_TRUE(SameOrBothNan(want[i], one[i]))
                << "1 token a pass, element " << i << ": " << want[i] << " vs " << one[i];
            ASSERT_TRUE(SameOrBothNan(want[i], eight[i]))
                << "8 tokens a pass, element " << i << ": " << want[i] << " vs " << eight[i];
          }
          ++cases;
        }
      }
    }
  }
  // dense, strided (f32, bf16, f16), w4a4 (fp4, even widths)
  EXPECT_EQ(cases, 7 * 3 * 7 + 3 * 3 * 7 + 3 * 3 * 3);
}

TEST(LinearLanes, AFailingUe8m0ScaleIsTheSameFaultOnEveryLane) {
  FailingUe8m0 f(10);
  const LinearOp& op = f.op;
  auto same_fault = [&](const KernelStatus& got, int64_t item) {
    KernelStatus want;
    RunItem(op, item, nullptr, &want);
    ASSERT_TRUE(want.fired);
    EXPECT_TRUE(got.fired);
    EXPECT_EQ(got.check, want.check);
    EXPECT_EQ(got.item, want.item);
    EXPECT_EQ(got.index, want.index);
    EXPECT_EQ(got.value, want.value);
  };
  const std::vector<KernelStatus> one = RunOnLanes<1>(op);
  for (int64_t i = 0; i < 200; ++i) same_fault(one[i], i);
  // In chunks of 8 tokens a fault names the chunk's first token's item.
  const std::vector<KernelStatus> eight = RunOnLanes<8>(op);
  ASSERT_EQ(eight.size(), 2u * 20);
  for (int64_t c = 0; c < 2; ++c) {
    for (int64_t row = 0; row < 20; ++row) same_fault(eight[c * 20 + row], (c * 8) * 20 + row);
  }
}

TEST(CpuKernels, ReferenceIsaRunsNothing) {
  const TestWeight tw = MakeWeight(Fmt::kBF16, 4, 16, 1, false, false);
  LinearShardView shard;
  shard.w = tw.w;
  const std::vector<float> x = RandomFloats(16, 2, false);
  std::vector<float> y(4, -7.0f);
  LinearOp op;
  op.shards = &shard;
  op.x = x.data();
  op.y = y.data();
  op.ranks = 1;
  op.tokens = 1;
  op.rows = 4;
  op.cols = 16;
  CpuPool pool(1);
  KernelStatus st;
  EXPECT_FALSE(LaunchLinearFast(op, pool, CpuIsa::kReference, &st));
  for (float v : y) EXPECT_EQ(v, -7.0f);
}

// ---- ExpertsOp / SharedExpertOp --------------------------------------------

struct MoeCase {
  Fmt fmt;
  DotKind kind;
  bool q;
  int64_t ranks, tokens, hidden, inter;
  bool bf16_x = false;  // token rows rounded to bf16: gate/up may fuse (cpu_dot.h)
  bool gpt_oss = false; // gate/up/down biases and the clamped SwiGLU (limit 0.5: often reached)
};

std::string Describe(const MoeCase& c) {
  return std::string(FmtName(c.fmt)) + " " + KindName(c.kind) + (c.q ? " w4a4" : "") +
         " ranks=" + std::to_string(c.ranks) + " tokens=" + std::to_string(c.tokens) +
         " hidden=" + std::to_string(c.hidden) + " inter=" + std::to_string(c.inter) + (c.bf16_x ? " bf16_x" : "") +
         (c.gpt_oss ? " gpt_oss" : "");
}

void CheckMoe(const MoeCase& c) {
  SCOPED_TRACE(Describe(c));
  constexpr int64_t kLocal = 3, kK = 2;
  const bool pow2 = c.kind == DotKind::kUe8m0;
  const int64_t R = c.ranks, T = c.tokens, H = c.hidden, mi = c.inter;
  std::vector<TestWeight> store;
  store.reserve(3 * (R * kLocal + R));
  std::vector<std::vector<float>> biases;
  biases.reserve(3 * (R * kLocal + R));
  auto expert = [&](uint32_t seed, float in_scale, float mid_scale) {
    ExpertView e;
    if (c.gpt_oss) {
      biases.push_back(RandomFloats(mi, seed + 3, false));
      e.gate_bias = biases.back().data();
      biases.push_back(RandomFloats(mi, seed + 4, false));
      e.up_bias = biases.back().data();
      biases.push_back(RandomFloats(H, seed + 5, false));
      e.down_bias = biases.back().data();
      e.glu_alpha = 1.702f;
      e.glu_limit = 0.5f;
    }
    store.push_back(MakeWeight(c.fmt, mi, H, seed, pow2, false));
    e.gate = store.back().w;
    store.push_back(MakeWeight(c.fmt, mi, H, seed + 1, pow2, false));
    e.up = store.back().w;
    store.push_back(MakeWeight(c.fmt, H, mi, seed + 2, pow2, false));
    e.down = store.back().w;
    for (QWeight* w : {&e.gate, &e.up, &e.down}) w->act_fp4 = c.q;
    e.gate.act_scale = e.up.act_scale = in_scale;
    e.down.act_scale = mid_scale;
    return e;
  };
  std::vector<ExpertView> experts, shared;
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t j = 0; j < kLocal; ++j) {
      experts.push_back(expert(static_cast<uint32_t>(10 * (r * kLocal + j)), 0.0009f * (1 + j), 0.0004f * (2 + j)));
    }
    shared.push_back(expert(static_cast<uint32_t>(1000 + 10 * r), 0.0011f, 0.0003f));
  }
  std::vector<int32_t> count(R, kLocal);
  std::vector<int64_t> begin(R);
  for (int64_t r = 0; r < R; ++r) begin[r] = r * kLocal;
  // Ids over every rank's experts plus one no rank holds.
  std::mt19937 g(5);
  std::vector<int32_t> ids(T * kK);
  for (auto& id : ids) id = static_cast<int32_t>(g() % (R * kLocal + 1));
  const std::vector<float> weights = RandomFloats(T * kK, 6, false);
  std::vector<float> x = RandomFloats(T * H, 7, false);
  if (c.bf16_x) {
    for (float& v : x) v = Bf16ToFloat(FloatToBf16(v));
  }
  QuantRows xq;
  if (c.q) xq = Quantize(x, T, H, experts[0].gate.act_scale);

  ExpertsOp ex;
  ex.experts = experts.data();
  ex.local_count = count.data();
  ex.expert_begin = begin.data();
  ex.x = x.data();
  ex.xq = c.q ? xq.values.data() : nullptr;
  ex.xq_scales = c.q ? xq.scales.data() : nullptr;
  ex.ids = ids.data();
  ex.weights = weights.data();
  ex.ranks = R;
  ex.tokens = T;
  ex.hidden = H;
  ex.k = kK;
  ex.stride = kLocal;
  ex.inter = mi;
  ex.dot = c.kind;
  SharedExpertOp se;
  se.shared = shared.data();
  se.x = ex.x;
  se.xq = ex.xq;
  se.xq_scales = ex.xq_scales;
  se.ranks = R;
  se.tokens = T;
  se.hidden = H;
  se.inter = mi;
  se.dot = c.kind;

  // The shared expert adds to what the routed experts left.
  const std::vector<float> start = RandomFloats(R * T * H, 8, false);
  std::vector<float> ref_ex(R * T * H, -7.0f), ref_se = start;
  ex.partial = ref_ex.data();
  se.partial = ref_se.data();
  ASSERT_FALSE(RunReference(ex).fired);
  ASSERT_FALSE(RunReference(se).fired);
  for (CpuIsa isa : Isas()) {
    for (int threads : {1, 2}) {
      SCOPED_TRACE(std::string(CpuIsaName(isa)) + " threads=" + std::to_string(threads));
      CpuPool pool(threads);
      std::vector<float> got_ex(ref_ex.size(), -7.0f), got_se = start;
      ex.partial = got_ex.data();
      se.partial = got_se.data();
      KernelStatus st;
      ASSERT_TRUE(LaunchExpertsFast(ex, pool, isa, &st));
      EXPECT_FALSE(st.fired);
      ASSERT_TRUE(LaunchSharedExpertFast(se, pool, isa, &st));
      EXPECT_FALSE(st.fired);
      int64_t d = FirstDiff(ref_ex, got_ex);
      ASSERT_EQ(d, -1) << "experts " << Show(ref_ex, got_ex, d);
      d = FirstDiff(ref_se, got_se);
      ASSERT_EQ(d, -1) << "shared expert " << Show(ref_se, got_se, d);
    }
  }
}

TEST(CpuKernels, ExpertsMatchExpertMlpForEveryFormatAndVariant) {
  const uint64_t fused_before = cpu::FusedRunsForTest();
  for (Fmt f : kAllFmts) {
    for (DotKind k : kAllKinds) {
      for (bool q : {false, true}) {
        if (q && !IsFp4(f)) continue;
        for (int64_t t : {1, 2, 7}) {
          CheckMoe({f, k, q, t == 2 ? 2 : 1, t, 64, 48});
          CheckMoe({f, k, q, t == 2 ? 2 : 1, t, 64, 48, true});
        }
      }
    }
  }
  // The bf16 rows took the fused paths somewhere (decode: raw e2m1 terms;
  // 7 tokens: the packed chunks).
  if (CpuIsaSupported(CpuIsa::kAvx2)) {
    EXPECT_GT(cpu::FusedRunsForTest(), fused_before);
  }
}

TEST(CpuKernels, GptOssExpertsWithBiasesAndClampMatchExpertMlp) {
  for (Fmt f : kAllFmts) {
    for (int64_t t : {1, 7}) {
      CheckMoe({f, DotKind::kDequant, false, t == 7 ? 2 : 1, t, 64, 48, false, true});
      CheckMoe({f, DotKind::kFused, false, 1, t, 64, 48, true, true});
    }
  }
  CheckMoe({Fmt::kNvfp4, DotKind::kDequant, true, 2, 5, 64, 48, false, true});  // w4a4: the clamped row quantized
}

TEST(CpuKernels, ExpertsOddSizesAndManyTokens) {
  CheckMoe({Fmt::kBF16, DotKind::kDequant, false, 2, 5, 40, 24});
  CheckMoe({Fmt::kF32, DotKind::kFused, false, 1, 3, 13, 7});
  CheckMoe({Fmt::kNvfp4, DotKind::kDequant, true, 1, 40, 64, 40});
  CheckMoe({Fmt::kFp8, DotKind::kUe8m0, false, 2, 30, 136, 72});
}

// A long prefill's inputs do not fit the launchers' scratch bound; they run
// in chunks of tokens, and the bits are still the work items'. Bounds of one
// token a chunk (the floor) and of a few, with a shorter last chunk.
class ScratchBound {
 public:
  explicit ScratchBound(size_t bytes) : saved_(CpuScratchBytes()) { SetCpuScratchBytes(bytes); }
  ~ScratchBound() { SetCpuScratchBytes(saved_); }

 private:
  size_t saved_;
};

TEST(CpuKernels, TokenChunksUnderASmallScratchBoundGiveTheWorkItemsBits) {
  for (size_t bytes : {size_t{1}, size_t{12} << 10}) {
    SCOPED_TRACE("scratch bound " + std::to_string(bytes));
    ScratchBound bound(bytes);
    CheckLinear({Fmt::kNvfp4, DotKind::kFused, true, 2, 7, 9, 96, true, true, false});  // w4a4, x per rank
    CheckLinear({Fmt::kBF16, DotKind::kDequant, false, 2, 9, 11, 131, false, true, true});  // odd width: copied
    CheckLinear({Fmt::kFp8, DotKind::kFused, false, 1, 5, 4, 64, false, false, false});    // read in place
    CheckMoe({Fmt::kNvfp4, DotKind::kDequant, true, 2, 7, 64, 40});
    CheckMoe({Fmt::kBF16, DotKind::kDequant, false, 2, 11, 40, 24});
  }
}

TEST(CpuKernels, ExpertsWithAnInvalidInputScaleLeaveTheOpToTheWorkItems) {
  const TestWeight gw = MakeWeight(Fmt::kNvfp4, 32, 32, 1, false, false);
  const TestWeight uw = MakeWeight(Fmt::kNvfp4, 32, 32, 2, false, false);
  const TestWeight dw = MakeWeight(Fmt::kNvfp4, 32, 32, 3, false, false);
  ExpertView e{gw.w, uw.w, dw.w};
  e.down.act_fp4 = true;
  e.down.act_scale = 0.0f;  // the quantization check fails on it
  const int32_t count = 1, id = 0;
  const int64_t begin = 0;
  const float weight = 1.0f;
  const std::vector<float> x = RandomFloats(32, 1, false);
  std::vector<float> out(32, -7.0f);
  ExpertsOp ex;
  ex.experts = &e;
  ex.local_count = &count;
  ex.expert_begin = &begin;
  ex.x = x.data();
  ex.ids = &id;
  ex.weights = &weight;
  ex.partial = out.data();
  ex.ranks = ex.tokens = ex.k = ex.stride = 1;
  ex.hidden = ex.inter = 32;
  CpuPool pool(1);
  KernelStatus st;
  EXPECT_FALSE(LaunchExpertsFast(ex, pool, CpuIsa::kGeneric, &st));
  for (float v : out) ASSERT_EQ(v, -7.0f);
  const KernelStatus ref = RunReference(ex);
  EXPECT_TRUE(ref.fired);
  EXPECT_EQ(ref.check, Check::kNvfp4InputScale);
}

// ---- IndexerOp ------------------------------------------------------------------

// Two ranks' index-key caches (bf16 or fp8) over 8 pages of 16 positions,
// written as the engine writes them, and a batch of a 40-token prefill row
// (pages 0-2) and a decode token at position 70 (pages 3-7).
struct IndexerCase {
  static constexpr int32_t kDim = 32, kPageSize = 16;
  static constexpr int64_t kHeads = 4, kPages = 8, kTopk = 24, kRanks = 2;
  std::vector<std::vector<uint8_t>> pools;
  std::vector<IndexPoolView> views;
  std::vector<int32_t> positions, token_row, tables = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<int64_t> offsets = {0, 3, 8};
  std::vector<float> q, w;
  IndexerOp op;

  explicit IndexerCase(bool fp8) {
    for (int32_t p = 0; p < 40; ++p) {
      positions.push_back(p);
      token_row.push_back(0);
    }
    positions.push_back(70);
    token_row.push_back(1);
    const int64_t T = static_cast<int64_t>(positions.size());
    pools.assign(kRanks, std::vector<uint8_t>(kPages * IndexPageBytes(fp8, kPageSize, kDim)));
    const std::vector<float> keys = RandomFloats(kPages * kPageSize * kDim, 61, false);
    std::vector<float> tmp(kDim);
    for (int64_t r = 0; r < kRanks; ++r) {
      IndexPoolView v;
      v.data = pools[r].data();
      v.fp8 = fp8;
      v.pages = kPages;
      v.page_size = kPageSize;
      v.dim = kDim;
      views.push_back(v);
      for (int64_t slot = 0; slot < kPages * kPageSize; ++slot) {
        IndexKStore(v, slot / kPageSize, slot % kPageSize, keys.data() + slot * kDim, tmp.data());
      }
    }
    q = RandomFloats(T * kHeads * kDim, 62, false);
    w = RandomFloats(T * kHeads, 63, false);
    op.views = views.data();
    op.q = q.data();
    op.w = w.data();
    op.batch.positions = positions.data();
    op.batch.token_row = token_row.data();
    op.batch.page_tables = tables.data();
    op.batch.table_offset = offsets.data();
    op.batch.tokens = T;
    op.ranks = kRanks;
    op.heads = kHeads;
    op.dim = kDim;
    op.topk = kTopk;
    op.max_len = 71;
    op.fp8 = fp8;
  }
  std::vector<int32_t> Run(bool fast, bool* covered = nullptr, CpuIsa isa = DefaultCpuIsa()) {
    std::vector<int32_t> ids(kRanks * op.batch.tokens * kTopk, -7);
    op.ids = ids.data();
    if (fast) {
      CpuPool pool(2);
      KernelStatus st;
      const bool ran = LaunchIndexerFast(op, pool, isa, &st);
      EXPECT_FALSE(st.fired);
      if (covered != nullptr) *covered = ran;
    } else {
      EXPECT_FALSE(RunReference(op).fired);
    }
    return ids;
  }
};

TEST(CpuKernels, IndexerRunsOnceForRanksWhosePagesAgree) {
  for (bool fp8 : {false, true}) {
    SCOPED_TRACE(fp8 ? "fp8 keys" : "bf16 keys");
    IndexerCase c(fp8);
    const std::vector<int32_t> ref = c.Run(false);
    bool covered = false;
    EXPECT_EQ(c.Run(true, &covered), ref);
    EXPECT_TRUE(covered);
    // Rank 1's cache differs in a page the decode token reads: rank 1 runs
    // its own items, and its top-k is its own.
    const int64_t page_bytes = IndexPageBytes(fp8, IndexerCase::kPageSize, IndexerCase::kDim);
    for (int64_t i = 0; i < IndexerCase::kPageSize * IndexerCase::kDim; ++i) c.pools[1][5 * page_bytes + i] ^= 0x21;
    const std::vector<int32_t> ref2 = c.Run(false);
    EXPECT_EQ(c.Run(true, &covered), ref2);
    EXPECT_TRUE(covered);
    EXPECT_NE(ref2, ref);  // the change reached rank 1's scores
    // A page outside the pool: the work items report it; nothing written.
    c.tables[6] = 99;
    std::vector<int32_t> untouched = c.Run(true, &covered);
    EXPECT_FALSE(covered);
    for (int32_t id : untouched) ASSERT_EQ(id, -7);
  }
}

// The SIMD scores (cpu_indexer.cc) against the work items, on every ISA,
// one rank and two: the ids in order, so every score's rank among the others
// is the work items'. Keys that tie (the same key at two positions: the
// lower position first), a NaN query head (NaN scores rank first), and
// heads whose dots are negative (relu to zero: ties again).
TEST(CpuKernels, IndexerScoresAreTheWorkItemsOnEveryIsa) {
  for (bool fp8 : {false, true}) {
    for (int64_t ranks : {int64_t{1}, int64_t{2}}) {
      IndexerCase c(fp8);
      c.op.ranks = ranks;
      // Position 9 holds position 3's key (both in page 0 of every rank).
      for (int64_t r = 0; r < IndexerCase::kRanks; ++r) {
        uint8_t* page = c.pools[r].data();
        const int64_t width = fp8 ? IndexerCase::kDim : 2 * IndexerCase::kDim;
        std::memcpy(page + 9 * width, page + 3 * width, width);
        if (fp8) {
          std::memcpy(page + IndexerCase::kPageSize * IndexerCase::kDim + 9 * 4,
                      page + IndexerCase::kPageSize * IndexerCase::kDim + 3 * 4, 4);
        }
      }
      // Token 20: head 1 all negative weights (its relu terms count against);
      // token 30: a NaN in head 0's query.
      for (int64_t h = 0; h < IndexerCase::kHeads; ++h) c.w[20 * IndexerCase::kHeads + h] = -std::fabs(c.w[h]);
      c.q[30 * IndexerCase::kHeads * IndexerCase::kDim + 5] = std::nanf("");
      const std::vector<int32_t> ref = c.Run(false);
      for (CpuIsa isa : Isas()) {
        SCOPED_TRACE(::testing::Message()
                     << (fp8 ? "fp8" : "bf16") << " keys, " << ranks << " rank(s), " << CpuIsaName(isa));
        bool covered = false;
        const std::vector<int32_t> got = c.Run(true, &covered, isa);
        EXPECT_TRUE(covered);
        for (int64_t i = 0; i < ranks * c.op.batch.tokens * IndexerCase::kTopk; ++i) {
          ASSERT_EQ(got[i], ref[i]) << "slot " << i % IndexerCase::kTopk << " of row " << i / IndexerCase::kTopk;
        }
      }
    }
  }
}

}  // namespace
}  // namespace crashreplay::replay
