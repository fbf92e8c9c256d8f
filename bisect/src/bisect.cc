#include "crashreplay/bisect/bisect.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace crashreplay::bisect {
namespace {

using Clock = std::chrono::steady_clock;

void Finish(BisectReport& r, Scheduler& s, Clock::time_point start) {
  r.trials = s.evaluations();
  r.runs = s.launches();
  r.history = s.history();
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
}

bool Stopped(BisectReport& r, Scheduler& s) {
  if (!s.stopped()) return false;
  if (s.interrupted()) {
    r.status = BisectStatus::kInterrupted;
    r.message = "interrupted: running trials were killed; the report holds what was known";
  } else {
    r.status = BisectStatus::kAborted;
    r.message = absl::StrCat("the search was aborted by ", s.abort_reason());
  }
  return true;
}

std::string Runs(const TrialResult& t) {
  return absl::StrCat(t.bad_runs, " of ", t.runs, " run", t.runs == 1 ? "" : "s", " failed");
}

// "{t1}: 2 of 4 runs failed; {t1, t3}: 1 of 4 runs failed" (the first few).
std::string FlakyList(const std::vector<FlakyConfig>& flaky) {
  std::string out;
  for (size_t i = 0; i < flaky.size() && i < 3; ++i) {
    absl::StrAppend(&out, i ? "; " : "", "{", flaky[i].changes, "}: ", Runs(flaky[i].result));
  }
  if (flaky.size() > 3) absl::StrAppend(&out, "; and ", flaky.size() - 3, " more");
  return out;
}

int Log2Ceil(size_t n) { return n <= 1 ? 0 : static_cast<int>(std::ceil(std::log2(static_cast<double>(n)))); }

// The other finding's own search: from the smallest configuration that
// failed its way down to its 1-minimal culprit, within `budget` trials.
void NarrowFinding(Scheduler& scheduler, const BisectOptions& o, const std::vector<Change>& changes, Progress* progress,
                   OtherFinding& f, std::vector<OtherFinding>& discovered) {
  const ChangeSet universe = ChangeSetOf(changes, o.good, f.config);
  if (universe.empty()) return;
  const int budget = o.other_budget > 0 ? o.other_budget : 4 * Log2Ceil(universe.size() + 1) + 8;
  Judge judge(f.signature, o.good);
  ConfigOracle oracle(scheduler, judge, o.good, changes, progress, budget);
  const DdResult d = IsolateCulprit(universe, oracle);
  f.trials = oracle.trials();
  for (size_t i : d.culprit) f.culprit.push_back(changes[i].name);
  f.culprit_text = DescribeChanges(changes, d.culprit);
  f.culprit_minimal = d.minimal;
  if (scheduler.stopped())
    f.status = FindingStatus::kStopped;
  else if (judge.target_flaky() || d.contradicted || !judge.flaky().empty())
    f.status = FindingStatus::kFlaky;
  else if (!d.complete)
    f.status = FindingStatus::kBudget;
  else if (!d.confirmed)
    f.status = FindingStatus::kInconclusive;
  else
    f.status = FindingStatus::kNarrowed;
  for (const OtherFinding& g : judge.other_findings()) discovered.push_back(g);
}

}  // namespace

std::string_view BisectStatusName(BisectStatus s) {
  switch (s) {
    case BisectStatus::kCulpritFound: return "culprit_found";
    case BisectStatus::kNotReproducible: return "not_reproducible";
    case BisectStatus::kGoodFails: return "good_fails";
    case BisectStatus::kFlaky: return "flaky";
    case BisectStatus::kInconclusive: return "inconclusive";
    case BisectStatus::kInterrupted: return "interrupted";
    case BisectStatus::kAborted: return "aborted";
  }
  return "unknown";
}

BisectReport RunBisect(Scheduler& scheduler, const BisectOptions& o, Progress* progress) {
  const auto start = Clock::now();
  BisectReport r;
  r.subject = scheduler.runner().SubjectId();
  r.good = o.good;
  r.bad = o.bad;
  r.tolerance = o.tolerance;
  r.confirm = scheduler.confirm();
  r.changes = Differences(o.good, o.bad);
  scheduler.set_describe_base(o.good);

  // 1. The two ends. A bad configuration that passes, or a good one that
  // fails, is run again before anything is concluded from it.
  scheduler.set_phase("check");
  std::vector<TrialResult> ends = scheduler.RunBatch({o.good, o.bad});
  if (Stopped(r, scheduler)) return Finish(r, scheduler, start), r;
  if (ends[1].verdict == Verdict::kGood || ends[0].verdict == Verdict::kBad) {
    scheduler.set_phase("confirm");
    std::vector<Config> again;
    if (ends[1].verdict == Verdict::kGood) again.push_back(o.bad);
    if (ends[0].verdict == Verdict::kBad) again.push_back(o.good);
    const std::vector<TrialResult> more = scheduler.Confirm(again);
    if (Stopped(r, scheduler)) return Finish(r, scheduler, start), r;
    size_t k = 0;
    if (ends[1].verdict == Verdict::kGood) ends[1] = more[k++];
    if (ends[0].verdict == Verdict::kBad) ends[0] = more[k++];
  }
  r.good_result = ends[0];
  r.bad_result = ends[1];
  r.target_signature = r.bad_result.signature;
  for (int which : {1, 0}) {
    const TrialResult& t = ends[static_cast<size_t>(which)];
    if (t.verdict != Verdict::kFlaky) continue;
    r.status = BisectStatus::kFlaky;
    r.flaky.push_back({which ? o.bad : o.good, which ? "(bad configuration)" : "(good configuration)", {}, t});
    r.message = absl::StrCat("the ", which ? "bad" : "good", " configuration (", which ? o.bad_label : o.good_label,
                             ") is flaky: ", Runs(t), " (", t.note, "); bisection needs ends that behave the same ",
                             "every time: make the failure deterministic (fixed seeds, one request order), or give a ",
                             which ? "bad configuration that always fails" : "good configuration that always works");
    return Finish(r, scheduler, start), r;
  }
  if (r.bad_result.verdict != Verdict::kBad) {
    r.status = BisectStatus::kNotReproducible;
    r.message = absl::StrCat("the bad configuration (", o.bad_label, ") does not fail: ",
                             r.bad_result.verdict == Verdict::kSkip
                                 ? "the trial skipped it (exit 125)"
                                 : absl::StrCat("it passed all ", r.bad_result.runs, " runs"),
                             r.bad_result.note.empty() ? "" : absl::StrCat(" (", r.bad_result.note, ")"),
                             "; check that the trial command runs the configuration it is given");
    return Finish(r, scheduler, start), r;
  }
  if (r.good_result.verdict != Verdict::kGood) {
    r.status = BisectStatus::kGoodFails;
    r.message = absl::StrCat("the good configuration (", o.good_label, ") ",
                             r.good_result.verdict == Verdict::kBad
                                 ? absl::StrCat("fails too, in all ", r.good_result.runs,
                                                " runs: ", DescribeSignature(r.good_result.signature))
                                 : std::string("is skipped by the trial (exit 125)"),
                             "; pick a configuration that works as --good");
    return Finish(r, scheduler, start), r;
  }
  if (r.changes.empty()) {
    r.status = BisectStatus::kFlaky;
    r.message = "the good and bad configurations are the same, yet one passed and one failed: the trial is flaky";
    return Finish(r, scheduler, start), r;
  }

  // 2. Isolation, with the facts the culprit rests on confirmed.
  scheduler.set_phase("isolate");
  Judge judge(r.target_signature, o.good);
  ConfigOracle oracle(scheduler, judge, o.good, r.changes, progress);
  const DdResult dd = IsolateCulprit(r.changes.size(), oracle);
  r.other_findings = judge.other_findings();
  r.flaky = judge.flaky();
  if (!dd.complete && !judge.target_flaky()) {
    r.candidates = SummarizeChanges(r.changes, dd.candidates, 400);
    Stopped(r, scheduler);
    return Finish(r, scheduler, start), r;
  }
  if (!dd.complete) {
    // Stopped at the first configuration that reproduced the target only
    // sometimes: what was still a candidate is all the search can say.
    r.status = BisectStatus::kFlaky;
    r.candidates = SummarizeChanges(r.changes, dd.candidates, 400);
    r.message = absl::StrCat(
        "flaky: ", FlakyList(r.flaky), " - the failure is reproduced only in some runs of the same configuration, ",
        "so no culprit can be earned; the search stopped there with candidates {", r.candidates,
        "}. Make the trial deterministic (fixed seeds, one request order), or rerun with a larger --repeat");
  } else if (dd.contradicted || !r.flaky.empty()) {
    r.status = BisectStatus::kFlaky;
    r.suspect = dd.culprit;
    r.message =
        absl::StrCat("flaky: ", r.flaky.size(), " configuration", r.flaky.size() == 1 ? "" : "s",
                     " gave different results when run again (", FlakyList(r.flaky), "); no culprit is claimed. ",
                     "The search isolated {", SummarizeChanges(r.changes, dd.culprit, 200), "}",
                     dd.confirmed ? ", which failed in every run" : ", which is not confirmed",
                     ". Make the trial deterministic, or rerun with a larger --repeat and --confirm");
  } else if (!dd.confirmed) {
    r.status = BisectStatus::kInconclusive;
    r.suspect = dd.culprit;
    r.message = absl::StrCat("inconclusive: the search isolated {", SummarizeChanges(r.changes, dd.culprit, 200),
                             "} but could not confirm that it fails on its own (its trials were skipped or "
                             "unresolved); no culprit is claimed");
  } else {
    r.status = BisectStatus::kCulpritFound;
    r.culprit = dd.culprit;
    r.culprit_minimal = dd.minimal;
    r.message = absl::StrCat("culprit: ", SummarizeChanges(r.changes, r.culprit, 400),
                             r.culprit_minimal ? "" : " (1-minimality unconfirmed: some removals were unresolved)");
  }

  // 3. Each other finding gets a search of its own.
  if (o.narrow_others) {
    std::vector<OtherFinding>& findings = r.other_findings;
    for (size_t i = 0; i < findings.size() && static_cast<int>(i) < o.max_others; ++i) {
      if (findings[i].step) continue;
      scheduler.set_phase(absl::StrCat("other-", i + 1));
      std::vector<OtherFinding> discovered;
      NarrowFinding(scheduler, o, r.changes, progress, findings[i], discovered);
      for (const OtherFinding& g : discovered) {
        const bool known = SameBug(g.signature, r.target_signature) ||
                           std::any_of(findings.begin(), findings.end(),
                                       [&](const OtherFinding& f) { return SameBug(f.signature, g.signature); });
        if (!known) findings.push_back(g);
      }
      if (scheduler.stopped()) break;
    }
    if (Stopped(r, scheduler)) return Finish(r, scheduler, start), r;
  }
  // Every finding gets a configuration file and the command that reruns it.
  for (size_t i = 0; i < r.other_findings.size() && !o.workdir.empty(); ++i) {
    OtherFinding& f = r.other_findings[i];
    if (f.step) continue;
    Config c = f.config;
    if (f.status == FindingStatus::kNarrowed) {
      ChangeSet cs;
      for (const std::string& name : f.culprit) {
        for (size_t k = 0; k < r.changes.size(); ++k)
          if (r.changes[k].name == name) cs.push_back(k);
      }
      c = ApplyChanges(o.good, r.changes, cs);
    }
    f.config_path = absl::StrCat(o.workdir, "/finding-", i + 1, ".toml");
    const std::string comment =
        absl::StrCat("crashreplay bisect: other finding ", i + 1, ": ", DescribeSignature(f.signature));
    if (WriteConfigFile(f.config_path, c, comment).ok()) {
      f.reproduce = scheduler.runner().ReproduceCommand(f.config_path, std::nullopt);
    } else {
      f.config_path.clear();
    }
  }
  if (r.status != BisectStatus::kCulpritFound) return Finish(r, scheduler, start), r;

  const Config culprit_config = ApplyChanges(o.good, r.changes, r.culprit);
  if (!o.workdir.empty()) {
    r.culprit_config_path = o.workdir + "/culprit.toml";
    const std::string comment = absl::StrCat("crashreplay bisect: the good configuration (", o.good_label,
                                             ") plus the culprit: ", SummarizeChanges(r.changes, r.culprit, 400));
    if (absl::Status st = WriteConfigFile(r.culprit_config_path, culprit_config, comment); !st.ok()) {
      r.message = std::string(st.message());
    }
  }
  r.reproduce = scheduler.runner().ReproduceCommand(r.culprit_config_path, std::nullopt);

  // 4. Threshold and step searches.
  if (o.threshold_toggle) {
    scheduler.set_phase("threshold");
    const std::string& t = *o.threshold_toggle;
    auto g = o.good.find(t);
    auto b = o.bad.find(t);
    if (g == o.good.end() || b == o.bad.end() || !g->second.is_number() || !b->second.is_number()) {
      ThresholdResult tr;
      tr.toggle = t;
      tr.note = "the toggle must be numeric and set in both configurations";
      r.threshold = tr;
    } else {
      // When the toggle is part of the culprit, vary it with the rest of the
      // culprit applied; otherwise vary it on the good configuration.
      ChangeSet others;
      bool in_culprit = false;
      for (size_t i : r.culprit) {
        if (r.changes[i].name != t)
          others.push_back(i);
        else
          in_culprit = true;
      }
      if (!in_culprit) others.clear();
      ThresholdOptions to;
      to.toggle = t;
      to.pass_value = g->second.as_number();
      to.fail_value = b->second.as_number();
      to.precision = o.threshold_precision;
      to.integer = g->second.is_int() && b->second.is_int();
      auto tr = ThresholdSearch(scheduler, ApplyChanges(o.good, r.changes, others), to);
      if (tr.ok()) r.threshold = *tr;
      if (Stopped(r, scheduler)) return Finish(r, scheduler, start), r;
    }
  }
  if (o.step_range) {
    scheduler.set_phase("first-step");
    auto fs =
        FirstFailingStep(scheduler, judge, culprit_config, o.step_range->first, o.step_range->second, o.step_mode);
    if (fs.ok()) {
      r.first_step = *fs;
      if (fs->first_fail) r.reproduce = scheduler.runner().ReproduceCommand(r.culprit_config_path, fs->first_fail);
    }
    if (Stopped(r, scheduler)) return Finish(r, scheduler, start), r;
    for (const OtherFinding& g : judge.other_findings()) {
      if (!g.step) continue;
      const bool known = std::any_of(r.other_findings.begin(), r.other_findings.end(), [&](const OtherFinding& f) {
        return f.step == g.step && SameBug(f.signature, g.signature);
      });
      if (!known) r.other_findings.push_back(g);
    }
  }

  // 5. First bad kernel, from tables the trials produced (the culprit's is cached).
  const TrialResult culprit_result = scheduler.RunOne(culprit_config);
  r.reference_kernels = r.good_result.kernels;
  std::optional<int64_t> reference_step = r.good_result.kernels_step;
  if (o.reference) {
    scheduler.set_phase("reference");
    const TrialResult ref = scheduler.RunOne(*o.reference);
    if (Stopped(r, scheduler)) return Finish(r, scheduler, start), r;
    r.reference_kernels = ref.kernels;
    reference_step = ref.kernels_step;
  }
  // The culprit failed in another step than the reference's table shows
  // (while re-executing the steps before the target): compare that step.
  if (culprit_result.kernels_step && reference_step && *culprit_result.kernels_step != *reference_step) {
    scheduler.set_phase("reference");
    const TrialResult ref = scheduler.RunOne(o.reference ? *o.reference : o.good, *culprit_result.kernels_step);
    if (Stopped(r, scheduler)) return Finish(r, scheduler, start), r;
    r.reference_kernels = ref.kernels_step == culprit_result.kernels_step ? ref.kernels : std::vector<KernelRow>{};
  }
  r.culprit_kernels = culprit_result.kernels;
  if (!r.reference_kernels.empty() && !r.culprit_kernels.empty()) {
    r.first_bad_kernel = FirstBadKernel(r.reference_kernels, r.culprit_kernels, o.tolerance);
  }
  Finish(r, scheduler, start);
  return r;
}

}  // namespace crashreplay::bisect
