// The engine's side of the capture container: recording a run of the
// built-in engine (CaptureRecorder, a StepObserver over capture::Recorder)
// and reading a capture back into replayable steps (LoadCapture).
//
// What the built-in engine records (docs/replay.md "Captures"):
//   manifest  engine "crashreplay", the checkpoint path and config.json text,
//             every toggle (typed), the emulated device (capacity =
//             device_memory_gb * 1e9), tp_size, and per-rank weight-shard
//             hashes (formats/sharding.h, the capture side's definition);
//   steps     mode, request ids, token ids, positions, seq/extend lens, one
//             page-table row of pool PAGE ids per request (the engine's
//             page_size is a toggle), sampling parameters, the sampled tokens,
//             and digests: "step" (logits + tokens) and "kernel:<label>" per
//             kernel; the per-request RNG counter is implied (the number of
//             earlier steps of that request);
//   failure   the fault's message, stage and class, and its signature
//             class/stage/kernel/check in exception_type;
//   snapshots before every step, the state that step reads (step_state.h:
//             the KV pages of its batch) goes to the recorder's bounded
//             ring (the last SnapshotOptions::steps steps within
//             budget_bytes); the ring is written on failure and on a clean
//             close, so a capture holds the snapshots of its last steps.
// One file per session (rank 0's), because one process emulates every rank.
//
// Errors: the recorder's and reader's statuses; InvalidArgument for a
// capture whose steps the engine cannot rebuild (naming the step).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "crashreplay/capture/recorder.h"
#include "crashreplay/formats/capture_reader.h"
#include "crashreplay/replay/engine.h"
#include "crashreplay/replay/replay_session.h"

namespace crashreplay::replay {

struct SnapshotOptions {
  uint32_t steps = 4;                   // snapshots kept (the last steps); 0: none
  uint64_t budget_bytes = 16ull << 20;  // the ring's byte budget (recorder.h)
};

class CaptureRecorder : public StepObserver {
 public:
  // Opens SESSION_DIR/rank-00000.crcap and writes the manifest.
  static absl::StatusOr<std::unique_ptr<CaptureRecorder>> Begin(const std::string& session_dir,
                                                                const std::string& checkpoint_dir,
                                                                const Config& config, const Model& model,
                                                                const SnapshotOptions& snapshots = {});
  void StateBeforeStep(const StepInput& input, const KvCache& kv) override;
  void BeforeStep(const StepInput& input) override;
  void AfterStep(const StepProgram& program) override;
  // Records the run's failure (if any) and closes the file.
  absl::Status Finish(const std::optional<Fault>& fault);
  const std::string& path() const { return recorder_->path(); }
  capture::RecorderStats stats() const { return recorder_->stats(); }

 private:
  std::unique_ptr<capture::Recorder> recorder_;
  SnapshotOptions snapshots_;
  absl::Status status_;
};

struct LoadedCapture {
  SessionManifest manifest;
  std::vector<RecordedStep> steps;
  std::optional<Fault> failure;     // the recorded failure (signature fields set)
  int64_t failure_step = -1;        // its step, -1 when none or before the first step
  Config config = Config::Defaults();  // the recorded toggles
  std::vector<std::map<std::string, Hash128>> weights;  // per rank
  std::map<int64_t, SnapshotRecord> snapshots;  // by step (the last record of a step wins)
  std::shared_ptr<const CaptureReader> reader;  // for the snapshots' blobs
  // One line per recorded toggle of another engine (sglang, vLLM) that
  // shares a name with one of ours but whose value is outside our domain
  // (sglang's attention_backend=flashinfer): the replay keeps our default
  // for it, and says so.
  std::vector<std::string> notes;
};

// `path`: a capture file or a session directory (its rank-00000.crcap).
absl::StatusOr<LoadedCapture> LoadCapture(const std::string& path);

// The state snapshot of `step`, read and checked: NotFound when no snapshot
// covers the step; DataLoss naming the file, the step and the tensor when a
// tensor is missing, not stored, inconsistent (dtype, shape, byte size) or
// its blob is corrupt (hash mismatch, undecodable). Whether the state fits
// the engine is Engine::RestoreState's check.
absl::StatusOr<StepState> LoadStepState(const LoadedCapture& capture, int64_t step);

}  // namespace crashreplay::replay
