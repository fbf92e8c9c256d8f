// The recorder (capture/recorder.h) exposed to Python as _crashreplay.Recorder.
//
// The Python class crashreplay.Recorder wraps this one; it normalises inputs
// (lists and torch tensors to contiguous int64 numpy arrays, CUDA tensors
// through pinned staging) so that this layer only borrows host memory.
// Every call that may copy, hash or wait releases the GIL; the arrays it
// borrows stay alive because their Python objects are arguments of the call.
// Weights passed to register_weights are kept referenced until close(),
// because the recorder re-hashes them in the background at every step.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bindings.h"
#include "crashreplay/capture/recorder.h"
#include "crashreplay/capture/weight_hash.h"
#include "manifest_from_python.h"
#include "records_to_python.h"
#include "status_bridge.h"
#include "tensor_intake.h"

namespace nb = nanobind;

namespace crashreplay::python {
namespace {

using I64 = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using F32 = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using U8 = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using OptI64 = std::optional<I64>;
using OptF32 = std::optional<F32>;

std::span<const int64_t> Span(const OptI64& a) {
  if (!a) return {};
  return {a->data(), a->shape(0)};
}

// Request ids as views of each Python string's own UTF-8 (for an ASCII
// str that is its storage: no copy, no allocation per id). Anything else
// in the sequence goes through str() first, kept alive in `keep`. The
// views last as long as `seq`, which the caller holds over the recorder
// call.
std::vector<std::string_view> IdViews(nb::handle ids, nb::object* seq, std::vector<nb::object>* keep) {
  *seq = nb::steal(PySequence_Fast(ids.ptr(), "request_ids must be a sequence of str"));
  if (!seq->is_valid()) throw nb::python_error();
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq->ptr());
  PyObject** items = PySequence_Fast_ITEMS(seq->ptr());
  std::vector<std::string_view> out;
  out.reserve(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* o = items[i];
    if (!PyUnicode_Check(o)) {
      keep->push_back(nb::str(nb::handle(o)));
      o = keep->back().ptr();
    }
    Py_ssize_t len = 0;
    const char* chars = PyUnicode_AsUTF8AndSize(o, &len);
    if (chars == nullptr) throw nb::python_error();
    out.emplace_back(chars, static_cast<size_t>(len));
  }
  return out;
}

// (name, tensor, dtype_override) triples as the Python layer passes them.
using NamedTensor = std::tuple<std::string, AnyTensor, std::string>;

// Host views plus the TensorViews pointing into them (shapes must outlive
// the recorder call, so both live here).
struct ViewSet {
  std::vector<HostTensorView> host;
  std::vector<std::string> names;
  std::vector<capture::TensorView> views;
};

ViewSet MakeViews(const std::vector<NamedTensor>& tensors, bool device = false) {
  ViewSet set;
  set.host.reserve(tensors.size());
  set.names.reserve(tensors.size());
  for (const auto& [name, array, dtype] : tensors) {
    std::optional<DType> override_dtype = ValueOrThrow(ParseDTypeOverride(dtype));
    set.host.push_back(ValueOrThrow(device ? DeviceView(array, name, override_dtype)
                                           : HostView(array, name, override_dtype)));
    set.names.push_back(name);
  }
  set.views.reserve(tensors.size());
  for (size_t i = 0; i < set.host.size(); ++i) {
    const HostTensorView& h = set.host[i];
    capture::TensorView v;
    v.name = set.names[i];
    v.dtype = h.dtype;
    v.shape = h.shape;
    v.data = h.data;
    v.byte_size = h.nbytes;
    set.views.push_back(v);
  }
  return set;
}

nb::dict StatsToPython(const capture::RecorderStats& s) {
  nb::dict d;
  d["steps_accepted"] = s.steps_accepted;
  d["steps_written"] = s.steps_written;
  d["steps_spilled"] = s.steps_spilled;
  d["snapshots_accepted"] = s.snapshots_accepted;
  d["snapshots_encoded"] = s.snapshots_encoded;
  d["snapshots_dropped"] = s.snapshots_dropped;
  d["bytes_dropped"] = s.bytes_dropped;
  d["ring_raw_bytes"] = s.ring_raw_bytes;
  d["ring_encoded_bytes"] = s.ring_encoded_bytes;
  d["weight_bytes"] = s.weight_bytes;
  d["weight_check_period_steps"] = s.weight_check_period_steps;
  d["weight_checks"] = s.weight_checks;
  d["corrupt_weight_slices"] = s.corrupt_weight_slices;
  d["file_bytes"] = s.file_bytes;
  d["steps_dropped"] = s.steps_dropped;
  d["records_dropped"] = s.records_dropped;
  d["write_errors"] = s.write_errors;
  d["steps_held"] = s.steps_held;
  d["held_bytes"] = s.held_bytes;
  d["page_rows_incomplete"] = s.page_rows_incomplete;
  return d;
}

// (name, 32-hex hash, byte size) entries to a shard with its root.
WeightShardHashes ShardFromEntries(uint32_t rank,
                                   const std::vector<std::tuple<std::string, std::string, uint64_t>>& entries) {
  WeightShardHashes shard;
  shard.rank = rank;
  for (const auto& [name, hex, size] : entries) {
    std::optional<Hash128> h = Hash128::FromHex(hex);
    if (!h) {
      ThrowIfError(absl::InvalidArgumentError(
          absl::StrCat("weight '", name, "': '", hex, "' is not a content hash (32 hex digits)")));
    }
    shard.tensors.push_back(TensorHash{name, *h, size});
  }
  shard.root = capture::WeightRoot(&shard.tensors);
  return shard;
}

class PyRecorder {
 public:
  PyRecorder(const nb::dict& manifest, const nb::dict& options) {
    SessionManifest m = ValueOrThrow(ManifestFromPython(manifest));
    capture::RecorderOptions o = ValueOrThrow(OptionsFromPython(options));
    absl::StatusOr<std::unique_ptr<capture::Recorder>> rec;
    {
      nb::gil_scoped_release release;
      rec = capture::Recorder::Begin(m, o);
    }
    recorder_ = ValueOrThrow(std::move(rec));
  }

  void RecordStep(uint64_t step, const std::string& mode, nb::handle request_ids,
                  const OptI64& token_ids, const OptI64& positions, const OptI64& seq_lens,
                  const OptI64& extend_lens, const OptI64& req_pool_indices, const OptI64& page_table_offsets,
                  const OptI64& page_table_slots, const OptI64& out_cache_loc, const OptF32& temperatures,
                  const OptF32& top_ps, const std::optional<I64>& top_ks, const OptF32& min_ps,
                  const OptI64& seeds, const std::optional<U8>& has_seed, uint64_t rng_seed, uint64_t rng_offset,
                  const OptI64& output_token_ids, const std::vector<std::pair<std::string, nb::object>>& digests,
                  int64_t timestamp_nanos, const OptI64& page_table_starts) {
    capture::Recorder& rec = Live();
    capture::StepView v;
    v.step = step;
    v.mode = ValueOrThrow(ParseForwardMode(mode));
    v.timestamp_nanos = timestamp_nanos;
    nb::object id_seq;
    std::vector<nb::object> id_strs;
    const std::vector<std::string_view> ids = IdViews(request_ids, &id_seq, &id_strs);
    v.request_ids = ids;
    v.token_ids = Span(token_ids);
    v.positions = Span(positions);
    v.seq_lens = Span(seq_lens);
    v.extend_lens = Span(extend_lens);
    v.req_pool_indices = Span(req_pool_indices);
    v.page_table_offsets = Span(page_table_offsets);
    v.page_table_slots = Span(page_table_slots);
    v.page_table_starts = Span(page_table_starts);
    v.out_cache_loc = Span(out_cache_loc);
    std::vector<SamplingParams> sampling = Sampling(temperatures, top_ps, top_ks, min_ps, seeds, has_seed);
    v.sampling = sampling;
    v.rng_seed = rng_seed;
    v.rng_offset = rng_offset;
    v.output_token_ids = Span(output_token_ids);
    std::vector<std::string> digest_names;
    std::vector<capture::DigestView> digest_views;
    digest_names.reserve(digests.size());
    for (const auto& [name, value] : digests) {
      digest_names.push_back(name);
      capture::DigestView d;
      std::string hex;
      uint64_t x = 0;
      if (nb::try_cast<std::string>(value, hex)) {
        std::optional<Hash128> h = Hash128::FromHex(hex);
        if (!h) ThrowIfError(absl::InvalidArgumentError(absl::StrCat("digest '", name, "': '", hex, "' is not 32 hex digits")));
        d.is_128 = true;
        d.value128 = *h;
      } else if (nb::try_cast<uint64_t>(value, x)) {
        d.value64 = x;
      } else {
        ThrowIfError(absl::InvalidArgumentError(
            absl::StrCat("digest '", name, "': expected an unsigned 64-bit int or a 32-digit hex string")));
      }
      digest_views.push_back(d);
    }
    for (size_t i = 0; i < digest_views.size(); ++i) digest_views[i].name = digest_names[i];
    v.digests = digest_views;
    absl::Status s;
    {
      nb::gil_scoped_release release;
      s = rec.RecordStep(v);
    }
    ThrowIfError(s);
  }

  void SubmitSnapshot(uint64_t step, const std::vector<NamedTensor>& tensors) {
    capture::Recorder& rec = Live();
    ViewSet set = MakeViews(tensors);
    absl::Status s;
    {
      nb::gil_scoped_release release;
      s = rec.SubmitSnapshot(step, set.views);
    }
    ThrowIfError(s);
  }

  // The summary of one host tensor at a named boundary (Recorder::
  // RecordFingerprint); the tensor's bytes are read on this thread.
  void Fingerprint(uint64_t step, const std::string& name, const NamedTensor& tensor) {
    capture::Recorder& rec = Live();
    ViewSet set = MakeViews({tensor});
    absl::Status s;
    {
      nb::gil_scoped_release release;
      s = rec.RecordFingerprint(step, name, set.views[0]);
    }
    ThrowIfError(s);
  }

  // The same for a step's boundaries at once: one call, one release of the
  // GIL (the per-call cost, not the summary, dominates small tensors). Stops
  // at the first malformed view, the boundaries before it recorded.
  void Fingerprints(uint64_t step, const std::vector<NamedTensor>& tensors) {
    capture::Recorder& rec = Live();
    ViewSet set = MakeViews(tensors);
    absl::Status s;
    {
      nb::gil_scoped_release release;
      for (size_t i = 0; i < set.views.size() && s.ok(); ++i) {
        s = rec.RecordFingerprint(step, std::get<0>(tensors[i]), set.views[i]);
      }
    }
    ThrowIfError(s);
  }

  // Internal, for crashreplay._fingerprint_hooks: a step's boundaries as
  // (name, address, element count, dtype name, columns) of contiguous host
  // tensors the caller holds for the duration of the call. It skips the
  // DLPack round trip, ~4 us a tensor through torch's __dlpack__ and the view
  // checks: most of a decode step's fingerprint cost at 1,024 elements a
  // boundary (bench/fingerprint_bench.py). Not for other callers: an address
  // is trusted as given.
  using RawBoundary = std::tuple<std::string, uintptr_t, int64_t, std::string, int64_t>;
  void FingerprintsAt(uint64_t step, const std::vector<RawBoundary>& items) {
    capture::Recorder& rec = Live();
    std::vector<capture::TensorView> views(items.size());
    std::vector<std::array<int64_t, 2>> shapes(items.size());
    for (size_t i = 0; i < items.size(); ++i) {
      const auto& [name, address, numel, dtype_name, columns] = items[i];
      std::optional<DType> dtype = ParseDType(dtype_name);
      if (!dtype) ThrowIfError(absl::InvalidArgumentError(absl::StrCat("fingerprint ", name, ": unknown dtype '", dtype_name, "'")));
      if (numel < 0 || columns < 1 || (numel > 0 && address == 0) || numel % columns != 0) {
        ThrowIfError(absl::InvalidArgumentError(absl::StrCat("fingerprint ", name, ": ", numel, " elements at 0x",
                                                             absl::Hex(address), " in rows of ", columns)));
      }
      shapes[i] = {numel / columns, columns};
      capture::TensorView& v = views[i];
      v.name = name;
      v.dtype = *dtype;
      v.shape = shapes[i];
      v.data = reinterpret_cast<const void*>(address);
      v.byte_size = DTypeBytes(*dtype, static_cast<uint64_t>(numel));
    }
    absl::Status s;
    {
      nb::gil_scoped_release release;
      for (size_t i = 0; i < views.size() && s.ok(); ++i) s = rec.RecordFingerprint(step, std::get<0>(items[i]), views[i]);
    }
    ThrowIfError(s);
  }

  // Records load-time weight hashes computed earlier (hash_tensors, or one
  // tensor at a time for device weights); the root is computed here.
  nb::dict RecordWeightHashes(uint32_t rank, const std::vector<std::tuple<std::string, std::string, uint64_t>>& entries) {
    capture::Recorder& rec = Live();
    WeightShardHashes shard = ShardFromEntries(rank, entries);
    absl::Status s;
    {
      nb::gil_scoped_release release;
      s = rec.RecordWeightHashes(shard);
    }
    ThrowIfError(s);
    return ToPython(shard);
  }

  void RegisterWeights(const std::vector<NamedTensor>& tensors) {
    capture::Recorder& rec = Live();
    ViewSet set = MakeViews(tensors);
    absl::Status s;
    {
      nb::gil_scoped_release release;
      s = rec.RegisterWeights(set.views);
    }
    ThrowIfError(s);
    // The recorder reads these buffers until Close(): keep them alive.
    for (const auto& t : tensors) kept_weights_.push_back(nb::cast(std::get<1>(t)));
  }

  // Device weights: re-hashed on the GPU by the recorder (CUDA builds only).
  void RegisterDeviceWeights(const std::vector<NamedTensor>& tensors) {
    capture::Recorder& rec = Live();
    ViewSet set = MakeViews(tensors, /*device=*/true);
    absl::Status s;
    {
      nb::gil_scoped_release release;
      s = rec.RegisterDeviceWeights(set.views);
    }
    ThrowIfError(s);
    for (const auto& t : tensors) kept_weights_.push_back(nb::cast(std::get<1>(t)));
  }

  void OnFailure(const std::string& reason, const std::string& stage, std::optional<uint64_t> step,
                 const std::string& failure_class, const std::string& exception_type, const std::string& backtrace) {
    capture::Recorder& rec = Live();
    capture::FailureInfo f;
    f.reason = reason;
    f.stage = stage;
    f.step = step;
    f.failure_class = ValueOrThrow(ParseFailureClass(failure_class));
    f.exception_type = exception_type;
    f.backtrace = backtrace;
    absl::Status s;
    {
      nb::gil_scoped_release release;
      s = rec.OnFailure(f);
    }
    ThrowIfError(s);
  }

  void Flush() {
    capture::Recorder& rec = Live();
    absl::Status s;
    {
      nb::gil_scoped_release release;
      s = rec.Flush();
    }
    ThrowIfError(s);
  }

  // None when everything reached the file; after a disk error, the
  // recorder's report of what could not be written (docs/capture.md, "Disk
  // full and slow disks") as a string: the Python layer warns with it
  // rather than raising from close(). Any other error raises.
  std::optional<std::string> Close() {
    if (!recorder_) return std::nullopt;
    absl::Status s;
    {
      nb::gil_scoped_release release;
      s = recorder_->Close();
    }
    closed_stats_ = recorder_->stats();
    path_ = recorder_->path();
    recorder_.reset();
    kept_weights_.clear();
    if (!s.ok() && closed_stats_.write_errors > 0) return std::string(s.message());
    ThrowIfError(s);
    return std::nullopt;
  }

  bool closed() const { return !recorder_; }
  nb::dict Stats() const { return StatsToPython(recorder_ ? recorder_->stats() : closed_stats_); }
  std::string Path() const { return recorder_ ? recorder_->path() : path_; }

  // The C++ recorder; raises once closed (RecorderOf, for the other bindings).
  capture::Recorder& Live() {
    if (!recorder_) {
      ThrowIfError(absl::FailedPreconditionError(
          absl::StrCat("recorder for ", path_, " is closed; start a new crashreplay.Recorder")));
    }
    return *recorder_;
  }

 private:

  static std::vector<SamplingParams> Sampling(const OptF32& temperatures, const OptF32& top_ps,
                                              const std::optional<I64>& top_ks, const OptF32& min_ps,
                                              const OptI64& seeds, const std::optional<U8>& has_seed) {
    size_t n = 0;
    auto take = [&n](size_t m, const char* what) {
      if (m == 0) return;
      if (n != 0 && m != n) {
        ThrowIfError(absl::InvalidArgumentError(
            absl::StrCat("sampling.", what, " has ", m, " entries but another field has ", n,
                         "; every sampling field has one entry per request")));
      }
      n = m;
    };
    if (temperatures) take(temperatures->shape(0), "temperatures");
    if (top_ps) take(top_ps->shape(0), "top_ps");
    if (top_ks) take(top_ks->shape(0), "top_ks");
    if (min_ps) take(min_ps->shape(0), "min_ps");
    if (seeds) take(seeds->shape(0), "seeds");
    if (has_seed) take(has_seed->shape(0), "has_seed");
    std::vector<SamplingParams> out(n);
    for (size_t i = 0; i < n; ++i) {
      SamplingParams& p = out[i];
      if (temperatures) p.temperature = temperatures->data()[i];
      if (top_ps) p.top_p = top_ps->data()[i];
      if (top_ks) p.top_k = static_cast<int32_t>(top_ks->data()[i]);
      if (min_ps) p.min_p = min_ps->data()[i];
      if (seeds) p.seed = static_cast<uint64_t>(seeds->data()[i]);
      p.has_seed = has_seed ? has_seed->data()[i] != 0 : static_cast<bool>(seeds);
    }
    return out;
  }

  std::unique_ptr<capture::Recorder> recorder_;
  std::vector<nb::object> kept_weights_;
  capture::RecorderStats closed_stats_;
  std::string path_;
};

}  // namespace

capture::Recorder& RecorderOf(nb::handle recorder) {
  PyRecorder* r = nullptr;
  if (!nb::try_cast<PyRecorder*>(recorder, r) || r == nullptr) {
    ThrowIfError(absl::InvalidArgumentError("expected a _crashreplay.Recorder (crashreplay.Recorder()._impl)"));
  }
  return r->Live();
}

void BindRecorder(nb::module_& m) {
  nb::class_<PyRecorder>(m, "Recorder", "The C++ recorder; use crashreplay.Recorder, which wraps it.")
      .def(nb::init<const nb::dict&, const nb::dict&>(), nb::arg("manifest"), nb::arg("options"))
      .def("record_step", &PyRecorder::RecordStep, nb::arg("step"), nb::arg("mode"), nb::arg("request_ids"),
           nb::arg("token_ids").none(), nb::arg("positions").none(), nb::arg("seq_lens").none(),
           nb::arg("extend_lens").none(), nb::arg("req_pool_indices").none(),
           nb::arg("page_table_offsets").none(), nb::arg("page_table_slots").none(),
           nb::arg("out_cache_loc").none(), nb::arg("temperatures").none(), nb::arg("top_ps").none(),
           nb::arg("top_ks").none(), nb::arg("min_ps").none(), nb::arg("seeds").none(),
           nb::arg("has_seed").none(), nb::arg("rng_seed"), nb::arg("rng_offset"),
           nb::arg("output_token_ids").none(), nb::arg("digests"), nb::arg("timestamp_nanos"),
           nb::arg("page_table_starts").none() = nb::none())
      .def("submit_snapshot", &PyRecorder::SubmitSnapshot, nb::arg("step"), nb::arg("tensors"))
      .def("fingerprint", &PyRecorder::Fingerprint, nb::arg("step"), nb::arg("name"), nb::arg("tensor"))
      .def("fingerprints", &PyRecorder::Fingerprints, nb::arg("step"), nb::arg("tensors"))
      .def("_fingerprints_at", &PyRecorder::FingerprintsAt, nb::arg("step"), nb::arg("items"))
      .def("record_weight_hashes", &PyRecorder::RecordWeightHashes, nb::arg("rank"), nb::arg("entries"))
      .def("register_weights", &PyRecorder::RegisterWeights, nb::arg("tensors"))
      .def("register_device_weights", &PyRecorder::RegisterDeviceWeights, nb::arg("tensors"))
      .def("on_failure", &PyRecorder::OnFailure, nb::arg("reason"), nb::arg("stage"), nb::arg("step").none(),
           nb::arg("failure_class"), nb::arg("exception_type"), nb::arg("backtrace"))
      .def("flush", &PyRecorder::Flush)
      .def("close", &PyRecorder::Close)
      .def_prop_ro("closed", &PyRecorder::closed)
      .def("stats", &PyRecorder::Stats)
      .def_prop_ro("path", &PyRecorder::Path);

  m.def(
      "hash_tensors",
      [](uint32_t rank, const std::vector<NamedTensor>& tensors, int threads) {
        ViewSet set = MakeViews(tensors);
        absl::StatusOr<WeightShardHashes> hashes;
        {
          nb::gil_scoped_release release;
          capture::HashOptions opts;
          opts.threads = threads;
          hashes = capture::HashTensors(rank, set.views, opts);
        }
        ThrowIfError(hashes.status());
        return ToPython(*hashes);
      },
      nb::arg("rank"), nb::arg("tensors"), nb::arg("threads") = 0,
      "Per-tensor XXH3-128 and the rank root over (name, tensor, dtype_override) host tensors.");

  m.def(
      "weight_root",
      [](uint32_t rank, const std::vector<std::tuple<std::string, std::string, uint64_t>>& entries) {
        return ToPython(ShardFromEntries(rank, entries));
      },
      nb::arg("rank"), nb::arg("entries"),
      "The rank root over (name, hash hex, byte size) entries, as {rank, root, tensors}.");
}

}  // namespace crashreplay::python
