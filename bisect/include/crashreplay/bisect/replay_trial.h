// Built-in trials: `crashreplay replay CAPTURE --config {config} --json
// [--step N]` run as an external command, its JSON read back.
//
// The contract with replay (issue 3, docs/cli.md): stdout is one JSON object
// with `outcome` (reproduced | diverged | failed), `step`, `kernels` (rows,
// kernel_table.h) and, when failed, `signature` {class, stage, kernel,
// check}; exit 0 reproduced, 1 failed or diverged, 2 usage, 3 data error.
// reproduced -> good; failed -> bad with replay's signature; usage and data
// errors abort the search (the configuration or capture is wrong, not the
// code). diverged (the step ran with every check passing, but its outputs
// differ from the recording) is judged by `diverged_is_bad`: by default it is
// good, because a bisection varies the configuration and any toggle that
// changes the arithmetic (GEMM path, scale format, reduction order) makes the
// digests differ from those the recorded configuration produced; the note
// names the first diverging kernel. With diverged_is_bad (hunting a numeric
// divergence rather than a crash) it is bad, class output_mismatch at that
// kernel.
// Deaths by signal, timeouts and OOM kills classify as for any command.
//
// Thread-safe like CommandTrialRunner.
#pragma once

#include <optional>
#include <string>

#include "crashreplay/bisect/command_trial.h"

namespace crashreplay::bisect {

// Judges a finished `replay --json` process.
TrialResult InterpretReplayOutput(const ProcessResult& p, const TrialLimits& limits, bool diverged_is_bad = false,
                                  const FailureTextRules* rules = nullptr);

struct ReplayTrialOptions {
  std::string crashreplay_binary;    // path of the crashreplay executable
  std::string capture;               // capture path
  std::vector<std::string> runner;   // prefix words
  std::string workdir;
  TrialLimits limits;
  bool diverged_is_bad = false;      // see InterpretReplayOutput
  std::shared_ptr<const FailureTextRules> rules = nullptr;  // for crashes of the replay process itself
  // Words added to every replay command line: `--engine NAME` and its
  // options, so each trial re-executes the step in that engine.
  std::vector<std::string> extra_args;
};

class ReplayTrialRunner : public TrialRunner {
 public:
  explicit ReplayTrialRunner(ReplayTrialOptions options);
  std::string SubjectId() const override;
  TrialResult Run(const TrialRequest& request, const std::atomic<bool>* cancel) override;
  std::string ReproduceCommand(const std::string& config_path, std::optional<int64_t> step) const override;

 private:
  ReplayTrialOptions options_;
  CommandTrialOptions command_;  // the replay command line, with {config}
  CommandTrialOptions command_with_step_;
};

}  // namespace crashreplay::bisect
