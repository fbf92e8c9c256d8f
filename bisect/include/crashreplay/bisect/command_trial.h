// External trials: any command, judged by its exit code like `git bisect run`.
//
// For each trial the runner writes the full configuration as a flat TOML file
// `<workdir>/trial-NNNN.toml`, replaces every `{config}` in the command's
// words with its path and `{step}` with the step (when the request has one),
// and sets in the child's environment:
//   CRASHREPLAY_CONFIG         the TOML file's path
//   CRASHREPLAY_SIGNATURE_OUT  where the command may write its failure
//                              signature as JSON (trial-NNNN.sig.json)
//   CRASHREPLAY_STEP           the step, when the request has one
//   CUDA_VISIBLE_DEVICES       the worker's GPUs, when a GPU pool is in use
// The runner prefix (`--runner 'srun -G1 --exclusive'`) goes in front of the
// command. Results are classified by ClassifyProcess (trial.h).
//
// Thread-safe: Run only reads the runner's fields; each trial has its own
// files (the index is unique per trial).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "crashreplay/bisect/trial.h"

namespace crashreplay::bisect {

struct CommandTrialOptions {
  std::vector<std::string> command;  // words; `{config}` / `{step}` substituted
  std::vector<std::string> runner;   // prefix words, may be empty
  std::string workdir;               // must exist; trial files go here
  TrialLimits limits;
  std::shared_ptr<const FailureTextRules> rules = nullptr;  // failure text; null: built-in rules
};

// What one launch produced, before judging.
struct LaunchOutput {
  ProcessResult process;
  std::optional<std::string> signature_file_text;
  std::string config_path;
};

// Writes the config, builds argv and environment, runs, reads the signature
// file. Shared by both runners.
LaunchOutput LaunchTrialProcess(const CommandTrialOptions& options, const TrialRequest& request,
                                const std::atomic<bool>* cancel);

// Replaces each `{config}` and `{step}` inside each word.
std::vector<std::string> SubstituteCommand(const std::vector<std::string>& words, const std::string& config_path,
                                           std::optional<int64_t> step);

class CommandTrialRunner : public TrialRunner {
 public:
  explicit CommandTrialRunner(CommandTrialOptions options) : options_(std::move(options)) {}
  std::string SubjectId() const override;
  TrialResult Run(const TrialRequest& request, const std::atomic<bool>* cancel) override;
  std::string ReproduceCommand(const std::string& config_path, std::optional<int64_t> step) const override;

 private:
  CommandTrialOptions options_;
};

}  // namespace crashreplay::bisect
