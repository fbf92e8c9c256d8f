#include "crashreplay/formats/blob_codec.h"

#include <zstd.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <cstring>
#include <memory>

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

// Scratch memory for the shuffle and the zstd output. Up to kKeepScratch a
// buffer is kept per thread and reused from call to call: not zero-filled,
// not faulted in again (a fresh zero-filled vector costs about 0.5 ms a MiB
// here in page faults and zeroing, a third of compressing it). Larger ones
// are allocated for the call, still without zero-filling, so a thread never
// keeps more than 2 x kKeepScratch.
constexpr size_t kKeepScratch = 64 << 20;

struct Scratch {
  std::unique_ptr<unsigned char[]> kept;
  size_t capacity = 0;
  unsigned char* Get(size_t n, std::unique_ptr<unsigned char[]>* once) {
    if (n > kKeepScratch) {
      once->reset(new unsigned char[n]);  // default-initialised: not zero-filled
      return once->get();
    }
    if (n > capacity) {
      kept.reset(new unsigned char[n]);
      capacity = n;
    }
    return kept.get();
  }
};

}  // namespace

std::vector<unsigned char> EncodeBlobPayload(std::span<const std::byte> raw, const Hash128& hash,
                                             size_t element_size, const BlobEncodeOptions& options,
                                             size_t headroom) {
  thread_local Scratch shuffle_scratch, zstd_scratch;
  std::unique_ptr<unsigned char[]> shuffle_once, zstd_once;
  const auto* src = reinterpret_cast<const unsigned char*>(raw.data());
  const size_t size = raw.size();
  BlobHeader header;
  header.raw_size = size;
  header.hash = hash;

  const unsigned char* to_compress = src;
  const bool shuffle = options.byte_plane_shuffle && element_size >= 2 && element_size <= 16 &&
                       size >= element_size;
  if (shuffle) {
    unsigned char* shuffled = shuffle_scratch.Get(size, &shuffle_once);
    ShuffleBytePlanes(src, size, element_size, shuffled);
    to_compress = shuffled;
  }

  const size_t bound = ZSTD_compressBound(size);
  unsigned char* z = zstd_scratch.Get(bound, &zstd_once);
  const size_t csize = ZSTD_compress(z, bound, to_compress, size, options.zstd_level);
  const bool use_zstd = !ZSTD_isError(csize) &&
                        static_cast<double>(csize) <= static_cast<double>(size) * (1.0 - options.min_saving);
  // The payload is allocated at its final size and written once.
  const size_t front = headroom + kBlobHeaderSize;
  const unsigned char* body = use_zstd ? z : src;  // stored as is, unshuffled: a reader then needs no work
  const size_t body_size = use_zstd ? csize : size;
  std::vector<unsigned char> out;
  out.reserve(front + body_size);
  out.resize(front);
  out.insert(out.end(), body, body + body_size);
  if (use_zstd) {
    header.codec = BlobCodec::kZstd;
    if (shuffle) {
      header.transform = BlobTransform::kBytePlaneShuffle;
      header.element_size = static_cast<uint8_t>(element_size);
    }
  } else {
    header.codec = BlobCodec::kNone;
  }
  EncodeBlobHeader(header, out.data() + headroom);
  return out;
}

absl::StatusOr<std::vector<std::byte>> DecodeBlobPayload(const unsigned char* payload, size_t size,
                                                         uint64_t max_raw_size) {
  BlobHeader h;
  if (absl::Status s = ParseBlobHeader(payload, size, &h); !s.ok()) return s;
  if (h.raw_size > max_raw_size) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "blob %s declares %d decoded bytes, over the reader's cap of %d (raise CaptureLimits."
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
      return absl::DataLossError(absl::StrFormat("blob %s: zstd frame header is invalid or does not state its decoded size", h.hash.Hex()));
    }
    if (content != h.raw_size) {
      return absl::DataLossError(absl::StrFormat(
          "blob %s: zstd frame says %d decoded bytes, the blob header %d", h.hash.Hex(), content, h.raw_size));
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
      return absl::DataLossError(absl::StrFormat("blob %s: zstd cannot decode it (%s)", h.hash.Hex(),
                                                 ZSTD_getErrorName(got)));
    }
    if (got != h.raw_size) {
      return absl::DataLossError(absl::StrFormat("blob %s: decoded %d bytes, the header declares %d",
                                                 h.hash.Hex(), got, h.raw_size));
    }
    if (shuffled) {
      UnshuffleBytePlanes(scratch.data(), scratch.size(), h.element_size,
                          reinterpret_cast<unsigned char*>(out.data()));
    }
  }
  const Hash128 actual = XXH128Of(out.data(), out.size());
  if (actual != h.hash) {
    return absl::DataLossError(absl::StrFormat("blob %s: decoded bytes hash to %s", h.hash.Hex(), actual.Hex()));
  }
  return out;
}

}  // namespace crashreplay
