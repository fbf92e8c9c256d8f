/* C ABI of the recorder, for the Python module and foreign engines.
 *
 * A thin layer over crashreplay::capture::Recorder (recorder.h): an opaque
 * handle, plain C types, and int return codes (CR_OK = 0, otherwise the
 * absl::StatusCode number, listed below). After a failed call,
 * cr_last_error() returns the message of the last error on the calling
 * thread (valid until the next call on that thread).
 *
 * Ownership: every pointer passed in is borrowed for the call only (bytes
 * are copied), except the weight buffers given to cr_recorder_register_weights,
 * which must stay valid until cr_recorder_close. The handle is owned by the
 * caller and released with cr_recorder_free (which closes it if needed).
 *
 * Thread safety: as Recorder's. Strings are UTF-8, NUL-terminated.
 * Dtypes are safetensors names ("BF16", "F32", "I64", ...).
 * Versioning: CR_RECORDER_ABI_VERSION changes when a struct's layout does;
 * structs are only ever extended at their end. Call cr_recorder_abi_version()
 * to check the library you loaded.
 */
#ifndef CRASHREPLAY_CAPTURE_RECORDER_C_H_
#define CRASHREPLAY_CAPTURE_RECORDER_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CR_RECORDER_ABI_VERSION 4  /* 2: disk-full options and counters; 3: page-table deltas; 4: GPU core dumps */

/* Return codes: absl::StatusCode values. */
enum {
  CR_OK = 0,
  CR_UNKNOWN = 2,
  CR_INVALID_ARGUMENT = 3,
  CR_NOT_FOUND = 5,
  CR_ALREADY_EXISTS = 6,
  CR_PERMISSION_DENIED = 7,
  CR_RESOURCE_EXHAUSTED = 8,
  CR_FAILED_PRECONDITION = 9,
  CR_UNIMPLEMENTED = 12,
  CR_INTERNAL = 13,
  CR_DATA_LOSS = 15
};

/* Forward modes: the numbering of ForwardMode / the schema enum. */
enum { CR_MODE_UNKNOWN = 0, CR_MODE_PREFILL, CR_MODE_DECODE, CR_MODE_EXTEND, CR_MODE_MIXED, CR_MODE_IDLE };

/* Failure classes: the numbering of FailureClass / the schema enum. */
enum {
  CR_FAILURE_UNKNOWN = 0,
  CR_FAILURE_DEVICE_ASSERT,
  CR_FAILURE_OUT_OF_MEMORY,
  CR_FAILURE_NON_FINITE,
  CR_FAILURE_OUTPUT_MISMATCH,
  CR_FAILURE_TIMEOUT,
  CR_FAILURE_CRASH,
  CR_FAILURE_EXCEPTION
};

typedef struct cr_recorder cr_recorder;

typedef struct cr_recorder_options {
  const char* session_dir;  /* this rank writes session_dir/rank-NNNNN.crcap */
  const char* path;         /* NULL or an explicit file path (overrides session_dir) */
  int overwrite;
  uint64_t snapshot_ring_bytes;
  uint32_t max_snapshots;
  int zstd_level;
  int write_snapshots_on_close;
  uint32_t step_queue_slots;
  int install_signal_handlers;
  double signal_drain_timeout_s;
  double weight_check_budget;
  uint64_t weight_check_bytes_per_step;
  uint64_t weight_chunk_bytes;
  /* ABI 2: disk full and slow disks (docs/capture.md). */
  double step_queue_wait_s;      /* a full step queue waits this long once, then drops (counted) */
  uint64_t held_steps;           /* newest step records held in memory while the disk refuses writes */
  uint64_t held_bytes;           /* and at most these bytes of held records */
  double disk_retry_interval_s;  /* how often the writer retries the file */
  /* ABI 3: page-table rows to the file as deltas (RecorderOptions::page_table_deltas);
     0 also sets RecorderOptions::step_list_deltas off: a file a crashreplay before 2.3 reads. */
  int page_table_deltas;
  /* ABI 4: arm lightweight GPU core dumps for this process at begin
     (RecorderOptions::arm_coredumps; docs/capture.md "GPU core dumps").
     0 by default: the cost on the serving path is not measured yet. */
  int arm_coredumps;
} cr_recorder_options;

typedef struct cr_tensor {
  const char* name;
  const char* dtype;        /* safetensors name */
  const int64_t* shape;
  int32_t ndim;
  const void* data;         /* host memory */
  uint64_t byte_size;
} cr_tensor;

typedef struct cr_sampling {
  float temperature;
  float top_p;
  int32_t top_k;
  float min_p;
  uint64_t seed;
  int32_t has_seed;
} cr_sampling;

typedef struct cr_digest {
  const char* name;
  int32_t is_128;
  uint64_t value64;   /* when !is_128 */
  uint64_t high, low; /* when is_128 */
} cr_digest;

typedef struct cr_step {
  uint64_t step;
  int32_t mode;              /* CR_MODE_* */
  int64_t timestamp_nanos;   /* 0: now */
  const char* const* request_ids;
  size_t num_requests;
  const int64_t* token_ids;
  size_t num_tokens;
  const int64_t* positions;
  size_t num_positions;
  const int64_t* seq_lens;
  size_t num_seq_lens;
  const int64_t* extend_lens;
  size_t num_extend_lens;
  const int64_t* req_pool_indices;
  size_t num_req_pool_indices;
  /* page-table rows as CSR: num_page_table_rows + 1 offsets into slots */
  const int64_t* page_table_offsets;
  size_t num_page_table_rows;
  const int64_t* page_table_slots;
  size_t num_page_table_slots;
  const int64_t* out_cache_loc;
  size_t num_out_cache_loc;
  const cr_sampling* sampling;
  size_t num_sampling;
  uint64_t rng_seed;
  uint64_t rng_offset;
  const int64_t* output_token_ids;
  size_t num_output_token_ids;
  const cr_digest* digests;
  size_t num_digests;
  /* ABI 3: NULL, or one per page-table row: row i's slots are its columns
   * from page_table_starts[i] on (StepView::page_table_starts). */
  const int64_t* page_table_starts;
} cr_step;

typedef struct cr_failure {
  const char* reason;
  const char* stage;
  int32_t has_step;
  uint64_t step;
  int32_t failure_class;     /* CR_FAILURE_* */
  const char* exception_type;
  const char* backtrace;
} cr_failure;

typedef struct cr_recorder_stats {
  uint64_t steps_accepted, steps_written;
  uint64_t snapshots_accepted, snapshots_encoded, snapshots_dropped, bytes_dropped;
  uint64_t ring_raw_bytes, ring_encoded_bytes;
  uint64_t weight_bytes;
  uint32_t weight_check_period_steps;
  uint64_t weight_checks, corrupt_weight_slices;
  uint64_t file_bytes;
  /* ABI 2: the disk counters (RecorderStats). */
  uint64_t steps_spilled;
  uint64_t steps_dropped, records_dropped, write_errors;
  uint64_t steps_held, held_bytes;
  /* ABI 3 */
  uint64_t page_rows_incomplete;
} cr_recorder_stats;

int cr_recorder_abi_version(void);
const char* cr_last_error(void);

/* Fills the defaults of RecorderOptions (session_dir/path NULL). */
void cr_recorder_options_init(cr_recorder_options* options);

/* The manifest as JSON (docs/capture.md "Manifest JSON"): an object with
 * optional keys session_id, engine, engine_version, hostname,
 * model {config_json, model_type, architecture, num_layers, hidden_size,
 * vocab_size, num_heads, num_kv_heads, head_dim, intermediate_size,
 * num_experts, quantization, dtype, checkpoint_path},
 * toggles {name: int|float|bool|string|null},
 * device {name, sm_arch, memory_capacity_bytes, driver_version, runtime_version, index},
 * parallel {tp_size, tp_rank, world_size, rank, pp_size, ep_size, dp_size},
 * features [string]. Unknown keys are an error (CR_INVALID_ARGUMENT). */
int cr_recorder_begin(const char* manifest_json, const cr_recorder_options* options, cr_recorder** out);

int cr_recorder_record_step(cr_recorder* r, const cr_step* step);
int cr_recorder_submit_snapshot(cr_recorder* r, uint64_t step, const cr_tensor* tensors, size_t num_tensors);
/* Hashes the tensors as one rank's shard (weight_hash.h) and records the
 * WeightHashesRecord; the root is returned through root_high/root_low (may be NULL). */
int cr_recorder_record_weight_hashes(cr_recorder* r, uint32_t rank, const cr_tensor* tensors, size_t num_tensors,
                                     uint64_t* root_high, uint64_t* root_low);
int cr_recorder_register_weights(cr_recorder* r, const cr_tensor* tensors, size_t num_tensors);
/* The same for device pointers (CUDA builds; CR_UNIMPLEMENTED otherwise). */
int cr_recorder_register_device_weights(cr_recorder* r, const cr_tensor* tensors, size_t num_tensors);
int cr_recorder_on_failure(cr_recorder* r, const cr_failure* failure);
int cr_recorder_flush(cr_recorder* r);
int cr_recorder_close(cr_recorder* r);
int cr_recorder_stats_get(const cr_recorder* r, cr_recorder_stats* out);
/* The capture file path (valid while the handle lives). */
const char* cr_recorder_path(const cr_recorder* r);
/* Closes if needed and frees. NULL is allowed. */
void cr_recorder_free(cr_recorder* r);

/* XXH3-128 of a buffer, canonical hex (33 bytes incl. NUL) into out_hex. */
void cr_xxh128_hex(const void* data, size_t size, char out_hex[33]);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* CRASHREPLAY_CAPTURE_RECORDER_C_H_ */
