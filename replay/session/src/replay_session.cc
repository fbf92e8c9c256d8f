#include "crashreplay/replay/session/replay_session.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

#include "crashreplay/base/text.h"

namespace crashreplay::replay {

using text::Cat;

void StepLogRecorder::BeforeStep(const StepInput& input) {
  RecordedStep s;
  s.input = input;
  steps_.push_back(std::move(s));
}

void StepLogRecorder::AfterStep(const StepProgram& p) {
  RecordedStep& s = steps_.back();
  if (kernel_digests_) {
    for (const KernelRecord& k : p.records()) {
      if (!k.failed) s.kernel_digests.emplace_back(k.label, k.digest);
    }
  }
  if (p.fault()) {
    s.fault = p.fault();
    return;
  }
  s.digest = p.Digest();
  s.sampled = p.SampledTokens();
}

nlohmann::json FingerprintJson(const crashreplay::Fingerprint& f) {
  nlohmann::json j = {{"name", f.name},
                      {"dtype", f.dtype},
                      {"numel", f.numel},
                      {"nan", f.nan},
                      {"pos_inf", f.pos_inf},
                      {"neg_inf", f.neg_inf},
                      {"min", f.min},
                      {"max", f.max},
                      {"max_abs", f.max_abs},
                      {"sum", f.sum},
                      {"sum_squares", f.sum_squares},
                      {"is_int", f.is_int},
                      {"text", FingerprintText(f)}};
  if (f.first_nonfinite_token >= 0) {
    j["first_nonfinite"] = {{"token", f.first_nonfinite_token}, {"column", f.first_nonfinite_column}};
  }
  if (f.content_hash) j["content_hash"] = f.content_hash->Hex();
  return j;
}

namespace {

// The replay's kernel that finishes boundary "L3.down_proj"-style names:
// "L3's mlp" for people.
std::string BoundaryWhere(const std::string& boundary) {
  const size_t dot = boundary.find('.');
  if (boundary.size() > 1 && boundary[0] == 'L' && dot != std::string::npos) {
    return Cat(boundary.substr(0, dot), "'s ", boundary.substr(dot + 1));
  }
  return boundary;
}

// The engine's records against the replay's, in the engine's order: the
// first boundary that departs. Boundaries the replay did not reach (it
// stopped at a fault) or does not have are passed over.
void CompareFingerprints(const RecordedStep& rec, const StepProgram& prog, ReplayReport* rep) {
  if (rec.fingerprints.empty()) return;
  std::map<std::string, const crashreplay::Fingerprint*> mine;
  for (const crashreplay::Fingerprint& f : prog.fingerprints()) mine.emplace(f.name, &f);
  rep->fingerprints_compared = 0;
  for (const crashreplay::Fingerprint& e : rec.fingerprints) {
    auto it = mine.find(e.name);
    if (it == mine.end()) continue;
    rep->fingerprints_compared += 1;
    if (rep->engine_divergence) continue;
    if (std::optional<std::string> why = FingerprintDeparts(e, *it->second)) {
      rep->engine_divergence = EngineDivergence{e.name, *why, e, *it->second};
    }
  }
  if (!rec.fingerprints_complete) rep->engine_last_boundary = rec.fingerprints.back().name;
}

}  // namespace

nlohmann::json EngineDivergence::ToJson() const {
  return nlohmann::json{{"boundary", boundary},
                        {"reason", reason},
                        {"engine", FingerprintJson(engine)},
                        {"replay", FingerprintJson(replay)}};
}

nlohmann::json ReplayReport::ToJson() const {
  nlohmann::json j;
  j["outcome"] = outcome;
  j["step"] = step;
  j["digest"] = digest.Hex();
  j["activation_bytes"] = activation_bytes;
  j["kernels"] = nlohmann::json::array();
  for (const KernelRecord& k : kernels) j["kernels"].push_back(KernelRecordToJson(k));
  if (fault) {
    j["fault"] = fault->ToJson();
    j["signature"] = j["fault"]["signature"];
  }
  j["first_nonfinite_kernel"] = first_nonfinite;
  if (diverged_step >= 0) j["diverged"] = {{"step", diverged_step}, {"kernel", diverged_kernel}};
  if (fault) j["matches_recorded_failure"] = matches_recorded_failure;
  if (fingerprints_compared >= 0) {
    j["fingerprints"] = {{"compared", fingerprints_compared}};
    if (!engine_last_boundary.empty()) j["fingerprints"]["engine_last_boundary"] = engine_last_boundary;
  }
  if (engine_divergence) {
    j["engine_divergence"] = engine_divergence->ToJson();
    // A step that ran clean but departs from what the engine computed is a
    // finding of its own, which bisection can target (--diverged-is-bad).
    if (!fault) {
      j["signature"] = {
          {"class", "engine_divergence"},
          {"stage", ForwardModeName(mode)},
          {"kernel", engine_divergence->boundary},
          {"check", "fingerprint"},
          {"detail", Cat(engine_divergence->reason, "; the engine: ", FingerprintText(engine_divergence->engine),
                         "; the reference: ", FingerprintText(engine_divergence->replay))}};
    }
  }
  j["detail"] = detail;
  j["start"] = start;
  if (snapshot_step >= 0) j["snapshot_step"] = snapshot_step;
  if (!start_note.empty()) j["start_note"] = start_note;
  return j;
}

namespace {

int64_t Tokens(const StepInput& in) {
  int64_t n = 0;
  for (const StepRow& r : in.rows) n += static_cast<int64_t>(r.tokens.size());
  return n;
}

}  // namespace

ReExecution PlanReExecution(const std::vector<RecordedStep>& log, int64_t target) {
  ReExecution r;
  r.steps = std::clamp<int64_t>(target, 0, static_cast<int64_t>(log.size()));
  for (int64_t i = 0; i < r.steps; ++i) {
    const int64_t t = Tokens(log[i].input);
    r.tokens += t;
    if (log[i].input.mode != ForwardMode::kDecode) r.prefill_tokens += t;
  }
  return r;
}

std::string ReExecution::Text() const {
  std::string s = absl::StrCat(tokens, " tokens in ", steps, steps == 1 ? " step" : " steps");
  if (prefill_tokens > 0 && prefill_tokens != tokens) absl::StrAppend(&s, " (", prefill_tokens, " of prefill)");
  return s;
}

ReplayReport ReplayStep(Engine& engine, const std::vector<RecordedStep>& log, int64_t target,
                        const ReplayOptions& options) {
  const std::string& stop_after = options.stop_after;
  ReplayReport rep;
  rep.step = target;
  if (engine.plan().fault) {
    rep.outcome = "failed";
    rep.fault = engine.plan().fault;
    rep.detail = rep.fault->message;
    return rep;
  }
  if (options.state_restored) {
    rep.start = "snapshot";
    rep.snapshot_step = target;
  }
  // Rebuild the KV cache: re-execute every earlier step as recorded.
  auto report = [&](std::string_view phase, int64_t done, int64_t total, std::string_view detail) {
    if (options.progress) options.progress(phase, done, total, detail);
  };
  // Progress in tokens (a kernel of a step counts its share of the step's
  // tokens), so a long prefill moves the line and the time left is an
  // estimate over the whole re-execution.
  const int64_t total_tokens = options.state_restored ? 0 : PlanReExecution(log, target).tokens;
  int64_t tokens_done = 0;
  for (int64_t i = 0; i < target && !options.state_restored; ++i) {
    const std::string what = Cat("step ", log[i].input.step, " ", ForwardModeName(log[i].input.mode));
    const int64_t step_tokens = Tokens(log[i].input);
    auto prog = engine.Prepare(log[i].input);
    prog->set_fingerprints(false);  // only the target step's are compared
    const int64_t kernels = std::max<int64_t>(1, static_cast<int64_t>(prog->kernels().size()));
    report("re-executing steps (tokens)", tokens_done, total_tokens, what);
    while (!prog->done()) {
      prog->RunNext();
      const int64_t ran = static_cast<int64_t>(prog->records().size());
      report("re-executing steps (tokens)", tokens_done + step_tokens * ran / kernels, total_tokens,
             Cat(what, ": ", prog->records().back().label));
    }
    prog->RunAll();  // the streamed layer released, the device synchronized
    tokens_done += step_tokens;
    if (prog->fault()) {
      rep.outcome = "failed";
      rep.fault = prog->fault();
      rep.kernels = prog->records();
      rep.first_nonfinite = prog->first_nonfinite();
      rep.detail = Cat("step ", i, " failed while rebuilding the state of step ", target, ": ", rep.fault->message);
      return rep;
    }
    if (log[i].digest && prog->Digest() != *log[i].digest && rep.diverged_step < 0) {
      rep.diverged_step = i;
    }
  }
  if (target > 0 && !options.state_restored) report("re-executing steps (tokens)", total_tokens, total_tokens, "");
  const RecordedStep& rec = log[target];
  auto prog = engine.Prepare(rec.input);
  const std::string phase = Cat("step ", rec.input.step, " kernel by kernel");
  const int64_t total = static_cast<int64_t>(prog->kernels().size());
  size_t next_digest = 0;
  while (!prog->done()) {
    prog->RunNext();
    report(phase, static_cast<int64_t>(prog->records().size()), total, prog->records().back().label);
    if (options.observer != nullptr) options.observer->AfterKernel(*prog, prog->records().size() - 1);
    const KernelRecord& k = prog->records().back();
    // Kernel digests are compared in order; the first mismatch names where
    // the step went another way.
    if (!k.failed && next_digest < rec.kernel_digests.size() && rec.kernel_digests[next_digest].first == k.label) {
      if (rec.kernel_digests[next_digest].second != k.digest && rep.diverged_kernel.empty()) {
        rep.diverged_kernel = k.label;
      }
      next_digest += 1;
    }
    if (!stop_after.empty() && k.label == stop_after) break;
  }
  rep.kernels = prog->records();
  rep.first_nonfinite = prog->first_nonfinite();
  rep.fault = prog->fault();
  rep.mode = rec.input.mode;
  rep.activation_bytes = prog->activation_bytes();
  if (!rep.fault && prog->done()) rep.digest = prog->Digest();
  CompareFingerprints(rec, *prog, &rep);
  const std::string engine_note =
      rep.engine_divergence
          ? Cat("the engine's ", rep.engine_divergence->boundary, " at step ", rec.input.step,
                " departs from the exact ", "reference at the same point: ", rep.engine_divergence->reason,
                "; the divergence starts in ", BoundaryWhere(rep.engine_divergence->boundary))
          : std::string();
  if (rep.fault) {
    // A failure is "failed" whether or not it was recorded: exit status 1,
    // which is what bisection counts as bad; the report says if it matches.
    rep.matches_recorded_failure = rec.fault && rec.fault->Signature() == rep.fault->Signature();
    rep.outcome = "failed";
    rep.detail = rep.matches_recorded_failure ? Cat("the recorded failure fired again: ", rep.fault->message)
                                              : rep.fault->message;
    if (!engine_note.empty()) rep.detail += Cat("; ", engine_note);
    return rep;
  }
  if (rep.engine_divergence) {
    rep.outcome = "diverged";
    if (rep.diverged_step < 0) rep.diverged_step = target;
    rep.detail = engine_note;
    return rep;
  }
  if (rec.fault) {
    // The recorded step failed, so only the kernels before the failure have
    // recorded digests; if they all match, the step ran clean where the
    // recording failed.
    if (rep.diverged_step >= 0 || !rep.diverged_kernel.empty()) {
      rep.outcome = "diverged";
      if (rep.diverged_step < 0) rep.diverged_step = target;
      rep.detail = Cat("first divergence at step ", rep.diverged_step,
                       rep.diverged_kernel.empty() ? std::string() : Cat(", kernel ", rep.diverged_kernel));
    } else {
      rep.outcome = "reproduced";
      rep.detail = Cat("ran clean: the recorded failure ", rec.fault->Signature(),
                       " did not fire and every recorded output matches");
    }
    return rep;
  }
  const bool step_differs = prog->done() && rec.digest && rep.digest != *rec.digest;
  if (rep.diverged_step >= 0 || !rep.diverged_kernel.empty() || step_differs) {
    rep.outcome = "diverged";
    if (rep.diverged_step < 0) rep.diverged_step = target;
    rep.detail = Cat("first divergence at step ", rep.diverged_step,
                     rep.diverged_kernel.empty() ? std::string() : Cat(", kernel ", rep.diverged_kernel));
    return rep;
  }
  rep.outcome = "reproduced";
  rep.detail = prog->done() ? "every output matches the recording" : Cat("matches up to ", stop_after);
  return rep;
}

nlohmann::json ChromeTrace(const std::vector<KernelRecord>& kernels, int64_t step) {
  nlohmann::json events = nlohmann::json::array();
  double ts = 0;
  for (const KernelRecord& k : kernels) {
    events.push_back(
        {{"name", k.label},
         {"cat", k.name},
         {"ph", "X"},
         {"ts", ts},
         {"dur", k.micros},
         {"pid", 1},
         {"tid", 1},
         {"args", {{"step", step}, {"nan", k.nan}, {"inf", k.inf}, {"digest", k.digest.Hex()}, {"failed", k.failed}}}});
    ts += k.micros;
  }
  return nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}};
}

}  // namespace crashreplay::replay
