// Bisection trials that run the built-in engine: `crashreplay run MODEL
// --config {config} --prompt ... --json`, one process per trial.
//
// The process is launched exactly as CommandTrialRunner launches any command
// (LaunchTrialProcess: trial-NNNN.toml, {config} substituted, limits, process
// group) and judged by ClassifyProcess like `git bisect run`. The only thing
// this adds is the translation of `run --json` (docs/replay.md) into the
// bisect signature-file contract (docs/bisect.md): the engine's fault class
// "assert" is the bisector's "device_assert"; the kernel rows are already in
// the bisector's format and pass through.
//
// Thread-safe like CommandTrialRunner: Run only reads the runner's fields.
#pragma once

#include <atomic>
#include <optional>
#include <string>
#include <vector>

#include "crashreplay/bisect/command_trial.h"
#include "crashreplay/bisect/trial.h"

namespace crashreplay::tools {

// `run --json` output -> {"signature": {...}, "kernels": [...]} as a bisect
// signature file reads it. Non-JSON text gives "" (the trial is then judged
// by its exit code alone).
std::string RunJsonToSignatureFile(const std::string& run_stdout);

class RunTrialRunner : public bisect::TrialRunner {
 public:
  // `options.command` must contain `{config}` and end in `--json`.
  explicit RunTrialRunner(bisect::CommandTrialOptions options) : options_(std::move(options)) {}
  std::string SubjectId() const override;
  bisect::TrialResult Run(const bisect::TrialRequest& request, const std::atomic<bool>* cancel) override;
  std::string ReproduceCommand(const std::string& config_path, std::optional<int64_t> step) const override;

 private:
  bisect::CommandTrialOptions options_;
};

}  // namespace crashreplay::tools
