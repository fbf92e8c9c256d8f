// XXH3-64 (seed 0) for inputs longer than 240 bytes, written once for host
// and device (CR_HD, DESIGN decision 8). It follows the scalar long-input
// path of the XXH3 specification: 8 accumulators, 64-byte stripes, a scramble
// every 16 stripes (1024-byte blocks) with the 192-byte secret, a last
// stripe read from the end, and the merge with the avalanche. The caller
// passes the default secret (libxxhash's XXH3_kSecret, copied at init) so it
// is not restated here. Inputs of 240 bytes or less take other paths and
// are not handled: callers hash those with libxxhash on the host.
// The host build of this code is tested against libxxhash (chunked_hash_test).
#pragma once

#include <cstddef>
#include <cstdint>

#include "crashreplay/base/hd.h"

namespace crashreplay::capture::xxh3 {

inline constexpr size_t kSecretSize = 192;
inline constexpr size_t kMidSizeMax = 240;

CR_HD uint64_t ReadLE64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

CR_HD uint64_t Mul128Fold64(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
  return (a * b) ^ __umul64hi(a, b);
#else
  const unsigned __int128 p = static_cast<unsigned __int128>(a) * b;
  return static_cast<uint64_t>(p) ^ static_cast<uint64_t>(p >> 64);
#endif
}

CR_HD void Accumulate512(uint64_t acc[8], const unsigned char* input, const unsigned char* secret) {
  for (int i = 0; i < 8; ++i) {
    const uint64_t data = ReadLE64(input + 8 * i);
    const uint64_t key = data ^ ReadLE64(secret + 8 * i);
    acc[i ^ 1] += data;
    acc[i] += (key & 0xFFFFFFFFull) * (key >> 32);
  }
}

CR_HD void Scramble(uint64_t acc[8], const unsigned char* secret) {
  for (int i = 0; i < 8; ++i) {
    uint64_t a = acc[i];
    a ^= a >> 47;
    a ^= ReadLE64(secret + 8 * i);
    a *= 0x9E3779B1ull;  // PRIME32_1
    acc[i] = a;
  }
}

// len > kMidSizeMax.
CR_HD uint64_t HashLong64(const unsigned char* input, size_t len, const unsigned char* secret) {
  uint64_t acc[8] = {0xC2B2AE3Dull,         0x9E3779B185EBCA87ull, 0xC2B2AE3D27D4EB4Full, 0x165667B19E3779F9ull,
                     0x85EBCA77C2B2AE63ull, 0x85EBCA77ull,         0x27D4EB2F165667C5ull, 0x9E3779B1ull};
  constexpr size_t kStripe = 64, kStripesPerBlock = (kSecretSize - kStripe) / 8, kBlock = kStripe * kStripesPerBlock;
  const size_t blocks = (len - 1) / kBlock;
  for (size_t b = 0; b < blocks; ++b) {
    for (size_t s = 0; s < kStripesPerBlock; ++s) Accumulate512(acc, input + b * kBlock + s * kStripe, secret + s * 8);
    Scramble(acc, secret + kSecretSize - kStripe);
  }
  const size_t stripes = ((len - 1) - kBlock * blocks) / kStripe;
  for (size_t s = 0; s < stripes; ++s) Accumulate512(acc, input + blocks * kBlock + s * kStripe, secret + s * 8);
  Accumulate512(acc, input + len - kStripe, secret + kSecretSize - kStripe - 7);
  uint64_t result = static_cast<uint64_t>(len) * 0x9E3779B185EBCA87ull;
  for (int i = 0; i < 4; ++i) {
    result +=
        Mul128Fold64(acc[2 * i] ^ ReadLE64(secret + 11 + 16 * i), acc[2 * i + 1] ^ ReadLE64(secret + 11 + 16 * i + 8));
  }
  result ^= result >> 37;
  result *= 0x165667919E3779F9ull;
  result ^= result >> 32;
  return result;
}

}  // namespace crashreplay::capture::xxh3
