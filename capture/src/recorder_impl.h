// Recorder::Impl (internal): the threads, queues and crash paths behind
// recorder.h. See recorder.h for the contract and docs/capture.md for the
// design (threads, ring policy, crash paths).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "crash_handler.h"
#include "crashreplay/capture/recorder.h"
#include "crashreplay/formats/capture_writer.h"
#include "snapshot_ring.h"
#include "step_queue.h"
#include "weight_integrity.h"

namespace crashreplay::capture {

class Recorder::Impl final : public internal::CrashTarget {
 public:
  Impl(const SessionManifest& manifest, const RecorderOptions& options, std::string path,
       std::unique_ptr<CaptureWriter> writer);
  ~Impl() override;

  absl::Status Start();
  absl::Status RecordStep(const StepView& step);
  absl::Status SubmitSnapshot(uint64_t step, std::span<const TensorView> tensors);
  absl::Status RecordWeightHashes(const WeightShardHashes& shard);
  absl::Status RegisterWeights(std::span<const TensorView> weights, bool device = false);
  absl::Status RecordFingerprint(uint64_t step, std::string_view boundary, const TensorView& tensor);
  absl::Status RecordFingerprints(const FingerprintRecord& record);
  absl::Status OnFailure(const FailureInfo& failure);
  absl::Status Flush();
  absl::Status Close();
  RecorderStats stats() const;
  const std::string& path() const { return path_; }

  void OnFatalSignal(int sig) noexcept override;
  void OnTerminate(const std::string& exception_type, const std::string& what) override;
  void OnExit() override;

 private:
  static constexpr int kNumSignals = 5;
  static constexpr size_t kMaxSignalFrame = 1024;
  struct SignalFrames {
    unsigned char bytes[kNumSignals][kMaxSignalFrame];
    uint32_t size[kNumSignals];
  };

  void WriterLoop();
  void EncoderLoop();
  void ProcessStep(StepRecord& record, uint64_t backlog);  // backlog: steps queued, this one included
  void EncodeSignalFrames(std::optional<uint64_t> step, ForwardMode mode);
  absl::Status WaitWritten(uint64_t target, double timeout_s);
  // Writes the held fingerprints (if any) as one record; fp_mu_ held.
  absl::Status WriteHeldFingerprints(bool complete);
  absl::Status WaitEncoded(double timeout_s);
  void SetError(const absl::Status& s);
  absl::Status error() const;

  const RecorderOptions options_;
  const std::string path_;
  const uint32_t rank_;
  std::unique_ptr<CaptureWriter> writer_;

  // Step queue: head = accepted, tail = written. producer_mu_ orders
  // concurrent RecordStep callers (uncontended in an engine: one scheduler
  // thread per rank). What RecordStep writes sits on cache lines of its own
  // (the queue is aligned likewise): a line the writer thread also stores
  // to would cost the serving thread a transfer from the other core on
  // every step.
  alignas(64) std::mutex producer_mu_;
  std::atomic<uint64_t> last_accepted_step_{0};
  std::atomic<ForwardMode> last_accepted_mode_{ForwardMode::kUnknown};
  internal::StepQueue queue_;
  std::atomic<int> writer_events_{0};
  std::atomic<int> encoder_events_{0};
  std::atomic<bool> stop_{false};
  std::thread writer_thread_, encoder_thread_;
  std::atomic<pid_t> writer_tid_{0}, encoder_tid_{0};

  internal::SnapshotRing ring_;
  internal::WeightIntegrity integrity_;
  uint64_t last_dropped_written_ = 0;  // writer thread
  double step_interval_ns_ = 0;        // writer thread (EMA)
  int64_t last_step_ts_ = 0;           // writer thread
  std::atomic<uint32_t> period_steps_{0};
  std::atomic<uint64_t> weight_checks_{0}, corrupt_slices_{0};
  std::atomic<uint64_t> last_step_{0};
  std::atomic<bool> any_step_{false};

  // Failure frames encoded in advance for the signal handler (double buffer).
  SignalFrames signal_frames_[2];
  std::atomic<int> signal_active_{-1};
  std::atomic<bool> in_signal_{false};
  std::atomic<bool> crashing_{false};
  std::atomic<bool> terminate_recorded_{false};

  // Fingerprints of the step in progress (RecordFingerprint).
  std::mutex fp_mu_;
  std::optional<FingerprintRecord> held_fp_;
  mutable std::mutex error_mu_;
  absl::Status error_;
  std::atomic<bool> failed_{false};

  std::mutex close_mu_;
  std::atomic<bool> closed_{false};
  bool started_ = false;
  absl::Status close_status_;
};

}  // namespace crashreplay::capture
