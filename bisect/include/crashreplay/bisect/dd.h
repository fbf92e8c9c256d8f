// Isolating the changes that cause a failure, among the differences between
// a passing and a failing configuration (delta debugging after Zeller &
// Hildebrandt, 2002, "Simplifying and Isolating Failure-Inducing Input").
//
// Input: a universe U of changes (ordered) such that applying none passes
// and applying all of U fails with the TARGET failure, and an oracle that
// judges sets of changes as pass, fail (the target), other (a different
// failure) or unresolved (skip, flaky). Output: a culprit C ⊆ U such that
// applying C alone fails, removing any one change of C does not (1-minimal),
// and, when the oracle confirms, every fact the claim rests on held in
// repeated runs.
//
// The search (docs/bisect.md):
//  1. needed = {}, rest = U. While `needed` alone does not fail, find the
//     shortest prefix p of `rest` such that needed ∪ rest[0, p) fails (a
//     binary search; (P+1)-ary with P parallel trials); rest[p-1] is needed:
//     move it to `needed`, and keep rest[0, p-1). The invariant "needed ∪
//     rest fails" holds throughout; another failure counts as "does not
//     fail" for the boundary, an unresolved probe is stepped around.
//  2. 1-minimality: each change of `needed` is removed in turn; a removal
//     that still fails is taken and the check starts over.
//  3. Confirmation: the decisive sets (none applied, C, each C minus one)
//     are judged again through DeltaOracle::Confirm. A set whose repeated
//     runs disagree comes back unresolved, and the result is not confirmed.
// One needed change costs ⌈log2 |U|⌉ probes plus one check of `needed`
// alone: a single culprit is found in ⌈log2 n⌉ + 1 sets, which is optimal
// for a search that tests the culprit alone (with d sets at most 2^(d-1)
// single culprits can be confirmed alone).
//
// Flakiness: every newly judged set is compared with all judged sets; a
// failing set inside a passing one (or a passing set holding a failing one)
// contradicts monotonicity, and both are re-judged through Confirm before
// the search goes on. A contradiction that Confirm cannot resolve, and a
// disagreeing confirmation, are reported (`contradicted`).
//
// Parallel probes are judged in a fixed order and the shortest failing
// prefix wins, so the result does not depend on the parallelism, only the
// number of speculative sets. Not thread-safe; the oracle may run trials in
// parallel.
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "crashreplay/bisect/delta.h"

namespace crashreplay::bisect {

enum class Outcome {
  kPass,        // works
  kFail,        // fails with the target failure
  kOther,       // fails with a different failure (another bug)
  kUnresolved,  // cannot be judged: skipped, flaky, aborted
};

class DeltaOracle {
 public:
  virtual ~DeltaOracle() = default;
  // Judges each set (changes applied to the good configuration), in order.
  virtual std::vector<Outcome> Test(const std::vector<ChangeSet>& sets) = 0;
  // Judges each set again with more runs (adaptive confirmation); a set
  // whose runs disagree is kUnresolved. Default: no more runs.
  virtual std::vector<Outcome> Confirm(const std::vector<ChangeSet>& sets) { return Test(sets); }
  // How many sets are worth judging at once.
  virtual int parallelism() const { return 1; }
  // True when the search must stop (interrupted, aborted, out of budget).
  virtual bool stopped() const { return false; }
  // Progress: the changes found needed so far, and where the next one is
  // being looked for.
  virtual void OnCandidates(const ChangeSet& /*needed*/, const ChangeSet& /*searching*/) {}
};

struct DdResult {
  ChangeSet culprit;        // complete: applying these fails; else the needed changes found so far
  ChangeSet candidates;     // when stopped: the culprit so far plus where the search was looking
  bool complete = false;    // the search ran to its end (not stopped)
  bool minimal = false;     // every single removal was judged and none failed with the target
  bool confirmed = false;   // the decisive sets were confirmed and agreed
  bool contradicted = false;  // some set's repeated runs disagreed (a flaky set was met)
  int oracle_sets = 0;      // distinct sets judged
  int confirmations = 0;    // sets re-judged through Confirm
};

// Precondition (checked by the caller): the empty set passes and `universe`
// (sorted) fails with the target.
DdResult IsolateCulprit(const ChangeSet& universe, DeltaOracle& oracle);

// Universe [0, n).
DdResult IsolateCulprit(size_t n, DeltaOracle& oracle);

}  // namespace crashreplay::bisect
