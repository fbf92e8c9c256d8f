// `replay --engine NAME`: the recorded steps re-executed by the engine that
// recorded them (transformers, sglang, vLLM), in a child process of that
// engine's Python, beside the exact engine (DESIGN decision 12).
//
// The child is `PYTHON -m crashreplay.engine_replay` (python/crashreplay/
// engine_replay.py): it rebuilds the model from the recorded checkpoint
// under the recorded configuration in the engine's own words, overridden by
// the user's (--config, --set), imports the --engine-setup modules, feeds
// the capture's steps 0..N to the engine's own model runner, records what
// it computed with the same recorder and boundaries as the original session
// (a capture of its own, OUT/session), and writes OUT/result.json: how far
// it ran, the exception that escaped (type, message, step, phase), and the
// tokens it sampled beside the recorded ones. Its exit codes: 0 ran (the
// result says how), 3 unreadable capture, 7 the engine cannot run here
// (vLLM on a CPU; a backend that needs a GPU), 9 an engine version outside
// the ones the driver was built for; anything else is the engine dying
// (a signal), which is itself a result.
//
// JudgeEngineRun compares that run with the recording: the failure by
// signature (the engine's exception text classified by the same rules
// bisect applies to external commands, on both sides), the target step's
// fingerprints bit for bit, the sampled tokens. The caller puts the real
// engine's fingerprints in the place of the recorded ones and replays the
// step in the exact engine, which then names the first boundary where the
// real engine departs from the exact one (cmd_replay.cc).
//
// Not thread-safe by design: one replay, one child.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "crashreplay/bisect/process.h"
#include "crashreplay/bisect/signature.h"
#include "crashreplay/replay/captures/capture_io.h"

namespace crashreplay::tools {

// The engines a driver exists for, in the order docs/cli.md lists them.
bool IsRealEngine(const std::string& name);
std::string RealEngineNames();  // "transformers, sglang, vllm"

struct EngineReplayOptions {
  std::string engine;                                         // transformers | sglang | vllm
  std::string python;                                         // the engine's interpreter
  std::vector<std::string> setups;                            // modules imported first
  std::vector<std::pair<std::string, std::string>> settings;  // engine words: --config, then --set
  std::string capture;                                        // the capture path, absolute
  int64_t step = 0;                                           // target step (index into the steps)
  std::string model_dir;                                      // "" = the recorded checkpoint
  std::string out_dir;                                        // the child's session and result.json
  std::optional<double> timeout_s;
};

struct EngineRun {
  bisect::ProcessResult process;
  nlohmann::json result;                          // result.json (object), null when none was written
  std::optional<replay::LoadedCapture> session;   // the child's own recording, when it reads back
  std::string session_problem;                    // why it does not, when it does not
};

// Starts the child and waits for it. Errors: FailedPrecondition when the
// interpreter cannot start (naming it and --engine-python); the child's own
// refusals come back in the EngineRun (exit 7/9/3).
absl::StatusOr<EngineRun> RunRealEngine(const EngineReplayOptions& options);

struct EngineVerdict {
  std::string outcome;  // reproduced | failed | diverged
  std::string detail;
  bisect::FailureSignature signature;                 // class none when reproduced
  std::optional<bisect::FailureSignature> recorded;   // the recording's failure, same rules
  bool matches_recorded_failure = false;
  nlohmann::json fingerprints;  // {compared, identical, first_difference?}
  nlohmann::json tokens;        // {compared, identical, first_mismatch?, fed_back}
};

// `recorded` is the capture as loaded for the replay; `step` the index of
// the target step in recorded.steps.
EngineVerdict JudgeEngineRun(const replay::LoadedCapture& recorded, int64_t step, const EngineRun& run);

// The engine's exception as a signature: its text classified by bisect's
// rules (failure_text.h), the stage from the step's mode, kernel "sampler"
// when it escaped sampling. Used on the recorded failure record too.
bisect::FailureSignature EngineFailureSignature(const std::string& exception_type, const std::string& message,
                                                const std::string& mode, const std::string& phase,
                                                std::optional<int64_t> step);

}  // namespace crashreplay::tools
