// StreamCopy: memcpy with streaming (non-temporal) stores for the body
// (internal). For copies whose destination another thread reads next: the
// stores write whole cache lines without first reading them into this
// core's cache (no read-for-ownership), and leave this core's cache to the
// caller's own data. Streaming stores are weakly ordered: call
// StreamFence() after the last StreamCopy and before the release store (a
// head index, a mutex) that publishes the bytes. Falls back to memcpy
// where SSE2 is not available.
#pragma once

#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace crashreplay::capture::internal {

inline void StreamCopy(void* dst_v, const void* src_v, size_t n) {
#if defined(__SSE2__)
  char* d = static_cast<char*>(dst_v);
  const char* s = static_cast<const char*>(src_v);
  const size_t head = std::min(n, (64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63);
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  const size_t body = n & ~size_t{63};
  for (size_t i = 0; i < body; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  std::memcpy(d + body, s + body, n - body);
#else
  std::memcpy(dst_v, src_v, n);
#endif
}

inline void StreamFence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

}  // namespace crashreplay::capture::internal
