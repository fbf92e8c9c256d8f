// `crashreplay replay CAPTURE [--step N] [--config FILE] [--set k=v]...
// [--json] [--trace OUT.json] [--dump DIR [--dump-kernels PATTERNS]]`:
// re-executes a recorded step kernel by kernel and says whether it
// reproduced, diverged or failed (docs/replay.md).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

#include "command.h"
#include "commands_decl.h"
#include "crashreplay/base/status_line.h"
#include "crashreplay/replay/captures/capture_io.h"
#include "crashreplay/replay/captures/engine_weights.h"
#include "crashreplay/replay/model/checkpoint_io.h"
#include "crashreplay/replay/session/replay_session.h"
#include "crashreplay/replay/session/step_dump.h"
#include "exit_codes.h"
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

}  // namespace

int RunReplay(int argc, char** argv) {
  CLI::App app("Replay one recorded step kernel by kernel under a configuration.", "replay");
  std::string capture_path, config_file, trace, model_dir, stop_after, dump_dir, dump_kernels;
  std::vector<std::string> sets;
  int64_t step = -1;
  int threads = 0;
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
  if (auto rc = ParseArgs(app, argc, argv)) return *rc;
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
  if (!config_file.empty()) {
    std::vector<std::string> file_notes;
    if (absl::Status s = config.ApplyFile(config_file, &file_notes); !s.ok()) return ReportError(s);
    for (const std::string& n : file_notes) std::fprintf(stderr, "crashreplay: note: %s\n", n.c_str());
    cap->notes.insert(cap->notes.end(), file_notes.begin(), file_notes.end());
  }
  for (const std::string& s : sets) {
    if (absl::Status st = config.ApplySetFlag(s); !st.ok()) return ReportError(st);
  }
  if (model_dir.empty()) model_dir = cap->manifest.model.checkpoint_path;
  if (model_dir.empty()) {
    return ReportError(absl::InvalidArgumentError("the capture records no checkpoint path (engine " +
                                                  cap->manifest.engine + "); give the checkpoint with --model DIR"));
  }
  // Progress on stderr: redrawn in place on a terminal; plain lines in logs
  // unless the output is --json (what scripts and bisection trials read).
  StatusLine progress(stderr, ::isatty(::fileno(stderr)) == 1, "replay", json && ::isatty(::fileno(stderr)) != 1);
  const replay::EngineConfig ec = replay::ResolveConfig(config);
  auto loaded = LoadModel(model_dir, ec, progress);
  if (!loaded.ok()) return ReportError(loaded.status());
  const replay::LoadedCheckpoint* ckpt = &loaded->checkpoint;
  std::unique_ptr<replay::Model>* model = &loaded->model;
  if (!loaded->notes.empty()) progress.Finish();  // notes stay above the live line
  for (const std::string& n : loaded->notes) std::fprintf(stderr, "crashreplay: note: %s\n", n.c_str());
  cap->notes.insert(cap->notes.end(), loaded->notes.begin(), loaded->notes.end());
  auto weights = replay::VerifyCaptureWeights(*cap, *ckpt, **model, ec);
  if (!weights.ok()) return ReportError(weights.status());
  const std::string weights_note = *weights;
  if (absl::Status s = replay::RepageSteps(&*cap, ec.page_size); !s.ok()) return ReportError(s);
  if (step < 0) step = cap->failure_step >= 0 ? cap->failure_step : static_cast<int64_t>(cap->steps.size()) - 1;
  int64_t max_page = 0;
  for (const auto& s : cap->steps)
    for (const auto& r : s.input.rows)
      for (int32_t p : r.page_table) max_page = std::max<int64_t>(max_page, p + 1);
  auto made = replay::Engine::Create(std::move(*model), ec, threads, max_page);
  if (!made.ok()) return ReportDeviceError(made.status());
  replay::Engine& engine = **made;
  for (const std::string& n : engine.notes()) {
    progress.Finish();
    std::fprintf(stderr, "crashreplay: note: %s\n", n.c_str());
    cap->notes.push_back(n);
  }

  const bool step_in_range = step < static_cast<int64_t>(cap->steps.size());
  if (!engine.plan().fault && !(cap->steps.empty() && cap->failure) && !step_in_range) {
    return ReportError(absl::InvalidArgumentError("--step " + std::to_string(step) + ": the capture has " +
                                                  std::to_string(cap->steps.size()) + " steps"));
  }
  std::unique_ptr<replay::StepDump> dump;
  std::string dump_path;
  if (!dump_dir.empty()) {
    if (step_in_range && !engine.plan().fault) {
      // The kernel list depends on the model and the batch, not on data:
      // list it without running anything to check the patterns.
      std::vector<std::string> labels;
      const std::unique_ptr<replay::StepProgram> program = engine.Prepare(cap->steps[step].input);
      for (const replay::KernelCall& k : program->kernels()) labels.push_back(k.Label());
      if (absl::Status s = patterns->CheckAgainst(labels); !s.ok()) return ReportError(s);
    }
    if (auto err = PrepareDumpDir(dump_dir)) return OutputError(*err);
    dump_path = dump_dir + "/" + replay::DumpFileName(step, static_cast<int>(cap->manifest.parallel.rank));
    dump = std::make_unique<replay::StepDump>(std::move(*patterns));
  }

  replay::ReplayReport rep;
  std::optional<replay::ReExecution> re_execution;
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
      return ReportError(absl::InvalidArgumentError("--step " + std::to_string(step) + ": the capture has " +
                                                    std::to_string(cap->steps.size()) + " steps"));
    }
  } else {
    replay::ReplayOptions options;
    options.stop_after = stop_after;
    options.observer = dump.get();
    options.progress = [&](std::string_view phase, int64_t done, int64_t total, std::string_view detail) {
      progress.Update(phase, done, total, detail);
    };
    const std::string start_note = ChooseStart(*cap, config, step, from_start, &engine, &options);
    if (!options.state_restored && step > 0) {
      // Said before it starts: a long prefill re-executed takes minutes.
      re_execution = replay::PlanReExecution(cap->steps, step);
      progress.Note(absl::StrCat("re-executing steps 0..", step - 1, " to rebuild step ", step, "'s KV cache (",
                                 start_note.empty() ? "no snapshot of it" : start_note, "): ", re_execution->Text()));
    }
    rep = replay::ReplayStep(engine, cap->steps, step, options);
    rep.start_note = start_note;
  }
  progress.Finish();
  if (dump) {
    replay::DumpContext ctx;
    std::error_code fs_ec;
    ctx.capture = std::filesystem::absolute(capture_path, fs_ec).lexically_normal().string();
    ctx.step = step;
    ctx.rank = static_cast<int>(cap->manifest.parallel.rank);
    ctx.config = config.Items();
    ctx.start = rep.start;
    if (absl::Status s = dump->Write(dump_path, ctx, rep); !s.ok()) return OutputError(std::string(s.message()));
  }
  if (!trace.empty()) {
    std::ofstream out(trace);
    out << replay::ChromeTrace(rep.kernels, rep.step).dump() << "\n";
  }
  if (json) {
    nlohmann::json j = rep.ToJson();
    j["weights"] = weights_note;
    j["config"] = nlohmann::json::object();
    for (const auto& [k, v] : config.Items()) j["config"][k] = v;
    if (cap->failure) j["recorded_signature"] = cap->failure->Signature();
    if (re_execution) {
      j["re_executed"] = {{"steps", re_execution->steps},
                          {"tokens", re_execution->tokens},
                          {"prefill_tokens", re_execution->prefill_tokens}};
    }
    if (!cap->notes.empty()) j["notes"] = cap->notes;
    if (dump) j["dump"] = {{"path", dump_path}, {"tensors", dump->num_tensors()}, {"kernels", dump->dumped_kernels()}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("step %lld: %s (%s)\nweights: %s\n", static_cast<long long>(rep.step), rep.outcome.c_str(),
                rep.detail.c_str(), weights_note.c_str());
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
      std::printf("engine fingerprints: %lld boundaries compared%s%s\n",
                  static_cast<long long>(rep.fingerprints_compared),
                  rep.engine_last_boundary.empty() ? "" : "; the engine's step stopped after ",
                  rep.engine_last_boundary.c_str());
    }
    if (rep.engine_divergence) {
      const replay::EngineDivergence& d = *rep.engine_divergence;
      std::printf("engine divergence at %s: %s\n  engine: %s\n  replay: %s\n", d.boundary.c_str(), d.reason.c_str(),
                  FingerprintText(d.engine).c_str(), FingerprintText(d.replay).c_str());
    }
    if (dump) {
      std::printf("dump: %s (%zu tensors from %zu kernels)\n", dump_path.c_str(), dump->num_tensors(),
                  dump->dumped_kernels().size());
    }
  }
  return rep.outcome == "reproduced" ? kExitOk : kExitFailed;
}

}  // namespace crashreplay::tools
