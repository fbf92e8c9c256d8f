// Block-scaled quantization on hand-computed vectors: every expected code
// below was worked out on paper from the layout and rounding rules in
// docs/formats/numerics.md, not produced by the code under test.
#include "crashreplay/formats/block_quant.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace crashreplay {
namespace {

using ::testing::HasSubstr;

std::vector<uint8_t> Nibbles(const std::vector<uint8_t>& packed, int64_t n) {
  std::vector<uint8_t> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = GetNibble(packed.data(), static_cast<uint64_t>(i));
  return out;
}

// ------------------------------------------------------------------ NVFP4

TEST(Nvfp4Test, GlobalScaleIsAmaxOver6Times448) {
  const std::vector<float> x = {1.0f, -2688.0f, 5.0f};
  EXPECT_EQ(Nvfp4GlobalScale(x), 1.0f);
  EXPECT_EQ(Nvfp4GlobalScale(std::vector<float>{0.0f, -0.0f}), 1.0f);  // no zero global
  EXPECT_TRUE(std::isnan(Nvfp4GlobalScale(std::vector<float>{1.0f, std::nanf("")})));
}

TEST(Nvfp4Test, QuantizesHandComputedBlocks) {
  // One row, four 16-element blocks, global scale 1 (tensor amax 2688).
  std::vector<float> x(64, 0.0f);
  // Block 0: amax 2688 -> scale 2688/6 = 448 (e4m3 0x7e); x/448 rounds to e2m1.
  const float b0[16] = {2688, 1344, 448, 224, 100, 112, 113, -896, 1120, 1568, 2240, 2300, -2688, 0, -0.0f, 672};
  const uint8_t b0_codes[16] = {0x7, 0x5, 0x2, 0x1, 0x0, 0x0, 0x1, 0xc, 0x4, 0x6, 0x6, 0x7, 0xf, 0x0, 0x8, 0x3};
  // Block 1: amax 12 -> scale 2 (0x40).
  const float b1[4] = {12, 3, -1, 0.4f};
  const uint8_t b1_codes[4] = {0x7, 0x3, 0x9, 0x0};
  // Block 2: all zero -> ModelOpt writes scale 1.0 (0x38).
  // Block 3: amax 7 -> 7/6 = 1.1667 rounds to e4m3 1.125 (0x39); 7/1.125 =
  // 6.2 saturates to 6; 3.375/1.125 = 3.
  const float b3[2] = {7, 3.375f};
  const uint8_t b3_codes[2] = {0x7, 0x5};
  for (int i = 0; i < 16; ++i) x[i] = b0[i];
  for (int i = 0; i < 4; ++i) x[16 + i] = b1[i];
  for (int i = 0; i < 2; ++i) x[48 + i] = b3[i];

  const MatrixShape shape{1, 64};
  ASSERT_EQ(Nvfp4GlobalScale(x), 1.0f);
  std::vector<uint8_t> packed(Nvfp4PackedBytes(shape)), scales(Nvfp4ScaleCount(shape));
  ASSERT_EQ(packed.size(), 32u);
  ASSERT_EQ(scales.size(), 4u);
  ASSERT_TRUE(QuantizeNvfp4(x, shape, 1.0f, packed, scales).ok());

  EXPECT_THAT(scales, ::testing::ElementsAre(0x7e, 0x40, 0x38, 0x39));
  const std::vector<uint8_t> n = Nibbles(packed, 64);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(n[i], b0_codes[i]) << "element " << i;
  for (int i = 0; i < 4; ++i) EXPECT_EQ(n[16 + i], b1_codes[i]) << "element " << 16 + i;
  for (int i = 0; i < 2; ++i) EXPECT_EQ(n[48 + i], b3_codes[i]) << "element " << 48 + i;
  EXPECT_EQ(packed[0], 0x57);  // elements 0 (0x7, low) and 1 (0x5, high)

  std::vector<float> back(64);
  ASSERT_TRUE(DequantizeNvfp4(packed, scales, 1.0f, shape, back).ok());
  EXPECT_EQ(back[0], 2688.0f);
  EXPECT_EQ(back[8], 896.0f);    // 1120 -> 2.5 -> 2 (tie to even) -> 2 * 448
  EXPECT_EQ(back[10], 1792.0f);  // 2240 -> 5 -> 4 (tie to even)
  EXPECT_EQ(back[7], -896.0f);
  EXPECT_TRUE(std::signbit(back[14]));
  EXPECT_EQ(back[18], -1.0f);
  EXPECT_EQ(back[48], 6.75f);  // 6 * 1.125: the saturated element
  EXPECT_EQ(back[40], 0.0f);
}

TEST(Nvfp4Test, GlobalScaleMultipliesAfterTheExactBlockProduct) {
  // e2m1 6 * e4m3 448 = 2688 exactly; then one rounding by the global scale.
  EXPECT_EQ(DequantNvfp4(0x7, 0x7e, 0.5f), 1344.0f);
  EXPECT_EQ(DequantNvfp4(0xf, 0x38, 0.25f), -1.5f);
  EXPECT_TRUE(std::isnan(DequantNvfp4(0x1, 0x7f, 1.0f)));  // NaN scale
  // 1.5 * 0.013671875 (e4m3 0x07) * 0.1: multiplying the block scale into
  // the global first would round twice and give 0.0020507812 instead.
  EXPECT_EQ(DequantNvfp4(0x3, 0x07, 0.1f), (1.5f * 0.013671875f) * 0.1f);
  EXPECT_NE(DequantNvfp4(0x3, 0x07, 0.1f), 1.5f * (0.013671875f * 0.1f));
}

TEST(Nvfp4Test, RandomDataDequantizesWithinAQuarterOfTheBlockAmax) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  const MatrixShape shape{8, 96};
  std::vector<float> x(8 * 96);
  for (float& v : x) v = dist(rng);
  const float g = Nvfp4GlobalScale(x);
  std::vector<uint8_t> packed(Nvfp4PackedBytes(shape)), scales(Nvfp4ScaleCount(shape));
  ASSERT_TRUE(QuantizeNvfp4(x, shape, g, packed, scales).ok());
  std::vector<float> back(x.size());
  ASSERT_TRUE(DequantizeNvfp4(packed, scales, g, shape, back).ok());
  for (int64_t r = 0; r < shape.rows; ++r) {
    for (int64_t b = 0; b < shape.cols / 16; ++b) {
      float amax = 0.0f;
      for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(x[r * 96 + b * 16 + i]));
      for (int i = 0; i < 16; ++i) {
        const int64_t k = r * 96 + b * 16 + i;
        // e2m1's coarsest half-step is 1/6 of the block max, e4m3 scale
        // rounding adds up to 1/16 more.
        EXPECT_LE(std::fabs(back[k] - x[k]), 0.25f * amax + 1e-6f) << "row " << r << " col " << b * 16 + i;
      }
    }
  }
}

TEST(Nvfp4Test, RejectsOddColumnsAndWrongSizesNamingThem) {
  std::vector<float> x(15);
  std::vector<uint8_t> packed(8), scales(1);
  absl::Status s = QuantizeNvfp4(x, MatrixShape{1, 15}, 1.0f, packed, scales);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("odd number of columns"));

  std::vector<float> y(32);
  std::vector<uint8_t> small(15), sc(2);
  s = QuantizeNvfp4(y, MatrixShape{1, 32}, 1.0f, small, sc);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("QuantizeNvfp4"));
  EXPECT_THAT(s.message(), HasSubstr("15"));

  std::vector<float> out(32);
  s = DequantizeNvfp4(std::vector<uint8_t>(16), std::vector<uint8_t>(1), 1.0f, MatrixShape{1, 32}, out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(QuantizeNvfp4(y, MatrixShape{-1, 32}, 1.0f, small, sc).code(), absl::StatusCode::kInvalidArgument);
}

// ------------------------------------------------------------------ MXFP4

TEST(Mxfp4Test, ScaleIsFloorLog2OfAmaxMinusTwo) {
  EXPECT_EQ(Mxfp4BlockScale(6.0f), 127);    // floor(log2 6) = 2 -> 2^0
  EXPECT_EQ(Mxfp4BlockScale(8.0f), 128);    // 3 - 2 -> 2^1
  EXPECT_EQ(Mxfp4BlockScale(7.99f), 127);
  EXPECT_EQ(Mxfp4BlockScale(100.0f), 131);  // 6 - 2 -> 2^4
  EXPECT_EQ(Mxfp4BlockScale(0.75f), 124);   // -1 - 2 -> 2^-3
  EXPECT_EQ(Mxfp4BlockScale(0.0f), 0);      // clamped to 2^-127
  EXPECT_EQ(Mxfp4BlockScale(std::ldexp(1.0f, -126)), 0);
  EXPECT_EQ(Mxfp4BlockScale(std::numeric_limits<float>::infinity()), 0xff);
  EXPECT_EQ(Mxfp4BlockScale(std::nanf("")), 0xff);
}

TEST(Mxfp4Test, QuantizesHandComputedBlocksIncludingAPartialOne) {
  // [1, 102]: three full 32-blocks and a partial one of 6 elements.
  const MatrixShape shape{1, 102};
  std::vector<float> x(102, 0.0f);
  x[0] = 6.0f;    // block 0: scale 2^0, elements are plain e2m1
  x[1] = -2.5f;   // tie -> -2 (0xc)
  x[2] = 0.3f;    // -> 0.5 (0x1)
  x[32] = 100.0f; // block 1: scale 2^4; 100/16 = 6.25 saturates to 6 -> 96
  x[33] = 40.0f;  // 2.5 -> 2 -> 32
  x[34] = -24.0f; // -1.5 -> 0xb
  // block 2 all zero: scale code 0, elements 0
  x[96] = 0.75f;  // block 3 (partial): scale 2^-3; 0.75 * 8 = 6 (0x7)
  x[101] = 0.0625f;  // 0.5 (0x1)
  std::vector<uint8_t> packed(Mxfp4PackedBytes(shape)), scales(Mxfp4ScaleCount(shape));
  ASSERT_EQ(scales.size(), 4u);
  ASSERT_TRUE(QuantizeMxfp4(x, shape, packed, scales).ok());
  EXPECT_THAT(scales, ::testing::ElementsAre(127, 131, 0, 124));
  const std::vector<uint8_t> n = Nibbles(packed, 102);
  EXPECT_EQ(n[0], 0x7);
  EXPECT_EQ(n[1], 0xc);
  EXPECT_EQ(n[2], 0x1);
  EXPECT_EQ(n[32], 0x7);
  EXPECT_EQ(n[33], 0x4);
  EXPECT_EQ(n[34], 0xb);
  EXPECT_EQ(n[64], 0x0);
  EXPECT_EQ(n[96], 0x7);
  EXPECT_EQ(n[101], 0x1);
  std::vector<float> back(102);
  ASSERT_TRUE(DequantizeMxfp4(packed, scales, shape, back).ok());
  EXPECT_EQ(back[32], 96.0f);
  EXPECT_EQ(back[33], 32.0f);
  EXPECT_EQ(back[34], -24.0f);
  EXPECT_EQ(back[96], 0.75f);
  EXPECT_EQ(back[101], 0.0625f);
  EXPECT_EQ(back[70], 0.0f);
}

TEST(Mxfp4Test, NanInABlockPoisonsItsScale) {
  const MatrixShape shape{1, 32};
  std::vector<float> x(32, 1.0f);
  x[5] = std::nanf("");
  std::vector<uint8_t> packed(16), scales(1);
  ASSERT_TRUE(QuantizeMxfp4(x, shape, packed, scales).ok());
  EXPECT_EQ(scales[0], 0xff);
  std::vector<float> back(32);
  ASSERT_TRUE(DequantizeMxfp4(packed, scales, shape, back).ok());
  EXPECT_TRUE(std::isnan(back[0]));
}

// -------------------------------------------------------------- FP8 block

TEST(Fp8BlockTest, WeightBlocksCoverShapesNotDivisibleBy128) {
  // [130, 260] -> a 2 x 3 grid of scales; the last row and column of blocks
  // are partial.
  const MatrixShape shape{130, 260};
  ASSERT_EQ(Fp8ScaleCount(shape, kFp8WeightBlocks), 6);
  std::vector<float> x(130 * 260, 0.0f);
  auto at = [&](int r, int c) -> float& { return x[r * 260 + c]; };
  at(5, 7) = 896.0f;     // block (0,0): amax 896 -> scale 2, q = 448
  at(0, 0) = 3.0f;       //              3/2 = 1.5 -> 0x3c
  at(100, 200) = 300.0f; // block (0,1): scale 300/448, q = 448
  at(129, 259) = -0.5f;  // block (1,2): partial both ways, scale 0.5/448
  std::vector<uint8_t> q(x.size());
  std::vector<float> scales(6);
  ASSERT_TRUE(QuantizeFp8Blocks(x, shape, kFp8WeightBlocks, q, scales).ok());
  EXPECT_EQ(scales[0], 2.0f);
  EXPECT_EQ(scales[1], 300.0f / 448.0f);
  EXPECT_EQ(scales[2], 1e-4f / 448.0f);  // all-zero block: the amax floor
  EXPECT_EQ(scales[5], 0.5f / 448.0f);
  EXPECT_EQ(q[5 * 260 + 7], 0x7e);
  EXPECT_EQ(q[0], 0x3c);
  EXPECT_EQ(q[100 * 260 + 200], 0x7e);
  EXPECT_EQ(q[129 * 260 + 259], 0xfe);
  EXPECT_EQ(q[1], 0x00);

  std::vector<float> back(x.size());
  ASSERT_TRUE(DequantizeFp8Blocks(q, scales, shape, kFp8WeightBlocks, back).ok());
  EXPECT_EQ(back[5 * 260 + 7], 896.0f);
  EXPECT_EQ(back[0], 3.0f);
  EXPECT_NEAR(back[100 * 260 + 200], 300.0f, 1e-4f);
  EXPECT_NEAR(back[129 * 260 + 259], -0.5f, 1e-7f);
}

TEST(Fp8BlockTest, Ue8m0ModeRoundsEachScaleUpToAPowerOfTwo) {
  const MatrixShape shape{1, 256};
  Fp8BlockOptions opts = kFp8WeightBlocks;
  opts.ue8m0_scales = true;
  std::vector<float> x(256, 0.0f);
  x[0] = 896.0f;   // 896/448 = 2: already a power of two
  x[128] = 300.0f; // 300/448 = 0.67 -> 1.0; q = e4m3(300) = 288 (0x79)
  std::vector<uint8_t> q(256);
  std::vector<float> scales(2);
  ASSERT_TRUE(QuantizeFp8Blocks(x, shape, opts, q, scales).ok());
  EXPECT_EQ(scales[0], 2.0f);
  EXPECT_EQ(scales[1], 1.0f);
  EXPECT_EQ(q[0], 0x7e);
  EXPECT_EQ(q[128], 0x79);
  for (float s : scales) EXPECT_TRUE(IsUe8m0Layout(FloatBits(s))) << s;
}

TEST(Fp8BlockTest, ActivationGroupsAre1x128) {
  const MatrixShape shape{2, 200};
  ASSERT_EQ(Fp8ScaleCount(shape, kFp8ActivationGroups), 4);
  std::vector<float> x(400, 0.0f);
  x[0] = 448.0f;      // row 0 group 0: scale 1
  x[1] = -1.0f;
  x[200 + 150] = 7.0f;   // row 1 group 1 (72 elements): scale 7/448 = 1/64, q 448
  x[200 + 151] = 0.0625f; // 0.0625 * 64 = 4 -> 0x48
  std::vector<uint8_t> q(400);
  std::vector<float> scales(4);
  ASSERT_TRUE(QuantizeFp8Blocks(x, shape, kFp8ActivationGroups, q, scales).ok());
  EXPECT_EQ(scales[0], 1.0f);
  EXPECT_EQ(scales[3], 1.0f / 64.0f);
  EXPECT_EQ(q[0], 0x7e);
  EXPECT_EQ(q[1], 0xb8);
  EXPECT_EQ(q[350], 0x7e);
  EXPECT_EQ(q[351], 0x48);
  std::vector<float> back(400);
  ASSERT_TRUE(DequantizeFp8Blocks(q, scales, shape, kFp8ActivationGroups, back).ok());
  EXPECT_EQ(back[350], 7.0f);
  EXPECT_EQ(back[351], 0.0625f);
}

TEST(Fp8BlockTest, RequantToUe8m0FollowsSglangBf16Path) {
  // One 128x128 block, scale 1 + 2^-10. fp8 448 dequantizes to 448.4375 in
  // fp32 but 448 in bf16 (8 significant bits).
  const MatrixShape shape{128, 128};
  std::vector<uint8_t> q(128 * 128, 0x00);
  q[0] = 0x7e;  // 448
  q[1] = 0x3c;  // 1.5
  const std::vector<float> scales = {1.0f + std::ldexp(1.0f, -10)};

  // sglang: bf16 amax 448 -> 448/448 = 1 -> scale 1; q' = e4m3(448) = 0x7e;
  // 1.5 * scale = 1.50146 -> bf16 1.5 -> 0x3c.
  std::vector<uint8_t> q_bf16(q.size());
  std::vector<float> s_bf16(1);
  ASSERT_TRUE(RequantizeFp8BlocksToUe8m0(q, scales, shape, kFp8WeightBlocks, true, q_bf16, s_bf16).ok());
  EXPECT_EQ(s_bf16[0], 1.0f);
  EXPECT_EQ(q_bf16[0], 0x7e);
  EXPECT_EQ(q_bf16[1], 0x3c);

  // fp32 path: amax 448.4375 -> 1.00098 -> scale 2; 448.4375/2 = 224.2 ->
  // e4m3 224 (0x76); 1.50146/2 = 0.7507 -> 0.75 (0x34).
  std::vector<uint8_t> q_f32(q.size());
  std::vector<float> s_f32(1);
  ASSERT_TRUE(RequantizeFp8BlocksToUe8m0(q, scales, shape, kFp8WeightBlocks, false, q_f32, s_f32).ok());
  EXPECT_EQ(s_f32[0], 2.0f);
  EXPECT_EQ(q_f32[0], 0x76);
  EXPECT_EQ(q_f32[1], 0x34);
}

TEST(Fp8BlockTest, RequantInPlaceMakesEveryScaleAPowerOfTwo) {
  const MatrixShape shape{200, 300};
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  std::vector<float> x(200 * 300);
  for (float& v : x) v = dist(rng);
  std::vector<uint8_t> q(x.size());
  std::vector<float> scales(Fp8ScaleCount(shape, kFp8WeightBlocks));
  ASSERT_TRUE(QuantizeFp8Blocks(x, shape, kFp8WeightBlocks, q, scales).ok());
  for (float s : scales) ASSERT_FALSE(IsUe8m0Layout(FloatBits(s)));  // random amax/448
  std::vector<float> before(x.size()), after(x.size());
  ASSERT_TRUE(DequantizeFp8Blocks(q, scales, shape, kFp8WeightBlocks, before).ok());
  ASSERT_TRUE(RequantizeFp8BlocksToUe8m0(q, scales, shape, kFp8WeightBlocks, true, q, scales).ok());
  for (float s : scales) EXPECT_TRUE(IsUe8m0Layout(FloatBits(s))) << s;
  ASSERT_TRUE(DequantizeFp8Blocks(q, scales, shape, kFp8WeightBlocks, after).ok());
  // Requantizing moves a value by at most half an e4m3 step at the new
  // scale S (|v|/16 for normals, S * 2^-10 for subnormals) plus the bf16
  // rounding of the intermediate (|v|/512).
  for (int64_t r = 0; r < shape.rows; ++r) {
    for (int64_t c = 0; c < shape.cols; ++c) {
      const size_t i = static_cast<size_t>(r * shape.cols + c);
      const float block_scale = scales[(r / 128) * 3 + c / 128];
      const float v = std::fabs(before[i]);
      EXPECT_LE(std::fabs(after[i] - before[i]), v / 16 + v / 512 + block_scale * std::ldexp(1.0f, -10))
          << "row " << r << " col " << c;
    }
  }
}

TEST(Fp8BlockTest, RejectsBadBlocksAndSizes) {
  std::vector<float> x(16);
  std::vector<uint8_t> q(16);
  std::vector<float> s(1);
  Fp8BlockOptions bad = kFp8WeightBlocks;
  bad.block_rows = 0;
  EXPECT_EQ(QuantizeFp8Blocks(x, MatrixShape{4, 4}, bad, q, s).code(), absl::StatusCode::kInvalidArgument);
  std::vector<float> s2(2);
  absl::Status st = QuantizeFp8Blocks(x, MatrixShape{4, 4}, kFp8WeightBlocks, q, s2);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("scale buffer"));
}

// ---------------------------------------------------------- UE8M0 tensors

TEST(Ue8m0TensorTest, CeilAndFloorConvertWholeScaleTensors) {
  const std::vector<float> scales = {1.0f, 0.75f, 3.0f, 0.001f};
  std::vector<uint8_t> ceil(4), floor(4);
  ASSERT_TRUE(Fp32ScalesToUe8m0Ceil(scales, ceil).ok());
  ASSERT_TRUE(Fp32ScalesToE8m0Floor(scales, floor).ok());
  // 0.001 = 1.024 * 2^-10: ceil 2^-9 (118), floor 2^-10 (117).
  EXPECT_THAT(ceil, ::testing::ElementsAre(127, 127, 129, 118));
  EXPECT_THAT(floor, ::testing::ElementsAre(127, 126, 128, 117));
  std::vector<uint8_t> wrong(3);
  EXPECT_EQ(Fp32ScalesToUe8m0Ceil(scales, wrong).code(), absl::StatusCode::kInvalidArgument);
}

TEST(Ue8m0TensorTest, PacksFourPerWordAlongRowsWithZeroPadding) {
  // [2, 5] codes -> [2, 2] words.
  const MatrixShape shape{2, 5};
  const std::vector<uint8_t> codes = {1, 2, 3, 4, 5, 11, 12, 13, 14, 15};
  std::vector<uint32_t> packed(Ue8m0PackedWords(shape));
  ASSERT_EQ(packed.size(), 4u);
  ASSERT_TRUE(PackUe8m0(codes, shape, packed).ok());
  EXPECT_THAT(packed, ::testing::ElementsAre(0x04030201u, 0x00000005u, 0x0e0d0c0bu, 0x0000000fu));
  std::vector<uint8_t> back(10);
  ASSERT_TRUE(UnpackUe8m0(packed, shape, back).ok());
  EXPECT_EQ(back, codes);
  std::vector<uint32_t> short_packed(3);
  EXPECT_EQ(PackUe8m0(codes, shape, short_packed).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace crashreplay
