#include "crashreplay/bisect/bisect.h"

#include <chrono>

#include "absl/strings/str_cat.h"

namespace crashreplay::bisect {
namespace {

// Remembers the last candidate sets for a report cut short.
class TrackingOracle : public ConfigOracle {
 public:
  using ConfigOracle::ConfigOracle;
  void OnCandidates(const ChangeSet& pass, const ChangeSet& fail) override {
    ConfigOracle::OnCandidates(pass, fail);
    last_pass = pass;
    last_fail = fail;
  }
  ChangeSet last_pass, last_fail;
};

void Finish(BisectReport& r, Scheduler& s, std::chrono::steady_clock::time_point start) {
  r.trials = s.evaluations();
  r.runs = s.launches();
  r.history = s.history();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
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

}  // namespace

std::string_view BisectStatusName(BisectStatus s) {
  switch (s) {
    case BisectStatus::kCulpritFound: return "culprit_found";
    case BisectStatus::kNotReproducible: return "not_reproducible";
    case BisectStatus::kGoodFails: return "good_fails";
    case BisectStatus::kInterrupted: return "interrupted";
    case BisectStatus::kAborted: return "aborted";
  }
  return "unknown";
}

BisectReport RunBisect(Scheduler& scheduler, const BisectOptions& o, Progress* progress) {
  const auto start = std::chrono::steady_clock::now();
  BisectReport r;
  r.subject = scheduler.runner().SubjectId();
  r.good = o.good;
  r.bad = o.bad;
  r.tolerance = o.tolerance;
  r.changes = Differences(o.good, o.bad);
  scheduler.set_describe_base(o.good);

  // 1. The two ends.
  scheduler.set_phase("check");
  const std::vector<TrialResult> ends = scheduler.RunBatch({o.good, o.bad});
  r.good_result = ends[0];
  r.bad_result = ends[1];
  if (Stopped(r, scheduler)) return Finish(r, scheduler, start), r;
  r.target_signature = r.bad_result.signature;
  if (r.bad_result.verdict != Verdict::kBad) {
    r.status = BisectStatus::kNotReproducible;
    r.message = absl::StrCat("the bad configuration (", o.bad_label, ") does not fail: it is ",
                             std::string(VerdictName(r.bad_result.verdict)),
                             r.bad_result.note.empty() ? "" : absl::StrCat(" (", r.bad_result.note, ")"),
                             "; check the command, or rerun with --repeat to see whether it is flaky");
    return Finish(r, scheduler, start), r;
  }
  if (r.good_result.verdict != Verdict::kGood) {
    r.status = BisectStatus::kGoodFails;
    r.message = absl::StrCat("the good configuration (", o.good_label, ") is ",
                             std::string(VerdictName(r.good_result.verdict)),
                             r.good_result.verdict == Verdict::kBad
                                 ? absl::StrCat(" too: ", DescribeSignature(r.good_result.signature))
                                 : std::string(),
                             "; pick a configuration that works as --good");
    return Finish(r, scheduler, start), r;
  }

  // 2. Isolation.
  scheduler.set_phase("isolate");
  Judge judge(r.target_signature, o.good);
  TrackingOracle oracle(scheduler, judge, o.good, r.changes, progress);
  if (r.changes.size() == 1) {
    r.culprit = {0};
    r.culprit_minimal = true;
  } else {
    absl::StatusOr<DdResult> dd = IsolateCulprit(r.changes.size(), oracle);
    r.other_findings = judge.other_findings();
    if (!dd.ok()) {
      ChangeSet diff;
      std::set_difference(oracle.last_fail.begin(), oracle.last_fail.end(), oracle.last_pass.begin(),
                          oracle.last_pass.end(), std::back_inserter(diff));
      r.candidates = DescribeChanges(r.changes, diff);
      Stopped(r, scheduler);
      return Finish(r, scheduler, start), r;
    }
    r.culprit = dd->culprit;
    r.culprit_minimal = dd->minimal;
  }
  const Config culprit_config = ApplyChanges(o.good, r.changes, r.culprit);
  if (!o.workdir.empty()) {
    r.culprit_config_path = o.workdir + "/culprit.toml";
    const std::string comment = absl::StrCat("crashreplay bisect: the good configuration (", o.good_label,
                                             ") plus the culprit: ", DescribeChanges(r.changes, r.culprit));
    if (absl::Status st = WriteConfigFile(r.culprit_config_path, culprit_config, comment); !st.ok()) {
      r.message = std::string(st.message());
    }
  }
  r.reproduce = scheduler.runner().ReproduceCommand(r.culprit_config_path, std::nullopt);

  // 3. Threshold and step searches.
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
        if (r.changes[i].name != t) others.push_back(i);
        else in_culprit = true;
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
    auto fs = FirstFailingStep(scheduler, judge, culprit_config, o.step_range->first, o.step_range->second,
                               o.step_mode);
    if (fs.ok()) {
      r.first_step = *fs;
      if (fs->first_fail) r.reproduce = scheduler.runner().ReproduceCommand(r.culprit_config_path, fs->first_fail);
    }
    if (Stopped(r, scheduler)) return Finish(r, scheduler, start), r;
  }
  r.other_findings = judge.other_findings();

  // 4. First bad kernel, from tables the trials produced (the culprit's is cached).
  const TrialResult culprit_result = scheduler.RunOne(culprit_config);
  r.reference_kernels = r.good_result.kernels;
  if (o.reference) {
    scheduler.set_phase("reference");
    const TrialResult ref = scheduler.RunOne(*o.reference);
    if (Stopped(r, scheduler)) return Finish(r, scheduler, start), r;
    r.reference_kernels = ref.kernels;
  }
  r.culprit_kernels = culprit_result.kernels;
  if (!r.reference_kernels.empty() && !r.culprit_kernels.empty()) {
    r.first_bad_kernel = FirstBadKernel(r.reference_kernels, r.culprit_kernels, o.tolerance);
  }
  r.status = BisectStatus::kCulpritFound;
  if (r.message.empty()) {
    r.message = absl::StrCat("culprit: ", DescribeChanges(r.changes, r.culprit), r.culprit_minimal ? "" : " (1-minimality unconfirmed: some trials were unresolved)");
  }
  Finish(r, scheduler, start);
  return r;
}

}  // namespace crashreplay::bisect
