// Fingerprints: fixed-size summaries of the tensors an engine computed at
// named points of a step ("boundaries"), and the rule that says when two of
// them depart (docs/formats/capture.md, "Fingerprints").
//
// A capture holds the engine's fingerprints (FingerprintRecord); the replay
// computes the same summaries from its own kernels and names the first
// boundary where the engine departed from the reference. Both sides use
// SummarizeTensor, so a summary means the same thing wherever it was made.
//
// SummarizeTensor decodes every element to fp64 (bf16, fp16, fp32, fp64,
// fp8 e4m3/e5m2, signed and unsigned integers, bool) and sums in a fixed
// order (8 interleaved lanes, element i in lane i % 8, combined pairwise):
// the same bits on every host and thread count. Pure functions,
// thread-safe, no allocation beyond the returned strings.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "crashreplay/formats/capture_records.h"
#include "crashreplay/formats/dtype.h"

namespace crashreplay {

// The summary of `numel` elements of `dtype` at `data` (dense, row-major).
// `columns` is the last dimension (0 or 1 for a vector): the first
// non-finite element i is reported as (token i / columns, column i %
// columns). With `hash`, the content hash is the XXH3-128 of the bytes.
// InvalidArgument-free by design: a dtype without a value meaning (F4_E2M1,
// F8_E8M0) is counted (numel) and hashed, with no statistics.
Fingerprint SummarizeTensor(std::string_view name, DType dtype, const void* data, uint64_t numel, uint64_t columns,
                            bool hash = false);

// The relative tolerance of a boundary whose engine stored `dtype` (the
// engine's fingerprint's dtype): F32 / F64 1e-2, F16 2e-2, BF16 6e-2, fp8
// 0.25; anything else 6e-2. Chosen to flag a kernel that produced wrong
// values (NaN or Inf, a magnitude off, garbage, zeros), not rounding: the
// engine's kernels sum in other orders than the replay's, and the
// difference grows through the layers.
double FingerprintTolerance(std::string_view dtype);

// Whether the engine's fingerprint departs from the reference's at the same
// boundary; nullopt when it does not, else one line saying how ("the
// engine has 3072 NaN where the reference is finite (max |x| 11.2)"). The
// rule (docs/formats/capture.md):
//   * element counts differ: departs;
//   * non-finite in one and finite in the other: departs (always);
//   * both non-finite: does not depart (the reference reproduces it);
//   * integers: departs when the engine's [min, max] leaves the
//     reference's (an index out of the range the reference produced);
//   * floats: departs when max |x|, the root mean square or the mean
//     (measured against the reference's root mean square) differ by more
//     than FingerprintTolerance(engine.dtype) relative to the reference.
std::optional<std::string> FingerprintDeparts(const Fingerprint& engine, const Fingerprint& reference);

// One line: "BF16 6144 elements, 0 NaN, 0 Inf, max |x| 11.2, rms 0.91".
std::string FingerprintText(const Fingerprint& f);

}  // namespace crashreplay
