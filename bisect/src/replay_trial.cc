#include "crashreplay/bisect/replay_trial.h"

#include "absl/strings/str_cat.h"

namespace crashreplay::bisect {
namespace {

// " (class during stage at kernel/check)" of a signature in replay's JSON,
// without its detail and step (the history row has both); "" when unreadable.
std::string Brief(const nlohmann::json& sig) {
  auto s = SignatureFromJson(sig);
  if (!s.ok()) return "";
  s->detail.clear();
  s->step.reset();
  return absl::StrCat(" (", DescribeSignature(*s), ")");
}

}  // namespace

TrialResult InterpretReplayOutput(const ProcessResult& p, const TrialLimits& limits, bool diverged_is_bad,
                                  const FailureTextRules* rules) {
  // Exit 7: the configuration's device or engine cannot run here (a backend
  // that needs a GPU, vLLM on a CPU): untestable, never good or bad.
  if (p.started && !p.cancelled && !p.timed_out && p.exited && p.exit_code == 7) {
    TrialResult r;
    r.exit_code = p.exit_code;
    r.duration_s = p.duration_s;
    r.stderr_tail = p.stderr_tail;
    r.verdict = Verdict::kSkip;
    const nlohmann::json j = nlohmann::json::parse(p.stdout_text, nullptr, /*allow_exceptions=*/false);
    const std::string why = j.is_object() && j.contains("refused") && j["refused"].is_string()
                                ? j["refused"].get<std::string>()
                                : std::string("the configuration's device is not present");
    r.note = absl::StrCat("untestable here: ", why);
    return r;
  }
  if (!p.started || p.cancelled || p.timed_out || !p.exited ||
      (p.exit_code != 0 && p.exit_code != 1 && p.exit_code != 2 && p.exit_code != 3)) {
    return ClassifyProcess(p, limits, std::nullopt, rules);
  }
  TrialResult r;
  r.exit_code = p.exit_code;
  r.duration_s = p.duration_s;
  r.stderr_tail = p.stderr_tail;
  if (p.exit_code == 2 || p.exit_code == 3) {
    r.verdict = Verdict::kAbort;
    r.note = absl::StrCat("replay exited ", p.exit_code,
                          p.exit_code == 2 ? " (usage: configuration rejected)" : " (data error)");
    return r;
  }
  const nlohmann::json j = nlohmann::json::parse(p.stdout_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    r.verdict = Verdict::kAbort;
    r.note = absl::StrCat("replay exited ", p.exit_code, " without a JSON object on stdout",
                          p.stdout_truncated ? " (output was truncated)" : "");
    return r;
  }
  // replay --engine NAME: the real engine's outcome decides; the exact
  // engine's, beside it, goes into the report.
  if (auto e = j.find("engine"); e != j.end() && e->is_string()) {
    std::string exact = "could not replay";
    if (auto x = j.find("exact"); x != j.end() && x->is_object()) {
      exact = x->value("outcome", std::string("could not replay"));
      if (auto sig = x->find("signature"); sig != x->end() && sig->is_object()) {
        absl::StrAppend(&exact, Brief(*sig));
      }
    }
    std::string own = j.value("outcome", std::string());
    if (auto sig = j.find("signature"); sig != j.end() && sig->is_object()) absl::StrAppend(&own, Brief(*sig));
    r.engines = absl::StrCat(e->get<std::string>(), ": ", own, "; exact engine: ", exact);
  }
  // Where the engine's numbers (the recording's, or the real engine's under
  // --engine) leave the exact engine's: the place to look, per trial.
  if (auto d = j.find("engine_divergence"); d != j.end() && d->is_object()) {
    absl::StrAppend(&r.engines, r.engines.empty() ? "" : "; ", "departs from the exact engine at ",
                    d->value("boundary", std::string("?")), ": ", d->value("reason", std::string()));
  }
  if (auto it = j.find("kernels"); it != j.end()) {
    auto rows = KernelRowsFromJson(*it);
    if (rows.ok())
      r.kernels = *std::move(rows);
    else
      r.note = absl::StrCat("kernel table ignored: ", rows.status().message());
  }
  std::optional<int64_t> step;
  if (auto it = j.find("step"); it != j.end() && it->is_number_integer()) step = it->get<int64_t>();
  // A fault names the step it happened in: an earlier one than `step` when
  // re-executing the steps before the target failed. The kernel table and
  // the signature are that step's.
  if (auto f = j.find("fault"); f != j.end() && f->is_object()) {
    if (auto fs = f->find("step"); fs != f->end() && fs->is_number_integer()) step = fs->get<int64_t>();
  }
  if (!r.kernels.empty()) r.kernels_step = step;
  const std::string outcome = j.value("outcome", std::string());
  if (outcome == "reproduced") {
    r.verdict = Verdict::kGood;
    if (p.exit_code != 0) absl::StrAppend(&r.note, r.note.empty() ? "" : "; ", "outcome reproduced but exit 1");
    return r;
  }
  if (outcome != "failed" && outcome != "diverged") {
    r.verdict = Verdict::kAbort;
    r.note = absl::StrCat("replay printed an unknown outcome '", outcome, "'");
    return r;
  }
  // The first diverging kernel: replay writes `diverged` {step, kernel};
  // older writers used `divergence` / `first_divergence`.
  std::string diverged_kernel;
  for (const char* key : {"diverged", "divergence", "first_divergence"}) {
    if (auto d = j.find(key); d != j.end() && d->is_object()) {
      diverged_kernel = d->value("kernel", std::string());
      if (!step && d->contains("step") && (*d)["step"].is_number_integer()) step = (*d)["step"].get<int64_t>();
      break;
    }
  }
  if (outcome == "diverged" && !diverged_is_bad) {
    r.verdict = Verdict::kGood;
    absl::StrAppend(&r.note, r.note.empty() ? "" : "; ",
                    "ran with every check passing; outputs differ from the recording",
                    diverged_kernel.empty() ? "" : " from kernel ", diverged_kernel,
                    " (--diverged-is-bad counts that as a failure)");
    return r;
  }
  r.verdict = Verdict::kBad;
  r.bad_runs = 1;
  FailureSignature sig;
  sig.failure_class = outcome == "failed" ? FailureClass::kOther : FailureClass::kOutputMismatch;
  if (auto it = j.find("signature"); it != j.end() && it->is_object()) {
    auto s = SignatureFromJson(*it);
    if (s.ok())
      sig = *s;
    else
      absl::StrAppend(&r.note, r.note.empty() ? "" : "; ", "signature ignored: ", s.status().message());
  } else if (outcome == "diverged") {
    sig.kernel = diverged_kernel;  // names the bug when replay gave no signature
  }
  if (!sig.is_failure()) sig.failure_class = FailureClass::kOther;  // "failed" with class none is still a failure
  if (!sig.step) sig.step = step;
  r.signature = sig;
  return r;
}

ReplayTrialRunner::ReplayTrialRunner(ReplayTrialOptions options) : options_(std::move(options)) {
  command_.command = {options_.crashreplay_binary, "replay", options_.capture, "--config", "{config}", "--json"};
  command_.command.insert(command_.command.end(), options_.extra_args.begin(), options_.extra_args.end());
  command_.runner = options_.runner;
  command_.workdir = options_.workdir;
  command_.limits = options_.limits;
  command_.rules = options_.rules;
  command_with_step_ = command_;
  command_with_step_.command.push_back("--step");
  command_with_step_.command.push_back("{step}");
}

std::string ReplayTrialRunner::SubjectId() const { return absl::StrCat("capture:", options_.capture); }

TrialResult ReplayTrialRunner::Run(const TrialRequest& request, const std::atomic<bool>* cancel) {
  LaunchOutput launch = LaunchTrialProcess(request.step ? command_with_step_ : command_, request, cancel);
  TrialResult r =
      InterpretReplayOutput(launch.process, options_.limits, options_.diverged_is_bad, options_.rules.get());
  r.config_path = launch.config_path;
  return r;
}

std::string ReplayTrialRunner::ReproduceCommand(const std::string& config_path, std::optional<int64_t> step) const {
  const CommandTrialOptions& c = step ? command_with_step_ : command_;
  std::vector<std::string> argv = c.runner;
  for (std::string& w : SubstituteCommand(c.command, config_path, step)) argv.push_back(std::move(w));
  return ShellJoin(argv);
}

}  // namespace crashreplay::bisect
