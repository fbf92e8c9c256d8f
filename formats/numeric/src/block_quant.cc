#include "crashreplay/formats/block_quant.h"

#include <algorithm>
#include <cstddef>
#include <string_view>

#include "absl/strings/str_format.h"
#include "crashreplay/base/status.h"

namespace crashreplay {
namespace {

// rows * cols, or -1 when the shape is negative or the product overflows.
int64_t Elements(MatrixShape shape) {
  if (shape.rows < 0 || shape.cols < 0) return -1;
  int64_t n = 0;
  if (__builtin_mul_overflow(shape.rows, shape.cols, &n)) return -1;
  return n;
}

absl::Status CheckShape(std::string_view fn, MatrixShape shape, bool needs_even_cols) {
  if (Elements(shape) < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: shape [%d, %d] is negative or too large", fn, shape.rows, shape.cols));
  }
  if (needs_even_cols && shape.cols % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: shape [%d, %d] has an odd number of columns; packed fp4 rows must start on a "
                        "byte, so pad the last dimension to an even size",
                        fn, shape.rows, shape.cols));
  }
  return absl::OkStatus();
}

absl::Status CheckSize(std::string_view fn, std::string_view what, size_t got, int64_t want, MatrixShape shape) {
  if (static_cast<int64_t>(got) != want) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: %s has %d elements but shape [%d, %d] needs %d", fn, what,
                                                      got, shape.rows, shape.cols, want));
  }
  return absl::OkStatus();
}

absl::Status CheckBlock(std::string_view fn, const Fp8BlockOptions& opts) {
  // The upper bound keeps CeilDiv and the scale count free of overflow.
  constexpr int64_t kMaxBlock = int64_t{1} << 30;
  if (opts.block_rows <= 0 || opts.block_cols <= 0 || opts.block_rows > kMaxBlock || opts.block_cols > kMaxBlock) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: block shape [%d, %d] must be positive and at most 2^30", fn,
                                                      opts.block_rows, opts.block_cols));
  }
  return absl::OkStatus();
}

int64_t ScaleCols(int64_t cols, int64_t block) { return BlockCount(cols, block); }

// Shared body of the two fp4 formats: one scale per `block` elements of a row.
// The block size is a template argument so the per-element index arithmetic
// compiles to shifts.
template <int64_t block, typename ScaleFn, typename QuantFn>
void QuantizeFp4Rows(std::span<const float> x, MatrixShape shape, std::span<uint8_t> packed, std::span<uint8_t> scales,
                     ScaleFn scale_fn, QuantFn quant_fn) {
  const int64_t scale_cols = ScaleCols(shape.cols, block);
  for (int64_t r = 0; r < shape.rows; ++r) {
    const float* row = x.data() + r * shape.cols;
    uint8_t* out = packed.data() + r * (shape.cols / 2);
    for (int64_t b = 0; b < scale_cols; ++b) {
      const int64_t begin = b * block;
      const int64_t end = std::min(begin + block, shape.cols);
      float amax = 0.0f;
      for (int64_t c = begin; c < end; ++c) amax = AbsMaxAccumulate(amax, row[c]);
      const uint8_t scale = scale_fn(amax);
      scales[r * scale_cols + b] = scale;
      for (int64_t c = begin; c < end; c += 2) {
        // cols is even and blocks are even-sized, so pairs never straddle.
        out[c / 2] = PackE2m1x2(quant_fn(row[c], scale), quant_fn(row[c + 1], scale));
      }
    }
  }
}

// decode_scale turns a stored scale code into a float once per block;
// dequant_fn(nibble, decoded_scale) gives an element.
template <int64_t block, typename DecodeScaleFn, typename DequantFn>
void DequantizeFp4Rows(std::span<const uint8_t> packed, std::span<const uint8_t> scales, MatrixShape shape,
                       std::span<float> out, DecodeScaleFn decode_scale, DequantFn dequant_fn) {
  const int64_t scale_cols = ScaleCols(shape.cols, block);
  for (int64_t r = 0; r < shape.rows; ++r) {
    const uint8_t* in = packed.data() + r * (shape.cols / 2);
    const uint8_t* row_scales = scales.data() + r * scale_cols;
    float* dst = out.data() + r * shape.cols;
    for (int64_t b = 0; b < scale_cols; ++b) {
      const float scale = decode_scale(row_scales[b]);
      const int64_t end = std::min((b + 1) * block, shape.cols);
      for (int64_t c = b * block; c < end; c += 2) {
        const uint8_t byte = in[c / 2];
        dst[c] = dequant_fn(static_cast<uint8_t>(byte & 0xfu), scale);
        dst[c + 1] = dequant_fn(static_cast<uint8_t>(byte >> 4), scale);
      }
    }
  }
}

absl::Status CheckFp4(std::string_view fn, MatrixShape shape, int64_t block, size_t values,
                      std::string_view values_what, size_t packed, size_t scales) {
  CR_RETURN_IF_ERROR(CheckShape(fn, shape, /*needs_even_cols=*/true));
  CR_RETURN_IF_ERROR(CheckSize(fn, values_what, values, Elements(shape), shape));
  CR_RETURN_IF_ERROR(CheckSize(fn, "packed fp4 buffer (bytes)", packed, Elements(shape) / 2, shape));
  CR_RETURN_IF_ERROR(CheckSize(fn, "scale buffer", scales, shape.rows * ScaleCols(shape.cols, block), shape));
  return absl::OkStatus();
}

absl::Status CheckFp8(std::string_view fn, MatrixShape shape, const Fp8BlockOptions& opts, size_t values,
                      std::string_view values_what, size_t q, size_t scales) {
  CR_RETURN_IF_ERROR(CheckShape(fn, shape, /*needs_even_cols=*/false));
  CR_RETURN_IF_ERROR(CheckBlock(fn, opts));
  CR_RETURN_IF_ERROR(CheckSize(fn, values_what, values, Elements(shape), shape));
  CR_RETURN_IF_ERROR(CheckSize(fn, "fp8 buffer", q, Elements(shape), shape));
  CR_RETURN_IF_ERROR(CheckSize(fn, "scale buffer", scales, Fp8ScaleCount(shape, opts), shape));
  return absl::OkStatus();
}

// Calls fn(r, c, scale_index) for every element, block by block.
template <typename Fn>
void ForEachFp8Block(MatrixShape shape, const Fp8BlockOptions& opts, Fn fn) {
  const int64_t block_row_count = BlockCount(shape.rows, opts.block_rows);
  const int64_t block_col_count = BlockCount(shape.cols, opts.block_cols);
  for (int64_t br = 0; br < block_row_count; ++br) {
    const int64_t r0 = br * opts.block_rows;
    const int64_t r1 = std::min(r0 + opts.block_rows, shape.rows);
    for (int64_t bc = 0; bc < block_col_count; ++bc) {
      const int64_t c0 = bc * opts.block_cols;
      const int64_t c1 = std::min(c0 + opts.block_cols, shape.cols);
      fn(r0, r1, c0, c1, br * block_col_count + bc);
    }
  }
}

}  // namespace

int64_t Nvfp4PackedBytes(MatrixShape shape) { return shape.rows * (shape.cols / 2); }
int64_t Nvfp4ScaleCount(MatrixShape shape) { return shape.rows * ScaleCols(shape.cols, kNvfp4BlockSize); }
int64_t Mxfp4PackedBytes(MatrixShape shape) { return shape.rows * (shape.cols / 2); }
int64_t Mxfp4ScaleCount(MatrixShape shape) { return shape.rows * ScaleCols(shape.cols, kMxfp4BlockSize); }
int64_t Fp8ScaleCount(MatrixShape shape, const Fp8BlockOptions& opts) {
  return BlockCount(shape.rows, opts.block_rows) * BlockCount(shape.cols, opts.block_cols);
}
int64_t Ue8m0PackedWords(MatrixShape shape) { return shape.rows * BlockCount(shape.cols, 4); }

float Nvfp4GlobalScale(std::span<const float> x) {
  float amax = 0.0f;
  for (float v : x) amax = AbsMaxAccumulate(amax, v);
  if (amax == 0.0f) return 1.0f;
  return amax / (kE2m1Max * kE4m3Max);
}

absl::Status QuantizeNvfp4(std::span<const float> x, MatrixShape shape, float global_scale, std::span<uint8_t> packed,
                           std::span<uint8_t> scales) {
  CR_RETURN_IF_ERROR(
      CheckFp4("QuantizeNvfp4", shape, kNvfp4BlockSize, x.size(), "input", packed.size(), scales.size()));
  QuantizeFp4Rows<kNvfp4BlockSize>(
      x, shape, packed, scales, [global_scale](float amax) { return Nvfp4BlockScale(amax, global_scale); },
      [global_scale](float v, uint8_t s) { return QuantNvfp4(v, s, global_scale); });
  return absl::OkStatus();
}

absl::Status DequantizeNvfp4(std::span<const uint8_t> packed, std::span<const uint8_t> scales, float global_scale,
                             MatrixShape shape, std::span<float> out) {
  CR_RETURN_IF_ERROR(
      CheckFp4("DequantizeNvfp4", shape, kNvfp4BlockSize, out.size(), "output", packed.size(), scales.size()));
  DequantizeFp4Rows<kNvfp4BlockSize>(
      packed, scales, shape, out, [](uint8_t s) { return E4m3ToFloat(s); },
      [global_scale](uint8_t n, float s) { return DequantNvfp4Decoded(n, s, global_scale); });
  return absl::OkStatus();
}

absl::Status QuantizeMxfp4(std::span<const float> x, MatrixShape shape, std::span<uint8_t> packed,
                           std::span<uint8_t> scales) {
  CR_RETURN_IF_ERROR(
      CheckFp4("QuantizeMxfp4", shape, kMxfp4BlockSize, x.size(), "input", packed.size(), scales.size()));
  QuantizeFp4Rows<kMxfp4BlockSize>(
      x, shape, packed, scales, [](float amax) { return Mxfp4BlockScale(amax); },
      [](float v, uint8_t s) { return QuantMxfp4(v, s); });
  return absl::OkStatus();
}

absl::Status DequantizeMxfp4(std::span<const uint8_t> packed, std::span<const uint8_t> scales, MatrixShape shape,
                             std::span<float> out) {
  CR_RETURN_IF_ERROR(
      CheckFp4("DequantizeMxfp4", shape, kMxfp4BlockSize, out.size(), "output", packed.size(), scales.size()));
  // E2m1ToFloat(n) * E8m0ToFloat(s), as DequantMxfp4, with the scale decoded once.
  DequantizeFp4Rows<kMxfp4BlockSize>(
      packed, scales, shape, out, [](uint8_t s) { return E8m0ToFloat(s); },
      [](uint8_t n, float s) { return E2m1ToFloat(n) * s; });
  return absl::OkStatus();
}

absl::Status QuantizeFp8Blocks(std::span<const float> x, MatrixShape shape, const Fp8BlockOptions& opts,
                               std::span<uint8_t> q, std::span<float> scales) {
  CR_RETURN_IF_ERROR(CheckFp8("QuantizeFp8Blocks", shape, opts, x.size(), "input", q.size(), scales.size()));
  const int64_t cols = shape.cols;
  ForEachFp8Block(shape, opts, [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1, int64_t s) {
    float amax = 0.0f;
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = c0; c < c1; ++c) amax = AbsMaxAccumulate(amax, x[r * cols + c]);
    }
    const float scale = Fp8BlockScale(amax, opts.amax_floor, opts.ue8m0_scales);
    scales[s] = scale;
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = c0; c < c1; ++c) q[r * cols + c] = QuantFp8(x[r * cols + c], scale);
    }
  });
  return absl::OkStatus();
}

absl::Status DequantizeFp8Blocks(std::span<const uint8_t> q, std::span<const float> scales, MatrixShape shape,
                                 const Fp8BlockOptions& opts, std::span<float> out) {
  CR_RETURN_IF_ERROR(CheckFp8("DequantizeFp8Blocks", shape, opts, out.size(), "output", q.size(), scales.size()));
  const int64_t cols = shape.cols;
  ForEachFp8Block(shape, opts, [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1, int64_t s) {
    const float scale = scales[s];
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = c0; c < c1; ++c) out[r * cols + c] = DequantFp8(q[r * cols + c], scale);
    }
  });
  return absl::OkStatus();
}

absl::Status RequantizeFp8BlocksToUe8m0(std::span<const uint8_t> q, std::span<const float> scales, MatrixShape shape,
                                        const Fp8BlockOptions& opts, bool through_bf16, std::span<uint8_t> q_out,
                                        std::span<float> scales_out) {
  constexpr std::string_view kFn = "RequantizeFp8BlocksToUe8m0";
  CR_RETURN_IF_ERROR(CheckFp8(kFn, shape, opts, q_out.size(), "output fp8 buffer", q.size(), scales.size()));
  CR_RETURN_IF_ERROR(CheckSize(kFn, "output scale buffer", scales_out.size(), Fp8ScaleCount(shape, opts), shape));
  const int64_t cols = shape.cols;
  // The dequantized value, computed identically in both passes, so the second
  // pass can overwrite q when q_out aliases it.
  auto dequant = [through_bf16](uint8_t v, float scale) {
    const float x = DequantFp8(v, scale);
    return through_bf16 ? Bf16ToFloat(FloatToBf16(x)) : x;
  };
  ForEachFp8Block(shape, opts, [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1, int64_t s) {
    const float old_scale = scales[s];
    float amax = 0.0f;
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = c0; c < c1; ++c) {
        amax = AbsMaxAccumulate(amax, dequant(q[r * cols + c], old_scale));
      }
    }
    const float new_scale = Fp8BlockScale(amax, 1e-4f, /*ue8m0=*/true);
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = c0; c < c1; ++c) {
        q_out[r * cols + c] = QuantFp8(dequant(q[r * cols + c], old_scale), new_scale);
      }
    }
    scales_out[s] = new_scale;
  });
  return absl::OkStatus();
}

absl::Status Fp32ScalesToUe8m0Ceil(std::span<const float> scales, std::span<uint8_t> codes) {
  if (scales.size() != codes.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("Fp32ScalesToUe8m0Ceil: %d scales but %d codes", scales.size(), codes.size()));
  }
  for (size_t i = 0; i < scales.size(); ++i) codes[i] = FloatToUe8m0Ceil(scales[i]);
  return absl::OkStatus();
}

absl::Status Fp32ScalesToE8m0Floor(std::span<const float> scales, std::span<uint8_t> codes) {
  if (scales.size() != codes.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("Fp32ScalesToE8m0Floor: %d scales but %d codes", scales.size(), codes.size()));
  }
  for (size_t i = 0; i < scales.size(); ++i) codes[i] = FloatToE8m0Floor(scales[i]);
  return absl::OkStatus();
}

absl::Status PackUe8m0(std::span<const uint8_t> codes, MatrixShape shape, std::span<uint32_t> packed) {
  CR_RETURN_IF_ERROR(CheckShape("PackUe8m0", shape, false));
  CR_RETURN_IF_ERROR(CheckSize("PackUe8m0", "code buffer", codes.size(), Elements(shape), shape));
  CR_RETURN_IF_ERROR(CheckSize("PackUe8m0", "packed buffer", packed.size(), Ue8m0PackedWords(shape), shape));
  const int64_t words = BlockCount(shape.cols, 4);
  for (int64_t r = 0; r < shape.rows; ++r) {
    for (int64_t w = 0; w < words; ++w) {
      uint8_t b[4] = {0, 0, 0, 0};
      for (int64_t i = 0; i < 4 && w * 4 + i < shape.cols; ++i) {
        b[i] = codes[r * shape.cols + w * 4 + i];
      }
      packed[r * words + w] = PackUe8m0x4(b[0], b[1], b[2], b[3]);
    }
  }
  return absl::OkStatus();
}

absl::Status UnpackUe8m0(std::span<const uint32_t> packed, MatrixShape shape, std::span<uint8_t> codes) {
  CR_RETURN_IF_ERROR(CheckShape("UnpackUe8m0", shape, false));
  CR_RETURN_IF_ERROR(CheckSize("UnpackUe8m0", "code buffer", codes.size(), Elements(shape), shape));
  CR_RETURN_IF_ERROR(CheckSize("UnpackUe8m0", "packed buffer", packed.size(), Ue8m0PackedWords(shape), shape));
  const int64_t words = BlockCount(shape.cols, 4);
  for (int64_t r = 0; r < shape.rows; ++r) {
    for (int64_t c = 0; c < shape.cols; ++c) {
      codes[r * shape.cols + c] = UnpackUe8m0(packed[r * words + c / 4], static_cast<int>(c % 4));
    }
  }
  return absl::OkStatus();
}

}  // namespace crashreplay
