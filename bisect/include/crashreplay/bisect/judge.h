// Judging trials against a fixed target signature.
//
// A search is after one bug: a trial counts as a reproduction (fail) only
// when it is bad with a signature that is SameBug as the target; good is
// pass; a failure with another signature is `other` for the search and
// recorded as an other finding (one per distinct signature, with the
// smallest configuration seen to fail that way, e.g. "at
// mem_fraction_static=0.95: oom during graph_capture"); skip is unresolved;
// flaky (runs that disagree) is unresolved and recorded, because a search
// that met flakiness must not end in "culprit found". ConfigOracle adapts
// this to delta debugging over a change list, with confirmation reruns and
// an optional trial budget.
//
// Not thread-safe (one search thread); trials themselves run in parallel in
// the Scheduler.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "crashreplay/bisect/dd.h"
#include "crashreplay/bisect/delta.h"
#include "crashreplay/bisect/scheduler.h"

namespace crashreplay::bisect {

// How an other finding's own search ended.
enum class FindingStatus {
  kListed,          // not narrowed (opted out, over --max-others, or found at a step)
  kNarrowed,        // its culprit is confirmed and 1-minimal
  kFlaky,           // its search met configurations whose runs disagree
  kInconclusive,    // its culprit could not be confirmed (unresolved trials)
  kBudget,          // its trial budget ran out; `culprit` holds what was found
  kStopped,         // interrupted or aborted
};
std::string_view FindingStatusName(FindingStatus s);

struct OtherFinding {
  FailureSignature signature;
  Config config;                // the smallest configuration seen to fail this way
  std::string changes;          // that configuration as changes from the good one
  size_t change_count = 0;
  int configurations = 0;       // distinct configurations seen to fail this way
  std::optional<int64_t> step;
  // Filled by the finding's own search (bisect.cc).
  FindingStatus status = FindingStatus::kListed;
  std::vector<std::string> culprit;   // change names, in name order
  std::string culprit_text;           // "k04=true"
  bool culprit_minimal = false;
  int trials = 0;                     // trials its search added
  std::string config_path;            // <workdir>/finding-N.toml: its culprit applied to the good
                                      // configuration when narrowed, else `config`
  std::string reproduce;              // the command that reruns config_path
};

struct FlakyConfig {
  Config config;
  std::string changes;          // as changes from the good one
  std::optional<int64_t> step;
  TrialResult result;           // runs, bad_runs, the verdicts in `note`
};

class Judge {
 public:
  Judge(FailureSignature target, const Config& good) : target_(std::move(target)), good_(good) {}
  Outcome Classify(const Config& config, const TrialResult& r, std::optional<int64_t> step = {});
  const FailureSignature& target() const { return target_; }
  const std::vector<OtherFinding>& other_findings() const { return findings_; }
  std::vector<OtherFinding>& mutable_other_findings() { return findings_; }
  const std::vector<FlakyConfig>& flaky() const { return flaky_; }
  // A configuration whose runs disagree and that failed with the target in
  // some of them: the search's evidence contradicts itself.
  bool target_flaky() const { return target_flaky_; }

 private:
  FailureSignature target_;
  Config good_;
  std::vector<OtherFinding> findings_;
  std::vector<FlakyConfig> flaky_;
  bool target_flaky_ = false;
};

class ConfigOracle : public DeltaOracle {
 public:
  // `max_trials` > 0 stops the search once it has added that many trials.
  ConfigOracle(Scheduler& scheduler, Judge& judge, const Config& good, const std::vector<Change>& changes,
               Progress* progress, int max_trials = 0)
      : scheduler_(scheduler),
        judge_(judge),
        good_(good),
        changes_(changes),
        progress_(progress),
        max_trials_(max_trials),
        start_trials_(scheduler.evaluations()) {}
  std::vector<Outcome> Test(const std::vector<ChangeSet>& sets) override;
  std::vector<Outcome> Confirm(const std::vector<ChangeSet>& sets) override;
  int parallelism() const override { return scheduler_.parallelism(); }
  // Stops when interrupted or aborted, out of budget, or once a configuration
  // reproduced the target only in some of its runs: from then on the search
  // cannot earn a culprit, and every further trial would be spent for none.
  bool stopped() const override { return scheduler_.stopped() || out_of_budget() || judge_.target_flaky(); }
  void OnCandidates(const ChangeSet& needed, const ChangeSet& searching) override;

  bool out_of_budget() const { return max_trials_ > 0 && trials() >= max_trials_; }
  int trials() const { return scheduler_.evaluations() - start_trials_; }
  // The last candidates reported (for a search cut short).
  const ChangeSet& last_needed() const { return last_needed_; }
  const ChangeSet& last_searching() const { return last_searching_; }

 private:
  Scheduler& scheduler_;
  Judge& judge_;
  const Config& good_;
  const std::vector<Change>& changes_;
  Progress* progress_;
  int max_trials_;
  int start_trials_;
  ChangeSet last_needed_, last_searching_;
};

}  // namespace crashreplay::bisect
