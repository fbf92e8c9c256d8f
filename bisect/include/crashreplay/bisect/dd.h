// Delta debugging over configuration changes (Zeller & Hildebrandt, 2002,
// "Simplifying and Isolating Failure-Inducing Input").
//
// Input: n changes between a passing configuration (none applied) and a
// failing one (all applied), and an oracle that judges sets of changes as
// pass, fail (the TARGET failure) or unresolved (skip, flaky, a different
// failure). Output: a culprit set C such that applying C alone to the good
// configuration fails, and removing any single element of C does not (it is
// 1-minimal, unless unresolved outcomes prevented checking; see `minimal`).
//
// Three phases, all in docs/bisect.md:
//  1. dd (isolation): keeps a passing set c_pass and a failing set c_fail
//     and shrinks their difference, testing c_pass ∪ Δi and c_fail \ Δi for a
//     partition Δ1..Δk; with one culprit this is a binary search, O(log n)
//     tests; worst case O(n²).
//  2. context: the isolated difference δ may need changes that were already
//     in c_pass (an interaction: A and B only fail together). While δ plus
//     what was found so far does not fail alone, a (P+1)-ary search finds
//     the shortest failing prefix of the remaining context; its last change
//     is needed. O(log n) tests per needed change, so O(k log n) in all.
//  3. 1-minimality: each change of the culprit is removed in turn; a
//     removal that still fails is taken and the check restarts.
// Unresolved outcomes are never treated as pass or fail; the algorithm moves
// to finer partitions around them, as the paper's dd does.
//
// Candidates of one round are evaluated in a fixed order, `parallelism()` at
// a time, and the first one satisfying a rule (in that order) wins; phase 2
// looks for the shortest failing prefix, which is unique when failures are
// monotone. So the result does not depend on the parallelism (only the
// number of speculative trials does). Not thread-safe; the oracle may run trials in parallel.
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "crashreplay/bisect/delta.h"

namespace crashreplay::bisect {

enum class Outcome { kPass, kFail, kUnresolved };

class DeltaOracle {
 public:
  virtual ~DeltaOracle() = default;
  // Judges each set (changes applied to the good configuration), in order.
  virtual std::vector<Outcome> Test(const std::vector<ChangeSet>& sets) = 0;
  // How many sets are worth judging at once.
  virtual int parallelism() const { return 1; }
  // True when the search must stop (interrupted or aborted).
  virtual bool stopped() const { return false; }
  // Called when the candidate difference changes (progress display).
  virtual void OnCandidates(const ChangeSet& /*pass*/, const ChangeSet& /*fail*/) {}
};

struct DdResult {
  ChangeSet culprit;          // applying these to the good configuration fails
  ChangeSet isolated;         // phase 1's 1-minimal difference (subset of culprit)
  bool minimal = true;        // false if unresolved outcomes kept 1-minimality unproven
  int oracle_sets = 0;        // sets judged (before the oracle's own caching)
};

// Precondition (checked by the caller): the empty set passes and the full
// set [0, n) fails. Cancelled when the oracle stops.
absl::StatusOr<DdResult> IsolateCulprit(size_t n, DeltaOracle& oracle);

// The paper's ddmin: a 1-minimal subset m of `c` such that fixed ∪ m fails,
// given that fixed ∪ c fails and fixed alone passes; starts at granularity
// `n`. O(|c|²) worst case; for minimizing one failing configuration.
absl::StatusOr<ChangeSet> MinimizeFailing(const ChangeSet& c, const ChangeSet& fixed, size_t n,
                                          DeltaOracle& oracle, bool* saw_unresolved);

}  // namespace crashreplay::bisect
