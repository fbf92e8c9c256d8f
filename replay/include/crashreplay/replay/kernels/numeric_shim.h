// Element decoders the kernel bodies use, until crashreplay/formats/numeric.h
// lands on main (wip/numerics). TODO(merge): replace this file's body with an
// include of formats/numeric.h + block_quant.h; the names are the same, so the
// kernels do not change. Pure CR_HD functions.
#pragma once

#include <cstdint>
#include <cstring>

#include "crashreplay/base/hd.h"

namespace crashreplay::replay::num {

CR_HD uint32_t FloatBits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
CR_HD float BitsFloat(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

CR_HD float Bf16ToFloat(uint16_t b) { return BitsFloat(static_cast<uint32_t>(b) << 16); }
CR_HD uint16_t FloatToBf16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

CR_HD float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t man = h & 0x3ff;
  if (exp == 0) {
    const float v = static_cast<float>(man) * (1.0f / 16777216.0f);  // man * 2^-24
    return sign ? -v : v;
  }
  if (exp == 31) return BitsFloat(sign | 0x7f800000u | (man << 13));
  return BitsFloat(sign | ((exp + 112) << 23) | (man << 13));
}

// OCP e4m3fn: bias 7, no infinities, S.1111.111 is NaN, max 448.
CR_HD float E4m3ToFloat(uint8_t b) {
  const bool neg = (b & 0x80) != 0;
  const int exp = (b >> 3) & 0xf;
  const int man = b & 7;
  float v;
  if (exp == 15 && man == 7) {
    v = BitsFloat(0x7fc00000u);
  } else if (exp == 0) {
    v = static_cast<float>(man) * (1.0f / 512.0f);  // man * 2^-9
  } else {
    v = BitsFloat(static_cast<uint32_t>(exp + 120) << 23 | static_cast<uint32_t>(man) << 20);
  }
  return neg ? -v : v;
}

// Round to nearest even, saturating to +-448 (as the satfinite conversions do).
CR_HD uint8_t FloatToE4m3(float f) {
  const uint32_t u = FloatBits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7f;
  float a = BitsFloat(u & 0x7fffffffu);
  if (a >= 448.0f) return sign | 0x7e;
  if (a < 0.015625f) {  // below 2^-6: subnormal, step 2^-9
    const float q = a * 512.0f;
    float r = static_cast<float>(static_cast<int>(q));
    const float frac = q - r;
    if (frac > 0.5f || (frac == 0.5f && (static_cast<int>(r) & 1))) r += 1.0f;
    return sign | static_cast<uint8_t>(static_cast<int>(r));  // r == 8 encodes 2^-6 exactly
  }
  // Normal: keep 3 mantissa bits with round-to-nearest-even on the fp32 bits.
  uint32_t b = FloatBits(a);
  const uint32_t lsb = (b >> 20) & 1u;
  b += 0x7ffffu + lsb;
  const int exp = static_cast<int>((b >> 23) & 0xff) - 127 + 7;
  const uint32_t man = (b >> 20) & 7u;
  if (exp > 15 || (exp == 15 && man == 7)) return sign | 0x7e;
  return sign | static_cast<uint8_t>(exp << 3) | static_cast<uint8_t>(man);
}

CR_HD float E2m1ToFloat(uint8_t nibble) {
  const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = mag[nibble & 7];
  return (nibble & 8) ? -v : v;
}

// Nearest e2m1 (ties to even code), saturating at 6.
CR_HD uint8_t FloatToE2m1(float f) {
  const uint8_t sign = f < 0 ? 8 : 0;
  const float a = f < 0 ? -f : f;
  if (!(a == a)) return 7;
  const float mids[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  uint8_t code = 0;
  for (int i = 0; i < 7; ++i) {
    if (a > mids[i] || (a == mids[i] && ((i + 1) & 1) == 0)) code = static_cast<uint8_t>(i + 1);
  }
  return sign | code;
}

// OCP e8m0: 2^(b-127); 0xff is NaN.
CR_HD float E8m0ToFloat(uint8_t b) {
  if (b == 0xff) return BitsFloat(0x7fc00000u);
  if (b == 0) return BitsFloat(0x00400000u);  // 2^-127 (subnormal)
  return BitsFloat(static_cast<uint32_t>(b) << 23);
}

// Smallest power of two >= |f| as e8m0 (the requantization DeepGEMM applies).
CR_HD uint8_t FloatToUe8m0Ceil(float f) {
  uint32_t u = FloatBits(f) & 0x7fffffffu;
  if (u == 0) return 0;
  uint32_t exp = u >> 23;
  if ((u & 0x7fffffu) != 0) exp += 1;
  return exp > 254 ? 254 : static_cast<uint8_t>(exp);
}

// DeepGEMM's UE8M0 layout: a non-negative power of two (or zero) stored as fp32
// has no sign and no mantissa bits.
CR_HD bool IsUe8m0Layout(uint32_t fp32_bits) { return (fp32_bits & 0x807fffffu) == 0; }

}  // namespace crashreplay::replay::num
