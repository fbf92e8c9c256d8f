#include "engine_replay.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "crashreplay/bisect/failure_text.h"
#include "crashreplay/formats/fingerprint.h"
#include "crashreplay/replay/session/replay_session.h"

namespace crashreplay::tools {
namespace {

constexpr const char* kEngines[] = {"transformers", "sglang", "vllm"};

// The failure record of `cap`'s reader, when there is one.
const FailureRecord* FirstFailure(const replay::LoadedCapture& cap) {
  if (!cap.reader || cap.reader->failures().empty()) return nullptr;
  return &cap.reader->failures().front();
}

// The fingerprints a capture holds for recorded step `step` (the step
// number, not the index), empty when none.
const replay::RecordedStep* StepNumbered(const replay::LoadedCapture& cap, int64_t step) {
  for (const replay::RecordedStep& s : cap.steps) {
    if (s.input.step == step) return &s;
  }
  return nullptr;
}

// Where an exception escaped a step, read from what the step's boundaries
// recorded: after the step's last boundary (lm_head) it escaped sampling;
// before it, the forward pass. The same rule on the recording and on the
// replay, so the two signatures compare.
std::string PhaseOf(const replay::RecordedStep* s) {
  if (s == nullptr || s->fingerprints.empty()) return "";
  for (const Fingerprint& f : s->fingerprints) {
    if (f.name == "lm_head") return "sampling";
  }
  return "forward";
}

}  // namespace

bool IsRealEngine(const std::string& name) {
  for (const char* e : kEngines) {
    if (name == e) return true;
  }
  return false;
}

std::string RealEngineNames() { return "transformers, sglang, vllm"; }

absl::StatusOr<EngineRun> RunRealEngine(const EngineReplayOptions& o) {
  std::error_code ec;
  std::filesystem::create_directories(o.out_dir, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("--engine-out ", o.out_dir, ": ", ec.message()));
  bisect::ProcessSpec spec;
  spec.argv = {o.python,  "-m",     "crashreplay.engine_replay", "--engine", o.engine, "--capture",
               o.capture, "--step", absl::StrCat(o.step),        "--out",    o.out_dir};
  if (!o.model_dir.empty()) {
    spec.argv.push_back("--model");
    spec.argv.push_back(o.model_dir);
  }
  for (const auto& [k, v] : o.settings) {
    spec.argv.push_back("--setting");
    spec.argv.push_back(absl::StrCat(k, "=", v));
  }
  for (const std::string& m : o.setups) {
    spec.argv.push_back("--setup");
    spec.argv.push_back(m);
  }
  spec.timeout_s = o.timeout_s;
  spec.stdout_limit = 1u << 20;
  EngineRun run;
  run.process = bisect::RunProcess(spec);
  if (!run.process.started) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot start the engine's Python '", o.python, "': ", run.process.start_error,
                     " (give the interpreter that has ", o.engine,
                     " installed with --engine-python PATH or CRASHREPLAY_ENGINE_PYTHON)"));
  }
  const std::string result_path = o.out_dir + "/result.json";
  std::ifstream in(result_path);
  if (in) {
    std::stringstream ss;
    ss << in.rdbuf();
    run.result = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
    if (run.result.is_discarded() || !run.result.is_object()) run.result = nullptr;
  }
  const std::string session = o.out_dir + "/session";
  if (std::filesystem::is_directory(session, ec)) {
    auto loaded = replay::LoadCapture(session);
    if (loaded.ok()) {
      run.session = *std::move(loaded);
    } else {
      run.session_problem = std::string(loaded.status().message());
    }
  } else {
    run.session_problem = "the engine wrote no session";
  }
  return run;
}

bisect::FailureSignature EngineFailureSignature(const std::string& exception_type, const std::string& message,
                                                const std::string& mode, const std::string& phase,
                                                std::optional<int64_t> step) {
  // Recorders spell a builtin's type either way ("builtins.RuntimeError",
  // "RuntimeError"), and some put it before the reason too: one spelling
  // on both sides, or the same failure would read as two.
  std::string type = exception_type;
  if (type.rfind("builtins.", 0) == 0) type = type.substr(9);
  std::string text_message = message;
  const std::string short_type = type.substr(type.rfind('.') == std::string::npos ? 0 : type.rfind('.') + 1);
  for (const std::string& prefix : {type + ": ", short_type + ": "}) {
    if (!type.empty() && text_message.rfind(prefix, 0) == 0) {
      text_message = text_message.substr(prefix.size());
      break;
    }
  }
  // The text a Python process prints for it: its last traceback line.
  const std::string text =
      absl::StrCat("Traceback (most recent call last):\n", type, type.empty() ? "" : ": ", text_message, "\n");
  bisect::FailureSignature sig;
  if (auto m = bisect::SignatureFromOutput(text)) {
    sig = *m;
  } else {
    sig.failure_class = bisect::FailureClass::kOther;
    sig.check = type;
    sig.detail = text_message;
  }
  if (mode == "prefill" || mode == "extend") sig.stage = bisect::FailureStage::kPrefill;
  if (mode == "decode") sig.stage = bisect::FailureStage::kDecode;
  if (mode == "load") sig.stage = bisect::FailureStage::kLoad;
  if (phase == "sampling") sig.kernel = "sampler";
  sig.step = step;
  return sig;
}

EngineVerdict JudgeEngineRun(const replay::LoadedCapture& recorded, int64_t step, const EngineRun& run) {
  EngineVerdict v;
  const int64_t step_no = recorded.steps[step].input.step;
  if (const FailureRecord* f = FirstFailure(recorded)) {
    std::optional<int64_t> s;
    if (f->step) s = static_cast<int64_t>(*f->step);
    v.recorded = EngineFailureSignature(f->exception_type, f->reason, f->stage,
                                        PhaseOf(s ? StepNumbered(recorded, *s) : nullptr), s);
  }
  const nlohmann::json& r = run.result;
  // The engine's failure: an exception it raised (result.json), or its
  // process dying without a result (a signal, an abort in native code).
  std::optional<bisect::FailureSignature> failed;
  if (r.is_object() && r.contains("failure") && r["failure"].is_object()) {
    const nlohmann::json& f = r["failure"];
    std::optional<int64_t> s;
    if (f.contains("step") && f["step"].is_number_integer()) s = f["step"].get<int64_t>();
    const replay::RecordedStep* rs = (run.session && s) ? StepNumbered(*run.session, *s) : nullptr;
    failed = EngineFailureSignature(f.value("type", std::string()), f.value("message", std::string()),
                                    f.value("mode", std::string()), PhaseOf(rs), s);
    v.detail = absl::StrCat(f.value("type", std::string()), ": ", f.value("message", std::string()));
  } else if (!r.is_object()) {
    const bisect::ProcessResult& p = run.process;
    bisect::FailureSignature sig;
    sig.failure_class = bisect::FailureClass::kOther;
    if (p.timed_out) {
      sig.failure_class = bisect::FailureClass::kTimeout;
      sig.check = "timeout";
    } else if (!p.exited) {
      sig.failure_class = bisect::FailureClass::kCrashSignal;
      sig.check = bisect::SignalName(p.term_signal);
    } else if (auto m = bisect::SignatureFromOutput(bisect::KeptStderr(p))) {
      sig = *m;
    } else {
      sig.check = absl::StrCat("exit ", p.exit_code);
    }
    sig.step = step_no;
    failed = sig;
    v.detail = absl::StrCat(
        "the engine's process ended without a result (",
        p.timed_out ? "timed out" : (p.exited ? absl::StrCat("exit ", p.exit_code) : bisect::SignalName(p.term_signal)),
        ")");
  }

  // Fingerprints of the target step, bit for bit.
  const replay::RecordedStep* want = StepNumbered(recorded, step_no);
  const replay::RecordedStep* got = run.session ? StepNumbered(*run.session, step_no) : nullptr;
  int64_t compared = 0, identical = 0;
  nlohmann::json first_difference;
  if (want != nullptr && got != nullptr) {
    for (const Fingerprint& w : want->fingerprints) {
      const Fingerprint* g = nullptr;
      for (const Fingerprint& x : got->fingerprints) {
        if (x.name == w.name) g = &x;
      }
      if (g == nullptr) continue;
      ++compared;
      if (*g == w) {
        ++identical;
        continue;
      }
      if (first_difference.is_null()) {
        const std::optional<std::string> departs = FingerprintDeparts(*g, w);
        first_difference = {{"boundary", w.name},
                            {"reason", departs ? *departs : "the same summary within tolerance, other bits"},
                            {"recorded", replay::FingerprintJson(w)},
                            {"engine", replay::FingerprintJson(*g)}};
      }
    }
  }
  v.fingerprints = {{"compared", compared},
                    {"identical", identical},
                    {"recorded", want ? want->fingerprints.size() : 0},
                    {"replayed", got ? got->fingerprints.size() : 0}};
  if (!first_difference.is_null()) v.fingerprints["first_difference"] = first_difference;

  // Tokens: what the engine sampled against what the recording fed back.
  int64_t tok_compared = 0, tok_identical = 0;
  nlohmann::json first_mismatch;
  if (r.is_object() && r.contains("tokens") && r["tokens"].is_array()) {
    for (const nlohmann::json& t : r["tokens"]) {
      if (!t.is_object() || !t.contains("recorded") || !t.contains("replayed")) continue;
      ++tok_compared;
      if (t["recorded"] == t["replayed"]) {
        ++tok_identical;
      } else if (first_mismatch.is_null()) {
        first_mismatch = t;
      }
    }
  }
  v.tokens = {{"compared", tok_compared}, {"identical", tok_identical}};
  if (r.is_object() && r.contains("sampling")) v.tokens["sampling"] = r["sampling"];
  if (!first_mismatch.is_null()) v.tokens["first_mismatch"] = first_mismatch;

  if (failed) {
    v.outcome = "failed";
    v.signature = *failed;
    v.matches_recorded_failure = v.recorded && bisect::SameBug(*v.recorded, *failed);
    return v;
  }
  const bool fp_same = compared == identical && (want == nullptr || want->fingerprints.empty() || compared > 0);
  if (!fp_same || tok_compared != tok_identical) {
    v.outcome = "diverged";
    v.signature.failure_class = bisect::FailureClass::kOutputMismatch;
    v.signature.step = step_no;
    if (!fp_same && first_difference.is_object()) {
      v.signature.kernel = first_difference["boundary"].get<std::string>();
      v.detail = absl::StrCat("the engine's fingerprint at ", v.signature.kernel,
                              " differs from the recording: ", first_difference["reason"].get<std::string>());
    } else if (!fp_same) {
      v.detail = "the engine computed none of the recorded boundaries of the step";
    } else {
      v.signature.kernel = "sampler";
      v.detail = absl::StrCat("the engine sampled other tokens than the recording at step ",
                              first_mismatch.value("step", int64_t{-1}));
    }
    return v;
  }
  const std::string ran =
      absl::StrCat("ran step ", step_no, " in ", run.result.value("engine", std::string("the engine")), " ",
                   run.result.value("version", std::string()), ": ", identical, " fingerprints and ", tok_identical,
                   " tokens identical to the recording");
  if (v.recorded && v.recorded->step && *v.recorded->step <= step_no) {
    // The recording failed here and the engine did not: not the run that
    // was recorded (an environment switch, a patch, a library not installed
    // as it was). Judged like a divergence (bisect: good unless
    // --diverged-is-bad), never as reproduced.
    v.outcome = "diverged";
    v.signature.failure_class = bisect::FailureClass::kOutputMismatch;
    v.signature.step = step_no;
    v.signature.check = "recorded_failure_absent";
    v.detail = absl::StrCat(ran, "; but the recorded failure (", bisect::DescribeSignature(*v.recorded),
                            ") did not happen again");
    return v;
  }
  v.outcome = "reproduced";
  v.detail = ran;
  return v;
}

}  // namespace crashreplay::tools
