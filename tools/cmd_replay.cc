// `crashreplay replay CAPTURE [--step N] [--config FILE] [--set k=v]...
// [--json] [--trace OUT.json] [--dump DIR [--dump-kernels PATTERNS]]`:
// re-executes a recorded step kernel by kernel and says whether it
// reproduced, diverged or failed (docs/replay.md).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "crashreplay/bisect/signature.h"
#include "crashreplay/formats/config_file.h"
#include "crashreplay/formats/hf_config.h"
#include "crashreplay/replay/config/engine_vocab.h"

#include "command.h"
#include "commands_decl.h"
#include "crashreplay/base/status.h"
#include "crashreplay/base/status_line.h"
#include "crashreplay/replay/captures/capture_io.h"
#include "crashreplay/replay/captures/engine_weights.h"
#include "crashreplay/replay/model/checkpoint_io.h"
#include "crashreplay/replay/session/replay_session.h"
#include "crashreplay/replay/session/step_dump.h"
#include "engine_replay.h"
#include "exit_codes.h"
#include "gpu_fault.h"
#include "load_model.h"
#include "replayable.h"

namespace crashreplay::tools {
namespace {

// An output that cannot be written is a data error (exit 3, docs/cli.md),
// never exit 1, which bisection would read as "the replay failed".
int OutputError(const std::string& message) {
  std::fprintf(stderr, "crashreplay: %s\n", message.c_str());
  return kExitDataError;
}

// Creates DIR and checks that a file can be created in it, before the replay
// runs, so an unwritable --dump fails fast and names the path.
std::optional<std::string> PrepareDumpDir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return "--dump " + dir + ": cannot create the directory: " + ec.message();
  if (!std::filesystem::is_directory(dir, ec)) return "--dump " + dir + ": not a directory";
  const std::string probe = dir + "/.crashreplay-probe-" + std::to_string(::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return "--dump " + dir + ": cannot create files in the directory: " + std::strerror(errno);
  ::close(fd);
  ::unlink(probe.c_str());
  return std::nullopt;
}

// Decides how the state of `step` is rebuilt: from the capture's snapshot of
// that step when there is one, the configuration is the recorded one (the
// snapshot holds the state the recorded configuration produced; under
// another, re-execution is what computes the state that configuration
// would have reached) and the snapshot reads back and fits the engine; else
// by re-execution. Restores the state into `engine` and sets
// options->state_restored when the snapshot is used; returns the reason it
// is not ("" when used). An unusable snapshot (corrupt blob, wrong shape) is
// a warning on stderr naming it, then re-execution: the step log alone
// rebuilds the same state.
std::string ChooseStart(const replay::LoadedCapture& cap, const replay::Config& config, int64_t step, bool from_start,
                        replay::Engine* engine, replay::ReplayOptions* options) {
  if (from_start) return "--from-start";
  const int64_t recorded = cap.steps[step].input.step;
  auto it = cap.snapshots.find(recorded);
  if (it == cap.snapshots.end()) {
    if (cap.snapshots.empty()) return "the capture holds no snapshot";
    return "no snapshot of step " + std::to_string(recorded) + " (the capture holds steps " +
           std::to_string(cap.snapshots.begin()->first) + ".." + std::to_string(cap.snapshots.rbegin()->first) + ")";
  }
  std::string differs;
  for (const std::string& name : config.DiffNames(cap.config)) {
    // Neither the backend nor how the host holds the weights changes the bits.
    if (name != "device" && name != "weights") differs += (differs.empty() ? "" : ", ") + name;
  }
  if (!differs.empty()) {
    return "the configuration differs from the recording (" + differs + "); the snapshot holds the recorded state";
  }
  // An engine adapter's snapshot holds that engine's step inputs (sglang's
  // token ids, positions, KV pages), not the exact engine's state: nothing
  // to restore from, and nothing wrong with it either.
  if (std::none_of(it->second.tensors.begin(), it->second.tensors.end(),
                   [](const TensorDescriptor& t) { return t.name.rfind("state.", 0) == 0; })) {
    return "the capture's snapshot of step " + std::to_string(recorded) + " holds " + cap.manifest.engine +
           "'s step inputs, not an exact-engine state";
  }
  absl::StatusOr<replay::StepState> state = replay::LoadStepState(cap, recorded);
  absl::Status s = state.ok() ? engine->RestoreState(*state, cap.steps[step].input) : state.status();
  if (!s.ok()) {
    std::fprintf(stderr, "crashreplay: warning: %s; re-executing steps 0..%lld instead\n",
                 std::string(s.message()).c_str(), static_cast<long long>(step - 1));
    return "snapshot unusable: " + std::string(s.message());
  }
  options->state_restored = true;
  return "";
}

// The user's settings for a real engine, in its own words: --config's keys
// (an `engine` key must name the same engine), then --set's.
absl::Status EngineSettings(const std::string& engine, const std::string& config_file,
                            const std::vector<std::string>& sets,
                            std::vector<std::pair<std::string, std::string>>* out) {
  if (!config_file.empty()) {
    auto parsed = ReadConfigFile(config_file);
    if (!parsed.ok()) return parsed.status();
    for (const auto& [k, v] : *parsed) {
      if (k == "engine") {
        if (v.ToDisplay() != engine) {
          return absl::InvalidArgumentError(
              absl::StrCat(config_file, ": engine '", v.ToDisplay(), "' where the replay runs --engine ", engine));
        }
        continue;
      }
      out->emplace_back(k, v.ToDisplay());
    }
  }
  for (const std::string& flag : sets) {
    auto kv = ParseSetFlag(flag);
    if (!kv.ok()) return kv.status();
    out->emplace_back(kv->first, kv->second.ToDisplay());
  }
  return absl::OkStatus();
}

// The same settings for the exact engine that replays beside the real one:
// sglang's and vLLM's words through their vocabulary (engine_vocab.h);
// transformers' dtype as activation_dtype; the exact engine's own toggle
// names as they are; anything else has no counterpart there, and a note says
// so (the real engine still runs with it).
absl::Status ApplyToExact(const std::string& engine, const std::vector<std::pair<std::string, std::string>>& settings,
                          replay::Config* config, std::vector<std::string>* notes) {
  if (replay::HasVocabulary(engine)) {
    replay::EngineSettings es(settings.begin(), settings.end());
    replay::VocabResult vr;
    CR_RETURN_IF_ERROR(replay::ApplyEngineSettings(engine, es, config, &vr, /*lenient=*/true));
    notes->insert(notes->end(), vr.notes.begin(), vr.notes.end());
    return absl::OkStatus();
  }
  for (const auto& [k, v] : settings) {
    std::string key = k, value = v;
    if (engine == "transformers" && k == "dtype") {
      key = "activation_dtype";
      value = v == "bfloat16" ? "bf16" : v == "float16" ? "fp16" : v == "float32" ? "fp32" : v;
    }
    if (replay::FindToggle(key) == nullptr) {
      notes->push_back(absl::StrCat(engine, "'s ", k, " = ", v, " has no counterpart in the exact engine, which ",
                                    "replays the step without it"));
      continue;
    }
    if (absl::Status s = config->Set(key, value); !s.ok()) {
      notes->push_back(
          absl::StrCat(engine, "'s ", k, " = ", v, ": the exact engine cannot model it (", s.message(), ")"));
    }
  }
  return absl::OkStatus();
}

// What the exact engine's replay of one step gives.
struct ExactRun {
  replay::ReplayReport rep;
  std::string weights_note;
  std::optional<replay::ReExecution> re_execution;
  std::unique_ptr<replay::StepDump> dump;
  std::string dump_path;
  int error_exit = kExitOk;  // the exit code that fits the error, when there was one
};

struct ExactArgs {
  std::string capture_path, model_dir, stop_after, dump_dir;
  replay::KernelPatterns patterns;
  int threads = 0;
  int64_t step = 0;
  bool from_start = false;
};

// The exact engine: loads the checkpoint, verifies the weights against the
// capture, rebuilds the state and replays the step kernel by kernel. An
// error is the status, with out->error_exit set to the exit code it means.
absl::Status ReplayExact(replay::LoadedCapture* cap, const replay::Config& config, const ExactArgs& a,
                         StatusLine& progress, ExactRun* out) {
  auto fail = [&](absl::Status s, int exit) {
    out->error_exit = exit;
    return s;
  };
  const replay::EngineConfig ec = replay::ResolveConfig(config);
  auto loaded = LoadModel(a.model_dir, ec, progress);
  if (!loaded.ok()) return fail(loaded.status(), IsUnsupportedModel(loaded.status()) ? kExitUnsupported : 0);
  const replay::LoadedCheckpoint* ckpt = &loaded->checkpoint;
  std::unique_ptr<replay::Model>* model = &loaded->model;
  if (!loaded->notes.empty()) progress.Finish();  // notes stay above the live line
  for (const std::string& n : loaded->notes) std::fprintf(stderr, "crashreplay: note: %s\n", n.c_str());
  cap->notes.insert(cap->notes.end(), loaded->notes.begin(), loaded->notes.end());
  auto weights = replay::VerifyCaptureWeights(*cap, *ckpt, **model, ec);
  if (!weights.ok()) return fail(weights.status(), 0);
  out->weights_note = *weights;
  if (absl::Status s = replay::RepageSteps(cap, ec.page_size); !s.ok()) return fail(s, 0);
  const int64_t step = a.step;
  int64_t max_page = 0;
  for (const auto& s : cap->steps)
    for (const auto& r : s.input.rows)
      for (int32_t p : r.page_table) max_page = std::max<int64_t>(max_page, p + 1);
  auto made = replay::Engine::Create(std::move(*model), ec, a.threads, max_page);
  if (!made.ok()) return fail(made.status(), kExitNoDevice);
  replay::Engine& engine = **made;
  for (const std::string& n : engine.notes()) {
    progress.Finish();
    std::fprintf(stderr, "crashreplay: note: %s\n", n.c_str());
    cap->notes.push_back(n);
  }

  const bool step_in_range = step < static_cast<int64_t>(cap->steps.size());
  if (!engine.plan().fault && !(cap->steps.empty() && cap->failure) && !step_in_range) {
    return fail(absl::InvalidArgumentError("--step " + std::to_string(step) + ": the capture has " +
                                           std::to_string(cap->steps.size()) + " steps"),
                0);
  }
  if (!a.dump_dir.empty()) {
    if (step_in_range && !engine.plan().fault) {
      // The kernel list depends on the model and the batch, not on data:
      // list it without running anything to check the patterns.
      std::vector<std::string> labels;
      const std::unique_ptr<replay::StepProgram> program = engine.Prepare(cap->steps[step].input);
      for (const replay::KernelCall& k : program->kernels()) labels.push_back(k.Label());
      if (absl::Status s = a.patterns.CheckAgainst(labels); !s.ok()) return fail(s, 0);
    }
    if (auto err = PrepareDumpDir(a.dump_dir)) return fail(absl::DataLossError(*err), kExitDataError);
    out->dump_path = a.dump_dir + "/" + replay::DumpFileName(step, static_cast<int>(cap->manifest.parallel.rank));
    out->dump = std::make_unique<replay::StepDump>(a.patterns);
  }

  replay::ReplayReport& rep = out->rep;
  if (engine.plan().fault || cap->steps.empty() || step >= static_cast<int64_t>(cap->steps.size())) {
    rep.step = step;
    if (engine.plan().fault) {
      rep.fault = engine.plan().fault;
      rep.matches_recorded_failure = cap->failure && cap->failure->Signature() == rep.fault->Signature();
      rep.outcome = "failed";
      rep.detail = rep.fault->message;
    } else if (cap->steps.empty() && cap->failure) {
      rep.outcome = "reproduced";
      rep.detail =
          "ran clean: the recorded failure " + cap->failure->Signature() + " (before the first step) does not happen";
    } else {
      return fail(absl::InvalidArgumentError("--step " + std::to_string(step) + ": the capture has " +
                                             std::to_string(cap->steps.size()) + " steps"),
                  0);
    }
  } else {
    replay::ReplayOptions options;
    options.stop_after = a.stop_after;
    options.observer = out->dump.get();
    options.progress = [&](std::string_view phase, int64_t done, int64_t total, std::string_view detail) {
      progress.Update(phase, done, total, detail);
    };
    const std::string start_note = ChooseStart(*cap, config, step, a.from_start, &engine, &options);
    if (!options.state_restored && step > 0) {
      // Said before it starts: a long prefill re-executed takes minutes.
      out->re_execution = replay::PlanReExecution(cap->steps, step);
      progress.Note(absl::StrCat("re-executing steps 0..", step - 1, " to rebuild step ", step, "'s KV cache (",
                                 start_note.empty() ? "no snapshot of it" : start_note,
                                 "): ", out->re_execution->Text()));
    }
    rep = replay::ReplayStep(engine, cap->steps, step, options);
    rep.start_note = start_note;
  }
  progress.Finish();
  if (out->dump) {
    replay::DumpContext ctx;
    std::error_code fs_ec;
    ctx.capture = std::filesystem::absolute(a.capture_path, fs_ec).lexically_normal().string();
    ctx.step = step;
    ctx.rank = static_cast<int>(cap->manifest.parallel.rank);
    ctx.config = config.Items();
    ctx.start = rep.start;
    if (absl::Status s = out->dump->Write(out->dump_path, ctx, rep); !s.ok()) {
      return fail(absl::DataLossError(s.message()), kExitDataError);
    }
  }
  return absl::OkStatus();
}

int ExactErrorExit(const absl::Status& s, const ExactRun& run) {
  if (run.error_exit == kExitNoDevice) return ReportDeviceError(s);
  if (run.error_exit == kExitDataError) return OutputError(std::string(s.message()));
  return ReportError(s);
}

// The GPU core dump of the recorded failure, when one was armed and is
// there (tools/gpu_fault.h): shown beside the replayed step.
std::optional<GpuFault> RecordedGpuFault(const replay::LoadedCapture& cap) {
  if (cap.reader == nullptr) return std::nullopt;
  const std::vector<FailureRecord>& f = cap.reader->failures();
  return FindGpuFault(cap.reader->path(), cap.manifest, f.empty() ? nullptr : &f.back());
}

void PrintGpuFault(const replay::LoadedCapture& cap) {
  if (std::optional<GpuFault> g = RecordedGpuFault(cap); g.has_value()) {
    for (const std::string& line : g->Lines()) std::printf("%s\n", line.c_str());
  }
}

nlohmann::json ExactJson(const ExactRun& run, const replay::Config& config, const replay::LoadedCapture& cap) {
  nlohmann::json j = run.rep.ToJson();
  j["weights"] = run.weights_note;
  j["config"] = nlohmann::json::object();
  for (const auto& [k, v] : config.Items()) j["config"][k] = v;
  if (cap.failure) j["recorded_signature"] = cap.failure->Signature();
  if (std::optional<GpuFault> g = RecordedGpuFault(cap); g.has_value()) j["gpu_fault"] = g->ToJson();
  if (run.re_execution) {
    j["re_executed"] = {{"steps", run.re_execution->steps},
                        {"tokens", run.re_execution->tokens},
                        {"prefill_tokens", run.re_execution->prefill_tokens}};
  }
  if (!cap.notes.empty()) j["notes"] = cap.notes;
  if (run.dump) {
    j["dump"] = {
        {"path", run.dump_path}, {"tensors", run.dump->num_tensors()}, {"kernels", run.dump->dumped_kernels()}};
  }
  return j;
}

void PrintExactText(const ExactRun& run) {
  const replay::ReplayReport& rep = run.rep;
  std::printf("step %lld: %s (%s)\nweights: %s\n", static_cast<long long>(rep.step), rep.outcome.c_str(),
              rep.detail.c_str(), run.weights_note.c_str());
  if (rep.start == "snapshot") {
    std::printf("start: snapshot of step %lld\n", static_cast<long long>(rep.snapshot_step));
  } else {
    std::printf("start: re-executed steps 0..%lld%s%s%s\n", static_cast<long long>(rep.step - 1),
                rep.start_note.empty() ? "" : " (", rep.start_note.c_str(), rep.start_note.empty() ? "" : ")");
  }
  std::printf("%-28s %10s %6s %6s %12s  %s\n", "kernel", "micros", "nan", "inf", "max|x|", "digest");
  for (const auto& k : rep.kernels) {
    std::printf("%-28s %10.1f %6lld %6lld %12.5g  %s%s\n", k.label.c_str(), k.micros, static_cast<long long>(k.nan),
                static_cast<long long>(k.inf), k.max_abs, k.digest.Hex().c_str(), k.failed ? "  FAILED" : "");
  }
  if (rep.fault) std::printf("fault: %s\n  %s\n", rep.fault->Signature().c_str(), rep.fault->message.c_str());
  if (!rep.first_nonfinite.empty()) std::printf("first non-finite output: %s\n", rep.first_nonfinite.c_str());
  if (rep.fingerprints_compared >= 0) {
    std::printf(
        "engine fingerprints: %lld boundaries compared%s%s\n", static_cast<long long>(rep.fingerprints_compared),
        rep.engine_last_boundary.empty() ? "" : "; the engine's step stopped after ", rep.engine_last_boundary.c_str());
  }
  if (rep.engine_divergence) {
    const replay::EngineDivergence& d = *rep.engine_divergence;
    std::printf("engine divergence at %s: %s\n  engine: %s\n  replay: %s\n", d.boundary.c_str(), d.reason.c_str(),
                FingerprintText(d.engine).c_str(), FingerprintText(d.replay).c_str());
  }
  if (run.dump) {
    std::printf("dump: %s (%zu tensors from %zu kernels)\n", run.dump_path.c_str(), run.dump->num_tensors(),
                run.dump->dumped_kernels().size());
  }
}

// The exit code of a child's refusal (engine_replay.h).
int RefusalExit(int child_exit) {
  switch (child_exit) {
    case 2: return kExitUsage;
    case 3: return kExitDataError;
    case 7: return kExitNoDevice;
    case 9: return kExitUnsupported;
    default: return kExitFailed;
  }
}

std::string MakeEngineOutDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/crashreplay-engine-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) return "";
  return buf.data();
}

}  // namespace

int RunReplay(int argc, char** argv) {
  CLI::App app("Replay one recorded step kernel by kernel under a configuration.", "replay");
  std::string capture_path, config_file, trace, model_dir, stop_after, dump_dir, dump_kernels;
  std::string engine = "crashreplay", engine_python, engine_out;
  std::vector<std::string> sets, engine_setups;
  int64_t step = -1;
  int threads = 0;
  double engine_timeout = 0;
  bool json = false, from_start = false;
  app.add_option("CAPTURE", capture_path, "capture file or session directory")->required();
  app.add_option("--step", step, "step to replay (default: the failing step, else the last)");
  app.add_option("--config", config_file, "flat TOML configuration applied over the recorded one");
  app.add_option("--set", sets, "override one toggle, name=value; repeatable");
  app.add_option("--model", model_dir, "checkpoint directory (default: the recorded path)");
  app.add_option("--stop-after", stop_after, "stop after this kernel label, e.g. L0.attention");
  app.add_option("--threads", threads, "CPU threads (never changes results)");
  app.add_option("--trace", trace, "write a Chrome/Perfetto trace of the step's kernels");
  app.add_option("--dump", dump_dir,
                 "write the step's kernel outputs (logits included) to DIR/step<N>.rank<R>.safetensors");
  app.add_option("--dump-kernels", dump_kernels,
                 "kernels to dump: comma-separated globs over labels (L<layer>.<kernel>, or <kernel> outside "
                 "layers), e.g. 'L*.attention,logits_*'; default every kernel");
  app.add_flag("--from-start", from_start,
               "rebuild the state by re-executing steps 0..N-1 even when a snapshot of step N is in the capture");
  app.add_flag("--json", json, "print the report as JSON");
  app.add_option("--engine", engine,
                 "who re-executes the step: crashreplay (the exact engine, the default), or the engine that "
                 "recorded it (transformers, sglang, vllm) in a child process of its own Python, beside the exact "
                 "engine; --config and --set then speak that engine's words (docs/engines.md)");
  app.add_option("--engine-python", engine_python,
                 "the Python that has the engine installed (default $CRASHREPLAY_ENGINE_PYTHON, else python3)");
  app.add_option("--engine-setup", engine_setups,
                 "a module the engine's Python imports before the run (your patches, a fork's kernels); repeatable");
  app.add_option("--engine-out", engine_out,
                 "where the engine's own recording of the replay (DIR/session) and its result.json go (default: a "
                 "new directory under $TMPDIR)");
  app.add_option("--engine-timeout", engine_timeout, "seconds the engine's run may take (default: no limit)");
  if (auto rc = ParseArgs(app, argc, argv)) return *rc;
  const bool real = engine != "crashreplay";
  if (real && !IsRealEngine(engine)) {
    return ReportError(absl::InvalidArgumentError(
        absl::StrCat("--engine ", engine, ": not an engine here; choose crashreplay, ", RealEngineNames())));
  }
  if (!real && (!engine_python.empty() || !engine_setups.empty() || !engine_out.empty() || engine_timeout > 0)) {
    return ReportError(absl::InvalidArgumentError(
        "--engine-python, --engine-setup, --engine-out and --engine-timeout go with --engine NAME"));
  }
  if (!dump_kernels.empty() && dump_dir.empty()) {
    return ReportError(absl::InvalidArgumentError("--dump-kernels needs --dump DIR"));
  }
  auto patterns = replay::KernelPatterns::Parse(dump_kernels);
  if (!patterns.ok()) return ReportError(patterns.status());

  auto cap = replay::LoadCapture(capture_path);
  if (!cap.ok()) return ReportError(cap.status());
  if (absl::Status s = CheckReplayable(*cap, capture_path); !s.ok()) return ReportError(s);
  for (const std::string& n : cap->notes) std::fprintf(stderr, "crashreplay: note: %s\n", n.c_str());
  replay::Config config = cap->config;
  // How the recording host held its weights says nothing about this host:
  // weights starts from its default here (auto), whatever was recorded.
  if (absl::Status s = config.ApplySetFlag("weights=auto"); !s.ok()) return ReportError(s);
  std::vector<std::pair<std::string, std::string>> engine_settings;
  if (real) {
    if (absl::Status s = EngineSettings(engine, config_file, sets, &engine_settings); !s.ok()) return ReportError(s);
    std::vector<std::string> notes;
    if (absl::Status s = ApplyToExact(engine, engine_settings, &config, &notes); !s.ok()) return ReportError(s);
    for (const std::string& n : notes) std::fprintf(stderr, "crashreplay: note: %s\n", n.c_str());
    cap->notes.insert(cap->notes.end(), notes.begin(), notes.end());
  } else {
    if (!config_file.empty()) {
      std::vector<std::string> file_notes;
      if (absl::Status s = config.ApplyFile(config_file, &file_notes); !s.ok()) return ReportError(s);
      for (const std::string& n : file_notes) std::fprintf(stderr, "crashreplay: note: %s\n", n.c_str());
      cap->notes.insert(cap->notes.end(), file_notes.begin(), file_notes.end());
    }
    for (const std::string& s : sets) {
      if (absl::Status st = config.ApplySetFlag(s); !st.ok()) return ReportError(st);
    }
  }
  const std::string user_model_dir = model_dir;
  if (model_dir.empty()) model_dir = cap->manifest.model.checkpoint_path;
  if (model_dir.empty()) {
    return ReportError(absl::InvalidArgumentError("the capture records no checkpoint path (engine " +
                                                  cap->manifest.engine + "); give the checkpoint with --model DIR"));
  }
  if (step < 0) step = cap->failure_step >= 0 ? cap->failure_step : static_cast<int64_t>(cap->steps.size()) - 1;
  // Progress on stderr: redrawn in place on a terminal; plain lines in logs
  // unless the output is --json (what scripts and bisection trials read).
  StatusLine progress(stderr, ::isatty(::fileno(stderr)) == 1, "replay", json && ::isatty(::fileno(stderr)) != 1);

  // The real engine first: its fingerprints take the recorded ones' place,
  // so the exact engine's replay names where the real engine leaves it.
  std::optional<EngineRun> engine_run;
  std::optional<EngineVerdict> verdict;
  if (real) {
    if (step < 0 || step >= static_cast<int64_t>(cap->steps.size())) {
      return ReportError(
          absl::InvalidArgumentError(absl::StrCat("--step ", step, ": the capture has ", cap->steps.size(), " steps")));
    }
    EngineReplayOptions eo;
    eo.engine = engine;
    const char* env_python = std::getenv("CRASHREPLAY_ENGINE_PYTHON");
    eo.python = !engine_python.empty() ? engine_python : (env_python && *env_python ? env_python : "python3");
    eo.setups = engine_setups;
    eo.settings = engine_settings;
    std::error_code fs_ec;
    eo.capture = std::filesystem::absolute(capture_path, fs_ec).lexically_normal().string();
    eo.step = cap->steps[step].input.step;
    eo.model_dir = user_model_dir.empty() ? "" : std::filesystem::absolute(user_model_dir, fs_ec).string();
    eo.out_dir = engine_out.empty() ? MakeEngineOutDir() : engine_out;
    if (eo.out_dir.empty()) return OutputError("cannot create a directory for the engine's run under $TMPDIR");
    if (engine_timeout > 0) eo.timeout_s = engine_timeout;
    progress.Note(absl::StrCat("running steps 0..", eo.step, " in ", engine, " (", eo.python,
                               "; its recording: ", eo.out_dir, "/session)"));
    auto run = RunRealEngine(eo);
    if (!run.ok()) return ReportError(run.status());
    if (run->result.is_object() && run->result.contains("refused")) {
      const std::string why = run->result["refused"].is_string() ? run->result["refused"].get<std::string>() : "";
      progress.Finish();
      std::fprintf(stderr, "crashreplay: %s cannot replay this here: %s\n", engine.c_str(), why.c_str());
      if (json) {
        nlohmann::json j = {{"outcome", "untestable"}, {"engine", engine}, {"refused", why}, {"step", step}};
        std::printf("%s\n", j.dump(2).c_str());
      }
      return RefusalExit(run->process.exit_code);
    }
    verdict = JudgeEngineRun(*cap, step, *run);
    replay::RecordedStep& target = cap->steps[step];
    target.fingerprints.clear();
    target.fingerprints_complete = true;
    if (run->session) {
      for (const replay::RecordedStep& s : run->session->steps) {
        if (s.input.step != target.input.step) continue;
        target.fingerprints = s.fingerprints;
        target.fingerprints_complete = s.fingerprints_complete;
      }
    }
    engine_run = std::move(*run);
  }

  ExactArgs a;
  a.capture_path = capture_path;
  a.model_dir = model_dir;
  a.stop_after = stop_after;
  a.dump_dir = dump_dir;
  a.patterns = std::move(*patterns);
  a.threads = threads;
  a.step = step;
  a.from_start = from_start;
  ExactRun exact;
  const absl::Status exact_status = ReplayExact(&*cap, config, a, progress, &exact);
  progress.Finish();
  if (!real) {
    if (!exact_status.ok()) return ExactErrorExit(exact_status, exact);
    if (!trace.empty()) {
      std::ofstream out(trace);
      out << replay::ChromeTrace(exact.rep.kernels, exact.rep.step).dump() << "\n";
    }
    if (json) {
      std::printf("%s\n", ExactJson(exact, config, *cap).dump(2).c_str());
    } else {
      PrintExactText(exact);
      PrintGpuFault(*cap);
    }
    return exact.rep.outcome == "reproduced" ? kExitOk : kExitFailed;
  }

  // --engine NAME: the real engine's verdict, the exact engine beside it.
  if (exact_status.ok() && !trace.empty()) {
    std::ofstream out(trace);
    out << replay::ChromeTrace(exact.rep.kernels, exact.rep.step).dump() << "\n";
  }
  const EngineRun& run = *engine_run;
  const EngineVerdict& v = *verdict;
  nlohmann::json j;
  j["outcome"] = v.outcome;
  j["step"] = cap->steps[step].input.step;
  j["detail"] = v.detail;
  j["engine"] = engine;
  if (v.signature.is_failure()) j["signature"] = bisect::SignatureToJson(v.signature);
  if (v.recorded) j["recorded_signature"] = bisect::SignatureToJson(*v.recorded);
  if (v.outcome == "failed") j["matches_recorded_failure"] = v.matches_recorded_failure;
  j["fingerprints"] = v.fingerprints;
  j["tokens"] = v.tokens;
  nlohmann::json re = run.result.is_object() ? run.result : nlohmann::json::object();
  re["out_dir"] = std::filesystem::path(run.result.is_object() ? run.result.value("session", std::string()) : "")
                      .parent_path()
                      .string();
  re["exit_code"] = run.process.exit_code;
  re["seconds"] = run.process.duration_s;
  if (!run.session_problem.empty()) re["session_problem"] = run.session_problem;
  if (!run.result.is_object()) re["stderr_tail"] = bisect::KeptStderr(run.process);
  j["real_engine"] = re;
  if (exact_status.ok()) {
    nlohmann::json ej = ExactJson(exact, config, *cap);
    // The exact engine's own verdict, and where the real engine's numbers
    // leave it: its kernels' table is the step's, for bisect's first bad kernel.
    if (ej.contains("engine_divergence")) j["engine_divergence"] = ej["engine_divergence"];
    j["kernels"] = ej["kernels"];
    j["weights"] = ej["weights"];
    ej.erase("kernels");
    j["exact"] = ej;
  } else {
    progress.Finish();
    std::fprintf(stderr, "crashreplay: note: the exact engine could not replay the step beside %s: %s\n",
                 engine.c_str(), std::string(exact_status.message()).c_str());
    j["exact"] = {{"error", std::string(exact_status.message())}};
  }
  if (!cap->notes.empty()) j["notes"] = cap->notes;
  if (std::optional<GpuFault> g = RecordedGpuFault(*cap); g.has_value()) j["gpu_fault"] = g->ToJson();
  if (json) {
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("step %lld in %s %s: %s (%s)\n", static_cast<long long>(j["step"].get<int64_t>()), engine.c_str(),
                re.value("version", std::string()).c_str(), v.outcome.c_str(), v.detail.c_str());
    if (v.outcome == "failed" && v.recorded) {
      std::printf("the recorded failure: %s (%s)\n", bisect::DescribeSignature(*v.recorded).c_str(),
                  v.matches_recorded_failure ? "the same failure" : "a different one");
    }
    std::printf("fingerprints: %lld of %lld compared boundaries identical to the recording\n",
                static_cast<long long>(v.fingerprints["identical"].get<int64_t>()),
                static_cast<long long>(v.fingerprints["compared"].get<int64_t>()));
    std::printf("tokens: %lld of %lld greedy tokens identical to the recording\n",
                static_cast<long long>(v.tokens["identical"].get<int64_t>()),
                static_cast<long long>(v.tokens["compared"].get<int64_t>()));
    if (exact_status.ok()) {
      std::printf("exact engine: %s (%s)\n", exact.rep.outcome.c_str(), exact.rep.detail.c_str());
      if (exact.rep.engine_divergence) {
        const replay::EngineDivergence& d = *exact.rep.engine_divergence;
        std::printf("%s departs from the exact engine at %s: %s\n  %s: %s\n  exact: %s\n", engine.c_str(),
                    d.boundary.c_str(), d.reason.c_str(), engine.c_str(), FingerprintText(d.engine).c_str(),
                    FingerprintText(d.replay).c_str());
      }
    } else {
      std::printf("exact engine: could not replay the step: %s\n", std::string(exact_status.message()).c_str());
    }
    std::printf("the engine's own recording of the replay: %s\n", re.value("session", std::string()).c_str());
    PrintGpuFault(*cap);
  }
  return v.outcome == "reproduced" ? kExitOk : kExitFailed;
}

}  // namespace crashreplay::tools
