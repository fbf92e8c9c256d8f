// The host side of the device fingerprints (capture/device_fingerprints.h):
// a slot's raw record becomes the capture's Fingerprint, and a table is
// refused with a reason where there is no device. The kernel itself runs in
// tests/gpu/device_fingerprint_test.cc (the GPU bundle).
#include <gtest/gtest.h>

#include <limits>

#include "crashreplay/capture/device_fingerprints.h"
#include "crashreplay/formats/fingerprint.h"
#include "device_fingerprints_cuda.h"

namespace crashreplay::capture {
namespace {

internal::DeviceFingerprintSlot Slot() {
  internal::DeviceFingerprintSlot s{};
  s.numel = 12;
  s.nan = 1;
  s.pos_inf = 2;
  s.min = -3;
  s.max = 5;
  s.max_abs = 5;
  s.sum = 4;
  s.sum_squares = 40;
  s.first_nonfinite = 7;
  s.finite = 9;
  s.generation = 1;
  return s;
}

TEST(DeviceFingerprints, ASlotBecomesTheFingerprintWithItsFirstNonFiniteAsTokenAndColumn) {
  const Fingerprint f = internal::FingerprintFromSlot(Slot(), "L2.attention", DType::kBF16, 4);
  EXPECT_EQ(f.name, "L2.attention");
  EXPECT_EQ(f.dtype, "BF16");
  EXPECT_EQ(f.numel, 12u);
  EXPECT_EQ(f.columns, 4u);
  EXPECT_EQ(f.nonfinite(), 3u);
  EXPECT_EQ(f.first_nonfinite_token, 1);  // element 7 of rows of 4
  EXPECT_EQ(f.first_nonfinite_column, 3);
  EXPECT_EQ(f.max_abs, 5.0);
  EXPECT_FALSE(f.is_int);
  EXPECT_FALSE(f.content_hash.has_value());
  // It departs from a finite reference like a host summary would.
  const float finite[12] = {1, 2, 3, -3, 5, 0, 0, 0, 0, 0, 0, 0};
  const Fingerprint ref = SummarizeTensor("L2.attention", DType::kF32, finite, 12, 4);
  ASSERT_TRUE(FingerprintDeparts(f, ref).has_value());
  EXPECT_NE(FingerprintDeparts(f, ref)->find("1 NaN, 2 +Inf (first at token 1, column 3)"), std::string::npos)
      << *FingerprintDeparts(f, ref);
}

TEST(DeviceFingerprints, AllFiniteAndAllNonFiniteSlots) {
  internal::DeviceFingerprintSlot s = Slot();
  s.nan = s.pos_inf = 0;
  s.first_nonfinite = std::numeric_limits<uint64_t>::max();
  const Fingerprint ok = internal::FingerprintFromSlot(s, "L0.topk", DType::kI32, 0);
  EXPECT_EQ(ok.first_nonfinite_token, -1);
  EXPECT_EQ(ok.columns, 1u);
  EXPECT_TRUE(ok.is_int);
  // No finite element: the kernel's +-Inf identities are not statistics.
  s.finite = 0;
  s.min = std::numeric_limits<double>::infinity();
  s.max = -std::numeric_limits<double>::infinity();
  const Fingerprint none = internal::FingerprintFromSlot(s, "L0.mlp", DType::kF16, 4);
  EXPECT_EQ(none.min, 0.0);
  EXPECT_EQ(none.max, 0.0);
  EXPECT_EQ(none.sum, 0.0);
}

TEST(DeviceFingerprints, WithoutADeviceTheTableIsRefusedWithTheReason) {
  auto t = DeviceFingerprints::Create(16);
  if (t.ok()) GTEST_SKIP() << "a CUDA device is present: tests/gpu covers the table";
#if CRASHREPLAY_HAVE_CUDA
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition) << t.status();
  EXPECT_NE(t.status().message().find("no CUDA device"), std::string::npos) << t.status();
#else
  EXPECT_EQ(t.status().code(), absl::StatusCode::kUnimplemented) << t.status();
#endif
}

}  // namespace
}  // namespace crashreplay::capture
