#include "crashreplay/bisect/kernel_table.h"

#include <cmath>

#include <gtest/gtest.h>

namespace crashreplay::bisect {
namespace {

KernelRow Row(const std::string& name, int64_t layer, double max_abs, const std::string& digest) {
  KernelRow r;
  r.name = name;
  r.layer = layer;
  r.numel = 4096;
  r.max_abs = max_abs;
  r.digest = digest;
  return r;
}

std::vector<KernelRow> Reference() {
  return {Row("embedding", -1, 1.0, "d0"), Row("rmsnorm", 0, 3.0, "d1"), Row("qkv_proj", 0, 10.0, "d2"),
          Row("attention", 0, 8.0, "d3"),  Row("o_proj", 0, 6.0, "d4"),  Row("lm_head", -1, 20.0, "d5")};
}

TEST(FirstBadKernel, IdenticalTablesHaveNoBadKernel) {
  EXPECT_FALSE(FirstBadKernel(Reference(), Reference()).has_value());
}

TEST(FirstBadKernel, NamesTheFirstKernelThatGoesNonFinite) {
  auto test = Reference();
  test[3].digest = "x3";
  test[3].nan_count = 12;
  test[4].digest = "x4";
  test[4].nan_count = 4096;
  auto f = FirstBadKernel(Reference(), test);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->reason, KernelFinding::Reason::kNonFinite);
  EXPECT_EQ(f->index, 3u);
  EXPECT_EQ(f->test.name, "attention");
  EXPECT_EQ(f->test.nan_count, 12);
  EXPECT_NE(DescribeKernelFinding(*f).find("12 NaN"), std::string::npos);
}

TEST(FirstBadKernel, ToleranceIsAtolPlusRefTimesRtol) {
  const Tolerance tol{.atol = 0.01, .rtol = 0.1};
  // qkv_proj: |ref| = 10 -> bound 0.01 + 10 * 0.1 = 1.01.
  auto inside = Reference();
  inside[2].digest = "x";
  inside[2].max_err = 1.0;
  EXPECT_FALSE(FirstBadKernel(Reference(), inside, tol).has_value());
  auto outside = Reference();
  outside[2].digest = "x";
  outside[2].max_err = 1.02;
  auto f = FirstBadKernel(Reference(), outside, tol);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->reason, KernelFinding::Reason::kOutOfTolerance);
  EXPECT_EQ(f->index, 2u);
  EXPECT_DOUBLE_EQ(f->bound, 1.01);
  EXPECT_DOUBLE_EQ(f->error, 1.02);
}

TEST(FirstBadKernel, WithoutElementErrorsComparesMaxAbs) {
  const Tolerance tol{.atol = 0.0, .rtol = 0.01};
  auto test = Reference();
  test[1].digest = "x";
  test[1].max_abs = 3.02;  // |3.02 - 3| = 0.02 < 0.03: within
  test[4].digest = "y";
  test[4].max_abs = 6.5;   // 0.5 > 0.06: out
  auto f = FirstBadKernel(Reference(), test, tol);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->index, 4u);
  EXPECT_EQ(f->first_digest_mismatch, 1u);  // bits differed earlier, within tolerance
}

TEST(FirstBadKernel, RowToleranceOverridesTheDefault) {
  auto test = Reference();
  test[2].digest = "x";
  test[2].max_err = 0.5;
  test[2].atol = 1.0;
  test[2].rtol = 0.0;
  EXPECT_FALSE(FirstBadKernel(Reference(), test, Tolerance{.atol = 0, .rtol = 0}).has_value());
}

TEST(FirstBadKernel, NonFiniteReferenceIsSkippedNotBlamed) {
  auto ref = Reference();
  ref[2].nan_count = 1;
  auto test = ref;
  test[2].digest = "x";
  test[2].nan_count = 5;
  EXPECT_FALSE(FirstBadKernel(ref, test).has_value());
}

TEST(FirstBadKernel, RunThatStoppedEarlyPointsAtTheKernelItNeverFinished) {
  auto test = Reference();
  test.resize(4);
  auto f = FirstBadKernel(Reference(), test);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->reason, KernelFinding::Reason::kMissing);
  EXPECT_EQ(f->index, 4u);
  EXPECT_EQ(f->reference.name, "o_proj");
}

TEST(FirstBadKernel, DifferentKernelSequenceIsStructural) {
  auto test = Reference();
  test[3].name = "flash_decode";
  auto f = FirstBadKernel(Reference(), test);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->reason, KernelFinding::Reason::kStructure);
  EXPECT_EQ(f->index, 3u);
}

TEST(KernelRows, ParseFromReplayJsonIncludingNonFiniteStrings) {
  auto rows = KernelRowsFromJson(nlohmann::json::parse(R"([
    {"name":"attention","layer":0,"numel":64,"nan_count":0,"inf_count":0,"digest":"ab","max_abs":1.5,"max_err":"nan"},
    {"name":"lm_head"}
  ])"));
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_EQ((*rows)[0].layer, 0);
  EXPECT_TRUE(std::isnan(*(*rows)[0].max_err));
  EXPECT_EQ((*rows)[1].layer, -1);
  auto bad = KernelRowsFromJson(nlohmann::json::parse(R"([{"name":"x","nan_count":"many"}])"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("kernels[0]"), std::string::npos);
  // A NaN error is out of tolerance, never silently within it.
  auto ref = Reference();
  auto test = Reference();
  test[0].digest = "x";
  test[0].max_err = NAN;
  auto f = FirstBadKernel(ref, test);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->index, 0u);
}

}  // namespace
}  // namespace crashreplay::bisect
