// Failure signatures: the identity of a failure, used to decide "same bug"
// (DESIGN decision 3).
//
// An OOM during CUDA-graph capture and a device assert in decode are
// different bugs even though both make a run fail. A signature is the class,
// the stage, the kernel and check that fired, the step and free-form detail;
// SameBug compares class, stage, kernel and check only (the step and detail
// of one bug vary between runs and configurations).
//
// JSON form (trial commands write it, replay prints it, reports embed it):
//   {"class": "device_assert", "stage": "decode", "kernel": "paged_decode",
//    "check": "page_index_in_pool", "step": 17, "detail": "..."}
// Only `class` is required; see docs/bisect.md for the names. Value types,
// thread-compatible; no shared state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace crashreplay::bisect {

enum class FailureClass {
  kNone,            // no failure
  kDeviceAssert,    // a check inside a kernel fired (device-side assert)
  kOom,             // out of memory (allocation failed, killed for memory)
  kNonFinite,       // NaN/Inf where a finite value is required
  kOutputMismatch,  // ran to completion with different outputs
  kTimeout,         // no result within the trial's time limit
  kCrashSignal,     // the process died by a signal (SIGSEGV, SIGABRT, ...)
  kOther,           // failed without saying how (a plain non-zero exit)
  kCudaError,       // a CUDA runtime error other than assert/OOM (illegal address, ...)
  kNcclError,       // an NCCL collective failed or timed out
  kException,       // an uncaught exception, named by its type (Python tracebacks)
  kUnsupportedArch, // a kernel with no code for the device's architecture ("no kernel image", "Unsupported
                    // architecture")
  kEngineDivergence, // replay: the capture's engine fingerprints depart from the replay's at a boundary
};

enum class FailureStage { kLoad, kGraphCapture, kPrefill, kDecode, kUnknown };

std::string_view FailureClassName(FailureClass c);  // "device_assert", ...
std::optional<FailureClass> ParseFailureClass(std::string_view name);
std::string_view FailureStageName(FailureStage s);  // "graph_capture", ...
std::optional<FailureStage> ParseFailureStage(std::string_view name);

struct FailureSignature {
  FailureClass failure_class = FailureClass::kNone;
  FailureStage stage = FailureStage::kUnknown;
  std::string kernel;             // kernel that fired, "" when unknown
  std::string check;              // check that fired, "" when unknown
  std::optional<int64_t> step;    // scheduler step, when known
  std::string detail;             // e.g. "SIGSEGV", the assert message

  bool is_failure() const { return failure_class != FailureClass::kNone; }
  friend bool operator==(const FailureSignature&, const FailureSignature&) = default;
};

// Same bug: equal class, stage, kernel and check.
bool SameBug(const FailureSignature& a, const FailureSignature& b);

// One line for people: "device_assert in decode at paged_decode/page_index_in_pool (step 17)".
std::string DescribeSignature(const FailureSignature& s);

nlohmann::json SignatureToJson(const FailureSignature& s);
// InvalidArgument when `class` is missing or any field has the wrong type or
// an unknown name.
absl::StatusOr<FailureSignature> SignatureFromJson(const nlohmann::json& j);

}  // namespace crashreplay::bisect
