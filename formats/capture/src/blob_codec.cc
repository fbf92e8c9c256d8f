#include "crashreplay/formats/blob_codec.h"

// ZSTD_c_literalCompressionMode is in zstd's advanced API (stable since
// 1.5.0 in practice; an older libzstd refuses it and level 1 is used).
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cstring>
#include <memory>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/str_format.h"

namespace crashreplay {

void ShuffleBytePlanes(const unsigned char* in, size_t size, size_t k, unsigned char* out) {
  const size_t n = size / k;
  if (k == 2) {  // the common case (bf16/fp16)
    unsigned char* lo = out;
    unsigned char* hi = out + n;
    size_t i = 0;
#if defined(__SSE2__)
    // 16 elements per iteration: mask/shift the bytes into 16-bit lanes and
    // pack them (the scalar loop ran at about 0.5 GB/s).
    const __m128i mask = _mm_set1_epi16(0x00ff);
    for (; i + 16 <= n; i += 16) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i + 16));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(lo + i),
                       _mm_packus_epi16(_mm_and_si128(a, mask), _mm_and_si128(b, mask)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(hi + i),
                       _mm_packus_epi16(_mm_srli_epi16(a, 8), _mm_srli_epi16(b, 8)));
    }
#endif
    for (; i < n; ++i) {
      lo[i] = in[2 * i];
      hi[i] = in[2 * i + 1];
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      for (size_t p = 0; p < k; ++p) out[p * n + i] = in[i * k + p];
    }
  }
  if (size > n * k) std::memcpy(out + n * k, in + n * k, size - n * k);
}

void UnshuffleBytePlanes(const unsigned char* in, size_t size, size_t k, unsigned char* out) {
  const size_t n = size / k;
  if (k == 2) {
    const unsigned char* lo = in;
    const unsigned char* hi = in + n;
    size_t i = 0;
#if defined(__SSE2__)
    for (; i + 16 <= n; i += 16) {
      const __m128i l = _mm_loadu_si128(reinterpret_cast<const __m128i*>(lo + i));
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi + i));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), _mm_unpacklo_epi8(l, h));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i + 16), _mm_unpackhi_epi8(l, h));
    }
#endif
    for (; i < n; ++i) {
      out[2 * i] = lo[i];
      out[2 * i + 1] = hi[i];
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      for (size_t p = 0; p < k; ++p) out[i * k + p] = in[p * n + i];
    }
  }
  if (size > n * k) std::memcpy(out + n * k, in + n * k, size - n * k);
}

namespace {

// One compression context per thread, reused: ZSTD_compress() creates and
// frees one (hundreds of KiB of tables) on every call.
ZSTD_CCtx* ThreadCCtx() {
  struct Free {
    void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
  };
  thread_local std::unique_ptr<ZSTD_CCtx, Free> cctx(ZSTD_createCCtx());
  return cctx.get();
}

// Plane p of the byte-plane shuffle for m elements of k bytes:
// out[i] = in[i * k + p].
void ExtractBytePlane(const unsigned char* in, size_t m, size_t k, size_t p, unsigned char* out) {
  size_t i = 0;
#if defined(__SSE2__)
  if (k == 2) {  // as ShuffleBytePlanes: 16 elements per iteration
    const __m128i mask = _mm_set1_epi16(0x00ff);
    for (; i + 16 <= m; i += 16) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i + 16));
      const __m128i v = p == 0 ? _mm_packus_epi16(_mm_and_si128(a, mask), _mm_and_si128(b, mask))
                               : _mm_packus_epi16(_mm_srli_epi16(a, 8), _mm_srli_epi16(b, 8));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), v);
    }
  }
#endif
  for (; i < m; ++i) out[i] = in[i * k + p];
}

// The shuffle and the compressor's output go through two small per-thread
// buffers, a chunk at a time, so that they stay in this core's cache and a
// blob of any size needs no scratch of its own size (a fresh 256 MiB buffer
// cost about 160 ms in page faults here, more than compressing it).
constexpr size_t kChunk = 256 << 10;

// Streams `raw` into one zstd frame that states its content size, plane by
// plane when `k` >= 2 (the byte-plane shuffle, without materialising it),
// into `*out` from byte `pos` on (what `*out` held past `pos` is
// overwritten or cut off). False when zstd fails (then `*out` holds
// whatever it had written).
bool CompressPlanes(const unsigned char* src, size_t size, size_t k, const BlobEncodeOptions& options, size_t pos,
                    std::vector<unsigned char>* out) {
  ZSTD_CCtx* c = ThreadCCtx();
  if (c == nullptr) return false;
  ZSTD_CCtx_reset(c, ZSTD_reset_session_and_parameters);
  const bool planes = k >= 2;
  int level = options.zstd_level;
  if (planes && options.plane_level != 0) {
    // Float planes are one part structure (sign, exponent) and one part
    // noise: matches gain next to nothing, Huffman-coded literals gain the
    // most. zstd's negative levels look for matches only every few hundred
    // bytes (a long run is still found) but leave literals uncoded, so
    // literal coding is asked for explicitly. If this libzstd does not
    // take the request, level 1 as before.
    level = options.plane_level;
    if (ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_literalCompressionMode, ZSTD_ps_enable))) {
      level = options.zstd_level;
    }
  }
  if (ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, level)) ||
      ZSTD_isError(ZSTD_CCtx_setPledgedSrcSize(c, size))) {
    return false;
  }
  thread_local std::unique_ptr<unsigned char[]> plane_buf(new unsigned char[kChunk]);
  thread_local std::unique_ptr<unsigned char[]> out_buf(new unsigned char[kChunk]);
  // The frame goes straight into `*out` past `pos` while its size lasts (a
  // reused buffer: its old bytes are overwritten in place), then through
  // out_buf, appended a chunk at a time.
  bool direct = pos < out->size();
  ZSTD_outBuffer o = direct ? ZSTD_outBuffer{out->data(), out->size(), pos} : ZSTD_outBuffer{out_buf.get(), kChunk, 0};
  auto flush = [&] {
    if (!direct) {
      out->insert(out->end(), out_buf.get(), out_buf.get() + o.pos);
      o.pos = 0;
    } else if (o.pos == o.size) {
      direct = false;
      o = ZSTD_outBuffer{out_buf.get(), kChunk, 0};
    }
  };
  auto feed = [&](const unsigned char* p, size_t n, ZSTD_EndDirective end) {
    ZSTD_inBuffer in{p, n, 0};
    for (;;) {
      const size_t left = ZSTD_compressStream2(c, &o, &in, end);
      if (ZSTD_isError(left)) return false;
      if (o.pos == o.size || (end == ZSTD_e_end && left == 0)) flush();
      if (end == ZSTD_e_end ? left == 0 : in.pos == in.size) return true;
    }
  };
  auto finish = [&](const unsigned char* p, size_t n) {
    if (!feed(p, n, ZSTD_e_end)) return false;
    if (direct) out->resize(o.pos);
    return true;
  };
  if (!planes) return finish(src, size);
  const size_t n = size / k;
  const size_t per_chunk = kChunk;  // elements of one plane per chunk
  for (size_t p = 0; p < k; ++p) {
    for (size_t i = 0; i < n; i += per_chunk) {
      const size_t m = std::min(per_chunk, n - i);
      ExtractBytePlane(src + i * k, m, k, p, plane_buf.get());
      if (!feed(plane_buf.get(), m, ZSTD_e_continue)) return false;
    }
  }
  return finish(src + n * k, size - n * k);  // the tail bytes, as they are
}

}  // namespace

std::vector<unsigned char> EncodeBlobPayload(std::span<const std::byte> raw, const Hash128& hash, size_t element_size,
                                             const BlobEncodeOptions& options, size_t headroom,
                                             std::vector<unsigned char> storage) {
  const auto* src = reinterpret_cast<const unsigned char*>(raw.data());
  const size_t size = raw.size();
  BlobHeader header;
  header.raw_size = size;
  header.hash = hash;
  const bool shuffle = options.byte_plane_shuffle && element_size >= 2 && element_size <= 16 && size >= element_size;
  const size_t front = headroom + kBlobHeaderSize;
  // Reserved at zstd's bound and written once: pages past what the frame
  // fills are never touched (so never resident), and nothing is copied
  // again when the vector would otherwise grow. `storage` whose capacity
  // suffices is written in place: its pages are resident already, where a
  // fresh allocation takes a page fault and a page clearing per 4 KiB
  // written (docs/capture.md, "Writer and snapshot encoder against zstd").
  // Its old bytes are overwritten where they stand, without clearing
  // them first.
  std::vector<unsigned char> out = std::move(storage);
  const size_t need = front + ZSTD_compressBound(size);
  if (out.capacity() < need || out.size() < front) out.clear();  // nothing to keep while reserve copies
  out.reserve(need);
  if (out.empty()) {
    out.resize(front);
  } else {
    std::memset(out.data(), 0, front);
  }
  const bool compressed = CompressPlanes(src, size, shuffle ? element_size : 1, options, front, &out);
  const size_t csize = out.size() - front;
  const bool use_zstd =
      compressed && static_cast<double>(csize) <= static_cast<double>(size) * (1.0 - options.min_saving);
  if (use_zstd) {
    header.codec = BlobCodec::kZstd;
    if (shuffle) {
      header.transform = BlobTransform::kBytePlaneShuffle;
      header.element_size = static_cast<uint8_t>(element_size);
    }
  } else {
    // Stored as is, unshuffled: a reader then needs no work.
    header.codec = BlobCodec::kNone;
    out.resize(front);
    out.insert(out.end(), src, src + size);
  }
  EncodeBlobHeader(header, out.data() + headroom);
  return out;
}

std::vector<unsigned char> EncodeBlobPayloadHashing(std::span<const std::byte> raw, size_t element_size,
                                                    const BlobEncodeOptions& options, size_t headroom, Hash128* hash,
                                                    std::vector<unsigned char> storage) {
  // A thread costs some tens of microseconds to start: worth it only when
  // hashing takes a millisecond or more (XXH3-128 runs at about 6 GB/s).
  constexpr size_t kHashAsideFrom = 4 << 20;
  std::thread aside;
  if (raw.size() >= kHashAsideFrom) {
    try {
      aside = std::thread([raw, hash] { *hash = XXH128Of(raw); });
    } catch (const std::system_error&) {  // no thread to be had: hash here
    }
  }
  if (!aside.joinable()) *hash = XXH128Of(raw);
  std::vector<unsigned char> out =
      EncodeBlobPayload(raw, Hash128{}, element_size, options, headroom, std::move(storage));
  if (aside.joinable()) aside.join();
  // The header is written last, with the hash in it.
  BlobHeader header;
  const absl::Status parsed = ParseBlobHeader(out.data() + headroom, out.size() - headroom, &header);
  (void)parsed;  // our own encoding: always parses
  header.hash = *hash;
  EncodeBlobHeader(header, out.data() + headroom);
  return out;
}

absl::StatusOr<std::vector<std::byte>> DecodeBlobPayload(const unsigned char* payload, size_t size,
                                                         uint64_t max_raw_size) {
  BlobHeader h;
  if (absl::Status s = ParseBlobHeader(payload, size, &h); !s.ok()) return s;
  if (h.raw_size > max_raw_size) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("blob %s declares %d decoded bytes, over the reader's cap of %d (raise CaptureLimits."
                        "max_blob_raw_size if the file is trusted)",
                        h.hash.Hex(), h.raw_size, max_raw_size));
  }
  const unsigned char* body = payload + kBlobHeaderSize;
  const size_t body_size = size - kBlobHeaderSize;
  std::vector<std::byte> out;
  if (h.codec == BlobCodec::kNone) {
    out.resize(body_size);
    if (body_size > 0) std::memcpy(out.data(), body, body_size);
  } else {
    // zstd's frame header states the content size; it must match what the
    // blob header declared, so a small frame cannot claim a huge output
    // (and a huge output cannot hide behind a small declared size).
    const unsigned long long content = ZSTD_getFrameContentSize(body, body_size);
    if (content == ZSTD_CONTENTSIZE_ERROR || content == ZSTD_CONTENTSIZE_UNKNOWN) {
      return absl::DataLossError(
          absl::StrFormat("blob %s: zstd frame header is invalid or does not state its decoded size", h.hash.Hex()));
    }
    if (content != h.raw_size) {
      return absl::DataLossError(absl::StrFormat("blob %s: zstd frame says %d decoded bytes, the blob header %d",
                                                 h.hash.Hex(), content, h.raw_size));
    }
    const bool shuffled = h.transform == BlobTransform::kBytePlaneShuffle;
    out.resize(h.raw_size);
    std::vector<unsigned char> scratch(shuffled ? h.raw_size : 0);
    unsigned char* dst = shuffled ? scratch.data() : reinterpret_cast<unsigned char*>(out.data());
    std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> dctx(ZSTD_createDCtx(), ZSTD_freeDCtx);
    if (!dctx) return absl::ResourceExhaustedError("cannot allocate a zstd decompression context");
    // Bound the window so a hostile frame cannot make zstd allocate more
    // than the output itself needs (plus its default 128 MiB ceiling).
    ZSTD_DCtx_setParameter(dctx.get(), ZSTD_d_windowLogMax, 27);
    const size_t got = ZSTD_decompressDCtx(dctx.get(), dst, h.raw_size, body, body_size);
    if (ZSTD_isError(got)) {
      return absl::DataLossError(
          absl::StrFormat("blob %s: zstd cannot decode it (%s)", h.hash.Hex(), ZSTD_getErrorName(got)));
    }
    if (got != h.raw_size) {
      return absl::DataLossError(
          absl::StrFormat("blob %s: decoded %d bytes, the header declares %d", h.hash.Hex(), got, h.raw_size));
    }
    if (shuffled) {
      UnshuffleBytePlanes(scratch.data(), scratch.size(), h.element_size, reinterpret_cast<unsigned char*>(out.data()));
    }
  }
  const Hash128 actual = XXH128Of(out.data(), out.size());
  if (actual != h.hash) {
    return absl::DataLossError(absl::StrFormat("blob %s: decoded bytes hash to %s", h.hash.Hex(), actual.Hex()));
  }
  return out;
}

}  // namespace crashreplay
