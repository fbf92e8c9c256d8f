// Checks every scalar conversion of numeric.h against ml_dtypes (numpy for
// fp16): exhaustively over every code for decoding, and over a dense input set
// (all values, all ties between neighbours, the floats just around them,
// saturation edges, subnormals, NaN, Inf, seeded randoms) for encoding. The
// tables are written at build time by tests/formats/numeric_oracle.py; to
// regenerate them: cmake --build build --target numeric_oracle.
#include "crashreplay/formats/numeric.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

namespace crashreplay {
namespace {

#ifndef CR_NUMERIC_ORACLE_DIR
#error "CR_NUMERIC_ORACLE_DIR must name the oracle table directory (tests/CMakeLists.txt sets it)"
#endif

// Reads a raw little-endian table; empty (and a test failure) if missing.
template <typename T>
std::vector<T> LoadTable(const std::string& name) {
  const std::string path = std::string(CR_NUMERIC_ORACLE_DIR) + "/" + name;
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) {
    ADD_FAILURE() << "oracle table " << path
                  << " is missing; build it with `cmake --build build --target numeric_oracle` "
                     "(needs python3 with ml_dtypes: scripts/setup.sh)";
    return {};
  }
  const std::streamsize bytes = in.tellg();
  if (bytes <= 0 || bytes % static_cast<std::streamsize>(sizeof(T)) != 0) {
    ADD_FAILURE() << "oracle table " << path << " has " << bytes << " bytes, not a whole number of " << sizeof(T)
                  << "-byte entries";
    return {};
  }
  std::vector<T> v(static_cast<size_t>(bytes) / sizeof(T));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()), bytes);
  return v;
}

std::string Hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}

// Same bits, or both NaN with the same sign (NaN payloads are a free choice).
bool SameFloat(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) {
    return std::isnan(a) && std::isnan(b) && std::signbit(a) == std::signbit(b);
  }
  return FloatBits(a) == FloatBits(b);
}

template <typename Decode>
void ExpectDecodeMatchesOracle(const char* table, int codes, Decode decode) {
  const std::vector<float> oracle = LoadTable<float>(table);
  ASSERT_EQ(oracle.size(), static_cast<size_t>(codes)) << table;
  int mismatches = 0;
  for (int c = 0; c < codes && mismatches < 10; ++c) {
    const float got = decode(static_cast<uint32_t>(c));
    if (!SameFloat(got, oracle[c])) {
      ++mismatches;
      ADD_FAILURE() << table << ": code " << Hex(c) << " decodes to " << got << " (" << Hex(FloatBits(got))
                    << "), ml_dtypes says " << oracle[c] << " (" << Hex(FloatBits(oracle[c])) << ")";
    }
  }
}

TEST(NumericDecodeTest, Bf16EveryCodeMatchesMlDtypes) {
  ExpectDecodeMatchesOracle("decode_bf16.f32", 65536, [](uint32_t c) { return Bf16ToFloat(static_cast<uint16_t>(c)); });
}
TEST(NumericDecodeTest, Fp16EveryCodeMatchesNumpy) {
  ExpectDecodeMatchesOracle("decode_fp16.f32", 65536, [](uint32_t c) { return Fp16ToFloat(static_cast<uint16_t>(c)); });
}
TEST(NumericDecodeTest, E4m3EveryCodeMatchesMlDtypes) {
  ExpectDecodeMatchesOracle("decode_e4m3.f32", 256, [](uint32_t c) { return E4m3ToFloat(static_cast<uint8_t>(c)); });
}
TEST(NumericDecodeTest, E5m2EveryCodeMatchesMlDtypes) {
  ExpectDecodeMatchesOracle("decode_e5m2.f32", 256, [](uint32_t c) { return E5m2ToFloat(static_cast<uint8_t>(c)); });
}
TEST(NumericDecodeTest, E8m0EveryCodeMatchesMlDtypes) {
  ExpectDecodeMatchesOracle("decode_e8m0.f32", 256, [](uint32_t c) { return E8m0ToFloat(static_cast<uint8_t>(c)); });
}
TEST(NumericDecodeTest, E2m1EveryCodeMatchesMlDtypes) {
  ExpectDecodeMatchesOracle("decode_e2m1.f32", 16, [](uint32_t c) { return E2m1ToFloat(static_cast<uint8_t>(c)); });
}

// How an oracle code compares with ours when the input is NaN.
enum class NanRule {
  kExact,       // the oracle's NaN code is our NaN code
  kSignedNan,   // any NaN code with the input's sign (numpy keeps payloads)
  kNotOracle,   // the oracle has no NaN rule for this format; ours is tested apart
};

template <typename Code, typename Encode>
void ExpectEncodeMatchesOracle(const std::string& name, NanRule nan_rule, Encode encode, bool (*is_nan_code)(Code)) {
  const std::vector<float> in = LoadTable<float>("encode_" + name + ".in.f32");
  const std::vector<Code> oracle = LoadTable<Code>("encode_" + name + ".out");
  ASSERT_FALSE(in.empty());
  ASSERT_EQ(in.size(), oracle.size()) << name;
  int mismatches = 0;
  size_t matched = 0;
  for (size_t i = 0; i < in.size() && mismatches < 10; ++i) {
    const Code got = encode(in[i]);
    bool ok = got == oracle[i];
    if (std::isnan(in[i])) {
      switch (nan_rule) {
        case NanRule::kExact: break;
        case NanRule::kSignedNan:
          ok = is_nan_code(got) && is_nan_code(oracle[i]) &&
               got >> (8 * sizeof(Code) - 1) == oracle[i] >> (8 * sizeof(Code) - 1);
          break;
        case NanRule::kNotOracle: ok = true; break;
      }
    }
    matched += ok ? 1 : 0;
    if (!ok) {
      ++mismatches;
      ADD_FAILURE() << name << ": input " << in[i] << " (" << Hex(FloatBits(in[i])) << ") encodes to " << Hex(got)
                    << ", oracle says " << Hex(oracle[i]);
    }
  }
  // The table is dense: guard against an accidentally tiny one.
  EXPECT_GT(matched, 1000u) << name;
}

bool IsNanBf16(uint16_t c) { return (c & 0x7fffu) > 0x7f80u; }
bool IsNanFp16(uint16_t c) { return (c & 0x7fffu) > 0x7c00u; }
bool IsNanE4m3(uint8_t c) { return (c & 0x7fu) == 0x7fu; }
bool IsNanE5m2(uint8_t c) { return (c & 0x7fu) > 0x7cu; }
bool IsNanE8m0(uint8_t c) { return c == 0xffu; }
bool NeverNan(uint8_t) { return false; }

TEST(NumericEncodeTest, Bf16MatchesMlDtypesOnDenseInputs) {
  ExpectEncodeMatchesOracle<uint16_t>("bf16", NanRule::kExact, FloatToBf16, IsNanBf16);
}
TEST(NumericEncodeTest, Fp16MatchesNumpyOnDenseInputs) {
  ExpectEncodeMatchesOracle<uint16_t>("fp16", NanRule::kSignedNan, FloatToFp16, IsNanFp16);
}
TEST(NumericEncodeTest, E4m3MatchesMlDtypesOfClippedInput) {
  ExpectEncodeMatchesOracle<uint8_t>("e4m3", NanRule::kExact, FloatToE4m3, IsNanE4m3);
}
TEST(NumericEncodeTest, E5m2MatchesMlDtypesIncludingOverflowToInf) {
  ExpectEncodeMatchesOracle<uint8_t>("e5m2", NanRule::kExact, FloatToE5m2, IsNanE5m2);
}
TEST(NumericEncodeTest, E5m2SaturateMatchesMlDtypesOfClippedInput) {
  ExpectEncodeMatchesOracle<uint8_t>("e5m2sat", NanRule::kExact, FloatToE5m2Saturate, IsNanE5m2);
}
TEST(NumericEncodeTest, E2m1MatchesMlDtypesOfClippedInput) {
  ExpectEncodeMatchesOracle<uint8_t>("e2m1", NanRule::kNotOracle, FloatToE2m1, NeverNan);
}
TEST(NumericEncodeTest, E8m0FloorMatchesFrexpOracle) {
  ExpectEncodeMatchesOracle<uint8_t>("e8m0floor", NanRule::kExact, FloatToE8m0Floor, IsNanE8m0);
}
TEST(NumericEncodeTest, Ue8m0CeilMatchesFrexpOracle) {
  ExpectEncodeMatchesOracle<uint8_t>("e8m0ceil", NanRule::kExact, FloatToUe8m0Ceil, IsNanE8m0);
}

// ------------------------------------------------- round trips and rules

TEST(NumericRoundTripTest, EveryNonNanCodeSurvivesDecodeEncode) {
  for (uint32_t c = 0; c < 65536; ++c) {
    const auto h = static_cast<uint16_t>(c);
    if (!IsNanBf16(h)) {
      EXPECT_EQ(FloatToBf16(Bf16ToFloat(h)), h) << Hex(c);
    }
    if (!IsNanFp16(h)) {
      EXPECT_EQ(FloatToFp16(Fp16ToFloat(h)), h) << Hex(c);
    }
  }
  for (uint32_t c = 0; c < 256; ++c) {
    const auto b = static_cast<uint8_t>(c);
    if (!IsNanE4m3(b)) {
      EXPECT_EQ(FloatToE4m3(E4m3ToFloat(b)), b) << Hex(c);
    }
    if (!IsNanE5m2(b)) {
      EXPECT_EQ(FloatToE5m2(E5m2ToFloat(b)), b) << Hex(c);
      if ((b & 0x7fu) != 0x7cu) {
        EXPECT_EQ(FloatToE5m2Saturate(E5m2ToFloat(b)), b) << Hex(c);
      }
    }
    // e8m0 values are powers of two: floor and ceil of log2 both give them back.
    EXPECT_EQ(FloatToE8m0Floor(E8m0ToFloat(b)), b) << Hex(c);
    EXPECT_EQ(FloatToUe8m0Ceil(E8m0ToFloat(b)), b) << Hex(c);
  }
  for (uint8_t n = 0; n < 16; ++n) EXPECT_EQ(FloatToE2m1(E2m1ToFloat(n)), n) << int{n};
}

TEST(NumericRuleTest, E4m3SaturatesAt448InsteadOfNan) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(E4m3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(FloatToE4m3(464.0f), 0x7e);  // tie with the (absent) 480 would be NaN in ml_dtypes
  EXPECT_EQ(FloatToE4m3(480.0f), 0x7e);  // would be code 0x7f, the NaN
  EXPECT_EQ(FloatToE4m3(1e30f), 0x7e);
  EXPECT_EQ(FloatToE4m3(inf), 0x7e);
  EXPECT_EQ(FloatToE4m3(-inf), 0xfe);
  EXPECT_EQ(FloatToE4m3(std::nanf("")), 0x7f);
  EXPECT_EQ(FloatToE4m3(-std::nanf("")), 0xff);
}

TEST(NumericRuleTest, E5m2OverflowsToInfAndSaturatingVariantStops) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToE5m2(57344.0f), 0x7b);
  EXPECT_EQ(FloatToE5m2(61439.996f), 0x7b);  // just below the tie
  EXPECT_EQ(FloatToE5m2(61440.0f), 0x7c);    // the tie rounds to even: Inf
  EXPECT_EQ(FloatToE5m2(-inf), 0xfc);
  EXPECT_EQ(FloatToE5m2Saturate(61440.0f), 0x7b);
  EXPECT_EQ(FloatToE5m2Saturate(-inf), 0xfb);
  EXPECT_EQ(FloatToE5m2(std::nanf("")), 0x7e);
  EXPECT_EQ(FloatToE5m2Saturate(-std::nanf("")), 0xfe);
  EXPECT_TRUE(std::isinf(E5m2ToFloat(0x7c)));
  EXPECT_TRUE(std::isnan(E5m2ToFloat(0x7d)));
}

TEST(NumericRuleTest, SubnormalsRoundToNearestEven) {
  // e4m3's smallest subnormal is 2^-9; half of it is a tie that goes to 0.
  EXPECT_EQ(E4m3ToFloat(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(FloatToE4m3(std::ldexp(1.0f, -10)), 0x00);
  EXPECT_EQ(FloatToE4m3(std::nextafter(std::ldexp(1.0f, -10), 1.0f)), 0x01);
  EXPECT_EQ(FloatToE4m3(std::ldexp(3.0f, -10)), 0x02);  // 1.5 units: tie, to even (2)
  // The largest subnormal 7 * 2^-9 plus half a unit carries into the first normal.
  EXPECT_EQ(FloatToE4m3(std::ldexp(7.5f, -9)), 0x08);
  EXPECT_EQ(Fp16ToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(FloatToBf16(std::ldexp(1.0f, -149)), 0x0000);  // tie below bf16's 2^-133 unit
}

TEST(NumericRuleTest, E2m1TiesGoToEvenCodes) {
  EXPECT_EQ(FloatToE2m1(0.25f), 0x0);  // 0 | 0.5
  EXPECT_EQ(FloatToE2m1(0.75f), 0x2);  // 0.5 | 1.0
  EXPECT_EQ(FloatToE2m1(1.25f), 0x2);  // 1.0 | 1.5
  EXPECT_EQ(FloatToE2m1(1.75f), 0x4);  // 1.5 | 2.0
  EXPECT_EQ(FloatToE2m1(2.5f), 0x4);   // 2 | 3
  EXPECT_EQ(FloatToE2m1(3.5f), 0x6);   // 3 | 4
  EXPECT_EQ(FloatToE2m1(5.0f), 0x6);   // 4 | 6
  EXPECT_EQ(FloatToE2m1(-5.0f), 0xe);
  EXPECT_EQ(FloatToE2m1(100.0f), 0x7);
  EXPECT_EQ(FloatToE2m1(-std::numeric_limits<float>::infinity()), 0xf);
  EXPECT_EQ(FloatToE2m1(std::nanf("")), 0x7);
  EXPECT_EQ(FloatToE2m1(-std::nanf("")), 0x7);
}

TEST(NumericRuleTest, NegativeZeroAndTinyNegativesKeepTheirSign) {
  EXPECT_EQ(FloatToE4m3(-0.0f), 0x80);
  EXPECT_EQ(FloatToE4m3(-1e-30f), 0x80);
  EXPECT_EQ(FloatToE5m2(-1e-30f), 0x80);
  EXPECT_EQ(FloatToE2m1(-0.1f), 0x8);
  EXPECT_EQ(FloatToFp16(-1e-30f), 0x8000);
  EXPECT_EQ(FloatToBf16(-0.0f), 0x8000);
  EXPECT_TRUE(std::signbit(E2m1ToFloat(0x8)));
  EXPECT_EQ(E2m1ToFloat(0x8), 0.0f);
}

TEST(NumericRuleTest, NanEncodingsAreCanonicalAndSigned) {
  const float qnan = std::nanf("");
  const float snan = BitsToFloat(0x7f800001u);
  EXPECT_EQ(FloatToBf16(snan), 0x7fc0);
  EXPECT_EQ(FloatToBf16(-qnan), 0xffc0);
  EXPECT_EQ(FloatToFp16(snan), 0x7e00);
  EXPECT_EQ(FloatToFp16(-qnan), 0xfe00);
  EXPECT_EQ(FloatToE8m0Floor(qnan), 0xff);
  EXPECT_EQ(FloatToUe8m0Ceil(qnan), 0xff);
  EXPECT_TRUE(std::isnan(E8m0ToFloat(0xff)));
  EXPECT_TRUE(std::signbit(E4m3ToFloat(0xff)));
}

TEST(Ue8m0Test, CeilAndFloorAgreeOnPowersAndSplitBetweenThem) {
  for (int k = -126; k <= 127; ++k) {
    const float p = std::ldexp(1.0f, k);
    EXPECT_EQ(FloatToUe8m0Ceil(p), k + 127) << k;
    EXPECT_EQ(FloatToE8m0Floor(p), k + 127) << k;
    if (k < 127) {
      // Anything strictly between 2^k and 2^(k+1).
      for (float x : {std::nextafter(p, 2 * p), 1.5f * p, std::nextafter(2 * p, p)}) {
        EXPECT_EQ(FloatToE8m0Floor(x), k + 127) << x;
        EXPECT_EQ(FloatToUe8m0Ceil(x), k + 128) << x;
      }
    }
  }
  // DeepGEMM's example: a block amax of 300 -> 300/448 = 0.67 -> scale 1.0.
  EXPECT_EQ(E8m0ToFloat(FloatToUe8m0Ceil(300.0f / 448.0f)), 1.0f);
  EXPECT_EQ(E8m0ToFloat(FloatToE8m0Floor(300.0f / 448.0f)), 0.5f);
}

TEST(Ue8m0Test, EdgesOfTheRange) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToUe8m0Ceil(0.0f), 0x00);
  EXPECT_EQ(FloatToE8m0Floor(-0.0f), 0x00);
  EXPECT_EQ(FloatToUe8m0Ceil(-1.0f), 0xff);  // e8m0 is unsigned
  EXPECT_EQ(FloatToE8m0Floor(-1.0f), 0xff);
  EXPECT_EQ(FloatToUe8m0Ceil(inf), 0xff);
  EXPECT_EQ(FloatToUe8m0Ceil(std::ldexp(1.0f, 127) * 1.5f), 0xff);  // would need 2^128
  EXPECT_EQ(FloatToE8m0Floor(std::ldexp(1.0f, 127) * 1.5f), 0xfe);
  EXPECT_EQ(FloatToUe8m0Ceil(std::ldexp(1.0f, -127)), 0x00);
  EXPECT_EQ(FloatToUe8m0Ceil(std::ldexp(1.0f, -140)), 0x00);
  EXPECT_EQ(FloatToUe8m0Ceil(std::ldexp(1.5f, -127)), 0x01);
  EXPECT_EQ(FloatToE8m0Floor(std::ldexp(1.5f, -127)), 0x00);
  EXPECT_EQ(FloatToE8m0Floor(std::ldexp(1.0f, -149)), 0x00);
  EXPECT_EQ(E8m0ToFloat(0x00), std::ldexp(1.0f, -127));
  EXPECT_EQ(E8m0ToFloat(0xfe), std::ldexp(1.0f, 127));
}

TEST(Ue8m0Test, LayoutCheckAcceptsOnlyPositivePowersOfTwo) {
  EXPECT_TRUE(IsUe8m0Layout(FloatBits(1.0f)));
  EXPECT_TRUE(IsUe8m0Layout(FloatBits(std::ldexp(1.0f, -20))));
  EXPECT_TRUE(IsUe8m0Layout(FloatBits(std::ldexp(1.0f, 127))));
  EXPECT_TRUE(IsUe8m0Layout(0u));           // +0: no mantissa or sign bits
  EXPECT_TRUE(IsUe8m0Layout(0x7f800000u));  // +Inf: all exponent bits
  EXPECT_FALSE(IsUe8m0Layout(FloatBits(0.75f)));
  EXPECT_FALSE(IsUe8m0Layout(FloatBits(-2.0f)));
  EXPECT_FALSE(IsUe8m0Layout(FloatBits(300.0f / 448.0f)));
  EXPECT_FALSE(IsUe8m0Layout(FloatBits(std::nanf(""))));
  EXPECT_FALSE(IsUe8m0Layout(FloatBits(E8m0ToFloat(0x00))));  // 2^-127 is subnormal
  // Every e8m0 code from 1 to 254 decodes into the layout, and IsUe8m0Layout
  // agrees with the bits the ceil conversion produces.
  for (int c = 1; c < 255; ++c) {
    EXPECT_TRUE(IsUe8m0Layout(FloatBits(E8m0ToFloat(static_cast<uint8_t>(c))))) << c;
  }
}

TEST(Ue8m0Test, ExactPow2MatchesLdexpAndInvertsEveryScale) {
  for (int k = -127; k <= 127; ++k) EXPECT_EQ(ExactPow2(k), std::ldexp(1.0f, k)) << k;
  for (int c = 0; c < 255; ++c) {
    EXPECT_EQ(E8m0ToFloat(static_cast<uint8_t>(c)) * ExactPow2(127 - c), 1.0f) << c;
  }
}

TEST(PackingTest, Ue8m0WordHoldsElementZeroInTheLowByte) {
  const uint32_t w = PackUe8m0x4(0x7f, 0x80, 0x01, 0xfe);
  EXPECT_EQ(w, 0xfe01807fu);
  EXPECT_EQ(UnpackUe8m0(w, 0), 0x7f);
  EXPECT_EQ(UnpackUe8m0(w, 1), 0x80);
  EXPECT_EQ(UnpackUe8m0(w, 2), 0x01);
  EXPECT_EQ(UnpackUe8m0(w, 3), 0xfe);
}

TEST(PackingTest, E2m1EvenElementLivesInTheLowNibble) {
  uint8_t buf[3] = {0xaa, 0xaa, 0xaa};
  SetNibble(buf, 0, 0x1);
  SetNibble(buf, 1, 0x2);
  SetNibble(buf, 4, 0xf);
  EXPECT_EQ(buf[0], 0x21);
  EXPECT_EQ(buf[1], 0xaa);  // untouched
  EXPECT_EQ(buf[2], 0xaf);  // element 4 is the low nibble of byte 2
  EXPECT_EQ(GetNibble(buf, 0), 0x1);
  EXPECT_EQ(GetNibble(buf, 1), 0x2);
  EXPECT_EQ(GetNibble(buf, 5), 0xa);
  EXPECT_EQ(PackE2m1x2(0x3, 0xc), 0xc3);
  SetNibble(buf, 1, 0x1f);  // only the low 4 bits of the value are stored
  EXPECT_EQ(buf[0], 0xf1);
}

}  // namespace
}  // namespace crashreplay
