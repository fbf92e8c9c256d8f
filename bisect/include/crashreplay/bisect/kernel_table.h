// Per-kernel tables and the "first bad kernel" search.
//
// A replay prints one row per kernel it ran (issue 3's `kernels` array):
// name, layer, output statistics, a digest of the output bits and, when the
// engine compared against a reference, the largest element-wise error and
// the tolerance it used. FirstBadKernel walks a reference table (reference
// backend or good configuration) and a test table (the failing
// configuration) in execution order and names the first kernel whose output
// goes non-finite where the reference's is finite, or leaves the tolerance
// atol + |ref| * rtol (the llm.c checker's form; docs/bisect.md). It is a pure
// function: no I/O, thread-safe.
//
// Row JSON keys (all but `name` optional): name, layer, numel, nan_count,
// inf_count, digest, max_abs, max_err, atol, rtol.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace crashreplay::bisect {

struct KernelRow {
  std::string name;
  int64_t layer = -1;                // -1: not a per-layer kernel
  int64_t numel = 0;
  int64_t nan_count = 0;
  int64_t inf_count = 0;
  std::string digest;                // digest of the output bits ("" unknown)
  double max_abs = 0;                // max |x| over the output's finite values
  std::optional<double> max_err;     // max |x - ref| if the engine compared
  std::optional<double> atol;        // tolerance the engine used, if any
  std::optional<double> rtol;
};

struct Tolerance {
  double atol = 1e-5;
  double rtol = 1e-2;  // eps of bf16 (2^-7) rounded up: the loosest dtype we compare
};

struct KernelFinding {
  enum class Reason {
    kNonFinite,        // test output has NaN/Inf where the reference has none
    kOutOfTolerance,   // error > atol + |ref| * rtol
    kMissing,          // the test run stopped before this kernel (it faulted here)
    kStructure,        // kernel sequences differ (different kernel at this index)
  };
  Reason reason = Reason::kOutOfTolerance;
  size_t index = 0;                 // position in execution order
  KernelRow reference;
  KernelRow test;
  double error = 0;                 // the error that was judged
  double bound = 0;                 // atol + |ref| * rtol
  size_t first_digest_mismatch = 0; // first index whose bits differ (<= index)
};

std::string_view KernelFindingReasonName(KernelFinding::Reason r);

// The first bad kernel, or nullopt when every common kernel is within
// tolerance and the sequences match. Row tolerances (atol/rtol in the test
// row) override `tol`. `error` is max_err when present, else
// |max_abs_test - max_abs_ref| (a lower bound of the element-wise error).
std::optional<KernelFinding> FirstBadKernel(const std::vector<KernelRow>& reference, const std::vector<KernelRow>& test,
                                            const Tolerance& tol = {});

nlohmann::json KernelRowToJson(const KernelRow& row);
absl::StatusOr<KernelRow> KernelRowFromJson(const nlohmann::json& j);
absl::StatusOr<std::vector<KernelRow>> KernelRowsFromJson(const nlohmann::json& j);
nlohmann::json KernelFindingToJson(const KernelFinding& f);
std::string DescribeKernelFinding(const KernelFinding& f);

}  // namespace crashreplay::bisect
