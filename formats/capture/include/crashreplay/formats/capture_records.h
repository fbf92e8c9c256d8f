// The records of a capture file as plain C++ values.
//
// These mirror formats/capture/schema/capture.capnp one to one. Writers build them,
// FrameEncoder turns them into frames, CaptureReader hands them back; no
// Cap'n Proto type (and so no kj exception) crosses this API. Values only:
// copyable, no sharing, thread-compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "crashreplay/formats/hash.h"

namespace crashreplay {

// A typed toggle value; monostate means "unset".
using ToggleValue = std::variant<std::monostate, int64_t, double, bool, std::string>;

struct Toggle {
  std::string name;
  ToggleValue value;
  friend bool operator==(const Toggle&, const Toggle&) = default;
};

struct ModelConfigInfo {
  std::string config_json;
  std::string model_type;
  std::string architecture;
  uint32_t num_layers = 0;
  uint32_t hidden_size = 0;
  uint32_t vocab_size = 0;
  uint32_t num_heads = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t intermediate_size = 0;
  uint32_t num_experts = 0;
  std::string quantization;
  std::string dtype;
  std::string checkpoint_path;
  friend bool operator==(const ModelConfigInfo&, const ModelConfigInfo&) = default;
};

struct DeviceInfo {
  std::string name;
  uint32_t sm_arch = 0;
  uint64_t memory_capacity_bytes = 0;
  std::string driver_version;
  std::string runtime_version;
  uint32_t index = 0;
  friend bool operator==(const DeviceInfo&, const DeviceInfo&) = default;
};

struct ParallelLayout {
  uint32_t tp_size = 1;
  uint32_t tp_rank = 0;
  uint32_t world_size = 1;
  uint32_t rank = 0;
  uint32_t pp_size = 1;
  uint32_t ep_size = 1;
  uint32_t dp_size = 1;
  friend bool operator==(const ParallelLayout&, const ParallelLayout&) = default;
};

struct TensorHash {
  std::string name;
  Hash128 hash;
  uint64_t byte_size = 0;
  friend bool operator==(const TensorHash&, const TensorHash&) = default;
};

struct WeightShardHashes {
  uint32_t rank = 0;
  std::vector<TensorHash> tensors;
  Hash128 root;
  friend bool operator==(const WeightShardHashes&, const WeightShardHashes&) = default;
};

// What the recorder armed for GPU core dumps (capture/coredump_arming.h).
struct CoredumpArming {
  std::string mode;    // "off" (or empty: a recorder before this field), "env", "driver_api", "failed"
  std::string reason;  // why this mode; for "failed", why nothing was armed
  std::string file_pattern;  // CUDA_COREDUMP_FILE as armed (%p: the process id)
  uint32_t generation_flags = 0;
  bool completion_callback = false;
  friend bool operator==(const CoredumpArming&, const CoredumpArming&) = default;
};

struct SessionManifest {
  // format_major/minor are filled in by the encoder; readers report what
  // the file says.
  uint16_t format_major = 0;
  uint16_t format_minor = 0;
  std::string session_id;
  std::string engine;
  std::string engine_version;
  std::string recorder_version;
  int64_t created_unix_nanos = 0;
  std::string hostname;
  uint32_t pid = 0;
  ModelConfigInfo model;
  std::vector<Toggle> toggles;
  DeviceInfo device;
  ParallelLayout parallel;
  std::vector<WeightShardHashes> weights;
  uint32_t weight_check_period_steps = 0;
  uint64_t quirks = 0;
  std::vector<std::string> features;
  CoredumpArming coredump;
  friend bool operator==(const SessionManifest&, const SessionManifest&) = default;
};

struct WeightHashesRecord {
  std::vector<WeightShardHashes> shards;
  friend bool operator==(const WeightHashesRecord&, const WeightHashesRecord&) = default;
};

// Numbering matches the schema's ForwardMode enum.
enum class ForwardMode : uint8_t { kUnknown = 0, kPrefill, kDecode, kExtend, kMixed, kIdle };
const char* ForwardModeName(ForwardMode m);

struct TensorDescriptor {
  std::string name;
  std::string dtype;  // DTypeName() spelling
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // elements; empty = contiguous
  Hash128 content_hash;
  uint64_t byte_size = 0;
  bool stored = false;  // a blob with content_hash is in the file
  std::string device;
  friend bool operator==(const TensorDescriptor&, const TensorDescriptor&) = default;
};

struct SamplingParams {
  float temperature = 1.0f;
  float top_p = 1.0f;
  int32_t top_k = -1;
  float min_p = 0.0f;
  uint64_t seed = 0;
  bool has_seed = false;
  friend bool operator==(const SamplingParams&, const SamplingParams&) = default;
};

struct Digest {
  std::string name;
  std::variant<uint64_t, Hash128> value;
  friend bool operator==(const Digest&, const Digest&) = default;
};

// A request's page-table row. In a file (format 2.3 on) a row may be a
// delta: token_slots are its columns from `start` on, and with
// from_previous the columns before come from the previous row of the same
// req_pool_index (docs/formats/capture.md, "Page-table deltas").
// CaptureReader resolves deltas: the rows it returns have from_previous
// false, and start is 0 unless the file never held the row's first
// columns (the recorder lost them: steps dropped before it).
struct PageTableRow {
  int64_t req_pool_index = 0;
  std::vector<int64_t> token_slots;
  int64_t start = 0;
  bool from_previous = false;
  bool complete() const { return start == 0 && !from_previous; }
  friend bool operator==(const PageTableRow&, const PageTableRow&) = default;
};

struct StepRecord {
  uint64_t step = 0;
  uint32_t rank = 0;
  ForwardMode mode = ForwardMode::kUnknown;
  int64_t timestamp_nanos = 0;
  std::vector<std::string> request_ids;
  std::vector<int64_t> token_ids;
  std::vector<int64_t> positions;
  std::vector<int64_t> seq_lens;
  std::vector<int64_t> extend_lens;
  std::vector<int64_t> req_pool_indices;
  std::vector<PageTableRow> page_table;
  std::vector<int64_t> out_cache_loc;
  std::vector<SamplingParams> sampling;
  uint64_t rng_seed = 0;
  uint64_t rng_offset = 0;
  std::vector<int64_t> output_token_ids;
  std::vector<Digest> digests;
  std::vector<TensorDescriptor> tensors;
  friend bool operator==(const StepRecord&, const StepRecord&) = default;
};

// Format 2.4 (frame flag bit 4, docs/formats/capture.md "List deltas"): the
// lists a streamed step record may hold as differences (mod 2^64) from the
// same lists of the step record before it, each only where that record's
// list has the same length. A decode step moves every position, sequence
// length and cache slot on by one: as differences they repeat from step to
// step, and zstd matches them where it could not match the values.
inline constexpr std::vector<int64_t> StepRecord::* kStepListDeltas[] = {&StepRecord::positions, &StepRecord::seq_lens,
                                                                         &StepRecord::out_cache_loc};

struct SnapshotRecord {
  uint64_t step = 0;
  uint32_t rank = 0;
  std::vector<TensorDescriptor> tensors;
  friend bool operator==(const SnapshotRecord&, const SnapshotRecord&) = default;
};

struct WeightSlice {
  std::string tensor;
  uint64_t byte_begin = 0;
  uint64_t byte_end = 0;
  Hash128 hash;
  Hash128 expected;
  bool corrupt = false;
  friend bool operator==(const WeightSlice&, const WeightSlice&) = default;
};

struct WeightCheckRecord {
  uint64_t step = 0;
  uint32_t rank = 0;
  uint32_t period_steps = 0;
  std::vector<WeightSlice> slices;
  friend bool operator==(const WeightCheckRecord&, const WeightCheckRecord&) = default;
};

struct DroppedSnapshotsRecord {
  uint64_t step = 0;
  uint64_t snapshots_dropped = 0;  // cumulative
  uint64_t bytes_dropped = 0;      // cumulative
  // Disk errors and a writer that fell behind (cumulative): step records
  // never written, other records dropped from the in-memory hold, and
  // failed writes.
  uint64_t steps_dropped = 0;
  uint64_t records_dropped = 0;
  uint64_t write_errors = 0;
  friend bool operator==(const DroppedSnapshotsRecord&, const DroppedSnapshotsRecord&) = default;
};

// A fixed-size summary of one tensor at a named boundary of a step
// (schema Fingerprint; docs/formats/capture.md, "Fingerprints").
struct Fingerprint {
  std::string name;
  std::string dtype;  // DTypeName() spelling
  uint64_t numel = 0;
  uint64_t columns = 0;
  uint64_t nan = 0;
  uint64_t pos_inf = 0;
  uint64_t neg_inf = 0;
  double min = 0, max = 0, max_abs = 0;
  double sum = 0, sum_squares = 0;
  int64_t first_nonfinite_token = -1;
  int64_t first_nonfinite_column = -1;
  bool is_int = false;
  std::optional<Hash128> content_hash;
  uint64_t nonfinite() const { return nan + pos_inf + neg_inf; }
  friend bool operator==(const Fingerprint&, const Fingerprint&) = default;
};

struct FingerprintRecord {
  uint64_t step = 0;
  uint32_t rank = 0;
  std::vector<Fingerprint> fingerprints;
  bool complete = true;
  std::string source;  // "host" or "device"
  friend bool operator==(const FingerprintRecord&, const FingerprintRecord&) = default;
};

// Numbering matches the schema's FailureClass enum.
enum class FailureClass : uint8_t {
  kUnknown = 0,
  kDeviceAssert,
  kOutOfMemory,
  kNonFinite,
  kOutputMismatch,
  kTimeout,
  kCrash,
  kException,
};
const char* FailureClassName(FailureClass c);

struct FailureRecord {
  std::string reason;
  std::string stage;
  std::optional<uint64_t> step;
  uint32_t rank = 0;
  int32_t signal = 0;
  std::string exception_type;
  FailureClass failure_class = FailureClass::kUnknown;
  int64_t timestamp_nanos = 0;
  std::string backtrace;
  // The GPU core dump found when the failure was written (a file name in
  // the capture's directory; empty: none found or none armed).
  std::string coredump;
  bool coredump_complete = false;
  std::string coredump_note;
  friend bool operator==(const FailureRecord&, const FailureRecord&) = default;
};

struct IndexEntry {
  uint16_t type = 0;
  uint64_t offset = 0;
  uint64_t step = 0;
  friend bool operator==(const IndexEntry&, const IndexEntry&) = default;
};

struct BlobIndexEntry {
  Hash128 hash;
  uint64_t offset = 0;
  friend bool operator==(const BlobIndexEntry&, const BlobIndexEntry&) = default;
};

struct IndexRecord {
  std::vector<IndexEntry> entries;
  std::vector<BlobIndexEntry> blobs;
  friend bool operator==(const IndexRecord&, const IndexRecord&) = default;
};

struct EndRecord {
  bool ok = false;
  uint64_t records = 0;
  uint64_t steps = 0;
  uint64_t blobs = 0;
  uint64_t index_offset = 0;
  uint64_t snapshots_dropped = 0;
  uint64_t bytes_dropped = 0;
  uint64_t steps_dropped = 0;
  uint64_t records_dropped = 0;
  uint64_t write_errors = 0;
  friend bool operator==(const EndRecord&, const EndRecord&) = default;
};

}  // namespace crashreplay
