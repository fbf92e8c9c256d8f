#include "crashreplay/bisect/first_step.h"

#include <algorithm>

namespace crashreplay::bisect {
namespace {

// Scans (from, to] in order, P at a time; returns the first target failure.
absl::StatusOr<StepSearchResult> Linear(Scheduler& scheduler, Judge& judge, const Config& config, int64_t from,
                                        int64_t to, StepSearchResult r) {
  const int64_t p = std::max(1, scheduler.parallelism());
  for (int64_t s = from; s <= to; s += p) {
    const int64_t end = std::min(to, s + p - 1);
    std::vector<Config> configs;
    std::vector<std::optional<int64_t>> steps;
    for (int64_t k = s; k <= end; ++k) {
      configs.push_back(config);
      steps.push_back(k);
    }
    const std::vector<TrialResult> results = scheduler.RunRequests(configs, steps);
    r.probes += static_cast<int>(end - s + 1);
    if (scheduler.stopped()) return absl::CancelledError("step search stopped");
    for (int64_t k = s; k <= end; ++k) {
      const TrialResult& t = results[static_cast<size_t>(k - s)];
      if (judge.Classify(config, t, k) == Outcome::kFail) {
        r.first_fail = k;
        r.signature = t.signature;
        return r;
      }
    }
  }
  return r;
}

}  // namespace

absl::StatusOr<StepSearchResult> FirstFailingStep(Scheduler& scheduler, Judge& judge, const Config& config, int64_t lo,
                                                  int64_t hi, StepSearchMode mode) {
  if (lo > hi) return absl::InvalidArgumentError("step range is empty (lo > hi)");
  StepSearchResult r;
  if (mode == StepSearchMode::kLinear) return Linear(scheduler, judge, config, lo, hi, r);
  // Binary: invariant `good_below` does not fail, `bad` fails.
  const TrialResult last = scheduler.RunOne(config, hi);
  ++r.probes;
  if (scheduler.stopped()) return absl::CancelledError("step search stopped");
  if (judge.Classify(config, last, hi) != Outcome::kFail) return Linear(scheduler, judge, config, lo, hi - 1, r);
  int64_t bad = hi;
  FailureSignature sig = last.signature;
  const TrialResult first = scheduler.RunOne(config, lo);
  ++r.probes;
  if (scheduler.stopped()) return absl::CancelledError("step search stopped");
  const Outcome first_outcome = judge.Classify(config, first, lo);
  if (first_outcome == Outcome::kFail) {
    r.first_fail = lo;
    r.signature = first.signature;
    return r;
  }
  int64_t good_below = lo;
  if (first_outcome == Outcome::kUnresolved) return Linear(scheduler, judge, config, lo + 1, hi, r);
  while (bad - good_below > 1) {
    const int64_t mid = good_below + (bad - good_below) / 2;
    const TrialResult t = scheduler.RunOne(config, mid);
    ++r.probes;
    if (scheduler.stopped()) return absl::CancelledError("step search stopped");
    const Outcome o = judge.Classify(config, t, mid);
    if (o == Outcome::kFail) {
      bad = mid;
      sig = t.signature;
    } else if (o == Outcome::kPass) {
      good_below = mid;
    } else {
      return Linear(scheduler, judge, config, good_below + 1, bad, r);
    }
  }
  r.first_fail = bad;
  r.signature = sig;
  return r;
}

nlohmann::json StepSearchResultToJson(const StepSearchResult& r) {
  return {{"first_fail", r.first_fail ? nlohmann::json(*r.first_fail) : nlohmann::json(nullptr)},
          {"signature", SignatureToJson(r.signature)},
          {"probes", r.probes}};
}

}  // namespace crashreplay::bisect
