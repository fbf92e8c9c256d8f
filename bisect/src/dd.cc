#include "crashreplay/bisect/dd.h"

#include <algorithm>
#include <map>
#include <set>

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
bool Includes(const ChangeSet& big, const ChangeSet& small) {
  return small.size() <= big.size() && std::includes(big.begin(), big.end(), small.begin(), small.end());
}
ChangeSet Sorted(ChangeSet s) {
  std::sort(s.begin(), s.end());
  return s;
}

// Memoizing front of the oracle: judges unknown sets P at a time, checks
// every new outcome against the known ones for contradictions, and
// re-judges through Confirm where needed.
class Evaluator {
 public:
  explicit Evaluator(DeltaOracle& oracle) : oracle_(oracle) {}

  void Seed(const ChangeSet& s, Outcome o) { memo_[s] = o; }

  // Outcomes of `sets` in order; unknown sets are judged (kUnresolved for
  // those the search stopped before judging).
  std::vector<Outcome> Judge(const std::vector<ChangeSet>& sets) {
    std::vector<ChangeSet> todo;
    for (const ChangeSet& s : sets) {
      if (!memo_.count(s) && std::find(todo.begin(), todo.end(), s) == todo.end()) todo.push_back(s);
    }
    const size_t p = static_cast<size_t>(std::max(1, oracle_.parallelism()));
    for (size_t i = 0; i < todo.size() && !oracle_.stopped(); i += p) {
      const std::vector<ChangeSet> chunk(todo.begin() + static_cast<ptrdiff_t>(i),
                                         todo.begin() + static_cast<ptrdiff_t>(std::min(todo.size(), i + p)));
      const std::vector<Outcome> out = oracle_.Test(chunk);
      judged_ += static_cast<int>(chunk.size());
      for (size_t k = 0; k < chunk.size(); ++k) memo_[chunk[k]] = out[k];
      for (const ChangeSet& s : chunk) CheckMonotone(s);
    }
    std::vector<Outcome> out;
    for (const ChangeSet& s : sets) {
      auto it = memo_.find(s);
      out.push_back(it == memo_.end() ? Outcome::kUnresolved : it->second);
    }
    return out;
  }
  Outcome Get(const ChangeSet& s) { return Judge({s}).front(); }
  Outcome Known(const ChangeSet& s) const {
    auto it = memo_.find(s);
    return it == memo_.end() ? Outcome::kUnresolved : it->second;
  }

  // Re-judges the sets not confirmed yet; a set that was resolved and comes
  // back unresolved had runs that disagree.
  void ConfirmSets(const std::vector<ChangeSet>& sets) {
    std::vector<ChangeSet> todo;
    for (const ChangeSet& s : sets) {
      if (confirmed_.insert(s).second) todo.push_back(s);
    }
    if (todo.empty() || oracle_.stopped()) return;
    const std::vector<Outcome> out = oracle_.Confirm(todo);
    confirmations_ += static_cast<int>(todo.size());
    for (size_t k = 0; k < todo.size(); ++k) {
      Outcome& known = memo_[todo[k]];
      if (out[k] != known && out[k] == Outcome::kUnresolved && known != Outcome::kUnresolved) contradicted_ = true;
      known = out[k];
    }
  }

  bool contradicted() const { return contradicted_; }
  int judged() const { return judged_; }
  int confirmations() const { return confirmations_; }
  DeltaOracle& oracle() { return oracle_; }

 private:
  // A target failure inside a passing set, or a pass holding a failing set,
  // contradicts monotonicity: either a real interaction or a flaky trial.
  // Judging both again tells which.
  void CheckMonotone(const ChangeSet& s) {
    for (auto& [t, ot] : memo_) {
      const Outcome os = memo_.at(s);
      if (os != Outcome::kPass && os != Outcome::kFail) return;
      if (t == s || (confirmed_.count(s) && confirmed_.count(t))) continue;
      const bool clash = (os == Outcome::kFail && ot == Outcome::kPass && Includes(t, s)) ||
                         (os == Outcome::kPass && ot == Outcome::kFail && Includes(s, t));
      if (clash) ConfirmSets({s, t});
    }
  }

  DeltaOracle& oracle_;
  std::map<ChangeSet, Outcome> memo_;
  std::set<ChangeSet> confirmed_;
  bool contradicted_ = false;
  int judged_ = 0;
  int confirmations_ = 0;
};

ChangeSet Prefix(const ChangeSet& rest, size_t len) {
  return ChangeSet(rest.begin(), rest.begin() + static_cast<ptrdiff_t>(len));
}
ChangeSet Slice(const ChangeSet& rest, size_t lo, size_t hi) {
  return ChangeSet(rest.begin() + static_cast<ptrdiff_t>(lo), rest.begin() + static_cast<ptrdiff_t>(hi));
}

// Up to `p` probe lengths in (lo, hi): evenly spaced, stepping around
// lengths already known to be unresolved.
std::vector<size_t> ProbeLengths(size_t lo, size_t hi, size_t p, const std::set<size_t>& unresolved) {
  std::vector<size_t> out;
  for (size_t i = 1; i <= p; ++i) {
    const size_t m = lo + (hi - lo) * i / (p + 1);
    if (m > lo && m < hi && !unresolved.count(m) && (out.empty() || m != out.back())) out.push_back(m);
  }
  if (!out.empty()) return out;
  // Every evenly spaced point is unresolved: the nearest others to the middle.
  const size_t mid = lo + (hi - lo) / 2;
  for (size_t d = 0; out.size() < p && (mid + d < hi || mid > lo + d); ++d) {
    for (size_t m : {mid - std::min(d, mid), mid + d}) {
      if (m > lo && m < hi && !unresolved.count(m) && std::find(out.begin(), out.end(), m) == out.end()) {
        out.push_back(m);
      }
    }
  }
  std::sort(out.begin(), out.end());
  if (out.size() > p) out.resize(p);
  return out;
}

struct PrefixSearch {
  size_t lo = 0, hi = 0;  // hi: the shortest failing prefix found
};

// The shortest prefix length p of `rest` such that needed ∪ rest[0, p)
// fails, given that the whole of `rest` does. Another failure at a probe
// counts as "does not fail"; unresolved probes are stepped around, and when
// every length in between is unresolved the search settles on hi.
PrefixSearch ShortestFailingPrefix(const ChangeSet& needed, const ChangeSet& rest, Evaluator& ev) {
  PrefixSearch s;
  s.hi = rest.size();
  std::set<size_t> unresolved;
  DeltaOracle& oracle = ev.oracle();
  const size_t p = static_cast<size_t>(std::max(1, oracle.parallelism()));
  while (s.hi - s.lo > 1) {
    oracle.OnCandidates(needed, Slice(rest, s.lo, s.hi));
    const std::vector<size_t> lengths = ProbeLengths(s.lo, s.hi, p, unresolved);
    if (lengths.empty()) break;
    std::vector<ChangeSet> sets;
    for (size_t len : lengths) sets.push_back(Union(needed, Prefix(rest, len)));
    const std::vector<Outcome> out = ev.Judge(sets);
    if (oracle.stopped()) return s;
    size_t hi = s.hi;
    for (size_t k = 0; k < lengths.size(); ++k) {
      if (out[k] == Outcome::kFail) {
        hi = lengths[k];
        break;
      }
    }
    size_t lo = s.lo;
    for (size_t k = 0; k < lengths.size(); ++k) {
      if (out[k] == Outcome::kUnresolved)
        unresolved.insert(lengths[k]);
      else if (out[k] != Outcome::kFail && lengths[k] < hi)
        lo = std::max(lo, lengths[k]);
    }
    s.lo = lo;
    s.hi = hi;
  }
  return s;
}

}  // namespace

DdResult IsolateCulprit(size_t n, DeltaOracle& oracle) {
  ChangeSet all(n);
  for (size_t i = 0; i < n; ++i) all[i] = i;
  return IsolateCulprit(all, oracle);
}

DdResult IsolateCulprit(const ChangeSet& universe_in, DeltaOracle& oracle) {
  const ChangeSet universe = Sorted(universe_in);
  Evaluator ev(oracle);
  ev.Seed({}, Outcome::kPass);
  ev.Seed(universe, Outcome::kFail);
  DdResult r;
  auto finish = [&](DdResult& out) -> DdResult& {
    out.oracle_sets = ev.judged();
    out.confirmations = ev.confirmations();
    out.contradicted = ev.contradicted();
    return out;
  };

  // 1. Needed changes, one prefix search each.
  ChangeSet needed;
  ChangeSet rest = universe;
  while (!rest.empty()) {
    if (!needed.empty()) {
      const Outcome o = ev.Get(needed);
      if (oracle.stopped()) {
        r.culprit = needed;
        r.candidates = Union(needed, rest);
        return finish(r);
      }
      if (o == Outcome::kFail) break;
    }
    const PrefixSearch s = ShortestFailingPrefix(needed, rest, ev);
    if (oracle.stopped()) {
      r.culprit = needed;
      r.candidates = Union(needed, Slice(rest, s.lo, s.hi));
      return finish(r);
    }
    needed = Union(needed, ChangeSet{rest[s.hi - 1]});
    rest.resize(s.hi - 1);
    oracle.OnCandidates(needed, rest);
  }

  // 2. 1-minimality: no single removal may still fail with the target.
  ChangeSet culprit = needed;
  std::vector<ChangeSet> removals;
  while (true) {
    removals.clear();
    if (culprit.size() > 1) {
      for (size_t x : culprit) removals.push_back(Minus(culprit, ChangeSet{x}));
    }
    const std::vector<Outcome> out = ev.Judge(removals);
    if (oracle.stopped()) {
      r.culprit = culprit;
      r.candidates = culprit;
      return finish(r);
    }
    auto fail = std::find(out.begin(), out.end(), Outcome::kFail);
    if (fail == out.end()) break;
    culprit = removals[static_cast<size_t>(fail - out.begin())];
    oracle.OnCandidates(culprit, {});
  }

  // 3. Confirmation of every fact the claim rests on.
  std::vector<ChangeSet> decisive = {ChangeSet{}, culprit};
  decisive.insert(decisive.end(), removals.begin(), removals.end());
  ev.ConfirmSets(decisive);
  r.culprit = culprit;
  r.candidates = culprit;
  r.complete = !oracle.stopped();
  bool minimal = true;
  for (const ChangeSet& s : removals) {
    const Outcome o = ev.Known(s);
    minimal = minimal && (o == Outcome::kPass || o == Outcome::kOther);
  }
  r.minimal = minimal;
  r.confirmed = r.complete && ev.Known(culprit) == Outcome::kFail && ev.Known({}) == Outcome::kPass;
  return finish(r);
}

}  // namespace crashreplay::bisect
