// Failure signatures read from what a trial printed.
//
// An external trial (an sglang or vLLM launch, a test script) usually dies
// without writing a signature file, but what it printed still tells one bug
// from another. SignatureFromOutput looks for, in this order:
//   1. the user's patterns (--signature-regex), tried on every line in
//      order: the first match gives class `other` with the match (its first
//      capture group, when it has one) as the check;
//   2. the earliest of the failures CUDA programs print, as the CUDA runtime
//      (cudaGetErrorString), PyTorch, sglang and vLLM spell them:
//        device_assert  "device-side assert triggered", cudaErrorAssert; the
//                       kernel and check come from the
//                       "FILE.cu:LINE: FUNC: block: [..], thread: [..]
//                       Assertion `EXPR` failed." line when one was printed
//                       (kernel "FILE.cu:LINE", check EXPR)
//        oom            check `cuda` (torch.OutOfMemoryError, "CUDA out of
//                       memory", "CUDA error: out of memory",
//                       cudaErrorMemoryAllocation, CUBLAS_STATUS_ALLOC_FAILED),
//                       `kv_cache` (sglang "Not enough memory. Please try to
//                       increase --mem-fraction-static", vLLM "No available
//                       memory for the cache blocks"), `host` (std::bad_alloc,
//                       MemoryError, "Cannot allocate memory")
//        cuda_error     every other cudaGetErrorString text (illegal memory
//                       access, misaligned address, unspecified launch
//                       failure, no kernel image, ...); check: the
//                       cudaError_t name, e.g. cudaErrorIllegalAddress
//        non_finite     torch.multinomial's "probability tensor contains
//                       either `inf`, `nan` or element < 0", sglang's "NaN in
//                       the logits" and "NaN detected!", autograd's "returned nan values"
//      with stage graph_capture when the output says "Capture cuda graph
//      failed" (sglang) or names the capture in a traceback frame;
//   3. an NCCL error: class nccl_error, check the ncclResult name
//      (ncclUnhandledCudaError, ncclSystemError, ...) or watchdog_timeout;
//   4. the exception type on the last line of the last Python traceback:
//      class exception, check the type ("ValueError",
//      "torch.distributed.DistBackendError").
// NCCL errors and exceptions rank below the CUDA failures because on a
// multi-GPU run they are usually a consequence of one (the rank whose kernel
// faulted takes the collective down). Step 2 takes the earliest match
// because a first fault causes the later ones.
//
// The detail of the signature is the line that decided it (printable,
// bounded). Rules are immutable after Create; thread-safe.
#pragma once

#include <optional>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "crashreplay/bisect/signature.h"

namespace crashreplay::bisect {

class FailureTextRules {
 public:
  // `user_patterns` are ECMAScript regular expressions, matched against one
  // line at a time. InvalidArgument naming the pattern when one does not
  // compile.
  static absl::StatusOr<FailureTextRules> Create(const std::vector<std::string>& user_patterns);
  FailureTextRules() = default;

  // The signature `output` names, or nullopt when it names none.
  std::optional<FailureSignature> Match(std::string_view output) const;

  const std::vector<std::string>& user_patterns() const { return sources_; }

 private:
  std::vector<std::string> sources_;
  std::vector<std::regex> user_;
};

// Built-in rules only (step 2-4 above).
std::optional<FailureSignature> SignatureFromOutput(std::string_view output);

// `text` with invalid UTF-8 and control characters (other than newline and
// tab) replaced by \xNN escapes, so it can go into JSON, HTML or a terminal
// whatever a trial printed.
std::string PrintableText(std::string_view text);

}  // namespace crashreplay::bisect
