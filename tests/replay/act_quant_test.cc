// NVFP4 activation quantization (kernels/act_quant.h) and the w4a4 linear
// paths (LinearElementQ) against naive formulas: exact known codes, a naive
// nearest-value quantizer, the dequantization round trip, saturation, zero
// and NaN blocks, the input_scale check, and the two GEMM variants.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "crashreplay/formats/block_quant.h"
#include "crashreplay/replay/kernels/act_quant.h"
#include "crashreplay/replay/kernels/linear.h"

namespace crashreplay::replay {
namespace {

struct QuantRow {
  std::vector<uint8_t> values, scales;
  KernelStatus st;
  bool ok = false;
};

QuantRow Quantize(const std::vector<float>& x, float input_scale) {
  QuantRow q;
  const int64_t cols = static_cast<int64_t>(x.size());
  q.values.assign(Nvfp4ActValueBytes(cols), 0xaa);
  q.scales.assign(Nvfp4ActScaleBytes(cols), 0xaa);
  q.ok = QuantizeNvfp4ActRow(x.data(), cols, input_scale, q.values.data(), q.scales.data(), 3, &q.st);
  return q;
}

uint8_t Nibble(const QuantRow& q, int64_t c) { return GetNibble(q.values.data(), static_cast<uint64_t>(c)); }

// The naive quantizer: the nearest representable value by search over every
// code, in double, from the formula in act_quant.h.
uint8_t NearestCode(double v, float (*decode)(uint8_t), int codes) {
  int best = 0;
  double best_d = std::numeric_limits<double>::infinity();
  for (int c = 0; c < codes; ++c) {
    const double f = decode(static_cast<uint8_t>(c));
    if (std::isnan(f)) continue;
    const double d = std::abs(f - v);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return static_cast<uint8_t>(best);
}

std::vector<float> Normal(size_t n, uint32_t seed, float sd) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

TEST(ActQuant, ExactValuesWithUnitGlobalScale) {
  // input_scale 1: global 1, block amax 6 -> block scale 1 (6 * fp32(1/6)
  // rounds to 1), so every e2m1 value is stored as itself.
  std::vector<float> x = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.5f, -1, -1.5f, -2, -3, -4, -6, 0.25f};
  QuantRow q = Quantize(x, 1.0f);
  ASSERT_TRUE(q.ok);
  ASSERT_EQ(q.scales.size(), 1u);
  EXPECT_EQ(E4m3ToFloat(q.scales[0]), 1.0f);
  const uint8_t want[16] = {0x0, 0x1, 0x2, 0x3, 0x4, 0x5, 0x6, 0x7, 0x9, 0xa, 0xb, 0xc, 0xd, 0xe, 0xf, 0x0};
  for (int c = 0; c < 16; ++c) EXPECT_EQ(Nibble(q, c), want[c]) << "column " << c;  // 0.25 ties to 0
  EXPECT_EQ(q.values[0], 0x10);  // even element in the low nibble
}

TEST(ActQuant, BlockScaleIsAmaxOverSixTimesGlobalInE4m3) {
  // input_scale 0.5 -> global 2; amax 3 -> scale e4m3(2 * 0.5) = 1;
  // amax 1.3 -> e4m3(2 * 1.3 / 6 = 0.4333) = 0.4375 (RNE on a 3-bit mantissa).
  std::vector<float> x(32, 0.0f);
  x[5] = -3.0f;
  x[16 + 9] = 1.3f;
  x[16 + 2] = 0.4f;
  QuantRow q = Quantize(x, 0.5f);
  ASSERT_TRUE(q.ok);
  EXPECT_EQ(E4m3ToFloat(q.scales[0]), 1.0f);
  EXPECT_EQ(E4m3ToFloat(q.scales[1]), 0.4375f);
  // x / (s / g): -3 / 0.5 = -6; 1.3 / 0.21875 = 5.94 -> 6; 0.4 / 0.21875 = 1.83 -> 2.
  EXPECT_EQ(Nibble(q, 5), 0xf);
  EXPECT_EQ(Nibble(q, 25), 0x7);
  EXPECT_EQ(Nibble(q, 18), 0x4);
}

TEST(ActQuant, MatchesANaiveNearestValueQuantizerAndRoundTrips) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    const std::vector<float> x = Normal(16 * 12 + 8, seed, 0.7f);  // a partial last block
    float amax = 0.0f;
    for (float v : x) amax = std::max(amax, std::abs(v));
    const float input_scale = (amax * (seed % 2 ? 1.0f : 1.7f)) / (6.0f * 448.0f);  // calibrated or roomy
    QuantRow q = Quantize(x, input_scale);
    ASSERT_TRUE(q.ok);
    const double g = 1.0f / input_scale;
    for (size_t b = 0; b < q.scales.size(); ++b) {
      double bmax = 0;
      for (size_t c = b * 16; c < std::min(x.size(), b * 16 + 16); ++c) bmax = std::max<double>(bmax, std::abs(x[c]));
      const uint8_t want_s = NearestCode(std::min(g * bmax / 6.0, 448.0), E4m3ToFloat, 127);
      ASSERT_EQ(q.scales[b], want_s) << "seed " << seed << " block " << b;
      const double s = E4m3ToFloat(want_s);
      for (size_t c = b * 16; c < std::min(x.size(), b * 16 + 16); ++c) {
        const double v = x[c] * g / s;
        const uint8_t mag = NearestCode(std::min(std::abs(v), 6.0), E2m1ToFloat, 8);
        const uint8_t want = mag == 0 ? (x[c] < 0 ? 0x8 : 0x0) : (mag | (x[c] < 0 ? 0x8 : 0x0));
        ASSERT_EQ(Nibble(q, static_cast<int64_t>(c)) & (mag == 0 ? 0x7 : 0xf), want & (mag == 0 ? 0x7 : 0xf))
            << "seed " << seed << " column " << c << " x " << x[c];
        // Round trip: within half the e2m1 spacing at that magnitude (1 at most) of one block step.
        const QWeight row = Nvfp4ActRow(q.values.data(), q.scales.data(), static_cast<int64_t>(x.size()), input_scale);
        const double back = DequantAt(row, 0, static_cast<int64_t>(c));
        const double step = std::abs(v) < 2 ? 0.5 : std::abs(v) < 4 ? 1.0 : 2.0;
        // (DequantAt rounds to bf16: one more relative 2^-9.)
        EXPECT_LE(std::abs(back - x[c]), (0.5 * step) * s / g * (1 + 1e-2) + std::abs(back) * 0x1p-8 + 1e-7)
            << "seed " << seed << " col " << c;
      }
    }
  }
}

TEST(ActQuant, ABlockAboveTheCalibratedAmaxSaturatesScaleAndValues) {
  const float input_scale = 1.0f / (6.0f * 448.0f);  // calibrated amax 1
  std::vector<float> x(32, 0.1f);
  x[3] = 2.0f;     // block 0: twice the calibrated amax
  x[20] = -0.9f;   // block 1: inside
  QuantRow q = Quantize(x, input_scale);
  ASSERT_TRUE(q.ok);
  EXPECT_EQ(q.scales[0], 0x7e) << "e4m3 scale saturates at 448";
  EXPECT_EQ(Nibble(q, 3), 0x7) << "the element clips at 6";
  const QWeight row = Nvfp4ActRow(q.values.data(), q.scales.data(), 32, input_scale);
  EXPECT_NEAR(DequantAt(row, 0, 3), 1.0f, 1e-2) << "clipped to the calibrated amax";
  EXPECT_NE(q.scales[1], 0x7e);
  EXPECT_NEAR(DequantAt(row, 0, 20), -0.9f, 0.9f / 6.0f);
  // An Inf saturates the same way and leaves no NaN.
  x[3] = std::numeric_limits<float>::infinity();
  QuantRow inf = Quantize(x, input_scale);
  EXPECT_EQ(inf.scales[0], 0x7e);
  EXPECT_EQ(Nibble(inf, 3), 0x7);
}

TEST(ActQuant, ZeroBlockGetsZeroScaleAndNanBlockGetsTheNanScale) {
  std::vector<float> x(48, 0.0f);
  x[16] = -0.0f;
  for (int c = 32; c < 48; ++c) x[c] = 0.25f * static_cast<float>(c - 40);
  x[33] = std::numeric_limits<float>::quiet_NaN();
  QuantRow q = Quantize(x, 0.01f);
  ASSERT_TRUE(q.ok);
  EXPECT_EQ(q.scales[0], 0x00);
  EXPECT_EQ(q.scales[1], 0x00);
  for (int c = 0; c < 32; ++c) EXPECT_EQ(Nibble(q, c) & 0x7, 0) << c;
  EXPECT_EQ(Nibble(q, 16), 0x8) << "-0 keeps its sign";
  EXPECT_EQ(q.scales[2], 0x7f) << "NaN amax -> the e4m3 NaN scale";
  const QWeight row = Nvfp4ActRow(q.values.data(), q.scales.data(), 48, 0.01f);
  EXPECT_TRUE(std::isnan(DequantAt(row, 0, 40)));
  EXPECT_EQ(DequantAt(row, 0, 5), 0.0f);
}

TEST(ActQuant, InvalidInputScaleFiresTheCheckAndWritesNothing) {
  const std::vector<float> x = Normal(32, 7, 1.0f);
  for (float bad : {0.0f, -0.5f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    1e-40f /* 1/x overflows */}) {
    QuantRow q = Quantize(x, bad);
    EXPECT_FALSE(q.ok) << bad;
    ASSERT_TRUE(q.st.fired) << bad;
    EXPECT_EQ(q.st.check, Check::kNvfp4InputScale);
    EXPECT_STREQ(CheckName(q.st.check), "nvfp4_input_scale_valid");
    EXPECT_EQ(q.st.item, 3);
    if (!std::isnan(bad)) {
      EXPECT_EQ(q.st.value, static_cast<double>(bad));
    }
    for (uint8_t b : q.values) EXPECT_EQ(b, 0xaa);
  }
  EXPECT_TRUE(Quantize(x, 1e-30f).ok);
}

// ---- the w4a4 GEMM paths ----------------------------------------------------

struct Nvfp4Matrix {
  std::vector<uint8_t> packed, scales;
  QWeight w;
};

Nvfp4Matrix MakeWeight(int64_t rows, int64_t cols, uint32_t seed) {
  Nvfp4Matrix m;
  const std::vector<float> f = Normal(rows * cols, seed, 0.2f);
  const float global = Nvfp4GlobalScale(f);
  m.packed.assign(rows * cols / 2, 0);
  m.scales.assign(rows * (cols / 16), 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < cols / 16; ++b) {
      float bmax = 0;
      for (int64_t c = b * 16; c < b * 16 + 16; ++c) bmax = std::max(bmax, std::abs(f[r * cols + c]));
      const uint8_t s8 = Nvfp4BlockScale(bmax, global);
      m.scales[r * (cols / 16) + b] = s8;
      for (int64_t c = b * 16; c < b * 16 + 16; ++c)
        SetNibble(m.packed.data(), r * cols + c, QuantNvfp4(f[r * cols + c], s8, global));
    }
  m.w = QWeight{WFormat::kE2m1, SFormat::kE4m3, m.packed.data(), rows, cols, m.scales.data(), 1, 16, cols / 16, global};
  m.w.act_fp4 = true;
  return m;
}

TEST(ActQuantLinear, BothVariantsMatchTheExactProductOfDequantizedOperands) {
  const int64_t rows = 9, cols = 96;
  Nvfp4Matrix m = MakeWeight(rows, cols, 11);
  const std::vector<float> x = Normal(cols, 12, 1.0f);
  float amax = 0;
  for (float v : x) amax = std::max(amax, std::abs(v));
  const float input_scale = amax / (6.0f * 448.0f);
  m.w.act_scale = input_scale;
  QuantRow q = Quantize(x, input_scale);
  ASSERT_TRUE(q.ok);
  const QWeight xq = Nvfp4ActRow(q.values.data(), q.scales.data(), cols, input_scale);
  for (int64_t r = 0; r < rows; ++r) {
    double exact = 0, mag = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const double wv = double(RawAt(m.w, r, c)) * StoredScaleAt(m.w, r, c) * m.w.global_scale;
      const double xv = double(RawAt(xq, 0, c)) * StoredScaleAt(xq, 0, c) * input_scale;
      exact += wv * xv;
      mag += std::abs(wv * xv);
    }
    KernelStatus st;
    const float fused = LinearElementQ(DotKind::kFused, m.w, xq, r, r, &st);
    const float deq = LinearElementQ(DotKind::kDequant, m.w, xq, r, r, &st);
    EXPECT_FALSE(st.fired);
    EXPECT_NEAR(fused, exact, 1e-6 * mag + 1e-12) << "row " << r;        // exact block sums, fp32 accumulation
    EXPECT_NEAR(deq, exact, std::ldexp(1.0, -7) * mag + 1e-12) << "row " << r;  // two bf16 roundings
    // And both stay close to the unquantized activation's product.
    const float w4a16 = LinearElement(DotKind::kFused, m.w, x.data(), r, r, &st);
    EXPECT_NEAR(fused, w4a16, 0.25 * mag + 1e-6) << "row " << r;
  }
}

TEST(ActQuantLinear, FusedBlockProductIsExactForAHandComputedBlock) {
  // One row, one block: w = 6 * 2 (scale 2, global 0.5), x = -3 * 4 (scale 4, input_scale 0.25).
  uint8_t wv[8] = {0x07, 0, 0, 0, 0, 0, 0, 0}, ws[1] = {0x40};  // e4m3 0x40 = 2
  uint8_t xv[8] = {0x0d, 0, 0, 0, 0, 0, 0, 0}, xs[1] = {0x48};  // 0xd = -3, e4m3 0x48 = 4
  QWeight w{WFormat::kE2m1, SFormat::kE4m3, wv, 1, 16, ws, 1, 16, 1, 0.5f};
  ASSERT_EQ(E4m3ToFloat(0x40), 2.0f);
  ASSERT_EQ(E4m3ToFloat(0x48), 4.0f);
  const QWeight x = Nvfp4ActRow(xv, xs, 16, 0.25f);
  KernelStatus st;
  // (6 * -3) * (2 * 4) * (0.5 * 0.25) = -18
  EXPECT_EQ(LinearElementQ(DotKind::kFused, w, x, 0, 0, &st), -18.0f);
  EXPECT_EQ(LinearElementQ(DotKind::kDequant, w, x, 0, 0, &st), -18.0f);
}

TEST(ActQuantLinear, Ue8m0VariantChecksTheWeightScaleLayout) {
  const int64_t rows = 2, cols = 32;
  Nvfp4Matrix m = MakeWeight(rows, cols, 5);
  const std::vector<float> x = Normal(cols, 6, 1.0f);
  QuantRow q = Quantize(x, 0.001f);
  const QWeight xq = Nvfp4ActRow(q.values.data(), q.scales.data(), cols, 0.001f);
  // fp32 scales: NVFP4's (e4m3 * global) are not powers of two -> the check fires.
  std::vector<float> f(rows * 2), pow2(rows * 2);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < 2; ++b) {
      f[r * 2 + b] = ScaleAt(m.w, r, b * 16);
      pow2[r * 2 + b] = E8m0ToFloat(FloatToUe8m0Ceil(f[r * 2 + b]));
    }
  QWeight w = m.w;
  w.scale_format = SFormat::kF32;
  w.scales = f.data();
  w.global_scale = 1.0f;
  KernelStatus st;
  LinearElementQ(DotKind::kUe8m0, w, xq, 1, 7, &st);
  ASSERT_TRUE(st.fired);
  EXPECT_EQ(st.check, Check::kUe8m0ScaleLayout);
  EXPECT_EQ(st.item, 7);
  EXPECT_EQ(st.index, 2);  // row 1, block 0
  // Power-of-two scales pass and give the fused result bit for bit.
  w.scales = pow2.data();
  KernelStatus ok;
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_EQ(LinearElementQ(DotKind::kUe8m0, w, xq, r, r, &ok), LinearElementQ(DotKind::kFused, w, xq, r, r, &ok));
  }
  EXPECT_FALSE(ok.fired);
}

}  // namespace
}  // namespace crashreplay::replay
