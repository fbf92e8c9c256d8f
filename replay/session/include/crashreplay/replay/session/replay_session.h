// Replay of recorded steps: rebuild the engine state by re-executing the step
// log (or restore it from a snapshot, step_state.h), then run the target step
// kernel by kernel and compare it with what was recorded.
//
// A RecordedStep is what the step log holds for one scheduler step: its exact
// inputs (batch rows, tokens, positions, page-table rows, sampling parameters
// and RNG counters), and what came out: the step digest, the sampled tokens,
// per-kernel output digests when the recorder took them, and the failure when
// the step failed. StepLogRecorder is the engine-side observer that produces
// them; the capture container stores them (capture/).
//
// Outcomes (ReplayReport::outcome), as bisection reads them (exit 0 / 1 / 1):
//   "reproduced" the target step ran to the end without a failure and every
//                recorded digest (earlier steps, the step, its kernels)
//                matches; when the recorded step had failed, only the kernels
//                before its failure have digests, and "reproduced" then means
//                it ran clean where the recording failed;
//   "diverged"   no failure, but an earlier step's digest, a kernel digest of
//                the target step or the step digest differs (first step and
//                kernel named);
//                When the capture holds the engine's fingerprints of the
//                target step and one departs from the replay's own at the
//                same boundary (formats/fingerprint.h), the outcome is
//                "diverged" with engine_divergence set and a signature of
//                class engine_divergence naming the boundary;
//   "failed"     a check fired (matches_recorded_failure says whether it is
//                the recorded failure's signature).
// Deterministic: the same log and configuration give the same report bits
// (timings aside) on any thread count.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "crashreplay/replay/session/engine.h"

namespace crashreplay::replay {

struct RecordedStep {
  StepInput input;
  std::optional<Hash128> digest;                  // absent when the step failed
  std::vector<int32_t> sampled;
  std::vector<std::pair<std::string, Hash128>> kernel_digests;  // label -> digest, in order
  std::optional<Fault> fault;
  // What the engine computed at the step's boundaries (a capture's
  // FingerprintRecord; empty when it has none), in the order they ran;
  // incomplete when the step did not finish.
  std::vector<crashreplay::Fingerprint> fingerprints;
  bool fingerprints_complete = true;
};

// The first boundary of the target step where the engine's fingerprint
// departs from the replay's own (FingerprintDeparts).
struct EngineDivergence {
  std::string boundary;
  std::string reason;
  crashreplay::Fingerprint engine, replay;
  nlohmann::json ToJson() const;
};

// Records every step the engine runs (inputs, digests, failure).
class StepLogRecorder : public StepObserver {
 public:
  explicit StepLogRecorder(bool kernel_digests = true) : kernel_digests_(kernel_digests) {}
  void BeforeStep(const StepInput& input) override;
  void AfterStep(const StepProgram& program) override;
  const std::vector<RecordedStep>& steps() const { return steps_; }

 private:
  bool kernel_digests_;
  std::vector<RecordedStep> steps_;
};

struct ReplayReport {
  std::string outcome;   // reproduced | diverged | failed
  int64_t step = -1;     // the target step
  Hash128 digest;        // the target step's digest (zero when it failed)
  uint64_t activation_bytes = 0;  // the target step's (StepProgram::activation_bytes)
  std::vector<KernelRecord> kernels;  // the target step's kernels as run
  std::optional<Fault> fault;
  std::string first_nonfinite;        // first kernel with a NaN/Inf output in the target step
  int64_t diverged_step = -1;
  std::string diverged_kernel;        // label, when a kernel digest differs
  bool matches_recorded_failure = false;
  // Fingerprints: how many of the engine's boundaries were compared, the
  // first departure, and (a step that did not finish in the engine) the
  // last boundary the engine completed.
  int64_t fingerprints_compared = -1;  // -1: the capture has none for the step
  std::optional<EngineDivergence> engine_divergence;
  std::string engine_last_boundary;
  ForwardMode mode = ForwardMode::kPrefill;  // the target step's
  std::string detail;                 // one line for people
  std::string start = "re-executed";  // re-executed | snapshot
  int64_t snapshot_step = -1;         // the snapshot's step, when start is "snapshot"
  std::string start_note;             // why a snapshot was not used, when one might have been

  nlohmann::json ToJson() const;
};

// Sees the target step's kernels as they run (StepDump, step_dump.h).
// AfterKernel is called right after kernel `index` of `program` ran (its
// record is records()[index], failed or not), before the next kernel can
// overwrite the buffers it wrote: the step reuses one buffer per role
// ("q", "hidden") across layers, so an observer that keeps outputs must
// copy them here.
class KernelObserver {
 public:
  virtual ~KernelObserver() = default;
  virtual void AfterKernel(const StepProgram& program, size_t index) = 0;
};

// Progress of a replay's long parts: phase "re-executing steps" (done =
// steps re-run, total = the target's index) and "step N" (done = kernels
// run, total = the step's kernels, detail = the last kernel's label).
using ProgressFn = std::function<void(std::string_view phase, int64_t done, int64_t total, std::string_view detail)>;

struct ReplayOptions {
  std::string stop_after;              // a kernel label ("L3.attention") or "" (run the whole step)
  KernelObserver* observer = nullptr;  // the target step's kernels
  // The engine's KV cache already holds the target step's state, restored
  // from a snapshot (Engine::RestoreState): run the target step only.
  bool state_restored = false;
  ProgressFn progress;  // optional
};

// What rebuilding the state of step `target` by re-execution will run: the
// steps before it and their tokens (those of prefill/extend steps apart).
// `replay` says it before it starts, and its progress counts tokens, so the
// time left is estimated from the pace as the work goes. (The capture's step
// timestamps are no estimate: engines take them at different points, the
// built-in engine after a step, sglang's adapter before it.)
struct ReExecution {
  int64_t steps = 0;
  int64_t tokens = 0;
  int64_t prefill_tokens = 0;
  std::string Text() const;  // "2634 tokens in 9 steps (2600 of prefill)"
};
ReExecution PlanReExecution(const std::vector<RecordedStep>& log, int64_t target);

// Replays `log` up to `target` (an index into the log) on `engine`, whose KV
// cache must be fresh (or hold the target's state: state_restored). The
// report's `start` says which: "re-executed" (steps 0..target-1 ran again,
// their digests compared) or "snapshot" (only the target step ran; earlier
// steps are not compared).
ReplayReport ReplayStep(Engine& engine, const std::vector<RecordedStep>& log, int64_t target,
                        const ReplayOptions& options);
inline ReplayReport ReplayStep(Engine& engine, const std::vector<RecordedStep>& log, int64_t target,
                               const std::string& stop_after = "") {
  ReplayOptions o;
  o.stop_after = stop_after;
  return ReplayStep(engine, log, target, o);
}

// Chrome/Perfetto trace ("traceEvents", complete events) of a step's kernels.
nlohmann::json ChromeTrace(const std::vector<KernelRecord>& kernels, int64_t step);

// One fingerprint as the reports write it (engine_divergence's engine and
// replay): its counts, extremes, sums, first non-finite element and text.
nlohmann::json FingerprintJson(const crashreplay::Fingerprint& f);

}  // namespace crashreplay::replay
