// How dtypes are spelled in safetensors headers, and the order the Python
// package lays tensors out in: formats' reader and writer, and replay's
// streamed checkpoint writer (replay/make_model/src/streamed_safetensors.h).
//
// crashreplay's DType names follow safetensors except for 4-bit e2m1, which
// the safetensors package spells "F4" and dtype.h spells "F4_E2M1": headers
// are read with either spelling and written with "F4", so the Python package
// can read what we write.
#pragma once

#include <optional>
#include <string_view>

#include "crashreplay/formats/dtype.h"

namespace crashreplay::safetensors_dtype {

std::optional<DType> Parse(std::string_view name);

// The spelling written into headers.
std::string_view Name(DType t);

// True for dtypes the safetensors format defines that crashreplay does not
// support (complex, 6-bit floats, fp8 "fnuz"): an Unimplemented error, not
// corruption.
bool IsKnownUnsupported(std::string_view name);

// The Python package (safetensors >= 0.4) writes tensors sorted by dtype in
// descending order of its Rust enum, then by name. This is that enum's rank.
int LayoutRank(DType t);

}  // namespace crashreplay::safetensors_dtype

#include <cstdint>
#include <span>
#include <string>

namespace crashreplay::safetensors_dtype {

// Elements and bytes of a tensor of `shape`, with every overflow checked.
// On failure returns false and says why in `*why` ("dimension 1 is -3").
// A 4-bit tensor must hold a whole number of bytes (as safetensors demands).
struct Extent {
  int64_t elements = 1;
  uint64_t bytes = 0;
};
bool ComputeExtent(DType t, std::span<const int64_t> shape, Extent* out, std::string* why);

}  // namespace crashreplay::safetensors_dtype
