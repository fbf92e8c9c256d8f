// Judging trials against a fixed target signature.
//
// The search is after one bug: the bad configuration's failure. A trial
// counts as a reproduction (fail) only when it is bad with a signature that
// is SameBug as the target; good is pass; a failure with another signature
// is unresolved for the search and recorded as an "other finding" (e.g. "at
// mem_fraction_static=0.95 the failure becomes an OOM during graph
// capture"); skip and flaky are unresolved. ConfigOracle adapts this to
// delta debugging over a change list.
//
// Not thread-safe (one search thread); trials themselves run in parallel in
// the Scheduler.
#pragma once

#include <vector>

#include "crashreplay/bisect/dd.h"
#include "crashreplay/bisect/delta.h"
#include "crashreplay/bisect/scheduler.h"

namespace crashreplay::bisect {

struct OtherFinding {
  Config config;
  std::string changes;          // the configuration as changes from the good one
  FailureSignature signature;
  std::optional<int64_t> step;
};

class Judge {
 public:
  Judge(FailureSignature target, const Config& good) : target_(std::move(target)), good_(good) {}
  Outcome Classify(const Config& config, const TrialResult& r, std::optional<int64_t> step = {});
  const FailureSignature& target() const { return target_; }
  const std::vector<OtherFinding>& other_findings() const { return findings_; }

 private:
  FailureSignature target_;
  Config good_;
  std::vector<OtherFinding> findings_;
};

class ConfigOracle : public DeltaOracle {
 public:
  ConfigOracle(Scheduler& scheduler, Judge& judge, const Config& good, const std::vector<Change>& changes,
               Progress* progress)
      : scheduler_(scheduler), judge_(judge), good_(good), changes_(changes), progress_(progress) {}
  std::vector<Outcome> Test(const std::vector<ChangeSet>& sets) override;
  int parallelism() const override { return scheduler_.parallelism(); }
  bool stopped() const override { return scheduler_.stopped(); }
  void OnCandidates(const ChangeSet& pass, const ChangeSet& fail) override;

 private:
  Scheduler& scheduler_;
  Judge& judge_;
  const Config& good_;
  const std::vector<Change>& changes_;
  Progress* progress_;
};

}  // namespace crashreplay::bisect
