// The C ABI (recorder_c.h) over Recorder: conversion only, no behaviour.
#include "crashreplay/capture/recorder_c.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "crashreplay/capture/recorder.h"
#include "crashreplay/capture/weight_hash.h"
#include "manifest_json.h"

struct cr_recorder {
  std::unique_ptr<crashreplay::capture::Recorder> recorder;
};

namespace {

using crashreplay::DType;
using namespace crashreplay::capture;

thread_local std::string g_last_error;

int Fail(const absl::Status& s) {
  g_last_error = s.ToString();
  return static_cast<int>(s.code());
}

int Result(const absl::Status& s) { return s.ok() ? CR_OK : Fail(s); }

const char* Str(const char* s) { return s != nullptr ? s : ""; }

absl::Status Tensors(const cr_tensor* in, size_t n, std::vector<TensorView>* out) {
  if (n > 0 && in == nullptr) return absl::InvalidArgumentError("tensors is NULL but num_tensors > 0");
  out->resize(n);
  for (size_t i = 0; i < n; ++i) {
    const cr_tensor& t = in[i];
    std::optional<DType> dt = crashreplay::ParseDType(Str(t.dtype));
    if (!dt) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", Str(t.name), "': unknown dtype '", Str(t.dtype),
                                                     "' (use a safetensors name such as BF16, F32, I64)"));
    }
    if (t.ndim < 0 || (t.ndim > 0 && t.shape == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", Str(t.name), "': bad shape"));
    }
    (*out)[i] = TensorView{Str(t.name), *dt, std::span<const int64_t>(t.shape, static_cast<size_t>(t.ndim)), t.data,
                           t.byte_size};
  }
  return absl::OkStatus();
}

template <typename T>
std::span<const T> Span(const T* p, size_t n) {
  return p != nullptr ? std::span<const T>(p, n) : std::span<const T>();
}

}  // namespace

extern "C" {

int cr_recorder_abi_version(void) { return CR_RECORDER_ABI_VERSION; }

const char* cr_last_error(void) { return g_last_error.c_str(); }

void cr_recorder_options_init(cr_recorder_options* o) {
  if (o == nullptr) return;
  const RecorderOptions d;
  std::memset(o, 0, sizeof *o);
  o->overwrite = d.overwrite;
  o->snapshot_ring_bytes = d.snapshot_ring_bytes;
  o->max_snapshots = d.max_snapshots;
  o->zstd_level = d.blob.zstd_level;
  o->write_snapshots_on_close = d.write_snapshots_on_close;
  o->step_queue_slots = d.step_queue_slots;
  o->install_signal_handlers = d.install_signal_handlers;
  o->signal_drain_timeout_s = d.signal_drain_timeout_s;
  o->weight_check_budget = d.weight_check_budget;
  o->weight_check_bytes_per_step = d.weight_check_bytes_per_step;
  o->weight_chunk_bytes = d.weight_chunk_bytes;
  o->step_queue_wait_s = d.step_queue_wait_s;
  o->held_steps = d.held_steps;
  o->held_bytes = d.held_bytes;
  o->disk_retry_interval_s = d.disk_retry_interval_s;
  o->page_table_deltas = d.page_table_deltas ? 1 : 0;
  o->arm_coredumps = d.arm_coredumps ? 1 : 0;
}

int cr_recorder_begin(const char* manifest_json, const cr_recorder_options* o, cr_recorder** out) {
  if (out == nullptr) return Fail(absl::InvalidArgumentError("cr_recorder_begin: out is NULL"));
  *out = nullptr;
  absl::StatusOr<crashreplay::SessionManifest> manifest =
      internal::ManifestFromJson(manifest_json != nullptr ? manifest_json : "{}");
  if (!manifest.ok()) return Fail(manifest.status());
  RecorderOptions options;
  if (o != nullptr) {
    options.session_dir = Str(o->session_dir);
    options.path = Str(o->path);
    options.overwrite = o->overwrite != 0;
    options.snapshot_ring_bytes = o->snapshot_ring_bytes;
    options.max_snapshots = o->max_snapshots;
    options.blob.zstd_level = o->zstd_level;
    options.write_snapshots_on_close = o->write_snapshots_on_close != 0;
    options.step_queue_slots = o->step_queue_slots;
    options.install_signal_handlers = o->install_signal_handlers != 0;
    options.signal_drain_timeout_s = o->signal_drain_timeout_s;
    options.weight_check_budget = o->weight_check_budget;
    options.weight_check_bytes_per_step = o->weight_check_bytes_per_step;
    options.weight_chunk_bytes = o->weight_chunk_bytes;
    options.step_queue_wait_s = o->step_queue_wait_s;
    options.held_steps = o->held_steps;
    options.held_bytes = o->held_bytes;
    options.disk_retry_interval_s = o->disk_retry_interval_s;
    options.page_table_deltas = o->page_table_deltas != 0;
    // Off: the file a crashreplay before 2.3 reads, so no 2.4 list deltas
    // either (the C ABI has no field of its own for them).
    options.step_list_deltas = options.page_table_deltas;
    options.arm_coredumps = o->arm_coredumps != 0;
  }
  absl::StatusOr<std::unique_ptr<Recorder>> r = Recorder::Begin(*manifest, options);
  if (!r.ok()) return Fail(r.status());
  *out = new cr_recorder{*std::move(r)};
  return CR_OK;
}

int cr_recorder_record_step(cr_recorder* r, const cr_step* s) {
  if (r == nullptr || s == nullptr) return Fail(absl::InvalidArgumentError("cr_recorder_record_step: NULL argument"));
  if (s->mode < CR_MODE_UNKNOWN || s->mode > CR_MODE_IDLE) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("step ", s->step, ": unknown forward mode ", s->mode)));
  }
  // Small per-call conversions; thread_local buffers keep the hot path
  // free of allocation once warm.
  thread_local std::vector<std::string_view> ids;
  thread_local std::vector<crashreplay::SamplingParams> sampling;
  thread_local std::vector<DigestView> digests;
  ids.resize(s->num_requests);
  for (size_t i = 0; i < s->num_requests; ++i) ids[i] = Str(s->request_ids != nullptr ? s->request_ids[i] : nullptr);
  sampling.resize(s->num_sampling);
  for (size_t i = 0; i < s->num_sampling; ++i) {
    const cr_sampling& c = s->sampling[i];
    sampling[i] = crashreplay::SamplingParams{c.temperature, c.top_p, c.top_k, c.min_p, c.seed, c.has_seed != 0};
  }
  digests.resize(s->num_digests);
  for (size_t i = 0; i < s->num_digests; ++i) {
    const cr_digest& d = s->digests[i];
    digests[i] = DigestView{Str(d.name), d.is_128 != 0, d.value64, crashreplay::Hash128{d.high, d.low}};
  }
  StepView v;
  v.step = s->step;
  v.mode = static_cast<crashreplay::ForwardMode>(s->mode);
  v.timestamp_nanos = s->timestamp_nanos;
  v.request_ids = ids;
  v.token_ids = Span(s->token_ids, s->num_tokens);
  v.positions = Span(s->positions, s->num_positions);
  v.seq_lens = Span(s->seq_lens, s->num_seq_lens);
  v.extend_lens = Span(s->extend_lens, s->num_extend_lens);
  v.req_pool_indices = Span(s->req_pool_indices, s->num_req_pool_indices);
  if (s->page_table_offsets != nullptr) v.page_table_offsets = Span(s->page_table_offsets, s->num_page_table_rows + 1);
  v.page_table_slots = Span(s->page_table_slots, s->num_page_table_slots);
  if (s->page_table_starts != nullptr) v.page_table_starts = Span(s->page_table_starts, s->num_page_table_rows);
  v.out_cache_loc = Span(s->out_cache_loc, s->num_out_cache_loc);
  v.sampling = sampling;
  v.rng_seed = s->rng_seed;
  v.rng_offset = s->rng_offset;
  v.output_token_ids = Span(s->output_token_ids, s->num_output_token_ids);
  v.digests = digests;
  return Result(r->recorder->RecordStep(v));
}

int cr_recorder_submit_snapshot(cr_recorder* r, uint64_t step, const cr_tensor* tensors, size_t n) {
  if (r == nullptr) return Fail(absl::InvalidArgumentError("cr_recorder_submit_snapshot: NULL recorder"));
  thread_local std::vector<TensorView> views;
  if (absl::Status s = Tensors(tensors, n, &views); !s.ok()) return Fail(s);
  return Result(r->recorder->SubmitSnapshot(step, views));
}

int cr_recorder_record_weight_hashes(cr_recorder* r, uint32_t rank, const cr_tensor* tensors, size_t n,
                                     uint64_t* root_high, uint64_t* root_low) {
  if (r == nullptr) return Fail(absl::InvalidArgumentError("cr_recorder_record_weight_hashes: NULL recorder"));
  std::vector<TensorView> views;
  if (absl::Status s = Tensors(tensors, n, &views); !s.ok()) return Fail(s);
  absl::StatusOr<crashreplay::WeightShardHashes> h = HashTensors(rank, views);
  if (!h.ok()) return Fail(h.status());
  if (root_high != nullptr) *root_high = h->root.high;
  if (root_low != nullptr) *root_low = h->root.low;
  return Result(r->recorder->RecordWeightHashes(*h));
}

int cr_recorder_register_weights(cr_recorder* r, const cr_tensor* tensors, size_t n) {
  if (r == nullptr) return Fail(absl::InvalidArgumentError("cr_recorder_register_weights: NULL recorder"));
  std::vector<TensorView> views;
  if (absl::Status s = Tensors(tensors, n, &views); !s.ok()) return Fail(s);
  return Result(r->recorder->RegisterWeights(views));
}

int cr_recorder_register_device_weights(cr_recorder* r, const cr_tensor* tensors, size_t n) {
  if (r == nullptr) return Fail(absl::InvalidArgumentError("cr_recorder_register_device_weights: NULL recorder"));
  std::vector<TensorView> views;
  if (absl::Status s = Tensors(tensors, n, &views); !s.ok()) return Fail(s);
  return Result(r->recorder->RegisterDeviceWeights(views));
}

int cr_recorder_on_failure(cr_recorder* r, const cr_failure* f) {
  if (r == nullptr || f == nullptr) return Fail(absl::InvalidArgumentError("cr_recorder_on_failure: NULL argument"));
  FailureInfo info;
  info.reason = Str(f->reason);
  info.stage = Str(f->stage);
  if (f->has_step) info.step = f->step;
  info.failure_class = static_cast<crashreplay::FailureClass>(f->failure_class);
  info.exception_type = Str(f->exception_type);
  info.backtrace = Str(f->backtrace);
  return Result(r->recorder->OnFailure(info));
}

int cr_recorder_flush(cr_recorder* r) {
  if (r == nullptr) return Fail(absl::InvalidArgumentError("cr_recorder_flush: NULL recorder"));
  return Result(r->recorder->Flush());
}

int cr_recorder_close(cr_recorder* r) {
  if (r == nullptr) return Fail(absl::InvalidArgumentError("cr_recorder_close: NULL recorder"));
  return Result(r->recorder->Close());
}

int cr_recorder_stats_get(const cr_recorder* r, cr_recorder_stats* out) {
  if (r == nullptr || out == nullptr) return Fail(absl::InvalidArgumentError("cr_recorder_stats_get: NULL argument"));
  const RecorderStats s = r->recorder->stats();
  *out = cr_recorder_stats{s.steps_accepted,     s.steps_written,
                           s.snapshots_accepted, s.snapshots_encoded,
                           s.snapshots_dropped,  s.bytes_dropped,
                           s.ring_raw_bytes,     s.ring_encoded_bytes,
                           s.weight_bytes,       s.weight_check_period_steps,
                           s.weight_checks,      s.corrupt_weight_slices,
                           s.file_bytes,         s.steps_spilled,
                           s.steps_dropped,      s.records_dropped,
                           s.write_errors,       s.steps_held,
                           s.held_bytes,         s.page_rows_incomplete};
  return CR_OK;
}

const char* cr_recorder_path(const cr_recorder* r) { return r != nullptr ? r->recorder->path().c_str() : ""; }

void cr_recorder_free(cr_recorder* r) { delete r; }

void cr_xxh128_hex(const void* data, size_t size, char out_hex[33]) {
  const std::string hex = crashreplay::XXH128Of(data, size).Hex();
  std::memcpy(out_hex, hex.c_str(), 33);
}

}  // extern "C"
