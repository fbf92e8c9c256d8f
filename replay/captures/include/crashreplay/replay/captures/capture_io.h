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
// Captures of other engines (sglang, vLLM; python/crashreplay adapters) are
// read into the same steps: their page-table rows (sglang's token slots,
// vLLM's block ids) become page ids at the replay's page_size
// (capture_steps.h), request ids that are not numbers (UUIDs, "cmpl-...")
// become stable distinct numbers, a decode step without extend lengths adds
// one token per request, and the weight hashes of every rank file of the
// session are gathered (rank_weights) for VerifyCaptureWeights
// (engine_weights.h).
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
#include "crashreplay/formats/capture_records.h"
#include "crashreplay/formats/config_file.h"
#include "crashreplay/replay/session/engine.h"
#include "crashreplay/replay/session/replay_session.h"

namespace crashreplay::replay {

struct SnapshotOptions {
  uint32_t steps = 4;                   // snapshots kept (the last steps); 0: none
  uint64_t budget_bytes = 64ull << 20;  // the ring's byte budget (recorder.h)
  // Page-table rows as deltas in the file (RecorderOptions::page_table_deltas).
  bool page_table_deltas = true;
  // Step lists as differences in the file (RecorderOptions::step_list_deltas).
  bool step_list_deltas = true;
  // Arm lightweight GPU core dumps for the process (RecorderOptions::arm_coredumps).
  bool coredumps = false;
};

// A run configured in a serving engine's words (`engine = "sglang"` in its
// configuration file) is recorded in that engine's manifest form, as its
// adapter writes it: the engine's settings under their own names, the
// replay's toggles the settings do not give as crashreplay.NAME, the page
// table unit, and the device (name, architecture, memory). Replay then reads
// it through the same vocabulary as a capture from a real server.
struct EngineIdentity {
  std::string engine;                                     // "sglang", "vllm"
  std::vector<std::pair<std::string, ConfigValue>> settings;  // as the file gives them
  std::vector<std::string> own_toggles;                   // replay toggles to record as crashreplay.NAME
  std::string device_name;
  // The checkpoint's tensors: weight hashes are written in the engine's
  // parameter layout (engine_weights.h), as its adapter hashes them.
  const TensorSet* tensors = nullptr;
};

class CaptureRecorder : public StepObserver {
 public:
  // Opens SESSION_DIR/rank-00000.crcap and writes the manifest (the built-in
  // engine's form, or `as`'s engine's).
  static absl::StatusOr<std::unique_ptr<CaptureRecorder>> Begin(const std::string& session_dir,
                                                                const std::string& checkpoint_dir, const Config& config,
                                                                const Model& model,
                                                                const SnapshotOptions& snapshots = {},
                                                                const EngineIdentity* as = nullptr);
  void StateBeforeStep(const StepInput& input, const KvCache& kv) override;
  void BeforeStep(const StepInput& input) override;
  void AfterStep(const StepProgram& program) override;
  // Records the run's failure (if any) and closes the file.
  absl::Status Finish(const std::optional<Fault>& fault);
  const std::string& path() const { return recorder_->path(); }
  capture::RecorderStats stats() const { return recorder_->stats(); }
  // The last step's state snapshot, when its bytes were over the budget (so
  // the ring could not keep it and a replay of that step re-executes the
  // steps before it): its step and bytes.
  struct Oversized {
    int64_t step = -1;
    uint64_t bytes = 0;
  };
  std::optional<Oversized> last_state_oversized() const { return last_oversized_; }

 private:
  std::unique_ptr<capture::Recorder> recorder_;
  SnapshotOptions snapshots_;
  absl::Status status_;
  std::optional<Oversized> last_oversized_;
};

struct LoadedCapture {
  SessionManifest manifest;
  std::vector<RecordedStep> steps;
  std::optional<Fault> failure;     // the recorded failure (signature fields set)
  int64_t failure_step = -1;        // its step, -1 when none or before the first step
  Config config = Config::Defaults();  // the recorded toggles
  std::vector<std::map<std::string, Hash128>> weights;  // per rank (the built-in engine's manifest)
  std::map<int64_t, SnapshotRecord> snapshots;  // by step (the last record of a step wins)
  std::shared_ptr<const CaptureReader> reader;  // for the snapshots' blobs
  // One line per recorded toggle of another engine (sglang, vLLM) that
  // shares a name with one of ours but whose value is outside our domain
  // (sglang's attention_backend=flashinfer): the replay keeps our default
  // for it, and says so.
  std::vector<std::string> notes;
  // Load-time weight hashes of every rank file of the session that recorded
  // some (this file's and its rank-NNNNN.crcap siblings' with the same
  // session id), by rank: the manifest's and the WeightHashesRecords'.
  struct RankWeights {
    uint32_t rank = 0;
    ParallelLayout parallel;          // that file's layout
    std::vector<TensorHash> tensors;  // name, hash, byte size
    std::string file;
  };
  std::vector<RankWeights> rank_weights;
  std::vector<uint32_t> ranks_without_file;  // ranks of the recorded layout with no file beside this one
  // The page-table rows' unit as recorded ("page ids", "token slots",
  // "block ids (16 tokens per block)") and the page_size the steps' page
  // ids are at now (RepageSteps changes it).
  std::string page_table_unit;
  int page_size = 0;
};

// `path`: a capture file or a session directory (its rank-00000.crcap, or
// its lowest rank's file when rank 0 wrote none).
absl::StatusOr<LoadedCapture> LoadCapture(const std::string& path);

// Rewrites every step's page-table rows for `page_size` (a replay under
// another page_size than the recorded one). The built-in engine's rows are
// page ids of its recorded page size and stay as they are; token-slot and
// block rows are cut into pages again (InvalidArgument naming the step and
// request when they are not laid out in pages of that size).
absl::Status RepageSteps(LoadedCapture* capture, int page_size);

// The state snapshot of `step`, read and checked: NotFound when no snapshot
// covers the step; DataLoss naming the file, the step and the tensor when a
// tensor is missing, not stored, inconsistent (dtype, shape, byte size) or
// its blob is corrupt (hash mismatch, undecodable). Whether the state fits
// the engine is Engine::RestoreState's check.
absl::StatusOr<StepState> LoadStepState(const LoadedCapture& capture, int64_t step);

}  // namespace crashreplay::replay
