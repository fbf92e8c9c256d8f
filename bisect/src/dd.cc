#include "crashreplay/bisect/dd.h"

#include <algorithm>
#include <functional>
#include <map>

namespace crashreplay::bisect {
namespace {

ChangeSet Union(const ChangeSet& a, const ChangeSet& b) {
  ChangeSet out;
  std::set_union(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}
ChangeSet Minus(const ChangeSet& a, const ChangeSet& b) {
  ChangeSet out;
  std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}
// Splits `c` into n contiguous parts of near-equal size.
std::vector<ChangeSet> Split(const ChangeSet& c, size_t n) {
  std::vector<ChangeSet> parts;
  size_t start = 0;
  for (size_t i = 0; i < n; ++i) {
    const size_t len = (c.size() - start) / (n - i);
    parts.emplace_back(c.begin() + static_cast<ptrdiff_t>(start), c.begin() + static_cast<ptrdiff_t>(start + len));
    start += len;
  }
  return parts;
}

// Memoizing front of the oracle that evaluates candidate lists in order,
// `parallelism` at a time, until a predicate holds.
class Evaluator {
 public:
  explicit Evaluator(DeltaOracle& oracle) : oracle_(oracle) {}

  // Returns the index of the first candidate (in order) for which
  // pred(index, outcome) holds, or nullopt once all are judged. Candidates
  // after the chunk containing the hit may remain unjudged.
  std::optional<size_t> FirstWhere(const std::vector<ChangeSet>& cands,
                                   const std::function<bool(size_t, Outcome)>& pred) {
    const size_t p = static_cast<size_t>(std::max(1, oracle_.parallelism()));
    size_t i = 0;
    while (i < cands.size()) {
      // Gather the next chunk of unjudged candidates, judging known ones on the way.
      std::vector<ChangeSet> chunk;
      size_t j = i;
      for (; j < cands.size() && chunk.size() < p; ++j) {
        if (!memo_.count(cands[j]) &&
            std::find(chunk.begin(), chunk.end(), cands[j]) == chunk.end()) {
          chunk.push_back(cands[j]);
        }
      }
      if (!chunk.empty()) {
        if (oracle_.stopped()) return std::nullopt;
        const std::vector<Outcome> out = oracle_.Test(chunk);
        judged_ += static_cast<int>(chunk.size());
        for (size_t k = 0; k < chunk.size(); ++k) memo_[chunk[k]] = out[k];
        if (oracle_.stopped()) return std::nullopt;
      }
      for (; i < j; ++i) {
        const Outcome o = memo_.at(cands[i]);
        if (o == Outcome::kUnresolved) saw_unresolved_ = true;
        if (pred(i, o)) return i;
      }
    }
    return std::nullopt;
  }
  Outcome Get(const ChangeSet& c) {
    std::vector<ChangeSet> one = {c};
    FirstWhere(one, [](size_t, Outcome) { return false; });
    auto it = memo_.find(c);
    return it == memo_.end() ? Outcome::kUnresolved : it->second;
  }
  Outcome Known(const ChangeSet& c) const { return memo_.at(c); }
  bool saw_unresolved() const { return saw_unresolved_; }
  void reset_unresolved() { saw_unresolved_ = false; }
  int judged() const { return judged_; }
  DeltaOracle& oracle() { return oracle_; }

 private:
  DeltaOracle& oracle_;
  std::map<ChangeSet, Outcome> memo_;
  bool saw_unresolved_ = false;
  int judged_ = 0;
};

absl::Status Stopped() { return absl::CancelledError("the search was stopped before it finished"); }

absl::StatusOr<ChangeSet> Ddmin(ChangeSet c, const ChangeSet& fixed, size_t n, Evaluator& ev) {
  while (c.size() > 1) {
    n = std::clamp<size_t>(n, 2, c.size());
    const std::vector<ChangeSet> parts = Split(c, n);
    std::vector<ChangeSet> cands;
    for (const ChangeSet& d : parts) cands.push_back(Union(fixed, d));
    const size_t subsets = cands.size();
    if (n > 2) {  // with two parts the complements are the subsets again
      for (const ChangeSet& d : parts) cands.push_back(Union(fixed, Minus(c, d)));
    }
    auto hit = ev.FirstWhere(cands, [](size_t, Outcome o) { return o == Outcome::kFail; });
    if (ev.oracle().stopped()) return Stopped();
    if (hit && *hit < subsets) {
      c = parts[*hit];
      n = 2;
    } else if (hit) {
      c = Minus(c, parts[*hit - subsets]);
      n = std::max<size_t>(n - 1, 2);
    } else if (n < c.size()) {
      n = std::min(2 * n, c.size());
    } else {
      break;
    }
    ev.oracle().OnCandidates(fixed, Union(fixed, c));
  }
  return c;
}

}  // namespace

absl::StatusOr<ChangeSet> MinimizeFailing(const ChangeSet& c, const ChangeSet& fixed, size_t n, DeltaOracle& oracle,
                                          bool* saw_unresolved) {
  Evaluator ev(oracle);
  auto r = Ddmin(c, fixed, n, ev);
  if (saw_unresolved != nullptr) *saw_unresolved = ev.saw_unresolved();
  return r;
}

absl::StatusOr<DdResult> IsolateCulprit(size_t n_changes, DeltaOracle& oracle) {
  Evaluator ev(oracle);
  DdResult result;
  ChangeSet c_pass;
  ChangeSet c_fail;
  for (size_t i = 0; i < n_changes; ++i) c_fail.push_back(i);
  // Phase 1: dd.
  size_t n = 2;
  while (true) {
    const ChangeSet delta = Minus(c_fail, c_pass);
    oracle.OnCandidates(c_pass, c_fail);
    if (delta.size() <= 1) break;
    n = std::min(n, delta.size());
    const std::vector<ChangeSet> parts = Split(delta, n);
    std::vector<ChangeSet> cands;
    for (const ChangeSet& d : parts) cands.push_back(Union(c_pass, d));
    for (const ChangeSet& d : parts) cands.push_back(Minus(c_fail, d));
    // Rules 1 and 2: a subset that fails, or a complement that passes.
    auto hit = ev.FirstWhere(cands, [&](size_t i, Outcome o) {
      return i < n ? o == Outcome::kFail : o == Outcome::kPass;
    });
    if (oracle.stopped()) return Stopped();
    if (hit) {
      if (*hit < n) c_fail = cands[*hit];
      else c_pass = cands[*hit];
      n = 2;
      continue;
    }
    // Every candidate is judged now. Rules 3 and 4: grow c_pass with a
    // passing subset, shrink c_fail by a failing complement.
    bool moved = false;
    for (size_t i = 0; i < n && !moved; ++i) {
      if (ev.Known(cands[i]) == Outcome::kPass) {
        c_pass = cands[i];
        moved = true;
      }
    }
    for (size_t i = 0; i < n && !moved; ++i) {
      if (ev.Known(cands[n + i]) == Outcome::kFail) {
        c_fail = cands[n + i];
        moved = true;
      }
    }
    if (moved) {
      n = std::max<size_t>(n - 1, 2);
    } else if (n < delta.size()) {
      n = std::min(2 * n, delta.size());
    } else {
      break;
    }
  }
  result.isolated = Minus(c_fail, c_pass);
  const bool phase1_unresolved = ev.saw_unresolved();
  ev.reset_unresolved();

  // Phase 2: the context c_pass may hold changes the isolated ones need
  // (an interaction). Invariant: fixed ∪ rest fails. Find the shortest
  // failing prefix of rest by (P+1)-ary search; its last change is needed;
  // move it to fixed and repeat until fixed fails alone: O(k log n).
  ChangeSet fixed = result.isolated;
  ChangeSet rest = c_pass;
  while (!rest.empty()) {
    if (ev.Get(fixed) == Outcome::kFail) break;
    if (oracle.stopped()) return Stopped();
    size_t lo = 0, hi = rest.size();  // prefix lo does not fail (or is unresolved), hi fails
    const size_t p = static_cast<size_t>(std::max(1, oracle.parallelism()));
    while (hi - lo > 1) {
      std::vector<size_t> lengths;
      for (size_t i = 1; i <= p; ++i) {
        const size_t len = lo + (hi - lo) * i / (p + 1);
        if (len > lo && len < hi && (lengths.empty() || len != lengths.back())) lengths.push_back(len);
      }
      if (lengths.empty()) lengths.push_back(lo + 1);
      std::vector<ChangeSet> cands;
      for (size_t len : lengths) {
        cands.push_back(Union(fixed, ChangeSet(rest.begin(), rest.begin() + static_cast<ptrdiff_t>(len))));
      }
      auto hit = ev.FirstWhere(cands, [](size_t, Outcome o) { return o == Outcome::kFail; });
      if (oracle.stopped()) return Stopped();
      if (hit) {
        hi = lengths[*hit];
        if (*hit > 0) lo = lengths[*hit - 1];
      } else {
        lo = lengths.back();
      }
    }
    fixed = Union(fixed, ChangeSet{rest[hi - 1]});
    rest.resize(hi - 1);
    oracle.OnCandidates({}, fixed);
  }
  result.culprit = fixed;
  // Phase 3: 1-minimality relative to the good configuration: removing any
  // one change must stop the failure. A removal that still fails is taken
  // and the check starts over.
  ev.reset_unresolved();
  bool shrunk = true;
  while (shrunk && result.culprit.size() > 1) {
    shrunk = false;
    std::vector<ChangeSet> cands;
    for (size_t x : result.culprit) cands.push_back(Minus(result.culprit, ChangeSet{x}));
    auto hit = ev.FirstWhere(cands, [](size_t, Outcome o) { return o == Outcome::kFail; });
    if (oracle.stopped()) return Stopped();
    if (hit) {
      result.culprit = cands[*hit];
      shrunk = true;
      oracle.OnCandidates({}, result.culprit);
    }
  }
  // A single failing change is 1-minimal outright: the good configuration passes.
  result.minimal = result.culprit.size() <= 1 || !ev.saw_unresolved();
  (void)phase1_unresolved;
  result.oracle_sets = ev.judged();
  return result;
}

}  // namespace crashreplay::bisect
