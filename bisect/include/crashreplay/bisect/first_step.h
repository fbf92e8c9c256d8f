// First failing step: the earliest step of a capture at which a
// step-parameterised trial (`replay --step N`, or `{step}` /
// CRASHREPLAY_STEP for a command) fails with the target signature.
//
// kBinary assumes that once a step fails every later one does (state
// corruption persists): O(log(hi - lo)) trials. An unresolved probe, or
// kLinear, scans the remaining range in order, P at a time: O(hi - lo).
// Not thread-safe (one driver).
#pragma once

#include <cstdint>
#include <optional>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "crashreplay/bisect/judge.h"

namespace crashreplay::bisect {

enum class StepSearchMode { kBinary, kLinear };

struct StepSearchResult {
  std::optional<int64_t> first_fail;   // nullopt: no step in range fails with the target
  FailureSignature signature;
  int probes = 0;
};

absl::StatusOr<StepSearchResult> FirstFailingStep(Scheduler& scheduler, Judge& judge, const Config& config, int64_t lo,
                                                  int64_t hi, StepSearchMode mode);

nlohmann::json StepSearchResultToJson(const StepSearchResult& r);

}  // namespace crashreplay::bisect
