#include "crashreplay/capture/recorder.h"

#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "crashreplay/base/status.h"
#include "crashreplay/formats/capture_encoder.h"
#include "crashreplay/formats/capture_format.h"
#include "recorder_impl.h"

namespace crashreplay::capture {
namespace {

constexpr int kSignalOrder[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};

pid_t CurrentTid() { return static_cast<pid_t>(syscall(SYS_gettid)); }

int64_t RealtimeNanos() {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

double MonotonicSeconds() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

void SleepMicros(long us) {
  struct timespec ts{us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, nullptr);
}

// Idle back-off of the background threads: poll every 50 us at first, up to
// every 1 ms after a while without work; `events` (bumped by Close/Flush/
// OnFailure) cuts the wait short. Latency from a step to the file is thus
// at most about 1 ms, and an idle recorder wakes about 1000 times a second.
void IdleWait(std::atomic<int>& events, int seen, int* idle) {
  if (events.load(std::memory_order_acquire) != seen) return;
  *idle = std::min(*idle + 1, 20);
  SleepMicros(*idle * 50);
}

}  // namespace

std::string SessionRankPath(const std::string& session_dir, uint32_t rank) {
  return (std::filesystem::path(session_dir) / CaptureFileNameForRank(rank)).string();
}

// ---------------------------------------------------------------------------
// Impl

Recorder::Impl::Impl(const SessionManifest& manifest, const RecorderOptions& options, std::string path,
                     std::unique_ptr<CaptureWriter> writer)
    : options_(options),
      path_(std::move(path)),
      coredump_(manifest.coredump),
      pid_(static_cast<uint32_t>(::getpid())),  // the pid the driver puts in the dump's name
      rank_(manifest.parallel.rank),
      writer_(std::move(writer)),
      queue_(options.step_queue_slots, options.step_queue_bytes),
      held_(options.held_steps, options.held_bytes),
      ring_(options.snapshot_ring_bytes, options.max_snapshots, manifest.parallel.rank, options.blob),
      integrity_(options.weight_chunk_bytes, options.weight_check_bytes_per_step, options.weight_check_budget) {
  step_stream_.set_list_deltas(options.step_list_deltas);
}

Recorder::Impl::~Impl() {
  if (!closed_.load()) {
    absl::Status s = Close();
    if (!s.ok()) std::fprintf(stderr, "crashreplay: closing capture %s: %s\n", path_.c_str(), s.ToString().c_str());
  }
}

absl::Status Recorder::Impl::Start() {
  if (!queue_.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat("capture ", path_, ": cannot map the step queue's arena of ",
                                                     options_.step_queue_bytes, " bytes"));
  }
  EncodeSignalFrames(std::nullopt, ForwardMode::kUnknown);
  writer_thread_ = std::thread([this] { WriterLoop(); });
  encoder_thread_ = std::thread([this] { EncoderLoop(); });
  started_ = true;
  CR_RETURN_IF_ERROR(internal::RegisterCrashTarget(this));
  if (options_.install_signal_handlers) CR_RETURN_IF_ERROR(internal::InstallFatalSignalHandlers());
  return absl::OkStatus();
}

void Recorder::Impl::SetError(const absl::Status& s) {
  std::lock_guard<std::mutex> lock(error_mu_);
  if (error_.ok()) error_ = s;
  failed_.store(true);
}

absl::Status Recorder::Impl::error() const {
  std::lock_guard<std::mutex> lock(error_mu_);
  return error_;
}

absl::Status Recorder::Impl::ReportOnce(absl::Status s) {
  if (reported_.exchange(true)) return absl::OkStatus();
  return s;
}

absl::Status Recorder::Impl::RecordStep(const StepView& step) {
  if (closed_.load(std::memory_order_relaxed)) {
    return absl::FailedPreconditionError(
        absl::StrCat("capture ", path_, " is closed; step ", step.step, " not recorded"));
  }
  if (failed_.load(std::memory_order_relaxed)) return error();
  CR_RETURN_IF_ERROR(internal::StepQueue::Validate(step));
  std::lock_guard<std::mutex> lock(producer_mu_);
  if (queue_.Full()) {
    // The writer is a whole queue behind (a stalled disk). Wait a bounded
    // time once, so that a burst loses nothing; then drop and count, and
    // drop without waiting until the writer has caught up by half a queue:
    // serving is never held up by the disk for longer than one wait.
    if (!overflowing_) {
      const double deadline = MonotonicSeconds() + options_.step_queue_wait_s;
      while (queue_.Full() && MonotonicSeconds() <= deadline) SleepMicros(50);
    }
    if (queue_.Full()) {
      overflowing_ = true;
      PushStep(step, 0, /*dropped=*/true);  // its rows still count for the deltas after it
      if (steps_dropped_.fetch_add(1, std::memory_order_relaxed) == 0) {
        std::fprintf(stderr,
                     "crashreplay: capture %s: the writer is %u steps behind (the disk is slow); step %llu and later "
                     "steps that find the queue full are dropped and counted (stats().steps_dropped, the file)\n",
                     path_.c_str(), queue_.slots(), static_cast<unsigned long long>(step.step));
      }
      return ReportOnce(absl::ResourceExhaustedError(absl::StrFormat(
          "capture %s: the writer is %d steps behind (the disk is slow); step %d was dropped, and later steps are "
          "dropped without waiting while the queue stays full: counted in stats().steps_dropped and the file, "
          "reported only this once (raise step_queue_slots, or check the disk)",
          path_, queue_.slots(), step.step)));
    }
  } else if (overflowing_ && queue_.head() - queue_.tail() <= queue_.slots() / 2) {
    overflowing_ = false;
  }
  last_accepted_step_.store(step.step, std::memory_order_relaxed);
  last_accepted_mode_.store(step.mode, std::memory_order_relaxed);
  PushStep(step, step.timestamp_nanos != 0 ? step.timestamp_nanos : RealtimeNanos(), /*dropped=*/false);
  // No wake-up call: a futex wake is a system call of several microseconds
  // on the serving thread. The writer polls (IdleWait) instead.
  if (report_pending_.load(std::memory_order_relaxed) && report_pending_.exchange(false)) {
    std::lock_guard<std::mutex> report_lock(report_mu_);
    return ReportOnce(absl::Status(
        pending_report_.code(),
        absl::StrFormat("%s; the steps since then, this one (step %d) included, are held in memory and written "
                        "when the disk takes writes again (reported only this once)",
                        pending_report_.message(), step.step)));
  }
  return absl::OkStatus();
}

void Recorder::Impl::PushStep(const StepView& step, int64_t timestamp_nanos, bool dropped) {
  const size_t rows = step.page_table_offsets.empty() ? 0 : step.page_table_offsets.size() - 1;
  if (rows == 0) {
    if (!dropped) queue_.Push(step, timestamp_nanos);
    return;
  }
  // Without deltas in the file, rows given as deltas are still resolved:
  // a new epoch every step passes each row on whole.
  if (!options_.page_table_deltas) given_rows_.NewEpoch();
  queue_offsets_.resize(rows + 1);
  queue_starts_.resize(rows);
  queue_slots_.clear();
  queue_offsets_[0] = 0;
  for (size_t i = 0; i < rows; ++i) {
    const int64_t pool = i < step.req_pool_indices.size() ? step.req_pool_indices[i] : -1;
    const int64_t start = step.page_table_starts.empty() ? 0 : step.page_table_starts[i];
    const auto from = static_cast<size_t>(step.page_table_offsets[i]);
    const auto to = static_cast<size_t>(step.page_table_offsets[i + 1]);
    const internal::PageRowTracker::Out out = given_rows_.Apply(
        pool, start, start > 0, step.page_table_slots.subspan(from, to - from), options_.page_table_deltas);
    if (dropped) continue;
    queue_slots_.insert(queue_slots_.end(), out.slots.begin(), out.slots.end());
    queue_offsets_[i + 1] = static_cast<int64_t>(queue_slots_.size());
    // The queue's start codes (StepQueue::Unpack): >= 0 continues the
    // previous row from that column, < 0 marks the columns before -c - 1
    // unknown.
    queue_starts_[i] = out.from_previous || out.start == 0 ? out.start : -out.start - 1;
  }
  page_rows_incomplete_.store(given_rows_.incomplete(), std::memory_order_relaxed);
  if (dropped) {
    given_rows_.NewEpoch();  // the writer never sees this step's rows: whole rows next
    return;
  }
  StepView queued = step;
  queued.page_table_offsets = queue_offsets_;
  queued.page_table_slots = queue_slots_;
  queued.page_table_starts = queue_starts_;
  queue_.Push(queued, timestamp_nanos);
}

void Recorder::Impl::DeltaPageRows(StepRecord& record, bool restart) {
  if (!options_.page_table_deltas) return;  // the queue holds whole rows
  // Whole rows again after a restart of the stream (the frames before may
  // never reach the file) and whenever the deltas since the last whole
  // rows weigh kWholeRowsEvery times the rows: a reader never has to
  // follow an unbounded chain, and the whole rows add at most about
  // 1/kWholeRowsEvery to the file, whatever the context length. (Every
  // reader starts at the file's first step; a torn tail loses nothing
  // before it.)
  constexpr uint64_t kWholeRowsEvery = 8;
  if (restart || page_units_since_whole_ >= kWholeRowsEvery * written_rows_.held_slots()) {
    written_rows_.NewEpoch();
    page_units_since_whole_ = 0;
  }
  for (PageTableRow& row : record.page_table) {
    const internal::PageRowTracker::Out out =
        written_rows_.Apply(row.req_pool_index, row.start, row.from_previous, row.token_slots, /*minimize=*/false);
    if (out.slots.data() != row.token_slots.data() || out.slots.size() != row.token_slots.size()) {
      row.token_slots.assign(out.slots.begin(), out.slots.end());
    }
    row.start = out.start;
    row.from_previous = out.from_previous;
    page_units_since_whole_ += out.slots.size() + kRequestUnits;
  }
}

absl::Status Recorder::Impl::SubmitSnapshot(uint64_t step, std::span<const TensorView> tensors) {
  if (closed_.load(std::memory_order_relaxed)) {
    return absl::FailedPreconditionError(
        absl::StrCat("capture ", path_, " is closed; snapshot of step ", step, " not taken"));
  }
  return ring_.Submit(step, tensors);  // the encoder polls, as the writer does
}

absl::Status Recorder::Impl::RecordWeightHashes(const WeightShardHashes& shard) {
  if (closed_.load()) return absl::FailedPreconditionError(absl::StrCat("capture ", path_, " is closed"));
  WeightHashesRecord r;
  r.shards.push_back(shard);
  std::lock_guard<std::mutex> lock(disk_mu_);
  AppendLocked(FrameEncoder::Encode(r));
  return error();
}

absl::Status Recorder::Impl::RegisterWeights(std::span<const TensorView> weights, bool device) {
  if (closed_.load()) return absl::FailedPreconditionError(absl::StrCat("capture ", path_, " is closed"));
  return integrity_.Register(weights, device);
}

void Recorder::Impl::WriterLoop() {
  writer_tid_.store(CurrentTid());
  uint64_t t = queue_.tail();
  int idle = 0;
  StepRecord record;  // reused: its vectors keep their capacity
  for (;;) {
    const int ev = writer_events_.load(std::memory_order_acquire);
    const uint64_t h = queue_.head();
    while (t < h) {
      queue_.Unpack(t, rank_, &record);
      ProcessStep(record, /*last=*/t + 1 == h);
      queue_.Release(t);
      ++t;
    }
    if (stop_.load(std::memory_order_acquire) && t == queue_.head()) break;
    RetryDisk(/*force=*/false);  // rate-limited; Close() makes the last try
    if (t == queue_.head())
      IdleWait(writer_events_, ev, &idle);
    else
      idle = 0;
  }
}

void Recorder::Impl::ProcessStep(StepRecord& record, bool last) {
  if (failed_.load(std::memory_order_relaxed)) return;
  if (last_step_ts_ != 0 && record.timestamp_nanos > last_step_ts_) {
    const double interval = static_cast<double>(record.timestamp_nanos - last_step_ts_);
    step_interval_ns_ = step_interval_ns_ == 0 ? interval : 0.9 * step_interval_ns_ + 0.1 * interval;
  }
  last_step_ts_ = record.timestamp_nanos;
  // A part of the step stream while the disk takes writes: it decodes only
  // after the parts before it, so while they may be held in memory (and
  // dropped from there) each step is a frame of its own, and the stream
  // starts again once the disk is back (StepStreamEncoder).
  absl::StatusOr<EncodedFrame> frame;
  const bool degraded = disk_degraded_.load(std::memory_order_relaxed);
  DeltaPageRows(record, degraded || step_stream_.restarted());
  if (degraded) {
    step_stream_.Restart();
    frame = FrameEncoder::Encode(record);
  } else {
    frame = step_stream_.Encode(record);
  }
  if (!frame.ok()) {
    SetError(frame.status());
    return;
  }
  std::optional<WeightCheckRecord> check;
  if (!integrity_.empty()) {  // hashed before disk_mu_ is taken
    check.emplace();
    check->rank = rank_;
    integrity_.CheckNext(record.step, step_interval_ns_, &*check);
    period_steps_.store(check->period_steps, std::memory_order_relaxed);
    weight_checks_.fetch_add(1, std::memory_order_relaxed);
    uint64_t corrupt = 0;
    for (const WeightSlice& slice : check->slices) corrupt += slice.corrupt;
    corrupt_slices_.fetch_add(corrupt, std::memory_order_relaxed);
  }
  {
    std::lock_guard<std::mutex> lock(disk_mu_);
    AppendLocked(std::move(*frame));
    if (disk_error_) step_stream_.Restart();  // the frame is held, not in the file
    WriteDroppedLocked(record.step);
    if (check) AppendLocked(FrameEncoder::Encode(*check));
  }
  if (failed_.load(std::memory_order_relaxed)) return;
  last_step_.store(record.step, std::memory_order_relaxed);
  any_step_.store(true, std::memory_order_relaxed);
  // Before the step counts as written, so that a signal handler that waited
  // for it finds a failure frame naming it. Only for the last step queued
  // when the writer looked (5 failure records a step cost it 2-4 us): the
  // handler waits for every accepted step, and the last one released is
  // always such a step.
  if (last) EncodeSignalFrames(record.step, record.mode);
}

void Recorder::Impl::EncodeSignalFrames(std::optional<uint64_t> step, ForwardMode mode) {
  if (crashing_.load()) return;
  const int active = signal_active_.load(std::memory_order_acquire);
  const int target = active == 0 ? 1 : 0;
  SignalFrames& out = signal_frames_[target];
  for (int i = 0; i < kNumSignals; ++i) {
    FailureRecord f;
    const int sig = kSignalOrder[i];
    f.reason = step.has_value() ? absl::StrFormat("fatal signal %s (%s) after step %d was recorded",
                                                  internal::FatalSignalName(sig), strsignal(sig), *step)
                                : absl::StrFormat("fatal signal %s (%s) before any step was recorded",
                                                  internal::FatalSignalName(sig), strsignal(sig));
    f.stage = step.has_value() ? ForwardModeName(mode) : "startup";
    f.step = step;
    f.rank = rank_;
    f.signal = sig;
    f.exception_type = internal::FatalSignalName(sig);
    f.failure_class = FailureClass::kCrash;
    f.timestamp_nanos = RealtimeNanos();  // of the last step; the crash came after it
    absl::StatusOr<EncodedFrame> frame = FrameEncoder::Encode(f);
    out.size[i] = 0;
    if (frame.ok() && frame->bytes.size() <= kMaxSignalFrame) {
      std::memcpy(out.bytes[i], frame->bytes.data(), frame->bytes.size());
      out.size[i] = static_cast<uint32_t>(frame->bytes.size());
    }
  }
  signal_active_.store(target, std::memory_order_release);
}

void Recorder::Impl::EncoderLoop() {
  encoder_tid_.store(CurrentTid());
  int idle = 0;
  double worked_at = MonotonicSeconds();
  for (;;) {
    const int ev = encoder_events_.load(std::memory_order_acquire);
    bool worked = false;
    while (ring_.EncodeNext()) worked = true;
    if (stop_.load(std::memory_order_acquire) && !ring_.HasStaged()) break;
    if (worked) {
      idle = 0;
      worked_at = MonotonicSeconds();
      continue;
    }
    // The buffers kept for the next snapshot are freed when none has come
    // for a second (snapshot_ring.h).
    if (idle == 20 && MonotonicSeconds() - worked_at > 1.0) ring_.ReleaseSpares();
    IdleWait(encoder_events_, ev, &idle);
  }
}

absl::Status Recorder::Impl::WaitWritten(uint64_t target, double timeout_s) {
  if (CurrentTid() == writer_tid_.load()) return absl::OkStatus();
  const double deadline = MonotonicSeconds() + timeout_s;
  while (queue_.tail() < target) {
    if (MonotonicSeconds() > deadline) {
      return absl::DeadlineExceededError(absl::StrFormat("capture %s: the writer did not write %d queued steps in %gs",
                                                         path_, target - queue_.tail(), timeout_s));
    }
    SleepMicros(100);
  }
  return error();
}

absl::Status Recorder::Impl::WaitEncoded(double timeout_s) {
  if (CurrentTid() == encoder_tid_.load()) return absl::OkStatus();
  const double deadline = MonotonicSeconds() + timeout_s;
  while (ring_.Pending()) {
    if (MonotonicSeconds() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrFormat("capture %s: snapshots still being encoded after %gs", path_, timeout_s));
    }
    encoder_events_.fetch_add(1);
    encoder_events_.notify_one();
    SleepMicros(200);
  }
  return absl::OkStatus();
}

absl::Status Recorder::Impl::WriteHeldFingerprints(bool complete) {
  if (!held_fp_) return absl::OkStatus();
  held_fp_->complete = complete;
  absl::StatusOr<EncodedFrame> frame = FrameEncoder::Encode(*held_fp_);
  held_fp_.reset();
  if (!frame.ok()) return frame.status();
  std::lock_guard<std::mutex> lock(disk_mu_);
  AppendLocked(std::move(*frame));
  return absl::OkStatus();
}

absl::Status Recorder::Impl::RecordFingerprint(uint64_t step, std::string_view boundary, const TensorView& t) {
  if (closed_.load()) return absl::FailedPreconditionError(absl::StrCat("capture ", path_, " is closed"));
  uint64_t numel = 1;
  for (int64_t d : t.shape) {
    if (d < 0)
      return absl::InvalidArgumentError(absl::StrCat("fingerprint ", std::string(boundary), ": negative dimension"));
    numel *= static_cast<uint64_t>(d);
  }
  if (t.data == nullptr && numel > 0) {
    return absl::InvalidArgumentError(absl::StrCat("fingerprint ", std::string(boundary), ": no data"));
  }
  if (DTypeBytes(t.dtype, numel) != t.byte_size) {
    return absl::InvalidArgumentError(absl::StrCat("fingerprint ", std::string(boundary), ": ", t.byte_size,
                                                   " bytes for ", numel, " elements of ",
                                                   std::string(DTypeName(t.dtype))));
  }
  const uint64_t columns = t.shape.empty() ? 1 : static_cast<uint64_t>(t.shape.back());
  crashreplay::Fingerprint f = SummarizeTensor(boundary, t.dtype, t.data, numel, columns, !IsFloat(t.dtype));
  std::lock_guard<std::mutex> lock(fp_mu_);
  if (held_fp_ && held_fp_->step != step) CR_RETURN_IF_ERROR(WriteHeldFingerprints(true));
  if (!held_fp_) {
    held_fp_.emplace();
    held_fp_->step = step;
    held_fp_->rank = rank_;
    held_fp_->source = "host";
  }
  held_fp_->fingerprints.push_back(std::move(f));
  return absl::OkStatus();
}

absl::Status Recorder::Impl::RecordFingerprints(const FingerprintRecord& record) {
  if (closed_.load()) return absl::FailedPreconditionError(absl::StrCat("capture ", path_, " is closed"));
  std::lock_guard<std::mutex> lock(fp_mu_);
  CR_RETURN_IF_ERROR(WriteHeldFingerprints(true));
  FingerprintRecord r = record;
  r.rank = rank_;
  absl::StatusOr<EncodedFrame> frame = FrameEncoder::Encode(r);
  if (!frame.ok()) return frame.status();
  std::lock_guard<std::mutex> disk_lock(disk_mu_);
  AppendLocked(std::move(*frame));
  return absl::OkStatus();
}

absl::Status Recorder::Impl::Flush() {
  if (closed_.load()) return absl::FailedPreconditionError(absl::StrCat("capture ", path_, " is closed"));
  CR_RETURN_IF_ERROR(WaitWritten(queue_.head(), 30.0));
  if (RetryDisk(/*force=*/true)) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(disk_mu_);
  return DiskStatusLocked("");
}

absl::Status Recorder::Impl::OnFailure(const FailureInfo& failure) {
  if (closed_.load()) return absl::FailedPreconditionError(absl::StrCat("capture ", path_, " is closed"));
  // The failure path may take time: drain the log, finish encoding the ring.
  absl::Status status = WaitWritten(queue_.head(), 30.0);
  absl::Status encoded = WaitEncoded(30.0);
  if (status.ok()) status = encoded;
  {
    // The failing step's boundaries so far: its record is incomplete.
    std::lock_guard<std::mutex> lock(fp_mu_);
    const bool failing = held_fp_ && (!failure.step || held_fp_->step == *failure.step);
    absl::Status fp = WriteHeldFingerprints(!failing);
    if (status.ok()) status = fp;
  }
  FailureRecord f;
  f.reason = failure.reason;
  f.stage = failure.stage;
  f.step = failure.step;
  f.rank = rank_;
  f.exception_type = failure.exception_type;
  f.failure_class = failure.failure_class;
  f.timestamp_nanos = RealtimeNanos();
  f.backtrace = failure.backtrace;
  NameCoredump(&f);
  absl::StatusOr<EncodedFrame> frame = FrameEncoder::Encode(f);
  if (!frame.ok()) return frame.status();
  std::lock_guard<std::mutex> lock(disk_mu_);
  // After a disk error: what was held first (a retry, not rate-limited),
  // then the ring and the failure record, or both kept for later.
  CatchUpLocked();
  if (!disk_error_) {
    absl::StatusOr<uint64_t> written = ring_.WriteAll(writer_.get());
    if (!written.ok()) OnWriteErrorLocked(written.status());
  }
  if (disk_error_) ring_pending_ = true;
  if (!disk_error_) {
    absl::Status appended = writer_->Append(*frame);
    if (!appended.ok()) OnWriteErrorLocked(appended);
  }
  if (disk_error_) {
    pending_failures_.push_back(std::move(*frame));
    return DiskStatusLocked(
        "; they stay in memory, are written when the disk takes writes again, and Close() names what is still "
        "missing");
  }
  if (::fsync(writer_->fd()) != 0 && errno != EINVAL && status.ok()) {  // EINVAL: a pipe
    status = absl::ErrnoToStatus(errno, absl::StrCat("fsync of capture ", path_));
  }
  return status;
}

void Recorder::Impl::NameCoredump(FailureRecord* f) {
  if (coredump_.mode != "env" && coredump_.mode != "driver_api") return;
  // The driver writes the dump when the exception is detected, before the
  // error reaches the host. A dump that exists but does not read whole is
  // still being written: wait for it (bounded); with the completion
  // callback, its count moving is the driver saying it has finished.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(options_.coredump_wait_s);
  FoundCoredump found = FindCoredump(coredump_.file_pattern, pid_);
  while (found.exists && !found.complete && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    found = FindCoredump(coredump_.file_pattern, pid_);
  }
  if (!found.exists) return;
  f->coredump = std::filesystem::path(found.path).filename().string();
  f->coredump_complete = found.complete;
  f->coredump_note = found.note;
}

void Recorder::Impl::OnTerminate(const std::string& exception_type, const std::string& what) {
  if (closed_.load()) return;
  FailureInfo f;
  f.reason = what;
  // The last step the recorder accepted is the one that was running or
  // had just run when the exception escaped.
  const bool any = queue_.head() > 0;
  f.stage = any ? ForwardModeName(last_accepted_mode_.load()) : "startup";
  if (any) f.step = last_accepted_step_.load();
  f.failure_class = FailureClass::kException;
  f.exception_type = exception_type;
  absl::Status s = OnFailure(f);
  if (!s.ok())
    std::fprintf(stderr, "crashreplay: recording the failure in %s: %s\n", path_.c_str(), s.ToString().c_str());
  terminate_recorded_.store(true);
}

void Recorder::Impl::OnExit() {
  absl::Status s = Close();
  if (!s.ok())
    std::fprintf(stderr, "crashreplay: closing capture %s at exit: %s\n", path_.c_str(), s.ToString().c_str());
}

// Async-signal context: atomics, nanosleep, clock_gettime, write, fsync.
void Recorder::Impl::OnFatalSignal(int sig) noexcept {
  if (closed_.load() || in_signal_.exchange(true)) return;
  const pid_t self = CurrentTid();
  const double deadline = MonotonicSeconds() + options_.signal_drain_timeout_s;
  // Let the writer finish the steps already accepted (they are in memory,
  // not encoded; encoding them here would allocate). Not when the writer is
  // the thread that crashed.
  if (self != writer_tid_.load()) {
    const uint64_t accepted = queue_.head();
    while (queue_.tail() < accepted && MonotonicSeconds() < deadline) SleepMicros(500);
  }
  if (self != encoder_tid_.load()) {
    while (ring_.PendingNoLock() && MonotonicSeconds() < deadline) SleepMicros(500);
  }
  // From here on the writer stops refreshing the failure frames, so the
  // active buffer is stable while we read it.
  crashing_.store(true);
  if (terminate_recorded_.load()) {  // the terminate handler already wrote ring + failure
    ::fsync(writer_->fd());
    return;
  }
  ring_.WriteForSignal(writer_.get());
  const int active = signal_active_.load(std::memory_order_acquire);
  for (int i = 0; i < kNumSignals; ++i) {
    if (kSignalOrder[i] == sig && active >= 0 && signal_frames_[active].size[i] > 0) {
      writer_->AppendEncodedFrame(signal_frames_[active].bytes[i], signal_frames_[active].size[i]);
    }
  }
  ::fsync(writer_->fd());
}

absl::Status Recorder::Impl::Close() {
  std::lock_guard<std::mutex> lock(close_mu_);
  if (closed_.load()) return close_status_;
  internal::UnregisterCrashTarget(this);
  stop_.store(true, std::memory_order_release);
  writer_events_.fetch_add(1);
  writer_events_.notify_all();
  encoder_events_.fetch_add(1);
  encoder_events_.notify_all();
  if (writer_thread_.joinable()) writer_thread_.join();
  if (encoder_thread_.joinable()) encoder_thread_.join();
  absl::Status status = error();
  {
    std::lock_guard<std::mutex> lock(fp_mu_);
    absl::Status fp = WriteHeldFingerprints(true);
    if (status.ok()) status = fp;
  }
  std::lock_guard<std::mutex> disk_lock(disk_mu_);
  CatchUpLocked();  // the last try: what the disk refused before
  WriteDroppedLocked(last_step_.load());  // drops after the last step
  if (options_.write_snapshots_on_close && !disk_error_) {
    absl::StatusOr<uint64_t> written = ring_.WriteAll(writer_.get());
    if (!written.ok()) OnWriteErrorLocked(written.status());
  }
  if (options_.write_snapshots_on_close && disk_error_) ring_pending_ = true;
  if (!disk_error_) {
    const uint64_t errors_before = writer_->write_errors();
    absl::Status closed = writer_->Close();
    if (!closed.ok() && writer_->write_errors() != errors_before) {
      OnWriteErrorLocked(closed);
    } else if (status.ok()) {
      status = closed;
    }
  }
  if (disk_error_) {
    // The file stays what it is: its complete records, without an end
    // record (a reader says "not closed cleanly" and reads them all).
    status = DiskStatusLocked(absl::StrFormat(
        ", and the index and end record: the file keeps its complete records (%d bytes) and reads as not closed "
        "cleanly",
        writer_->bytes_written()));
  }
  close_status_ = status;
  closed_.store(true);
  return status;
}

// ---------------------------------------------------------------------------
// Disk errors

void Recorder::Impl::AppendLocked(EncodedFrame frame) {
  if (!disk_error_) {
    absl::Status s = writer_->Append(frame);
    if (s.ok()) return;
    OnWriteErrorLocked(s);
  }
  held_.Push(std::move(frame));
}

void Recorder::Impl::AppendLocked(const absl::StatusOr<EncodedFrame>& frame) {
  if (!frame.ok()) {
    SetError(frame.status());  // an encoding error: a bug, not the disk
    return;
  }
  AppendLocked(*frame);
}

void Recorder::Impl::OnWriteErrorLocked(const absl::Status& s) {
  last_disk_error_ = s;
  next_retry_s_.store(MonotonicSeconds() + options_.disk_retry_interval_s);
  if (disk_error_) return;  // a retry that failed: counted by the writer
  disk_error_ = true;
  disk_degraded_.store(true);
  if (first_disk_error_.ok()) first_disk_error_ = s;
  std::fprintf(stderr,
               "crashreplay: %s; the file keeps its complete records (%llu bytes) and recording goes on in memory: "
               "the newest %llu steps are held and written when the disk takes writes again (retried every %gs)\n",
               std::string(s.message()).c_str(), static_cast<unsigned long long>(writer_->bytes_written()),
               static_cast<unsigned long long>(options_.held_steps), options_.disk_retry_interval_s);
  if (!reported_.load()) {
    // Space errors are ResourceExhausted whatever errno's mapping (EFBIG
    // would read OutOfRange, which callers take for a bad argument).
    const absl::StatusCode code =
        s.code() == absl::StatusCode::kResourceExhausted || s.code() == absl::StatusCode::kOutOfRange
            ? absl::StatusCode::kResourceExhausted
            : absl::StatusCode::kUnavailable;
    std::lock_guard<std::mutex> lock(report_mu_);
    pending_report_ = absl::Status(code, s.message());
    report_pending_.store(true);
  }
}

bool Recorder::Impl::CatchUpLocked() {
  if (!disk_error_) return true;
  // The counters first: a reader that finds a gap in the steps (those
  // dropped from the hold) has already read how many are missing, even if
  // the disk takes only part of what is held.
  if (!WriteDroppedLocked(last_step_.load(), /*force=*/true)) return false;
  while (!held_.empty()) {
    absl::Status s = writer_->Append(held_.front());
    if (!s.ok()) {
      OnWriteErrorLocked(s);
      return false;
    }
    held_.PopFront();
  }
  if (ring_pending_) {
    absl::StatusOr<uint64_t> written = ring_.WriteAll(writer_.get());
    if (!written.ok()) {
      OnWriteErrorLocked(written.status());
      return false;
    }
    ring_pending_ = false;
  }
  while (!pending_failures_.empty()) {
    absl::Status s = writer_->Append(pending_failures_.front());
    if (!s.ok()) {
      OnWriteErrorLocked(s);
      return false;
    }
    pending_failures_.erase(pending_failures_.begin());
    ::fsync(writer_->fd());
  }
  disk_error_ = false;
  disk_degraded_.store(false);
  std::fprintf(stderr,
               "crashreplay: capture %s: the disk takes writes again; the records held in memory are written "
               "(%llu steps dropped so far)\n",
               path_.c_str(), static_cast<unsigned long long>(held_.steps_dropped() + steps_dropped_.load()));
  WriteDroppedLocked(last_step_.load());
  return !disk_error_;
}

bool Recorder::Impl::RetryDisk(bool force) {
  if (!disk_degraded_.load(std::memory_order_relaxed)) return true;
  if (!force && MonotonicSeconds() < next_retry_s_.load(std::memory_order_relaxed)) return false;
  std::lock_guard<std::mutex> lock(disk_mu_);
  return CatchUpLocked();
}

bool Recorder::Impl::WriteDroppedLocked(uint64_t step, bool force) {
  if (disk_error_ && !force) return false;  // the counters are written when the disk is back
  const uint64_t now[4] = {ring_.dropped(), steps_dropped_.load() + held_.steps_dropped(), held_.records_dropped(),
                           writer_->write_errors()};
  if (std::equal(now, now + 4, last_dropped_written_)) return true;
  DroppedSnapshotsRecord d;
  d.step = step;
  d.snapshots_dropped = now[0];
  d.bytes_dropped = ring_.bytes_dropped();
  d.steps_dropped = now[1];
  d.records_dropped = now[2];
  d.write_errors = now[3];
  absl::Status s = writer_->Append(d);
  if (!s.ok()) {
    OnWriteErrorLocked(s);
    return false;
  }
  std::copy(now, now + 4, last_dropped_written_);
  return true;
}

std::string Recorder::Impl::UnwrittenLocked() const {
  std::vector<std::string> parts;
  const uint64_t steps = held_.steps();
  if (steps > 0) {
    parts.push_back(
        absl::StrFormat("steps %d-%d (%d steps, held in memory)", held_.first_step(), held_.last_step(), steps));
  }
  if (held_.records() > steps) parts.push_back(absl::StrFormat("%d other held records", held_.records() - steps));
  const uint64_t dropped = steps_dropped_.load() + held_.steps_dropped();
  if (dropped > 0) parts.push_back(absl::StrFormat("%d steps dropped", dropped));
  if (held_.records_dropped() > 0)
    parts.push_back(absl::StrFormat("%d other records dropped", held_.records_dropped()));
  if (ring_pending_) parts.push_back(absl::StrFormat("the snapshot ring (%d snapshots)", ring_.encoded()));
  if (!pending_failures_.empty()) parts.push_back(absl::StrFormat("%d failure record(s)", pending_failures_.size()));
  return parts.empty() ? std::string("nothing held") : absl::StrJoin(parts, ", ");
}

absl::Status Recorder::Impl::DiskStatusLocked(std::string_view more) const {
  const absl::Status& last = last_disk_error_.ok() ? first_disk_error_ : last_disk_error_;
  const absl::StatusCode code =
      last.code() == absl::StatusCode::kResourceExhausted || last.code() == absl::StatusCode::kOutOfRange
          ? absl::StatusCode::kResourceExhausted
          : absl::StatusCode::kUnavailable;
  return absl::Status(code, absl::StrFormat("capture %s: the disk refuses writes (%d failed writes; last: %s); not "
                                            "written: %s%s",
                                            path_, writer_->write_errors(), last.message(), UnwrittenLocked(), more));
}

RecorderStats Recorder::Impl::stats() const {
  RecorderStats s;
  s.steps_accepted = queue_.head();
  s.steps_written = queue_.tail();
  s.steps_spilled = queue_.spilled();
  s.snapshots_accepted = ring_.accepted();
  s.snapshots_encoded = ring_.encoded();
  s.snapshots_dropped = ring_.dropped();
  s.bytes_dropped = ring_.bytes_dropped();
  s.ring_raw_bytes = ring_.staged_bytes();
  s.ring_encoded_bytes = ring_.encoded_bytes();
  s.weight_bytes = integrity_.total_bytes();
  s.weight_check_period_steps = period_steps_.load();
  s.weight_checks = weight_checks_.load();
  s.corrupt_weight_slices = corrupt_slices_.load();
  s.file_bytes = writer_->bytes_written();
  s.steps_held = held_.steps();
  s.held_bytes = held_.bytes();
  s.steps_dropped = steps_dropped_.load() + held_.steps_dropped();
  s.page_rows_incomplete = page_rows_incomplete_.load(std::memory_order_relaxed);
  s.records_dropped = held_.records_dropped();
  s.write_errors = writer_->write_errors();
  // Steps the writer has taken in and that are in the file: neither held
  // nor dropped from the hold.
  const uint64_t not_in_file = s.steps_held + held_.steps_dropped();
  s.steps_written = s.steps_written > not_in_file ? s.steps_written - not_in_file : 0;
  return s;
}

// ---------------------------------------------------------------------------
// Recorder

absl::StatusOr<std::unique_ptr<Recorder>> Recorder::Begin(const SessionManifest& manifest_in,
                                                          const RecorderOptions& options) {
  if (options.path.empty() && options.session_dir.empty()) {
    return absl::InvalidArgumentError("RecorderOptions: set session_dir (or path) to say where the capture goes");
  }
  SessionManifest manifest = manifest_in;
  if (manifest.pid == 0) manifest.pid = static_cast<uint32_t>(getpid());
  if (manifest.created_unix_nanos == 0) manifest.created_unix_nanos = RealtimeNanos();
  if (manifest.hostname.empty()) {
    char host[256] = {};
    if (gethostname(host, sizeof host - 1) == 0) manifest.hostname = host;
  }
  if (manifest.recorder_version.empty()) manifest.recorder_version = "crashreplay 0.1.0";
  std::string path = options.path;
  if (path.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(options.session_dir, ec);
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create session directory ", options.session_dir, ": ", ec.message()));
    }
    path = SessionRankPath(options.session_dir, manifest.parallel.rank);
  }
  if (options.arm_coredumps) {
    // Before the engine's CUDA context if the caller started the recorder
    // first (then the environment is enough), else the attribute API.
    std::error_code ec;
    std::filesystem::path abs = std::filesystem::absolute(path, ec);
    CoredumpArmRequest req;
    req.file_pattern = CoredumpPatternFor(ec ? path : abs.lexically_normal().string());
    req.method = options.coredump_method;
    req.driver_library = options.coredump_driver_library;
    manifest.coredump = ArmCoredumps(req);
  } else if (manifest.coredump.mode.empty()) {
    manifest.coredump.mode = "off";
    manifest.coredump.reason = "not asked for: off by default, its cost is not measured on a GPU yet";
  }
  CaptureWriterOptions wo;
  wo.blob = options.blob;
  wo.overwrite = options.overwrite;
  CR_ASSIGN_OR_RETURN(std::unique_ptr<CaptureWriter> writer, CaptureWriter::Create(path, manifest, wo));
  auto impl = std::make_unique<Impl>(manifest, options, path, std::move(writer));
  CR_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<Recorder>(new Recorder(std::move(impl)));
}

Recorder::Recorder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Recorder::~Recorder() = default;

absl::Status Recorder::RecordStep(const StepView& step) { return impl_->RecordStep(step); }
absl::Status Recorder::SubmitSnapshot(uint64_t step, std::span<const TensorView> tensors) {
  return impl_->SubmitSnapshot(step, tensors);
}
absl::Status Recorder::RecordWeightHashes(const WeightShardHashes& shard) { return impl_->RecordWeightHashes(shard); }
absl::Status Recorder::RegisterWeights(std::span<const TensorView> weights) { return impl_->RegisterWeights(weights); }
absl::Status Recorder::RegisterDeviceWeights(std::span<const TensorView> weights) {
  return impl_->RegisterWeights(weights, /*device=*/true);
}
absl::Status Recorder::RecordFingerprint(uint64_t step, std::string_view boundary, const TensorView& tensor) {
  return impl_->RecordFingerprint(step, boundary, tensor);
}
absl::Status Recorder::RecordFingerprints(const FingerprintRecord& record) { return impl_->RecordFingerprints(record); }
absl::Status Recorder::OnFailure(const FailureInfo& failure) { return impl_->OnFailure(failure); }
absl::Status Recorder::Flush() { return impl_->Flush(); }
absl::Status Recorder::Close() { return impl_->Close(); }
RecorderStats Recorder::stats() const { return impl_->stats(); }
const std::string& Recorder::path() const { return impl_->path(); }

}  // namespace crashreplay::capture
