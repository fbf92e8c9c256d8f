// `crashreplay shrink CAPTURE -o OUT [--config FILE] [--set k=v]... [--engine NAME ...] [--model DIR]
// [--max-trials N] [--time-budget S] [--timeout S] [--memory-limit B] [-j N] [--repeat N] [--confirm N]
// [--gpus LIST] [--no-anonymize] [--export-kernel] [--json]`: the smallest capture whose replay still
// fails the same way (shrink.h; docs/cli.md).
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "command.h"
#include "commands_decl.h"
#include "crashreplay/bisect/process.h"
#include "crashreplay/bisect/scheduler.h"
#include "crashreplay/bisect/signature.h"
#include "exit_codes.h"
#include "shrink.h"

namespace crashreplay::tools {

int RunShrink(int argc, char** argv) {
  CLI::App app(
      "Shrink a failing capture to the smallest one that still fails the same way (requests, layers, token ids), "
      "with nothing of the user's prompts in it. Exit codes: 0 shrunk, 1 the capture's replay does not fail "
      "(nothing to shrink) or cannot be judged, 2 usage, 3 data error.",
      "shrink");
  std::string capture, out, config_file, model_dir, engine, engine_python;
  std::vector<std::string> sets, engine_setups;
  int max_trials = 400, jobs = 1, repeat = 1, confirm = bisect::kDefaultConfirmRuns;
  double timeout = 0, time_budget = 0;
  std::string memory_limit, gpus;
  bool json = false, no_anonymize = false, quiet = false, export_kernel = false;
  app.add_option("CAPTURE", capture, "capture file or session directory whose replay fails")->required();
  app.add_option("-o,--out", out, "output directory: capture/, model/ (a layer slice), README.md, shrink.json")
      ->required();
  app.add_option("--config", config_file, "configuration the replay fails under (flat TOML)");
  app.add_option("--set", sets, "one toggle the replay fails under, name=value; repeatable");
  app.add_option("--model", model_dir, "checkpoint directory (default: the recorded path)");
  app.add_option("--engine", engine, "replay every candidate in this engine (replay --engine)");
  app.add_option("--engine-python", engine_python, "with --engine: the engine's Python");
  app.add_option("--engine-setup", engine_setups, "with --engine: a module imported first; repeatable");
  app.add_option("--max-trials", max_trials,
                 "trial budget (default 400); reached, the smallest failing capture "
                 "found so far is written, marked not minimal")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--time-budget", time_budget,
                 "seconds after which no trial starts; the smallest failing capture found so far is written, "
                 "marked not minimal (0: no limit)");
  app.add_option("--timeout", timeout, "seconds a trial's replay may take (0: no limit)");
  app.add_option("--memory-limit", memory_limit, "address-space limit per trial (bytes, or with K/M/G/T)");
  app.add_option("--jobs,-j", jobs, "trials run in parallel (default 1, or the size of --gpus)")
      ->check(CLI::Range(1, 256));
  app.add_option("--repeat", repeat, "runs per trial; runs that disagree make it flaky, counted as unresolved")
      ->check(CLI::Range(1, 100));
  app.add_option("--confirm", confirm,
                 absl::StrCat("extra runs of the shrunk capture at the end (default ", bisect::kDefaultConfirmRuns,
                              "); shrink.json `confirmed` says how many failed the same way"))
      ->check(CLI::Range(0, 100));
  app.add_option("--gpus", gpus, "GPU pool: CUDA_VISIBLE_DEVICES per worker, e.g. 0,1,2 (or 0,1;2,3)");
  app.add_flag("--no-anonymize", no_anonymize, "keep request ids, sampled tokens and token ids as recorded");
  app.add_flag("--export-kernel", export_kernel,
               "then export the failing kernel of the shrunk capture (export-kernel) into OUT/kernel");
  app.add_flag("--json", json, "print shrink.json on stdout");
  app.add_flag("--quiet,-q", quiet, "no progress on stderr");
  if (auto rc = ParseArgs(app, argc, argv)) return *rc;

  ShrinkOptions o;
  o.capture = capture;
  o.out_dir = out;
  o.self = SelfPath(argv[0]);
  std::error_code ec;
  if (!config_file.empty()) {
    o.replay_args.insert(o.replay_args.end(),
                         {"--config", std::filesystem::absolute(config_file, ec).lexically_normal().string()});
  }
  for (const std::string& s : sets) o.replay_args.insert(o.replay_args.end(), {"--set", s});
  if (!engine.empty()) {
    o.replay_args.insert(o.replay_args.end(), {"--engine", engine});
    if (!engine_python.empty()) o.replay_args.insert(o.replay_args.end(), {"--engine-python", engine_python});
    for (const std::string& m : engine_setups) o.replay_args.insert(o.replay_args.end(), {"--engine-setup", m});
  }
  if (!model_dir.empty()) o.model_dir = std::filesystem::absolute(model_dir, ec).lexically_normal().string();
  o.max_trials = max_trials;
  if (timeout > 0) o.trial_timeout_s = timeout;
  if (time_budget > 0) o.time_budget_s = time_budget;
  if (!memory_limit.empty()) {
    auto bytes = ParseBytes("--memory-limit", memory_limit);
    if (!bytes.ok()) return ReportError(bytes.status());
    o.memory_limit_bytes = *bytes;
  }
  o.gpus = bisect::ParseGpuList(gpus);
  o.jobs = gpus.empty() ? jobs : static_cast<int>(o.gpus.size());
  o.repeat = repeat;
  o.confirm = confirm;
  o.anonymize = !no_anonymize;
  if (!quiet) o.progress = [](const std::string& line) { std::fprintf(stderr, "shrink: %s\n", line.c_str()); };

  absl::StatusOr<ShrinkResult> r = Shrink(o);
  if (!r.ok()) {
    if (r.status().code() == absl::StatusCode::kFailedPrecondition) {
      std::fprintf(stderr, "crashreplay: %s\n", std::string(r.status().message()).c_str());
      return kExitFailed;
    }
    return ReportError(r.status());
  }
  nlohmann::json j = r->ToJson();
  if (export_kernel) {
    // The failing kernel of the shrunk step, exported as export-kernel does
    // (the exact engine's replay: no --engine words), from OUT.
    nlohmann::json e = {{"kernel", r->target.kernel}, {"dir", "kernel"}};
    if (r->target.kernel.empty()) {
      e["exit_code"] = nullptr;
      e["note"] = "the failure names no kernel: nothing to export";
    } else {
      auto export_as = [&](const std::string& label) {
        bisect::ProcessSpec spec;
        spec.argv = {o.self, "export-kernel", r->capture_dir, "--kernel", label, "-o", out + "/kernel"};
        for (size_t i = 0; i + 1 < o.replay_args.size(); i += 2) {
          if (o.replay_args[i] == "--config" || o.replay_args[i] == "--set") {
            spec.argv.insert(spec.argv.end(), {o.replay_args[i], o.replay_args[i + 1]});
          }
        }
        const std::string model = !r->model_dir.empty() ? r->model_dir : o.model_dir;
        if (!model.empty()) spec.argv.insert(spec.argv.end(), {"--model", model});
        spec.timeout_s = o.trial_timeout_s;
        return bisect::RunProcess(spec);
      };
      bisect::ProcessResult p = export_as(r->target.kernel);
      if (p.exited && p.exit_code == kExitUsage && r->target.kernel.rfind('L', 0) != 0) {
        // A check of the step's plan (the KV slot checks) names the kernel
        // without a layer: every layer's runs that plan; the first one's is
        // exported.
        const std::string first = absl::StrCat("L0.", r->target.kernel);
        p = export_as(first);
        e["kernel"] = first;
        e["note"] = absl::StrCat("the check names '", r->target.kernel, "' of every layer: exported ", first);
      }
      e["exit_code"] = p.exited ? nlohmann::json(p.exit_code) : nlohmann::json(nullptr);
      if (!p.exited || p.exit_code != 0) {
        std::string why = p.started ? bisect::KeptStderr(p) : p.start_error;
        if (why.size() > 2000) why = why.substr(why.size() - 2000);
        e["note"] = absl::StrCat("export-kernel did not finish: ", why);
        std::fprintf(stderr, "crashreplay: shrink --export-kernel: %s\n", std::string(e["note"]).c_str());
      }
    }
    j["export_kernel"] = e;
  }
  if (!r->regenerate_command.empty()) {
    // The drawn model is not shipped: its config files and seed draw it
    // again, byte for byte (make-model's bytes depend on no host or thread
    // count).
    std::error_code ec;
    std::filesystem::remove_all(r->model_dir, ec);
  }
  {
    std::ofstream f(out + "/shrink.json");
    f << j.dump(2) << "\n";
    std::ofstream readme(out + "/README.md");
    readme << "# A shrunk crashreplay capture\n\n"
           << "Made by `crashreplay shrink` (shrink.json says what was removed at each stage). From this "
              "directory, "
           << (r->regenerate_command.empty()
                   ? ""
                   : "this command draws the model (random weights: the same bytes on any host) and then ")
           << "this command replays the step and fails with " << bisect::DescribeSignature(r->target) << ":\n\n```\n"
           << (r->regenerate_command.empty() ? "" : r->regenerate_command + "\n") << r->replay_command << "\n```\n\n"
           << (!r->regenerate_command.empty()
                   ? "The failure survives random weights: `model-config/` holds the config files of the model "
                     "(the checkpoint's layers up to the one that fails), and make-model draws its tensors, in the "
                     "checkpoint's names, dtypes and shapes, from the seed. No checkpoint is needed.\n"
               : r->model_dir.empty() ? "The failure needs the original checkpoint (shrink.json `needs.checkpoint`).\n"
                                      : "`model/` is a slice of the checkpoint: the layers up to the one that fails; "
                                        "the failure needs its values (shrink.json `needs.weights`).\n")
           << (r->minimal ? ""
                          : "\nThe trial budget ran out: this is the smallest failing capture found, not a "
                            "minimal one.\n")
           << (r->confirm_failed == r->confirm_runs
                   ? ""
                   : absl::StrCat("\nFlaky: run again ", r->confirm_runs, " times, it failed the same way ",
                                  r->confirm_failed, " times.\n"))
           << (j.contains("export_kernel") && j["export_kernel"].value("exit_code", nlohmann::json()) == 0
                   ? "\n`kernel/` holds the failing kernel's tensors, parameters and `repro.py` (export-kernel).\n"
                   : "");
    if (!f || !readme) {
      std::fprintf(stderr, "crashreplay: cannot write %s/shrink.json or README.md\n", out.c_str());
      return kExitDataError;
    }
  }
  if (json) {
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("target: %s\n", bisect::DescribeSignature(r->target).c_str());
    for (const ShrinkStage& s : r->stages) {
      std::printf("  %-10s %lld -> %lld (%d trials)%s%s\n", s.stage.c_str(), static_cast<long long>(s.before),
                  static_cast<long long>(s.after), s.trials, s.note.empty() ? "" : ": ", s.note.c_str());
    }
    std::printf("%d trials, capture %llu -> %llu bytes%s\nreplay it: cd %s && %s%s\n", r->trials,
                static_cast<unsigned long long>(r->bytes_before), static_cast<unsigned long long>(r->bytes_after),
                r->minimal ? "" : " (budget reached: not minimal)", out.c_str(),
                r->regenerate_command.empty() ? "" : (r->regenerate_command + " && ").c_str(),
                r->replay_command.c_str());
  }
  return kExitOk;
}

}  // namespace crashreplay::tools
