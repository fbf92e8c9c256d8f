#include "crashreplay/formats/hash.h"

#include <cstdio>

#define XXH_INLINE_ALL
#include <xxhash.h>

#if defined(__x86_64__)
// libxxhash's runtime-dispatched one-shot hashes pick AVX2/AVX-512 when the
// CPU has them; the inlined code is compiled for the SSE2 baseline and runs
// at about half the speed on tensor-sized inputs (bench/capture_bench.cc).
extern "C" XXH128_hash_t XXH3_128bits_dispatch(const void* input, size_t len);
extern "C" XXH64_hash_t XXH3_64bits_dispatch(const void* input, size_t len);
#define CR_XXH3_128 XXH3_128bits_dispatch
#define CR_XXH3_64 XXH3_64bits_dispatch
#else
#define CR_XXH3_128 XXH3_128bits
#define CR_XXH3_64 XXH3_64bits
#endif

namespace crashreplay {

std::string Hash128::Hex() const {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(high),
                static_cast<unsigned long long>(low));
  return std::string(buf, 32);
}

std::optional<Hash128> Hash128::FromHex(std::string_view hex) {
  if (hex.size() != 32) return std::nullopt;
  uint64_t parts[2] = {0, 0};
  for (size_t i = 0; i < 32; ++i) {
    const char c = hex[i];
    int v;
    if (c >= '0' && c <= '9')
      v = c - '0';
    else if (c >= 'a' && c <= 'f')
      v = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F')
      v = c - 'A' + 10;
    else
      return std::nullopt;
    parts[i / 16] = (parts[i / 16] << 4) | static_cast<uint64_t>(v);
  }
  return Hash128{parts[0], parts[1]};
}

Hash128 XXH128Of(const void* data, size_t size) {
  const XXH128_hash_t h = CR_XXH3_128(data, size);
  return Hash128{h.high64, h.low64};
}

uint64_t XXH64Of(const void* data, size_t size) { return CR_XXH3_64(data, size); }

Hasher128::Hasher128() : state_(XXH3_createState()) { XXH3_128bits_reset(static_cast<XXH3_state_t*>(state_)); }
Hasher128::~Hasher128() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }
void Hasher128::Update(const void* data, size_t size) {
  XXH3_128bits_update(static_cast<XXH3_state_t*>(state_), data, size);
}
Hash128 Hasher128::Digest() const {
  const XXH128_hash_t h = XXH3_128bits_digest(static_cast<XXH3_state_t*>(state_));
  return Hash128{h.high64, h.low64};
}

}  // namespace crashreplay
