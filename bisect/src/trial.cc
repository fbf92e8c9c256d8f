#include "crashreplay/bisect/trial.h"

#include <csignal>

#include "absl/strings/str_cat.h"

namespace crashreplay::bisect {
namespace {

constexpr size_t kStdoutScanBytes = 4u << 20;

// What the process printed, for failure-text recognition: stderr first (where
// tracebacks go), then the head of stdout (vLLM logs to stdout; CUDA device
// asserts print there).
std::string OutputText(const ProcessResult& p) {
  std::string text = KeptStderr(p);
  text += '\n';
  text.append(p.stdout_text, 0, std::min(p.stdout_text.size(), kStdoutScanBytes));
  return text;
}

}  // namespace

std::string_view VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kGood: return "good";
    case Verdict::kBad: return "bad";
    case Verdict::kSkip: return "skip";
    case Verdict::kAbort: return "abort";
    case Verdict::kFlaky: return "flaky";
  }
  return "unknown";
}

nlohmann::json TrialResultToJson(const TrialResult& r) {
  nlohmann::json j = {{"verdict", std::string(VerdictName(r.verdict))},
                      {"signature", SignatureToJson(r.signature)},
                      {"duration_s", r.duration_s},
                      {"runs", r.runs},
                      {"bad_runs", r.bad_runs}};
  if (r.exit_code >= 0) j["exit_code"] = r.exit_code;
  if (r.term_signal != 0) j["signal"] = SignalName(r.term_signal);
  if (r.timed_out) j["timed_out"] = true;
  if (!r.note.empty()) j["note"] = r.note;
  if (!r.config_path.empty()) j["config_path"] = r.config_path;
  if (!r.engines.empty()) j["engines"] = r.engines;
  return j;
}

TrialResult ClassifyProcess(const ProcessResult& p, const TrialLimits& limits,
                            const std::optional<std::string>& signature_file_text, const FailureTextRules* rules) {
  TrialResult r;
  r.exit_code = p.exited ? p.exit_code : -1;
  r.term_signal = p.term_signal;
  r.timed_out = p.timed_out;
  r.duration_s = p.duration_s;
  r.stderr_tail = p.stderr_tail;
  if (!p.started) {
    r.verdict = Verdict::kAbort;
    r.note = p.start_error;
    return r;
  }
  if (p.cancelled) {
    r.verdict = Verdict::kAbort;
    r.note = "interrupted";
    return r;
  }
  // The command's own signature, when it wrote a valid one.
  std::optional<FailureSignature> written;
  if (signature_file_text && !signature_file_text->empty()) {
    auto parsed = nlohmann::json::parse(*signature_file_text, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded()) {
      r.note = "signature file is not valid JSON; ignored";
    } else {
      // Either the signature object itself or {"signature": {...}, "kernels": [...]}.
      const nlohmann::json& sig = parsed.contains("signature") ? parsed["signature"] : parsed;
      auto s = SignatureFromJson(sig);
      if (s.ok())
        written = *s;
      else
        r.note = absl::StrCat("signature file ignored: ", s.status().message());
      if (parsed.contains("kernels")) {
        auto rows = KernelRowsFromJson(parsed["kernels"]);
        if (rows.ok()) r.kernels = *std::move(rows);
      }
    }
  }
  // A bad verdict's signature: the command's own file, else what it printed,
  // else how the process ended.
  auto bad = [&](FailureSignature fallback) {
    r.verdict = Verdict::kBad;
    r.bad_runs = 1;
    if (written && written->is_failure()) {
      r.signature = *written;  // the command knows its failure better than its exit code
      return;
    }
    const std::string text = OutputText(p);
    std::optional<FailureSignature> printed = rules != nullptr ? rules->Match(text) : SignatureFromOutput(text);
    if (printed) {
      absl::StrAppend(&printed->detail, printed->detail.empty() ? "" : " ", "(", fallback.detail, ")");
      r.signature = *std::move(printed);
    } else {
      r.signature = std::move(fallback);
    }
  };
  if (p.timed_out) {
    FailureSignature s;
    s.failure_class = FailureClass::kTimeout;
    s.detail = absl::StrCat("no result within ", limits.timeout_s.value_or(0), " s");
    r.verdict = Verdict::kBad;
    r.bad_runs = 1;
    r.signature = s;  // our own observation outranks whatever the command wrote or printed
    return r;
  }
  if (!p.exited) {
    FailureSignature s;
    const bool oom = p.term_signal == SIGKILL && limits.memory_limit_bytes;
    s.failure_class = oom ? FailureClass::kOom : FailureClass::kCrashSignal;
    s.check = oom ? "host" : SignalName(p.term_signal);
    s.detail = absl::StrCat("killed by ", SignalName(p.term_signal));
    bad(s);
    return r;
  }
  const int code = p.exit_code;
  if (code == 0) {
    r.verdict = Verdict::kGood;
    if (written && written->is_failure()) {
      absl::StrAppend(&r.note, r.note.empty() ? "" : "; ",
                      "exit 0 judged good although the signature file names a failure");
    }
    return r;
  }
  if (code == 125) {
    r.verdict = Verdict::kSkip;
    return r;
  }
  if (code < 128) {
    // The exit status is the signature when nothing better names the
    // failure: exit 3 and exit 7 are different bugs.
    FailureSignature s;
    s.failure_class = FailureClass::kOther;
    s.check = absl::StrCat("exit ", code);
    s.detail = absl::StrCat("exit ", code);
    bad(s);
    return r;
  }
  if (code > 128 && code - 128 < NSIG) {
    FailureSignature s;
    s.failure_class = FailureClass::kCrashSignal;
    s.check = SignalName(code - 128);
    s.detail = absl::StrCat(SignalName(code - 128), " (exit ", code, ")");
    bad(s);
    return r;
  }
  r.verdict = Verdict::kAbort;
  r.note = absl::StrCat("exit code ", code, " aborts the search (0 good, 125 skip, 1-127 bad)");
  return r;
}

TrialResult CombineRepeats(const std::vector<TrialResult>& runs) {
  if (runs.empty()) return TrialResult{};
  TrialResult out = runs.front();
  out.runs = static_cast<int>(runs.size());
  out.bad_runs = 0;
  bool disagree = false;
  for (const TrialResult& r : runs) {
    if (r.verdict == Verdict::kAbort) {
      TrialResult a = r;
      a.runs = out.runs;
      return a;
    }
    if (r.verdict == Verdict::kBad) ++out.bad_runs;
    if (r.verdict != runs.front().verdict) disagree = true;
    if (r.verdict == Verdict::kBad && runs.front().verdict == Verdict::kBad &&
        !SameBug(r.signature, runs.front().signature)) {
      disagree = true;
    }
  }
  if (disagree) {
    out.verdict = Verdict::kFlaky;
    // Keep the first failure's signature for the report.
    for (const TrialResult& r : runs) {
      if (r.verdict == Verdict::kBad) {
        out.signature = r.signature;
        break;
      }
    }
    std::string verdicts;
    for (const TrialResult& r : runs)
      absl::StrAppend(&verdicts, verdicts.empty() ? "" : ",", std::string(VerdictName(r.verdict)));
    out.note = absl::StrCat("runs disagree (", verdicts, ")");
  }
  return out;
}

}  // namespace crashreplay::bisect
