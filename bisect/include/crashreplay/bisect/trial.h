// Trials: one configuration, run once, in its own process, judged.
//
// A TrialRunner turns a TrialRequest (full configuration, optional step, the
// GPUs the worker owns) into a TrialResult. Two real implementations exist:
// CommandTrialRunner (any external command, judged like `git bisect run`)
// and ReplayTrialRunner (the built-in `crashreplay replay --json`). The
// bisector never assumes which one it drives.
//
// Classification of a finished process (ClassifyProcess, documented in
// docs/bisect.md):
//   could not start / cancelled      -> abort
//   killed for the time limit        -> bad, class timeout
//   died by signal S                 -> bad, class crash_signal, check "SIGSEGV"
//     ... SIGKILL under a memory limit -> oom, check "host"
//   exit 0 -> good; 125 -> skip; 1..127 (not 125) -> bad, class other,
//                                       check "exit N"
//   exit 128+S (S a signal number, how a shell reports a child killed by S)
//                                    -> bad, class crash_signal, check "SIGSEGV"
//   exit 128 or 193..255             -> abort
// A bad verdict's signature comes from the command's signature file when it
// wrote a valid one; else from what the process printed (failure_text.h:
// CUDA errors, OOMs, NCCL errors, Python exceptions, --signature-regex);
// else from how it ended, as above. So exit 3 and exit 7 are different bugs,
// and so are SIGSEGV and SIGABRT.
//
// Thread safety: runners are called from several scheduler threads at once
// and must be safe for that; results are values.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "crashreplay/bisect/failure_text.h"
#include "crashreplay/bisect/kernel_table.h"
#include "crashreplay/bisect/process.h"
#include "crashreplay/bisect/signature.h"
#include "crashreplay/formats/config_file.h"

namespace crashreplay::bisect {

enum class Verdict {
  kGood,   // the configuration works
  kBad,    // it fails; see the signature
  kSkip,   // cannot be judged (exit 125, like git bisect)
  kAbort,  // the search must stop (command missing, bad exit code, interrupted)
  kFlaky,  // repeated runs disagreed (--repeat): never guessed good or bad
};
std::string_view VerdictName(Verdict v);

struct TrialResult {
  Verdict verdict = Verdict::kSkip;
  FailureSignature signature;       // class none when good
  int exit_code = -1;               // -1 when it did not exit normally
  int term_signal = 0;
  bool timed_out = false;
  double duration_s = 0;
  std::string stderr_tail;          // last lines of stderr (bounded)
  std::string note;                 // why it was classified so, warnings
  std::vector<KernelRow> kernels;   // per-kernel table when the trial gave one
  // The step that table belongs to, when the trial said: a replay that
  // failed while re-executing an earlier step prints that step's kernels.
  std::optional<int64_t> kernels_step;
  int runs = 1;                     // how many runs this verdict combines
  int bad_runs = 0;                 // of which failed
  std::string config_path;          // the TOML file the (last) run read
  // A replay trial: under --engine NAME that engine's outcome and the exact
  // engine's beside it, and where the engine's fingerprints depart from the
  // exact engine's (engine_divergence); one line, "" for other trials.
  std::string engines;
};

nlohmann::json TrialResultToJson(const TrialResult& r);

// Limits applied to every trial process.
struct TrialLimits {
  std::optional<double> timeout_s;
  std::optional<uint64_t> memory_limit_bytes;
  double kill_grace_s = 2.0;
};

struct TrialRequest {
  Config config;                    // the full configuration
  std::optional<int64_t> step;      // for step-parameterised trials
  std::string gpus;                 // CUDA_VISIBLE_DEVICES for this worker, "" = leave as is
  int index = 0;                    // unique trial number (names its files)
};

class TrialRunner {
 public:
  virtual ~TrialRunner() = default;
  // What the trials run on (capture path or command line): half the cache key.
  virtual std::string SubjectId() const = 0;
  virtual TrialResult Run(const TrialRequest& request, const std::atomic<bool>* cancel) = 0;
  // The one shell command that reruns a configuration stored at config_path.
  virtual std::string ReproduceCommand(const std::string& config_path, std::optional<int64_t> step) const = 0;
};

// Judges a finished process as the header comment describes.
// `signature_file_text` is the content the command wrote to
// CRASHREPLAY_SIGNATURE_OUT, if any; `rules` recognise failures in its
// output (nullptr: the built-in rules only).
TrialResult ClassifyProcess(const ProcessResult& p, const TrialLimits& limits,
                            const std::optional<std::string>& signature_file_text,
                            const FailureTextRules* rules = nullptr);

// Combines K runs of one configuration: all agree -> that verdict (the first
// run's details); verdicts or failure signatures disagree -> flaky; any
// abort -> abort.
TrialResult CombineRepeats(const std::vector<TrialResult>& runs);

}  // namespace crashreplay::bisect
