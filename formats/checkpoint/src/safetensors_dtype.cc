#include "crashreplay/formats/safetensors_dtype.h"

namespace crashreplay::safetensors_dtype {

std::optional<DType> Parse(std::string_view name) {
  if (name == "F4") return DType::kF4E2M1;
  return ParseDType(name);
}

std::string_view Name(DType t) {
  if (t == DType::kF4E2M1) return "F4";
  return DTypeName(t);
}

bool IsKnownUnsupported(std::string_view name) {
  // The safetensors package's other dtypes (0.8: torch.complex64, the 6-bit
  // floats, and the "fnuz" fp8 variants AMD GPUs use, with one NaN and no
  // negative zero: a different decoding from F8_E4M3 / F8_E5M2).
  return name == "C64" || name == "F6_E2M3" || name == "F6_E3M2" || name == "F8_E4M3FNUZ" || name == "F8_E5M2FNUZ";
}

int LayoutRank(DType t) {
  // Position in safetensors' `Dtype` enum: BOOL, F4, F6_E2M3, F6_E3M2, U8,
  // I8, F8_E5M2, F8_E4M3, F8_E8M0, I16, U16, F16, BF16, I32, U32, F32, C64,
  // F64, I64, U64.
  switch (t) {
    case DType::kBool: return 0;
    case DType::kF4E2M1: return 1;
    case DType::kU8: return 4;
    case DType::kI8: return 5;
    case DType::kF8E5M2: return 6;
    case DType::kF8E4M3: return 7;
    case DType::kF8E8M0: return 8;
    case DType::kI16: return 9;
    case DType::kU16: return 10;
    case DType::kF16: return 11;
    case DType::kBF16: return 12;
    case DType::kI32: return 13;
    case DType::kU32: return 14;
    case DType::kF32: return 15;
    case DType::kF64: return 17;
    case DType::kI64: return 18;
    case DType::kU64: return 19;
  }
  return 0;
}

}  // namespace crashreplay::safetensors_dtype

#include "absl/strings/str_cat.h"

namespace crashreplay::safetensors_dtype {

bool ComputeExtent(DType t, std::span<const int64_t> shape, Extent* out, std::string* why) {
  int64_t elements = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      *why = absl::StrCat("dimension ", i, " is negative (", shape[i], ")");
      return false;
    }
    if (__builtin_mul_overflow(elements, shape[i], &elements)) {
      *why = absl::StrCat("the element count overflows 64 bits at dimension ", i);
      return false;
    }
  }
  const int bits = DTypeBits(t);
  uint64_t bytes = 0;
  if (bits % 8 == 0) {
    if (__builtin_mul_overflow(static_cast<uint64_t>(elements), static_cast<uint64_t>(bits / 8), &bytes)) {
      *why = "the byte size overflows 64 bits";
      return false;
    }
  } else {
    const uint64_t total_bits_div = 8 / static_cast<uint64_t>(bits);  // elements per byte
    if (static_cast<uint64_t>(elements) % total_bits_div != 0) {
      *why = absl::StrCat(elements, " elements of ", std::string(Name(t)), " do not fill a whole number of bytes");
      return false;
    }
    bytes = static_cast<uint64_t>(elements) / total_bits_div;
  }
  out->elements = elements;
  out->bytes = bytes;
  return true;
}

}  // namespace crashreplay::safetensors_dtype
