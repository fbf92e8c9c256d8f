// `crashreplay bisect`: find the configuration change that causes a failure.
//
//   crashreplay bisect CAPTURE --good GOOD.toml --bad BAD.toml [options]
//   crashreplay bisect --good GOOD.toml --bad BAD.toml [options] -- COMMAND ...
//
// Argument parsing only; the search lives in bisect/ (docs/bisect.md).
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "command.h"
#include "commands_decl.h"
#include "crashreplay/bisect/bisect.h"
#include "crashreplay/bisect/command_trial.h"
#include "crashreplay/bisect/failure_text.h"
#include "crashreplay/bisect/replay_trial.h"
#include "crashreplay/bisect/report.h"
#include "exit_codes.h"

namespace crashreplay::tools {
namespace {

std::atomic<bool> g_interrupted{false};

void OnSigint(int) {
  g_interrupted.store(true);
  ::signal(SIGINT, SIG_DFL);  // a second Ctrl-C ends the process at once
}

// ReportError for messages that may hold what a user's file held: NUL bytes
// and invalid UTF-8 are escaped, so the message is printed whole.
int ReportInputError(const absl::Status& status) {
  return ReportError(absl::Status(status.code(), bisect::PrintableText(std::string(status.message()))));
}

// Opens `path` for writing without truncating it: an unwritable report is
// found before the search, not after an hour of trials.
absl::Status CheckWritable(const std::string& path, const std::string& what) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NONBLOCK, 0644);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot write the ", what, " to ", path, ": ", std::strerror(errno)));
  }
  ::close(fd);
  return absl::OkStatus();
}

absl::Status WriteText(const std::string& path, const std::string& text, const std::string& what) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.flush();
  if (!out) return absl::FailedPreconditionError(absl::StrCat("cannot write the ", what, " to ", path));
  return absl::OkStatus();
}

}  // namespace

int RunBisectCommand(int argc, char** argv) {
  // Everything after `--` is the external trial command, untouched by CLI11.
  std::vector<std::string> command;
  int cli_argc = argc;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--") {
      cli_argc = i;
      for (int k = i + 1; k < argc; ++k) command.emplace_back(argv[k]);
      break;
    }
  }
  CLI::App app(
      "Find the minimal configuration change that turns a working run into the failing one, the first bad "
      "kernel, and the one command that reproduces them. Trials replay CAPTURE, or run COMMAND after `--` "
      "with {config} replaced by a TOML file of the trial's configuration (also in $CRASHREPLAY_CONFIG); "
      "exit 0 good, 125 skip, 1-127 bad. Exit codes: 0 culprit found, 1 aborted, 2 usage, 3 data error "
      "(unreadable configuration, unwritable report), 4 the bad configuration does not fail, 5 the good "
      "configuration fails too, 6 flaky (runs of one configuration disagreed; no culprit claimed), 130 interrupted.",
      "bisect");
  std::string capture, good_path, bad_path, reference_path, runner, gpus, threshold, report_path, workdir, memory_limit,
      steps, step_mode = "binary";
  int jobs = 0, repeat = 1, confirm = bisect::kDefaultConfirmRuns, max_others = 4, other_budget = 0;
  std::vector<std::string> signature_regexes;
  bool no_narrow_others = false;
  double timeout = 0, kill_grace = 2.0;
  bool json = false, quiet = false, diverged_is_bad = false;
  app.add_option("capture", capture, "capture to replay (built-in trials)");
  app.add_option("--good", good_path, "configuration that works (flat TOML)")->required();
  app.add_option("--bad", bad_path, "configuration that fails (flat TOML)")->required();
  app.add_option("--reference", reference_path,
                 "configuration whose kernel table is the reference for the first bad kernel (default: --good)");
  app.add_option("--jobs,-j", jobs, "trials run in parallel (default 1, or the size of --gpus)");
  app.add_option("--repeat", repeat, "runs per configuration; disagreement is reported as flaky")
      ->check(CLI::Range(1, 100));
  app.add_option("--confirm", confirm,
                 absl::StrCat("extra runs of every configuration a culprit rests on (and of any result that "
                              "contradicts another) before it is claimed (default ",
                              bisect::kDefaultConfirmRuns, "); 0 trusts single runs"))
      ->check(CLI::Range(0, 100));
  app.add_option("--signature-regex", signature_regexes,
                 "a line of trial output matching this (ECMAScript) regex names the failure: its first capture "
                 "group, or the match, tells bugs apart; repeatable, tried in order before the built-in patterns");
  app.add_flag("--no-narrow-others", no_narrow_others,
               "list failures with other signatures without searching each one's own culprit");
  app.add_option("--max-others", max_others, "how many other findings get a search of their own (default 4)")
      ->check(CLI::Range(0, 100));
  app.add_option("--other-budget", other_budget,
                 "trials each other finding's search may add (default 4*ceil(log2(m+1))+8 for m changes)")
      ->check(CLI::Range(0, 100000));
  app.add_option("--timeout", timeout, "seconds before a trial is killed and judged a timeout (0: none)");
  app.add_option("--kill-grace", kill_grace, "seconds between SIGTERM and SIGKILL on timeout");
  app.add_option("--memory-limit", memory_limit, "address-space limit per trial (bytes, or with K/M/G/T)");
  app.add_option("--runner", runner, "prefix for every trial command, e.g. 'srun -G1 --exclusive'");
  app.add_option("--gpus", gpus, "GPU pool: CUDA_VISIBLE_DEVICES per worker, e.g. 0,1,2 (or 0,1;2,3)");
  app.add_option("--threshold", threshold, "numeric toggle to search a threshold on, TOGGLE[:precision]");
  app.add_option("--steps", steps, "search the first failing step in LO:HI (step-parameterised trials)");
  app.add_option("--step-mode", step_mode, "binary (failures persist) or linear")
      ->check(CLI::IsMember({"binary", "linear"}));
  app.add_option("--report", report_path, "write a self-contained HTML report here");
  app.add_option("--workdir", workdir, "where trial configurations and culprit.toml go (default: a new temp dir)");
  app.add_flag(
      "--diverged-is-bad", diverged_is_bad,
      "built-in trials: count a replay whose outputs differ from the recording (no check failed) as a failure");
  app.add_flag("--json", json, "print the report as JSON on stdout");
  app.add_flag("--quiet,-q", quiet, "no progress on stderr");
  std::string engine, engine_python;
  std::vector<std::string> engine_setups;
  app.add_option("--engine", engine,
                 "built-in trials: re-execute the step in this engine (transformers, sglang, vllm: replay --engine), "
                 "the configurations in its words; a trial it cannot run here is untestable, not good");
  app.add_option("--engine-python", engine_python, "with --engine: the Python that has the engine installed");
  app.add_option("--engine-setup", engine_setups, "with --engine: a module imported before each trial; repeatable");
  if (auto rc = ParseArgs(app, cli_argc, argv)) return *rc;
  if (engine.empty() && (!engine_python.empty() || !engine_setups.empty())) {
    std::fprintf(stderr, "crashreplay bisect: --engine-python and --engine-setup go with --engine NAME\n");
    return kExitUsage;
  }
  if (!engine.empty() && capture.empty()) {
    std::fprintf(stderr, "crashreplay bisect: --engine replays a CAPTURE; an external command runs its own engine\n");
    return kExitUsage;
  }

  if (capture.empty() == command.empty()) {
    std::fprintf(stderr, "crashreplay bisect: give either a CAPTURE or `-- COMMAND ...`, not %s\n",
                 capture.empty() ? "neither" : "both");
    return kExitUsage;
  }
  // A configuration file is read with a plain stream, which would wait
  // forever on a FIFO: refuse anything but a regular file first (exit 3).
  for (const std::string* path : {&good_path, &bad_path, &reference_path}) {
    struct stat st;
    if (!path->empty() && ::stat(path->c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
      return ReportInputError(absl::NotFoundError(absl::StrCat("configuration '", *path, "' is not a regular file")));
    }
  }
  auto good = ReadConfigFile(good_path);
  if (!good.ok()) return ReportInputError(good.status());
  auto bad = ReadConfigFile(bad_path);
  if (!bad.ok()) return ReportInputError(bad.status());

  std::optional<Config> reference;
  if (!reference_path.empty()) {
    auto ref = ReadConfigFile(reference_path);
    if (!ref.ok()) return ReportInputError(ref.status());
    reference = *ref;
  }
  auto rules = bisect::FailureTextRules::Create(signature_regexes);
  if (!rules.ok()) return ReportInputError(rules.status());
  auto shared_rules = std::make_shared<const bisect::FailureTextRules>(*std::move(rules));
  if (!report_path.empty()) {
    if (absl::Status st = CheckWritable(report_path, "HTML report"); !st.ok()) {
      std::fprintf(stderr, "crashreplay: %s\n", bisect::PrintableText(std::string(st.message())).c_str());
      return kExitDataError;
    }
  }

  bisect::TrialLimits limits;
  if (timeout > 0) limits.timeout_s = timeout;
  limits.kill_grace_s = kill_grace;
  if (!memory_limit.empty()) {
    auto bytes = ParseBytes("--memory-limit", memory_limit);
    if (!bytes.ok()) return ReportError(bytes.status());
    limits.memory_limit_bytes = *bytes;
  }
  std::vector<std::string> runner_words;
  if (!runner.empty()) {
    auto words = bisect::SplitCommandLine(runner);
    if (!words.ok()) return ReportError(words.status());
    runner_words = *words;
  }
  if (workdir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/crashreplay-bisect-XXXXXX");
    if (::mkdtemp(tmpl.data()) == nullptr) {
      return ReportError(absl::FailedPreconditionError(absl::StrCat("cannot create a work directory ", tmpl)));
    }
    workdir = tmpl;
  } else if (::access(workdir.c_str(), W_OK) != 0) {
    return ReportError(
        absl::InvalidArgumentError(absl::StrCat("--workdir '", workdir, "' is not a writable directory")));
  }
  if (absl::Status st = CheckWritable(workdir + "/report.json", "JSON report"); !st.ok()) {
    std::fprintf(stderr, "crashreplay: %s\n", bisect::PrintableText(std::string(st.message())).c_str());
    return kExitDataError;
  }

  bisect::BisectOptions options;
  options.good = *good;
  options.bad = *bad;
  options.good_label = good_path;
  options.bad_label = bad_path;
  options.workdir = workdir;
  options.reference = reference;
  options.narrow_others = !no_narrow_others;
  options.max_others = max_others;
  options.other_budget = other_budget;
  if (!threshold.empty()) {
    const size_t colon = threshold.find(':');
    options.threshold_toggle = threshold.substr(0, colon);
    if (colon != std::string::npos && (!absl::SimpleAtod(threshold.substr(colon + 1), &options.threshold_precision) ||
                                       options.threshold_precision <= 0)) {
      std::fprintf(stderr, "crashreplay bisect: --threshold '%s': precision must be a positive number\n",
                   threshold.c_str());
      return kExitUsage;
    }
  }
  if (!steps.empty()) {
    const size_t colon = steps.find(':');
    int64_t lo = 0, hi = 0;
    if (colon == std::string::npos || !absl::SimpleAtoi(steps.substr(0, colon), &lo) ||
        !absl::SimpleAtoi(steps.substr(colon + 1), &hi) || lo > hi || lo < 0) {
      std::fprintf(stderr, "crashreplay bisect: --steps '%s': expected LO:HI with 0 <= LO <= HI\n", steps.c_str());
      return kExitUsage;
    }
    options.step_range = std::make_pair(lo, hi);
    options.step_mode = step_mode == "linear" ? bisect::StepSearchMode::kLinear : bisect::StepSearchMode::kBinary;
  }

  std::unique_ptr<bisect::TrialRunner> trial_runner;
  if (!command.empty()) {
    trial_runner = std::make_unique<bisect::CommandTrialRunner>(
        bisect::CommandTrialOptions{command, runner_words, workdir, limits, shared_rules});
  } else {
    bisect::ReplayTrialOptions ro;
    ro.crashreplay_binary = SelfPath(argv[0]);
    ro.capture = capture;
    ro.runner = runner_words;
    ro.workdir = workdir;
    ro.limits = limits;
    ro.diverged_is_bad = diverged_is_bad;
    ro.rules = shared_rules;
    if (!engine.empty()) {
      ro.extra_args = {"--engine", engine};
      if (!engine_python.empty()) ro.extra_args.insert(ro.extra_args.end(), {"--engine-python", engine_python});
      for (const std::string& m : engine_setups) ro.extra_args.insert(ro.extra_args.end(), {"--engine-setup", m});
      // Each trial's engine run keeps its recording beside the trial's files.
      ro.extra_args.insert(ro.extra_args.end(), {"--engine-out", "{config}.engine"});
    }
    trial_runner = std::make_unique<bisect::ReplayTrialRunner>(ro);
  }

  bisect::SchedulerOptions so;
  so.gpus = bisect::ParseGpuList(gpus);
  so.jobs = jobs > 0 ? jobs : (so.gpus.empty() ? 1 : static_cast<int>(so.gpus.size()));
  so.repeat = repeat;
  so.confirm = confirm;
  so.interrupt = &g_interrupted;
  bisect::Progress progress = bisect::Progress::ForStderr(quiet);
  bisect::Scheduler scheduler(*trial_runner, so, &progress);

  struct sigaction sa{};
  sa.sa_handler = OnSigint;
  sigemptyset(&sa.sa_mask);
  struct sigaction old{};
  ::sigaction(SIGINT, &sa, &old);
  if (!quiet) progress.Note(absl::StrCat("trial files and culprit.toml go to ", workdir));
  bisect::BisectReport report = bisect::RunBisect(scheduler, options, &progress);
  ::sigaction(SIGINT, &old, nullptr);
  progress.Finish();
  report.jobs = scheduler.parallelism();
  report.repeat = so.repeat;

  // Whatever bytes the configurations hold, the JSON stays valid UTF-8.
  const std::string json_text =
      bisect::ReportJson(report).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  bool write_failed = false;
  if (absl::Status st = WriteText(workdir + "/report.json", json_text, "JSON report"); !st.ok()) {
    std::fprintf(stderr, "crashreplay: %s\n", bisect::PrintableText(std::string(st.message())).c_str());
    write_failed = true;
  }
  if (!report_path.empty()) {
    if (absl::Status st = WriteText(report_path, bisect::ReportHtml(report), "HTML report"); !st.ok()) {
      std::fprintf(stderr, "crashreplay: %s\n", bisect::PrintableText(std::string(st.message())).c_str());
      write_failed = true;
    }
  }
  if (json) {
    std::fputs(json_text.c_str(), stdout);
  } else {
    std::fputs(bisect::ReportText(report).c_str(), stdout);
  }
  std::fflush(stdout);
  if (write_failed) return kExitDataError;
  switch (report.status) {
    case bisect::BisectStatus::kCulpritFound: return kExitOk;
    case bisect::BisectStatus::kNotReproducible: return kExitNotReproduced;
    case bisect::BisectStatus::kGoodFails: return kExitGoodFails;
    case bisect::BisectStatus::kFlaky:
    case bisect::BisectStatus::kInconclusive: return kExitFlaky;
    case bisect::BisectStatus::kInterrupted: return kExitInterrupted;
    case bisect::BisectStatus::kAborted: return kExitFailed;
  }
  return kExitFailed;
}

}  // namespace crashreplay::tools
