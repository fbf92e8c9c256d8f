// Element types of tensors on disk and in memory.
//
// One enum serves the safetensors reader, the capture container's tensor
// descriptors and the replay engine. Names are the safetensors spellings
// ("BF16", "F8_E4M3", ...). F4_E2M1 is packed two per byte, the even element
// in the low nibble; its byte size is rounded up. Pure functions, thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace crashreplay {

enum class DType : uint8_t {
  kBool = 0,
  kU8,
  kI8,
  kI16,
  kI32,
  kI64,
  kF16,
  kBF16,
  kF32,
  kF64,
  kF8E4M3,  // OCP fp8 e4m3fn: no infinities, 0x7f/0xff are NaN, max 448
  kF8E5M2,  // OCP fp8 e5m2: IEEE-like, max 57344
  kF8E8M0,  // OCP e8m0 ("ue8m0"): an unsigned power of two, 0xff is NaN
  kF4E2M1,  // OCP fp4 e2m1: two per byte, even element in the low nibble
  kU16,
  kU32,
  kU64,
};

inline constexpr int kNumDTypes = 17;

// Bits per element: 1..64 (kF4E2M1 is 4, kBool is 8).
int DTypeBits(DType t);

// Bytes that `num_elements` elements occupy (4-bit types round up).
size_t DTypeBytes(DType t, uint64_t num_elements);

// The safetensors name ("BF16"); stable, used in files.
std::string_view DTypeName(DType t);

// Parses a safetensors dtype name; nullopt if unknown.
std::optional<DType> ParseDType(std::string_view name);

bool IsFloat(DType t);

}  // namespace crashreplay
