// Recorder::Impl (internal): the threads, queues and crash paths behind
// recorder.h. See recorder.h for the contract and docs/capture.md for the
// design (threads, ring policy, crash paths).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "crash_handler.h"
#include "crashreplay/capture/recorder.h"
#include "crashreplay/formats/capture_encoder.h"
#include "crashreplay/formats/capture_writer.h"
#include "held_frames.h"
#include "page_row_tracker.h"
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
  void ProcessStep(StepRecord& record, bool last);  // last: the newest step queued when the batch began
  void EncodeSignalFrames(std::optional<uint64_t> step, ForwardMode mode);
  absl::Status WaitWritten(uint64_t target, double timeout_s);
  // Writes the held fingerprints (if any) as one record; fp_mu_ held.
  absl::Status WriteHeldFingerprints(bool complete);
  absl::Status WaitEncoded(double timeout_s);
  void SetError(const absl::Status& s);
  absl::Status error() const;

  // Disk errors (docs/capture.md, "Disk full and slow disks"). Every record
  // goes through AppendLocked, disk_mu_ held: to the file, or to held_
  // once a write has failed.
  void AppendLocked(EncodedFrame frame);
  void AppendLocked(const absl::StatusOr<EncodedFrame>& frame);
  // A write failed: cut back by the writer; hold from now on, warn once.
  void OnWriteErrorLocked(const absl::Status& s);
  // Writes what the disk refused before, in order: held records, then the
  // ring and the failure record OnFailure could not write, then the
  // counters. True when nothing is left in memory.
  bool CatchUpLocked();
  // Retries when the disk is refusing and `force` or the retry interval
  // has passed. True when nothing is held.
  bool RetryDisk(bool force);
  // The cumulative drop counters as a record, when they changed (and the
  // disk is taking writes, or `force`). False when its write failed.
  bool WriteDroppedLocked(uint64_t step, bool force = false);
  // What is still only in memory, for a status ("steps 930-3999 (3070
  // held in memory), the failure record"); disk_mu_ held.
  std::string UnwrittenLocked() const;
  absl::Status DiskStatusLocked(std::string_view what) const;
  // The caller's one report of a disk problem (the first RecordStep after
  // it); every later one is counted only.
  absl::Status ReportOnce(absl::Status s);

  const RecorderOptions options_;
  const std::string path_;
  const CoredumpArming coredump_;  // as the manifest records it
  const uint32_t pid_;
  // The dump named in a failure record, if any (OnFailure).
  void NameCoredump(FailureRecord* f);
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

  // Queue overflow (a stalled writer): steps dropped, and whether steps
  // are being dropped without waiting (until the queue is half empty).
  std::atomic<uint64_t> steps_dropped_{0};
  bool overflowing_ = false;  // producer_mu_
  // Page-table deltas, caller's side (producer_mu_): the rows given, and
  // the step's rows as they go into the queue.
  internal::PageRowTracker given_rows_;
  std::vector<int64_t> queue_offsets_, queue_slots_, queue_starts_;
  std::atomic<uint64_t> page_rows_incomplete_{0};
  // Queues `step`, its page-table rows turned into deltas (producer_mu_).
  void PushStep(const StepView& step, int64_t timestamp_nanos, bool dropped);

  // Disk errors. disk_mu_ orders every append to writer_ and held_.
  std::mutex disk_mu_;
  internal::HeldFrames held_;
  bool disk_error_ = false;               // disk_mu_: appends go to held_
  absl::Status first_disk_error_;         // disk_mu_
  absl::Status last_disk_error_;          // disk_mu_
  bool ring_pending_ = false;             // disk_mu_: OnFailure could not write the ring
  std::vector<EncodedFrame> pending_failures_;   // disk_mu_: nor the failure records
  std::atomic<bool> disk_degraded_{false};       // disk_error_, readable anywhere
  std::atomic<double> next_retry_s_{0};
  std::atomic<bool> reported_{false};            // the caller has had its one report
  std::atomic<bool> report_pending_{false};      // the next RecordStep returns pending_report_
  std::mutex report_mu_;
  absl::Status pending_report_;                  // report_mu_

  internal::SnapshotRing ring_;
  internal::WeightIntegrity integrity_;
  // The drop counters last written (disk_mu_): snapshots, steps, records, write errors.
  uint64_t last_dropped_written_[4] = {0, 0, 0, 0};
  // Step records as parts of one zstd stream (writer thread); restarted
  // whenever a step frame does not go straight to the file.
  StepStreamEncoder step_stream_;
  // Page-table deltas, file side (writer thread): rows whole after a
  // restart of the step stream and every so often (DeltaPageRows); the
  // 8-byte units written since (a row's slots plus kRequestUnits for the
  // request's other fields).
  internal::PageRowTracker written_rows_;
  uint64_t page_units_since_whole_ = 0;
  static constexpr uint64_t kRequestUnits = 8;
  void DeltaPageRows(StepRecord& record, bool restart);
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
