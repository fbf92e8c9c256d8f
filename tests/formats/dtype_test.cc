#include "crashreplay/formats/dtype.h"

#include <gtest/gtest.h>

#include "crashreplay/formats/hash.h"

namespace crashreplay {
namespace {

TEST(DTypeTest, NamesRoundTripForEveryType) {
  for (int i = 0; i < kNumDTypes; ++i) {
    const DType t = static_cast<DType>(i);
    auto parsed = ParseDType(DTypeName(t));
    ASSERT_TRUE(parsed.has_value()) << DTypeName(t);
    EXPECT_EQ(*parsed, t);
  }
  EXPECT_FALSE(ParseDType("F8_E4M3FNUZ").has_value());
}

TEST(DTypeTest, PackedFp4RoundsBytesUp) {
  EXPECT_EQ(DTypeBytes(DType::kF4E2M1, 3), 2u);
  EXPECT_EQ(DTypeBytes(DType::kBF16, 3), 6u);
  EXPECT_EQ(DTypeBytes(DType::kI64, 2), 16u);
}

TEST(HashTest, CanonicalHexMatchesXxhsum) {
  // `printf abc | xxhsum -H2` prints 06b05ab6733a618578af5f94892f3950.
  const Hash128 h = XXH128Of("abc", 3);
  EXPECT_EQ(h.Hex(), "06b05ab6733a618578af5f94892f3950");
  EXPECT_EQ(Hash128::FromHex(h.Hex()), h);
  EXPECT_FALSE(Hash128::FromHex("xyz").has_value());
}

TEST(HashTest, StreamingEqualsOneShot) {
  Hasher128 hasher;
  hasher.Update("ab", 2);
  hasher.Update("c", 1);
  EXPECT_EQ(hasher.Digest(), XXH128Of("abc", 3));
}

}  // namespace
}  // namespace crashreplay
