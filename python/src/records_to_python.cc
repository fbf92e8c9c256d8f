#include "records_to_python.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

namespace nb = nanobind;

namespace crashreplay::python {
namespace {

template <typename T>
nb::list ListOf(const std::vector<T>& items) {
  nb::list out;
  for (const T& item : items) out.append(ToPython(item));
  return out;
}

}  // namespace

nb::object ToPython(const ToggleValue& v) {
  if (std::holds_alternative<int64_t>(v)) return nb::int_(std::get<int64_t>(v));
  if (std::holds_alternative<double>(v)) return nb::float_(std::get<double>(v));
  if (std::holds_alternative<bool>(v)) return nb::bool_(std::get<bool>(v));
  if (std::holds_alternative<std::string>(v)) return nb::str(std::get<std::string>(v).c_str());
  return nb::none();
}

nb::dict ToPython(const TensorDescriptor& t) {
  nb::dict d;
  d["name"] = t.name;
  d["dtype"] = t.dtype;
  d["shape"] = t.shape;
  d["strides"] = t.strides;
  d["hash"] = t.content_hash.Hex();
  d["byte_size"] = t.byte_size;
  d["stored"] = t.stored;
  d["device"] = t.device;
  return d;
}

nb::dict ToPython(const WeightShardHashes& w) {
  nb::dict d;
  d["rank"] = w.rank;
  d["root"] = w.root.Hex();
  nb::dict tensors;
  for (const TensorHash& t : w.tensors) {
    nb::dict e;
    e["hash"] = t.hash.Hex();
    e["byte_size"] = t.byte_size;
    tensors[nb::str(t.name.c_str())] = e;
  }
  d["tensors"] = tensors;
  return d;
}

nb::dict ToPython(const SessionManifest& m) {
  nb::dict d;
  d["format_version"] = nb::make_tuple(m.format_major, m.format_minor);
  d["session_id"] = m.session_id;
  d["engine"] = m.engine;
  d["engine_version"] = m.engine_version;
  d["recorder_version"] = m.recorder_version;
  d["created_unix_nanos"] = m.created_unix_nanos;
  d["hostname"] = m.hostname;
  d["pid"] = m.pid;
  nb::dict model;
  model["config_json"] = m.model.config_json;
  model["model_type"] = m.model.model_type;
  model["architecture"] = m.model.architecture;
  model["num_layers"] = m.model.num_layers;
  model["hidden_size"] = m.model.hidden_size;
  model["vocab_size"] = m.model.vocab_size;
  model["num_heads"] = m.model.num_heads;
  model["num_kv_heads"] = m.model.num_kv_heads;
  model["head_dim"] = m.model.head_dim;
  model["intermediate_size"] = m.model.intermediate_size;
  model["num_experts"] = m.model.num_experts;
  model["quantization"] = m.model.quantization;
  model["dtype"] = m.model.dtype;
  model["checkpoint_path"] = m.model.checkpoint_path;
  d["model"] = model;
  nb::dict toggles;
  for (const Toggle& t : m.toggles) toggles[nb::str(t.name.c_str())] = ToPython(t.value);
  d["toggles"] = toggles;
  nb::dict device;
  device["name"] = m.device.name;
  device["sm_arch"] = m.device.sm_arch;
  device["memory_capacity_bytes"] = m.device.memory_capacity_bytes;
  device["driver_version"] = m.device.driver_version;
  device["runtime_version"] = m.device.runtime_version;
  device["index"] = m.device.index;
  d["device"] = device;
  nb::dict parallel;
  parallel["tp_size"] = m.parallel.tp_size;
  parallel["tp_rank"] = m.parallel.tp_rank;
  parallel["world_size"] = m.parallel.world_size;
  parallel["rank"] = m.parallel.rank;
  parallel["pp_size"] = m.parallel.pp_size;
  parallel["ep_size"] = m.parallel.ep_size;
  parallel["dp_size"] = m.parallel.dp_size;
  d["parallel"] = parallel;
  d["weights"] = ListOf(m.weights);
  d["weight_check_period_steps"] = m.weight_check_period_steps;
  d["quirks"] = m.quirks;
  d["features"] = m.features;
  nb::dict c;
  c["mode"] = m.coredump.mode;
  c["reason"] = m.coredump.reason;
  c["file_pattern"] = m.coredump.file_pattern;
  c["generation_flags"] = m.coredump.generation_flags;
  c["completion_callback"] = m.coredump.completion_callback;
  d["coredump"] = c;
  return d;
}

nb::dict ToPython(const StepRecord& s) {
  nb::dict d;
  d["step"] = s.step;
  d["rank"] = s.rank;
  d["mode"] = ForwardModeName(s.mode);
  d["timestamp_nanos"] = s.timestamp_nanos;
  d["request_ids"] = s.request_ids;
  d["token_ids"] = s.token_ids;
  d["positions"] = s.positions;
  d["seq_lens"] = s.seq_lens;
  d["extend_lens"] = s.extend_lens;
  d["req_pool_indices"] = s.req_pool_indices;
  nb::list rows;
  for (const PageTableRow& r : s.page_table) {
    nb::dict row;
    row["req_pool_index"] = r.req_pool_index;
    row["token_slots"] = r.token_slots;
    if (r.start != 0) row["start"] = r.start;  // an incomplete row: columns before it were never recorded
    rows.append(row);
  }
  d["page_table"] = rows;
  d["out_cache_loc"] = s.out_cache_loc;
  nb::list sampling;
  for (const SamplingParams& p : s.sampling) {
    nb::dict e;
    e["temperature"] = p.temperature;
    e["top_p"] = p.top_p;
    e["top_k"] = p.top_k;
    e["min_p"] = p.min_p;
    e["seed"] = p.has_seed ? nb::object(nb::int_(p.seed)) : nb::none();
    sampling.append(e);
  }
  d["sampling"] = sampling;
  d["rng_seed"] = s.rng_seed;
  d["rng_offset"] = s.rng_offset;
  d["output_token_ids"] = s.output_token_ids;
  nb::dict digests;
  for (const Digest& g : s.digests) {
    if (std::holds_alternative<uint64_t>(g.value)) {
      digests[nb::str(g.name.c_str())] = nb::int_(std::get<uint64_t>(g.value));
    } else {
      digests[nb::str(g.name.c_str())] = nb::str(std::get<Hash128>(g.value).Hex().c_str());
    }
  }
  d["digests"] = digests;
  d["tensors"] = ListOf(s.tensors);
  return d;
}

nb::dict ToPython(const SnapshotRecord& s) {
  nb::dict d;
  d["step"] = s.step;
  d["rank"] = s.rank;
  d["tensors"] = ListOf(s.tensors);
  return d;
}

nb::dict ToPython(const FailureRecord& f) {
  nb::dict d;
  d["reason"] = f.reason;
  d["stage"] = f.stage;
  d["step"] = f.step ? nb::object(nb::int_(*f.step)) : nb::none();
  d["rank"] = f.rank;
  d["signal"] = f.signal;
  d["exception_type"] = f.exception_type;
  d["failure_class"] = FailureClassName(f.failure_class);
  d["timestamp_nanos"] = f.timestamp_nanos;
  d["backtrace"] = f.backtrace;
  d["coredump"] = f.coredump;
  d["coredump_complete"] = f.coredump_complete;
  d["coredump_note"] = f.coredump_note;
  return d;
}

nb::dict ToPython(const WeightCheckRecord& w) {
  nb::dict d;
  d["step"] = w.step;
  d["rank"] = w.rank;
  d["period_steps"] = w.period_steps;
  nb::list slices;
  for (const WeightSlice& s : w.slices) {
    nb::dict e;
    e["tensor"] = s.tensor;
    e["byte_begin"] = s.byte_begin;
    e["byte_end"] = s.byte_end;
    e["hash"] = s.hash.Hex();
    e["expected"] = s.expected.Hex();
    e["corrupt"] = s.corrupt;
    slices.append(e);
  }
  d["slices"] = slices;
  return d;
}

nb::dict ToPython(const FingerprintRecord& r) {
  nb::dict d;
  d["step"] = r.step;
  d["rank"] = r.rank;
  d["complete"] = r.complete;
  d["source"] = r.source;
  nb::list fps;
  for (const Fingerprint& f : r.fingerprints) {
    nb::dict e;
    e["name"] = f.name;
    e["dtype"] = f.dtype;
    e["numel"] = f.numel;
    e["columns"] = f.columns;
    e["nan"] = f.nan;
    e["pos_inf"] = f.pos_inf;
    e["neg_inf"] = f.neg_inf;
    e["min"] = f.min;
    e["max"] = f.max;
    e["max_abs"] = f.max_abs;
    e["sum"] = f.sum;
    e["sum_squares"] = f.sum_squares;
    e["first_nonfinite"] = f.first_nonfinite_token >= 0
                               ? nb::object(nb::make_tuple(f.first_nonfinite_token, f.first_nonfinite_column))
                               : nb::none();
    e["is_int"] = f.is_int;
    e["content_hash"] = f.content_hash ? nb::object(nb::str(f.content_hash->Hex().c_str())) : nb::none();
    fps.append(e);
  }
  d["fingerprints"] = fps;
  return d;
}

nb::dict ToPython(const CaptureSummary& s) {
  nb::dict d;
  d["path"] = s.path;
  d["format_version"] = nb::make_tuple(s.format_major, s.format_minor);
  d["ok"] = s.ok;
  d["truncated"] = s.truncated;
  d["corrupt"] = s.corrupt;
  d["problem"] = s.problem;
  d["problem_offset"] = s.problem_offset;
  d["records"] = s.records;
  d["steps"] = s.steps;
  d["ranks"] = s.ranks;
  d["first_step"] = s.first_step;
  d["last_step"] = s.last_step;
  d["blobs"] = s.blobs;
  d["duplicate_blobs"] = s.duplicate_blobs;
  d["blob_raw_bytes"] = s.blob_raw_bytes;
  d["blob_stored_bytes"] = s.blob_stored_bytes;
  d["bytes"] = s.bytes;
  d["snapshots"] = s.snapshots;
  d["failures"] = s.failures;
  d["weight_checks"] = s.weight_checks;
  d["corrupt_weight_slices"] = s.corrupt_weight_slices;
  d["snapshots_dropped"] = s.snapshots_dropped;
  d["bytes_dropped"] = s.bytes_dropped;
  d["steps_dropped"] = s.steps_dropped;
  d["records_dropped"] = s.records_dropped;
  d["write_errors"] = s.write_errors;
  d["skipped_unknown"] = s.skipped_unknown;
  return d;
}

}  // namespace crashreplay::python
