// Threshold search on one numeric toggle: the highest value (or lowest,
// when the failing value is below the passing one) that still passes, to a
// given precision. "Passes" is a good verdict; any bad verdict is a failure
// here (the question is "up to which mem_fraction_static does it start at
// all"), and the failure's signature is reported with the boundary.
//
// With P parallel trials each round probes P evenly spaced points of the
// bracket, shrinking it by a factor P+1 (binary search for P = 1): about
// log_{P+1}(|fail - pass| / precision) rounds. The search assumes the
// outcome is monotonic in the toggle; a skip or flaky probe stops it early
// with the bracket found so far and a note. Not thread-safe (one driver).
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "crashreplay/bisect/scheduler.h"

namespace crashreplay::bisect {

struct ThresholdOptions {
  std::string toggle;
  double pass_value = 0;   // a value that passes (checked)
  double fail_value = 0;   // a value that fails (checked)
  double precision = 0;    // stop when |fail - pass| <= precision; 0 = 1/1000 of the range
  bool integer = false;    // probe integers only (the toggle is an integer)
};

struct ThresholdResult {
  std::string toggle;
  bool bracketed = false;          // pass_value passed and fail_value failed
  double last_pass = 0;            // highest passing value found (toward fail_value)
  double first_fail = 0;           // nearest failing value found
  FailureSignature fail_signature; // how first_fail fails
  int probes = 0;                  // configurations judged
  bool integer = false;            // an integer toggle: values are written as integers
  std::string note;
};

// `base` holds every other toggle; the toggle is set to each probe value.
absl::StatusOr<ThresholdResult> ThresholdSearch(Scheduler& scheduler, const Config& base,
                                                const ThresholdOptions& options);

nlohmann::json ThresholdResultToJson(const ThresholdResult& r);
std::string DescribeThreshold(const ThresholdResult& r);

}  // namespace crashreplay::bisect
