// A structured failure of the engine: what bisection compares (DESIGN
// decision 3) and what `run`/`replay` report.
//
// class   "assert" (a kernel check fired), "unsupported_arch" (a kernel whose
//         library has no code for device_arch), "oom" (the memory planner or the KV
//         pool ran out), "nonfinite" (reserved for callers that treat a NaN/Inf
//         output as a failure), "error" (anything else).
// stage   "load", "graph_capture", "prefill" or "decode".
// The signature is (class, stage, kernel, check); layer, step, rank, index and
// value locate one occurrence. ToJson writes the class in the signature
// vocabulary of docs/bisect.md: assert -> device_assert, nonfinite ->
// non_finite, oom -> oom, error -> other. Value type, thread-compatible.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace crashreplay::replay {

struct Fault {
  std::string klass;
  std::string stage;
  std::string kernel;  // base kernel name, e.g. "attention" (no layer prefix)
  std::string check;
  int layer = -1;      // -1: not a per-layer kernel
  int64_t step = -1;
  int rank = -1;
  int64_t item = -1;   // work item (token/row) where it fired
  int64_t index = 0;   // offending index
  double value = 0;    // offending value
  std::string message; // one line for people

  std::string Signature() const { return klass + "/" + stage + "/" + kernel + "/" + check; }
  nlohmann::json ToJson() const;
};

}  // namespace crashreplay::replay
