#include "crashreplay/formats/dtype.h"

namespace crashreplay {
namespace {

struct DTypeInfo {
  DType type;
  std::string_view name;
  int bits;
  bool is_float;
};

constexpr DTypeInfo kInfo[kNumDTypes] = {
    {DType::kBool, "BOOL", 8, false},     {DType::kU8, "U8", 8, false},         {DType::kI8, "I8", 8, false},
    {DType::kI16, "I16", 16, false},      {DType::kI32, "I32", 32, false},      {DType::kI64, "I64", 64, false},
    {DType::kF16, "F16", 16, true},       {DType::kBF16, "BF16", 16, true},     {DType::kF32, "F32", 32, true},
    {DType::kF64, "F64", 64, true},       {DType::kF8E4M3, "F8_E4M3", 8, true}, {DType::kF8E5M2, "F8_E5M2", 8, true},
    {DType::kF8E8M0, "F8_E8M0", 8, true}, {DType::kF4E2M1, "F4_E2M1", 4, true}, {DType::kU16, "U16", 16, false},
    {DType::kU32, "U32", 32, false},      {DType::kU64, "U64", 64, false},
};

const DTypeInfo& Info(DType t) { return kInfo[static_cast<int>(t)]; }

}  // namespace

int DTypeBits(DType t) { return Info(t).bits; }

size_t DTypeBytes(DType t, uint64_t num_elements) {
  const uint64_t bits = num_elements * static_cast<uint64_t>(Info(t).bits);
  return static_cast<size_t>((bits + 7) / 8);
}

std::string_view DTypeName(DType t) { return Info(t).name; }

std::optional<DType> ParseDType(std::string_view name) {
  for (const DTypeInfo& info : kInfo) {
    if (info.name == name) return info.type;
  }
  return std::nullopt;
}

bool IsFloat(DType t) { return Info(t).is_float; }

}  // namespace crashreplay
