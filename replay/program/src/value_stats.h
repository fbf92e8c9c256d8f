// Value statistics of a float buffer for the watcher (StepProgram::Watch):
// NaN and infinity counts, and over the finite values their count, minimum,
// maximum, largest magnitude and sum of magnitudes.
//
// The sum is in double over 8 lanes (lane = index mod 8, each lane in index
// order) combined by LaneSum8's tree, so it is the same on every host and
// ISA, and it runs as SIMD instead of one dependent add per element. The
// minimum and maximum are of the values as floats (exact); where -0 and +0
// tie, which sign is kept follows the lanes (deterministic as well).
#pragma once

#include <cstddef>
#include <cstdint>

namespace crashreplay::replay {

struct ValueStats {
  int64_t nan = 0, inf = 0, finite = 0;
  float min = 0, max = 0, max_abs = 0;  // min/max: 0 when there is no finite value
  double sum_abs = 0;
};

ValueStats SummarizeFloats(const float* p, size_t n);

}  // namespace crashreplay::replay
