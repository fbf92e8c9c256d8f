// StreamCopy: memcpy with streaming (non-temporal) stores for the body
// (internal). For copies whose destination another thread reads next: the
// stores write whole cache lines without first reading them into this
// core's cache (no read-for-ownership), and leave this core's cache to the
// caller's own data. Streaming stores are weakly ordered: call
// StreamFence() after the last StreamCopy and before the release store (a
// head index, a mutex) that publishes the bytes. Falls back to memcpy
// where SSE2 is not available.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
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

// CopyShort: memcpy for a short piece (a request id, a name) with
// fixed-size copies inlined, no library call: overlapping head and tail
// copies cover every length of a size class. Longer pieces go to memcpy.
inline void CopyShort(char* d, const char* s, size_t n) {
  if (n > 64) {
    std::memcpy(d, s, n);
  } else if (n >= 16) {
    for (size_t i = 0; i + 16 < n; i += 16) std::memcpy(d + i, s + i, 16);
    std::memcpy(d + n - 16, s + n - 16, 16);
  } else if (n >= 8) {
    uint64_t a, b;
    std::memcpy(&a, s, 8);
    std::memcpy(&b, s + n - 8, 8);
    std::memcpy(d, &a, 8);
    std::memcpy(d + n - 8, &b, 8);
  } else if (n >= 4) {
    uint32_t a, b;
    std::memcpy(&a, s, 4);
    std::memcpy(&b, s + n - 4, 4);
    std::memcpy(d, &a, 4);
    std::memcpy(d + n - 4, &b, 4);
  } else if (n > 0) {
    d[0] = s[0];
    d[n / 2] = s[n / 2];
    d[n - 1] = s[n - 1];
  }
}

// LineStream: writes a record made of many pieces (headers, lists, short
// strings) to a cache-line-aligned destination as whole streamed lines
// only. Pieces are gathered in a line held here until it is complete, so no
// line of the destination is ever written twice or in part (a partial store
// would first read the line in, from memory or from the core that holds
// it). Short pieces (up to a line: request ids, names) are copied inline,
// with no call. Finish() zero-fills and streams the last partial line; call
// StreamFence() before publishing.
class LineStream {
 public:
  explicit LineStream(void* dst) : out_(static_cast<char*>(dst)), start_(out_) {}

  void Put(const void* src, size_t n) {
    const char* s = static_cast<const char*>(src);
    if (n <= 64) {
      CopyShort(line_ + fill_, s, n);  // fill_ < 64, so it fits in the two lines held
      fill_ += n;
      if (fill_ >= 64) {
        Line(line_);
        fill_ -= 64;
        std::memcpy(line_, line_ + 64, 64);
      }
      return;
    }
    if (fill_ > 0) {
      const size_t k = 64 - fill_;
      std::memcpy(line_ + fill_, s, k);
      Line(line_);
      s += k;
      n -= k;
    }
    for (; n >= 64; n -= 64, s += 64) Line(s);
    std::memcpy(line_, s, n);
    fill_ = n;
  }
  // `n` zero bytes (alignment padding inside the record).
  void Zero(size_t n) {
    static constexpr char kZeros[64] = {};
    for (; n > 0;) {
      const size_t k = std::min(n, sizeof kZeros);
      Put(kZeros, k);
      n -= k;
    }
  }
  // Bytes put so far.
  size_t offset() const { return static_cast<size_t>(out_ - start_) + fill_; }
  void Finish() {
    if (fill_ == 0) return;
    std::memset(line_ + fill_, 0, 64 - fill_);
    Line(line_);
    fill_ = 0;
  }

 private:
  void Line(const char* s) {
#if defined(__SSE2__)
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(out_), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(out_ + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(out_ + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(out_ + 48), e);
#else
    std::memcpy(out_, s, 64);
#endif
    out_ += 64;
  }

  alignas(64) char line_[128];  // the line being gathered, and room for a short piece that completes it
  size_t fill_ = 0;             // < 64 between calls
  char* out_;
  const char* const start_;
};

inline void StreamFence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

}  // namespace crashreplay::capture::internal
