// Recorder: the always-on flight recorder that runs inside a serving process.
//
// One Recorder per rank (per process) writes one capture file,
// SESSION_DIR/rank-NNNNN.crcap (docs/capture.md: session directory layout).
// It keeps two tiers (DESIGN "capture/"):
//   * the step log: RecordStep() copies the step's small vectors into a
//     preallocated slot; a background writer thread encodes them as parts
//     of one zstd stream (StepStreamEncoder, format 2.2) and appends them
//     to the file continuously;
//   * tensor snapshots: SubmitSnapshot() memcpys host bytes into a bounded
//     in-memory ring (a byte budget); a background encoder thread hashes
//     (XXH3-128) and compresses them (zstd via the blob codec) and keeps the
//     ENCODED frames in host memory. The ring is written to the file only on
//     failure (OnFailure, fatal signal) or, if asked, on Close: the step log
//     is continuous, snapshots are "ready to write on failure".
// When the ring is full the oldest snapshot is dropped; the step never
// waits on the ring. Drops are counted and written (DroppedSnapshotsRecord,
// EndRecord).
//
// Failure paths (docs/capture.md lists what each one guarantees):
//   * OnFailure(): drains the step log, finishes encoding the ring, writes
//     the ring and a FailureRecord, fsyncs. The recorder stays usable and a
//     later Close() still writes the footer.
//   * fatal signals (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT), when
//     options.install_signal_handlers: the handler waits a bounded time for
//     the writer thread to drain accepted steps, writes the ring's encoded
//     frames and a FailureRecord encoded in advance, with write(2) only, then
//     restores the previous action and re-raises. No lock, no allocation.
//   * SIGKILL / power loss: whatever the writer had appended is readable.
//   * Close() / destructor: drains, writes index + end record (ok = true).
//
// Thread safety: RecordStep, SubmitSnapshot and the weight-check hook are
// meant to be called from one thread at a time (the scheduler thread of the
// rank); they are nonetheless safe to call concurrently (a short internal
// lock orders them). OnFailure, Flush, stats() may be called from any
// thread. Close() must not race with other calls.
//
// Ownership: views passed in are borrowed only for the duration of the
// call (their bytes are copied), except RegisterWeights(), whose buffers
// must stay valid and mapped until Close().
//
// Disk full and slow disks (docs/capture.md, "Disk full and slow disks"):
//   * a write that fails (ENOSPC, EDQUOT, EFBIG, EIO) is cut back to the end
//     of the last complete frame, so the file stays a valid capture; the
//     recorder warns once on stderr and goes on recording into memory: the
//     newest records are held (options.held_steps / held_bytes; older ones
//     dropped and counted) and the ring keeps its snapshots. It retries the
//     file every options.disk_retry_interval_s, and at Flush, OnFailure and
//     Close; when the disk takes writes again the held records are appended
//     after the intact prefix, followed by a DroppedSnapshotsRecord whose
//     counters (steps dropped, write errors) a reader sees;
//   * the caller hears of it once: the first RecordStep after the error
//     returns its status (the step itself is held, not lost); every later
//     call returns OK. Flush and OnFailure return a status that says what
//     is still only in memory; Close() writes what it can and returns a
//     status naming what could not be written (the file then ends at its
//     intact prefix, without an end record);
//   * a stalled disk never stalls the caller for long: a step that finds the
//     step queue full waits at most options.step_queue_wait_s once, is then
//     dropped and counted (stats().steps_dropped, the file), and later
//     steps are dropped without waiting until the queue is half empty again.
//
// Errors: absl::Status. InvalidArgument for malformed views, FailedPrecondition
// after Close(), ResourceExhausted (disk full, queue full) or Unavailable
// (EIO and other write errors) once for the first disk problem, as above.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "crashreplay/capture/coredump_arming.h"
#include "crashreplay/formats/blob_codec.h"
#include "crashreplay/formats/capture_records.h"
#include "crashreplay/formats/dtype.h"
#include "crashreplay/formats/fingerprint.h"
#include "crashreplay/formats/hash.h"

namespace crashreplay::capture {

inline constexpr uint64_t kDefaultSnapshotRingBytes = 256ull << 20;

struct RecorderOptions {
  // This rank's file is session_dir/rank-NNNNN.crcap (rank from
  // manifest.parallel.rank); the directory is created if missing.
  std::string session_dir;
  // Overrides the layout: write exactly this file (tests, single files).
  std::string path;
  bool overwrite = false;

  // Snapshot ring: raw bytes staged + encoded frames kept, each bounded by
  // this budget (so at most about twice it in host memory).
  uint64_t snapshot_ring_bytes = kDefaultSnapshotRingBytes;
  uint32_t max_snapshots = 64;  // entries in the ring, whatever their size
  BlobEncodeOptions blob;       // byte planes at zstd -100 + Huffman literals, else level 1 (blob_codec.h)
  bool write_snapshots_on_close = false;

  // Step log queue. A step that finds every slot taken (the writer is that
  // far behind: a stalled disk) waits at most step_queue_wait_s for one,
  // then is dropped and counted; later steps are dropped without waiting
  // until the writer has emptied half the queue.
  uint32_t step_queue_slots = 256;
  double step_queue_wait_s = 0.1;
  // The queue's records live in an arena of this many bytes, mapped and
  // pre-faulted at Begin (docs/capture.md, "The step queue"). A step that
  // finds no room while the writer is behind gets a buffer of its own
  // (stats().steps_spilled); one larger than the arena grows it.
  uint64_t step_queue_bytes = 8ull << 20;

  // After a write error: the records held in memory until the disk takes
  // writes again (the newest held_steps step records and held_bytes bytes;
  // older ones dropped and counted), and how often the file is retried.
  uint64_t held_steps = 4096;
  uint64_t held_bytes = 64ull << 20;

  // Page-table rows go to the file as deltas (format 2.3): a row is
  // written whole once per zstd frame of the step stream, then only the
  // columns that changed. false: every row whole, every step (the file an
  // older crashreplay reads, at a cost that grows with context length).
  bool page_table_deltas = true;
  // A streamed step's positions, sequence lengths and cache slots go to the
  // file as differences from the step before (format 2.4): a decode step
  // moves each on by one, which zstd cannot match as values (the writer
  // 1.3-1.4x faster and the step log 35% smaller on recorder_bench's
  // evolving decode batch). false, with page_table_deltas false: the file
  // a crashreplay before 2.3 reads.
  bool step_list_deltas = true;
  double disk_retry_interval_s = 1.0;

  // Fatal-signal handlers (process-wide, chained to the previous ones).
  bool install_signal_handlers = true;
  // How long a signal handler waits for the writer to drain accepted steps.
  double signal_drain_timeout_s = 2.0;

  // Weight integrity (RegisterWeights): every step, after its record, the
  // writer thread re-hashes the next slice of the registered weights.
  // weight_check_bytes_per_step > 0 fixes the slice size; 0 sizes it from
  // the budget: weight_check_budget (fraction of the measured step
  // interval) times the measured hashing speed. Slices are whole chunks.
  double weight_check_budget = 0.01;
  uint64_t weight_check_bytes_per_step = 0;
  uint64_t weight_chunk_bytes = 1ull << 20;

  // GPU core dumps (docs/capture.md, "GPU core dumps"): Begin arms
  // lightweight dumps for the whole process (coredump_arming.h), written
  // beside the capture as <capture stem>.<pid>.cudacore, and records what
  // it armed in the manifest; OnFailure names the dump in the failure
  // record once the coredump reader reads it whole. Off by default: what
  // arming costs the serving path has not been measured on a GPU yet.
  bool arm_coredumps = false;
  CoredumpArmMethod coredump_method = CoredumpArmMethod::kAuto;
  std::string coredump_driver_library = "libcuda.so.1";
  // OnFailure waits at most this long for a dump that exists but does not
  // read whole yet (the driver still writing it); a missing dump is not
  // waited for (the failure may not be a device exception).
  double coredump_wait_s = 2.0;
};

// A borrowed host tensor. `data` must hold `byte_size` bytes;
// byte_size must equal DTypeBytes(dtype, prod(shape)).
struct TensorView {
  std::string_view name;
  DType dtype = DType::kU8;
  std::span<const int64_t> shape;
  const void* data = nullptr;
  uint64_t byte_size = 0;
};

struct DigestView {
  std::string_view name;
  bool is_128 = false;
  uint64_t value64 = 0;
  Hash128 value128;
};

// One step of one rank, as borrowed spans (copied by RecordStep). Per
// request vectors have one entry per request of the batch; token_ids,
// positions and out_cache_loc have one entry per token of the step.
struct StepView {
  uint64_t step = 0;
  ForwardMode mode = ForwardMode::kUnknown;
  int64_t timestamp_nanos = 0;  // 0: the recorder stamps CLOCK_REALTIME
  std::span<const std::string_view> request_ids;
  std::span<const int64_t> token_ids;
  std::span<const int64_t> positions;
  std::span<const int64_t> seq_lens;
  std::span<const int64_t> extend_lens;
  std::span<const int64_t> req_pool_indices;
  // Page-table rows (req_to_token rows) as CSR: row i lists
  // page_table_slots[page_table_offsets[i] .. page_table_offsets[i+1]) and
  // belongs to req_pool_indices[i]. Both empty: no rows recorded.
  std::span<const int64_t> page_table_offsets;
  std::span<const int64_t> page_table_slots;
  // Optional, one per row: row i's slots are its columns from
  // page_table_starts[i] on, the columns before being those of the last row
  // given for the same req_pool_index (a decode step passes one new slot a
  // request, not its whole row). Empty: every row is given whole. A start
  // past what this recorder was given keeps the row as incomplete (counted
  // in stats().page_rows_incomplete; replay names it).
  std::span<const int64_t> page_table_starts;
  std::span<const int64_t> out_cache_loc;
  std::span<const SamplingParams> sampling;
  uint64_t rng_seed = 0;
  uint64_t rng_offset = 0;
  std::span<const int64_t> output_token_ids;
  std::span<const DigestView> digests;
};

struct FailureInfo {
  std::string reason;          // error text as seen
  std::string stage;           // "load", "graph_capture", "prefill", "decode", ...
  std::optional<uint64_t> step;
  FailureClass failure_class = FailureClass::kException;
  std::string exception_type;  // e.g. "torch.AcceleratorError"
  std::string backtrace;
};

struct RecorderStats {
  uint64_t steps_accepted = 0;
  uint64_t steps_written = 0;
  uint64_t steps_spilled = 0;  // queued outside the arena (see step_queue_bytes)
  uint64_t snapshots_accepted = 0;
  uint64_t snapshots_encoded = 0;
  uint64_t snapshots_dropped = 0;
  uint64_t bytes_dropped = 0;
  uint64_t ring_raw_bytes = 0;      // staged raw bytes now held
  uint64_t ring_encoded_bytes = 0;  // encoded frames now held
  uint64_t weight_bytes = 0;        // registered weight bytes
  uint32_t weight_check_period_steps = 0;  // K: steps to cover all weights
  uint64_t weight_checks = 0;
  uint64_t corrupt_weight_slices = 0;
  uint64_t file_bytes = 0;
  // Disk full and slow disks: steps dropped (the queue was full, or they
  // were held past held_steps), other records dropped from the hold,
  // failed writes, and what is held in memory now.
  uint64_t steps_dropped = 0;
  uint64_t records_dropped = 0;
  uint64_t write_errors = 0;
  uint64_t steps_held = 0;
  uint64_t held_bytes = 0;
  // Page-table rows given as continuing columns the recorder never had
  // (steps recorded before it began, or a caller's miscount): kept as
  // incomplete rows, which replay names.
  uint64_t page_rows_incomplete = 0;
};

class Recorder {
 public:
  // Opens the rank's file, writes header + manifest, starts the threads,
  // and (if asked) installs the signal handlers. manifest.pid,
  // created_unix_nanos, hostname and recorder_version are filled when unset.
  static absl::StatusOr<std::unique_ptr<Recorder>> Begin(const SessionManifest& manifest,
                                                         const RecorderOptions& options = {});
  // Close()s if still open (errors go to stderr).
  ~Recorder();
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  // Hot path: copies the step into a queue slot. Never touches the disk.
  // Returns a disk error (or a dropped step) once, then OK (see above).
  absl::Status RecordStep(const StepView& step);

  // Hot path: one memcpy per tensor into the ring. Returns OK also when the
  // snapshot had to be dropped (the drop is counted: stats(), the file).
  // InvalidArgument for a malformed view; a snapshot larger than the whole
  // budget is dropped and counted.
  absl::Status SubmitSnapshot(uint64_t step, std::span<const TensorView> tensors);

  // Load-time weight hashes (per tensor + root) written as a
  // WeightHashesRecord (see weight_hash.h to compute them).
  absl::Status RecordWeightHashes(const WeightShardHashes& shard);

  // Registers host weight buffers for the per-step integrity check. Hashes
  // them now (load-time reference, chunked by weight_chunk_bytes); the
  // buffers must stay valid until Close(). May be called once per tensor
  // set; later calls add tensors.
  absl::Status RegisterWeights(std::span<const TensorView> weights);

  // The same for weights in device memory (`data` is a device pointer):
  // slices are hashed on the GPU with the chunked hash (chunked_hash.h), so
  // WeightSlice hashes of these tensors are chunked hashes, not XXH3-128.
  // Unimplemented in a build without CUDA; FailedPrecondition for host memory.
  absl::Status RegisterDeviceWeights(std::span<const TensorView> weights);

  // Fingerprints (docs/capture.md, "Fingerprints"): the fixed-size summary
  // of a host tensor at a named boundary of `step` ("L3.attention"),
  // computed now on the calling thread (SummarizeTensor, fingerprint.h) and
  // held with the step's other boundaries until the step is over: the first
  // fingerprint of a later step, Close() or OnFailure() writes them as one
  // FingerprintRecord (OnFailure marks the failing step's record
  // incomplete, its last entry the last boundary that ran). Steps must not
  // interleave. InvalidArgument for a malformed view.
  absl::Status RecordFingerprint(uint64_t step, std::string_view boundary, const TensorView& tensor);
  // Appends a record made elsewhere (the device path reads its records out
  // of mapped memory; the built-in engine summarises its own buffers).
  // Held fingerprints of another step are written first.
  absl::Status RecordFingerprints(const FingerprintRecord& record);
  // Writes the ring and a FailureRecord, fsyncs. Waits for the writer and
  // encoder (seconds at most: it is the failure path). After a disk error
  // it first writes the held records; if the disk still refuses, the ring
  // and the failure record are kept for a later retry or Close(), and the
  // status says so.
  absl::Status OnFailure(const FailureInfo& failure);

  // Waits until every accepted step (and weight check) is in the file.
  // After a disk error: retries now; the status says what is still held.
  absl::Status Flush();

  // Drains, optionally writes the ring, writes index + end record (ok =
  // true), fsyncs, stops the threads, uninstalls this recorder from the
  // signal handlers. Idempotent: a second call returns the first result.
  // After a disk error it retries once more; what the disk still refuses
  // is named in the status (steps, records, ring, failure record, end
  // record) and the file is left as its intact prefix.
  absl::Status Close();

  RecorderStats stats() const;
  const std::string& path() const;

  class Impl;

 private:
  explicit Recorder(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// "<session_dir>/rank-NNNNN.crcap".
std::string SessionRankPath(const std::string& session_dir, uint32_t rank);

}  // namespace crashreplay::capture
