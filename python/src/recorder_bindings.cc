// The recorder (capture/recorder.h) exposed to Python as _crashreplay.Recorder.
//
// The Python class crashreplay.Recorder wraps this one; it normalises inputs
// (lists and torch tensors to contiguous int64 numpy arrays, CUDA tensors
// through pinned staging) so that this layer only borrows host memory;
// record_step's common case (numpy arrays of the exact types) skips that
// and comes straight here (RecordStepFast), which takes it or declines.
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

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bindings.h"
#include "buffer_vec.h"
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

// Buffers the step calls fill, reused on each thread: a vector made afresh
// for every call landed on pages the allocator had just handed back to the
// system, and those first-touch faults were most of a decode step's
// record_step (perf on bench/python_recorder_bench.py: 5 of 10 us for 256
// requests' sampling parameters). A call nested in one that holds them (a
// request id's __str__ recording a step) gets buffers of its own.
struct StepScratch {
  std::vector<std::string_view> ids;
  std::vector<SamplingParams> sampling;
  std::vector<int64_t> offsets, slots;
  bool busy = false;
};

class ScratchLease {
 public:
  static constexpr size_t kKeptSlots = size_t{1} << 21;  // 16 MiB of page-table slots kept between calls

  ScratchLease() {
    thread_local StepScratch shared;
    s_ = shared.busy ? &own_ : &shared;
    s_->busy = true;
  }
  ~ScratchLease() {
    s_->busy = false;
    if (s_->slots.capacity() > kKeptSlots) std::vector<int64_t>().swap(s_->slots);  // one huge step's rows
  }
  ScratchLease(const ScratchLease&) = delete;
  ScratchLease& operator=(const ScratchLease&) = delete;
  StepScratch* operator->() const { return s_; }

 private:
  StepScratch own_;
  StepScratch* s_;
};

// Request ids as views of each Python string's own UTF-8 (for an ASCII
// str that is its storage: no copy, no allocation per id). Anything else
// in the sequence goes through str() first, kept alive in `keep`. The
// views last as long as `seq`, which the caller holds over the recorder
// call.
void IdViews(nb::handle ids, nb::object* seq, std::vector<nb::object>* keep, std::vector<std::string_view>* out) {
  *seq = nb::steal(PySequence_Fast(ids.ptr(), "request_ids must be a sequence of str"));
  if (!seq->is_valid()) throw nb::python_error();
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq->ptr());
  PyObject** items = PySequence_Fast_ITEMS(seq->ptr());
  out->clear();
  out->reserve(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* o = items[i];
    if (!PyUnicode_Check(o)) {
      keep->push_back(nb::str(nb::handle(o)));
      o = keep->back().ptr();
    }
    Py_ssize_t len = 0;
    const char* chars = PyUnicode_AsUTF8AndSize(o, &len);
    if (chars == nullptr) throw nb::python_error();
    out->emplace_back(chars, static_cast<size_t>(len));
  }
}

// A Python int (not bool, not another type: those take the general path)
// as an unsigned or a signed 64-bit value; false, no error set, otherwise.
bool U64(nb::handle h, uint64_t* out) {
  if (!PyLong_CheckExact(h.ptr())) return false;
  const unsigned long long x = PyLong_AsUnsignedLongLong(h.ptr());
  if (x == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  *out = x;
  return true;
}

bool I64Of(nb::handle h, int64_t* out) {
  if (!PyLong_CheckExact(h.ptr())) return false;
  const long long x = PyLong_AsLongLong(h.ptr());
  if (x == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  *out = x;
  return true;
}

// The sampling vectors of a step, each empty when not given.
struct SamplingSpans {
  std::span<const float> temperatures, top_ps, min_ps;
  std::span<const int64_t> top_ks, seeds;
  std::span<const uint8_t> has_seed;  // empty: every request seeded iff seeds are given
};

// One SamplingParams a request. Every field given has the same number of
// entries (one a request), else InvalidArgument naming the two counts.
void Sampling(const SamplingSpans& s, std::vector<SamplingParams>* params) {
  size_t n = 0;
  auto take = [&n](size_t m, const char* what) {
    if (m == 0) return;
    if (n != 0 && m != n) {
      ThrowIfError(
          absl::InvalidArgumentError(absl::StrCat("sampling.", what, " has ", m, " entries but another field has ", n,
                                                  "; every sampling field has one entry per request")));
    }
    n = m;
  };
  take(s.temperatures.size(), "temperatures");
  take(s.top_ps.size(), "top_ps");
  take(s.top_ks.size(), "top_ks");
  take(s.min_ps.size(), "min_ps");
  take(s.seeds.size(), "seeds");
  take(s.has_seed.size(), "has_seed");
  params->assign(n, SamplingParams{});
  for (size_t i = 0; i < n; ++i) {
    SamplingParams& p = (*params)[i];
    if (!s.temperatures.empty()) p.temperature = s.temperatures[i];
    if (!s.top_ps.empty()) p.top_p = s.top_ps[i];
    if (!s.top_ks.empty()) p.top_k = static_cast<int32_t>(s.top_ks[i]);
    if (!s.min_ps.empty()) p.min_p = s.min_ps[i];
    if (!s.seeds.empty()) p.seed = static_cast<uint64_t>(s.seeds[i]);
    p.has_seed = !s.has_seed.empty() ? s.has_seed[i] != 0 : !s.seeds.empty();
  }
}

// A digest value: an unsigned 64-bit int, or 32 hex digits (128 bits).
capture::DigestView Digest(std::string_view name_view, nb::handle value) {
  const absl::string_view name(name_view.data(), name_view.size());
  capture::DigestView d;
  std::string hex;
  uint64_t x = 0;
  if (nb::try_cast<std::string>(value, hex)) {
    std::optional<Hash128> h = Hash128::FromHex(hex);
    if (!h)
      ThrowIfError(absl::InvalidArgumentError(absl::StrCat("digest '", name, "': '", hex, "' is not 32 hex digits")));
    d.is_128 = true;
    d.value128 = *h;
  } else if (nb::try_cast<uint64_t>(value, x)) {
    d.value64 = x;
  } else {
    ThrowIfError(absl::InvalidArgumentError(
        absl::StrCat("digest '", name, "': expected an unsigned 64-bit int or a 32-digit hex string")));
  }
  return d;
}

// Keys of a dict, all str and all among `allowed`; false otherwise.
bool KeysAmong(PyObject* dict, std::initializer_list<std::string_view> allowed) {
  PyObject* key = nullptr;
  PyObject* value = nullptr;
  Py_ssize_t at = 0;
  while (PyDict_Next(dict, &at, &key, &value)) {
    Py_ssize_t n = 0;
    const char* chars = PyUnicode_Check(key) ? PyUnicode_AsUTF8AndSize(key, &n) : nullptr;
    if (chars == nullptr) {
      PyErr_Clear();
      return false;
    }
    const std::string_view k(chars, static_cast<size_t>(n));
    if (std::find(allowed.begin(), allowed.end(), k) == allowed.end()) return false;
  }
  return true;
}

// The page table as the fast path takes it (RecordStepFast): CSR spans into
// the caller's buffers, or into `own_*` where padded rows were cut to
// their lengths.
struct PageTableParts {
  BufferVec a, b, c;
  std::vector<int64_t>* own_offsets = nullptr;  // where padded rows are cut to CSR
  std::vector<int64_t>* own_slots = nullptr;
  std::span<const int64_t> offsets, slots, starts;
};

// Rows of a 2-D int64 buffer, row i cut to lengths[i] columns (all of them
// when `lengths` is empty), as CSR in out->own_*. False when a length is
// negative or past the width, or the counts differ (the general path names it).
bool CutRows(const BufferVec& rows, std::span<const int64_t> lengths, bool whole, PageTableParts* out) {
  const int64_t n = rows.size();
  const int64_t width = rows.cols();
  if (!whole && static_cast<int64_t>(lengths.size()) != n) return false;
  out->own_offsets->resize(static_cast<size_t>(n) + 1);
  (*out->own_offsets)[0] = 0;
  int64_t total = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = whole ? width : lengths[static_cast<size_t>(i)];
    if (len < 0 || len > width) return false;
    total += len;
    (*out->own_offsets)[static_cast<size_t>(i) + 1] = total;
  }
  out->own_slots->resize(static_cast<size_t>(total));
  const char* base = rows.bytes();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = (*out->own_offsets)[static_cast<size_t>(i) + 1] - (*out->own_offsets)[static_cast<size_t>(i)];
    if (len > 0) {
      std::memcpy(out->own_slots->data() + (*out->own_offsets)[static_cast<size_t>(i)],
                  base + i * rows.row_stride_bytes(), static_cast<size_t>(len) * sizeof(int64_t));
    }
  }
  out->offsets = *out->own_offsets;
  out->slots = *out->own_slots;
  return true;
}

// page_table in a form the fast path takes: None, (offsets, slots[, starts]),
// {"rows": 2-D, "lengths"[, "starts"]}, or a 2-D block (every row whole).
bool TakePageTable(PyObject* pt, PageTableParts* out) {
  using K = BufferVec::Kind;
  if (pt == Py_None) return true;
  if (PyTuple_Check(pt)) {
    const Py_ssize_t n = PyTuple_GET_SIZE(pt);
    if (n != 2 && n != 3) return false;
    if (!out->a.Take(PyTuple_GET_ITEM(pt, 0), K::kI64) || !out->b.Take(PyTuple_GET_ITEM(pt, 1), K::kI64) ||
        (n == 3 && !out->c.Take(PyTuple_GET_ITEM(pt, 2), K::kI64))) {
      return false;
    }
    out->offsets = out->a.span<int64_t>();
    out->slots = out->b.span<int64_t>();
    out->starts = out->c.span<int64_t>();
    return true;
  }
  if (PyDict_Check(pt)) {
    if (!KeysAmong(pt, {"rows", "lengths", "starts"})) return false;
    PyObject* rows = PyDict_GetItemString(pt, "rows");
    PyObject* lengths = PyDict_GetItemString(pt, "lengths");
    PyObject* starts = PyDict_GetItemString(pt, "starts");
    if (rows == nullptr || lengths == nullptr || rows == Py_None || lengths == Py_None) return false;
    if (!out->a.Take(rows, K::kI64, 2) || !out->b.Take(lengths, K::kI64) ||
        (starts != nullptr && !out->c.Take(starts, K::kI64))) {
      return false;
    }
    out->starts = out->c.span<int64_t>();
    return CutRows(out->a, out->b.span<int64_t>(), false, out);
  }
  if (!out->a.Take(pt, K::kI64, 2)) return false;
  return CutRows(out->a, {}, true, out);
}

struct SamplingBuffers {
  BufferVec temperatures, top_ps, top_ks, min_ps, seeds;
  SamplingSpans spans;
};

// sampling in a form the fast path takes: None, or a dict of the known keys
// whose values are None or vectors of their type (seeds as an array: every
// request seeded, as the general path reads it).
bool TakeSampling(PyObject* s, SamplingBuffers* out) {
  using K = BufferVec::Kind;
  if (s == Py_None) return true;
  if (!PyDict_Check(s) || !KeysAmong(s, {"temperatures", "top_ps", "top_ks", "min_ps", "seeds"})) return false;
  auto get = [s](const char* key) -> PyObject* {
    PyObject* v = PyDict_GetItemString(s, key);
    return v == nullptr ? Py_None : v;
  };
  if (!out->temperatures.Take(get("temperatures"), K::kF32) || !out->top_ps.Take(get("top_ps"), K::kF32) ||
      !out->top_ks.Take(get("top_ks"), K::kI64) || !out->min_ps.Take(get("min_ps"), K::kF32) ||
      !out->seeds.Take(get("seeds"), K::kI64)) {
    return false;
  }
  out->spans.temperatures = out->temperatures.span<float>();
  out->spans.top_ps = out->top_ps.span<float>();
  out->spans.top_ks = out->top_ks.span<int64_t>();
  out->spans.min_ps = out->min_ps.span<float>();
  out->spans.seeds = out->seeds.span<int64_t>();
  return true;  // has_seed empty: every request seeded when seeds are given
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
    set.host.push_back(
        ValueOrThrow(device ? DeviceView(array, name, override_dtype) : HostView(array, name, override_dtype)));
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

  void RecordStep(uint64_t step, const std::string& mode, nb::handle request_ids, const OptI64& token_ids,
                  const OptI64& positions, const OptI64& seq_lens, const OptI64& extend_lens,
                  const OptI64& req_pool_indices, const OptI64& page_table_offsets, const OptI64& page_table_slots,
                  const OptI64& out_cache_loc, const OptF32& temperatures, const OptF32& top_ps,
                  const std::optional<I64>& top_ks, const OptF32& min_ps, const OptI64& seeds,
                  const std::optional<U8>& has_seed, uint64_t rng_seed, uint64_t rng_offset,
                  const OptI64& output_token_ids, const std::vector<std::pair<std::string, nb::object>>& digests,
                  int64_t timestamp_nanos, const OptI64& page_table_starts) {
    capture::Recorder& rec = Live();
    capture::StepView v;
    v.step = step;
    v.mode = ValueOrThrow(ParseForwardMode(mode));
    v.timestamp_nanos = timestamp_nanos;
    ScratchLease scratch;
    nb::object id_seq;
    std::vector<nb::object> id_strs;
    IdViews(request_ids, &id_seq, &id_strs, &scratch->ids);
    v.request_ids = scratch->ids;
    v.token_ids = Span(token_ids);
    v.positions = Span(positions);
    v.seq_lens = Span(seq_lens);
    v.extend_lens = Span(extend_lens);
    v.req_pool_indices = Span(req_pool_indices);
    v.page_table_offsets = Span(page_table_offsets);
    v.page_table_slots = Span(page_table_slots);
    v.page_table_starts = Span(page_table_starts);
    v.out_cache_loc = Span(out_cache_loc);
    SamplingSpans ss;
    if (temperatures) ss.temperatures = {temperatures->data(), temperatures->shape(0)};
    if (top_ps) ss.top_ps = {top_ps->data(), top_ps->shape(0)};
    if (top_ks) ss.top_ks = {top_ks->data(), top_ks->shape(0)};
    if (min_ps) ss.min_ps = {min_ps->data(), min_ps->shape(0)};
    ss.seeds = Span(seeds);
    if (has_seed) ss.has_seed = {has_seed->data(), has_seed->shape(0)};
    Sampling(ss, &scratch->sampling);
    v.sampling = scratch->sampling;
    v.rng_seed = rng_seed;
    v.rng_offset = rng_offset;
    v.output_token_ids = Span(output_token_ids);
    std::vector<std::string> digest_names;
    digest_names.reserve(digests.size());
    std::vector<capture::DigestView> digest_views;
    for (const auto& [name, value] : digests) {
      digest_names.push_back(name);
      digest_views.push_back(Digest(name, value));
    }
    for (size_t i = 0; i < digest_views.size(); ++i) digest_views[i].name = digest_names[i];
    v.digests = digest_views;
    Record(rec, v);
  }

  // The hot path of crashreplay.Recorder.record_step, taking its arguments as
  // given: every vector None or a host buffer of the exact type (BufferVec:
  // int64, float32 for temperatures/top_ps/min_ps), page_table None, a CSR
  // tuple (offsets, slots[, starts]), padded {"rows", "lengths"[, "starts"]}
  // or a 2-D block, sampling None or a dict of such vectors, digests None or
  // a dict. Returns false, having recorded nothing and raised nothing, when
  // any argument is in another form: the Python layer then converts it (or
  // says what is wrong with it) and calls record_step. Errors of the step
  // itself (lengths that disagree, a closed recorder) raise as there.
  bool RecordStepFast(nb::handle step, nb::handle mode, nb::handle request_ids, nb::handle token_ids,
                      nb::handle positions, nb::handle seq_lens, nb::handle extend_lens, nb::handle req_pool_indices,
                      nb::handle page_table, nb::handle out_cache_loc, nb::handle sampling, nb::handle rng_seed,
                      nb::handle rng_offset, nb::handle output_token_ids, nb::handle digests,
                      nb::handle timestamp_nanos) {
    using K = BufferVec::Kind;
    capture::StepView v;
    int64_t stamp = 0;
    if (!U64(step, &v.step) || !U64(rng_seed, &v.rng_seed) || !U64(rng_offset, &v.rng_offset) ||
        !I64Of(timestamp_nanos, &stamp) || !PyUnicode_Check(mode.ptr())) {
      return false;
    }
    v.timestamp_nanos = stamp;  // 0: the recorder stamps CLOCK_REALTIME, as time.time_ns() would
    Py_ssize_t mode_len = 0;
    const char* mode_chars = PyUnicode_AsUTF8AndSize(mode.ptr(), &mode_len);
    if (mode_chars == nullptr) {
      PyErr_Clear();
      return false;
    }
    absl::StatusOr<ForwardMode> parsed = ParseForwardMode(std::string(mode_chars, static_cast<size_t>(mode_len)));
    if (!parsed.ok()) return false;
    v.mode = *parsed;

    BufferVec tok, pos, seq, ext, pool, loc, out;
    if (!tok.Take(token_ids.ptr(), K::kI64) || !pos.Take(positions.ptr(), K::kI64) ||
        !seq.Take(seq_lens.ptr(), K::kI64) || !ext.Take(extend_lens.ptr(), K::kI64) ||
        !pool.Take(req_pool_indices.ptr(), K::kI64) || !loc.Take(out_cache_loc.ptr(), K::kI64) ||
        !out.Take(output_token_ids.ptr(), K::kI64)) {
      return false;
    }
    ScratchLease scratch;
    PageTableParts pt;
    pt.own_offsets = &scratch->offsets;
    pt.own_slots = &scratch->slots;
    if (!TakePageTable(page_table.ptr(), &pt)) return false;
    SamplingBuffers sb;
    if (!TakeSampling(sampling.ptr(), &sb)) return false;
    std::vector<std::pair<std::string_view, PyObject*>> named;
    if (digests.ptr() != Py_None) {
      if (!PyDict_Check(digests.ptr())) return false;
      PyObject* key = nullptr;
      PyObject* value = nullptr;
      Py_ssize_t at = 0;
      while (PyDict_Next(digests.ptr(), &at, &key, &value)) {
        Py_ssize_t n = 0;
        const char* chars = PyUnicode_Check(key) ? PyUnicode_AsUTF8AndSize(key, &n) : nullptr;
        if (chars == nullptr) {
          PyErr_Clear();
          return false;
        }
        named.emplace_back(std::string_view(chars, static_cast<size_t>(n)), value);
      }
      std::sort(named.begin(), named.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    }
    // Every argument is in a form this path takes: from here on it records
    // or raises, as record_step would.
    capture::Recorder& rec = Live();
    nb::object id_seq;
    std::vector<nb::object> id_strs;
    IdViews(request_ids, &id_seq, &id_strs, &scratch->ids);
    v.request_ids = scratch->ids;
    v.token_ids = tok.span<int64_t>();
    v.positions = pos.span<int64_t>();
    v.seq_lens = seq.span<int64_t>();
    v.extend_lens = ext.span<int64_t>();
    v.req_pool_indices = pool.span<int64_t>();
    v.out_cache_loc = loc.span<int64_t>();
    v.output_token_ids = out.span<int64_t>();
    v.page_table_offsets = pt.offsets;
    v.page_table_slots = pt.slots;
    v.page_table_starts = pt.starts;
    Sampling(sb.spans, &scratch->sampling);
    v.sampling = scratch->sampling;
    std::vector<capture::DigestView> digest_views;
    digest_views.reserve(named.size());
    for (const auto& [name, value] : named) {
      digest_views.push_back(Digest(name, nb::handle(value)));
      digest_views.back().name = name;
    }
    v.digests = digest_views;
    Record(rec, v);
    return true;
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
      if (!dtype)
        ThrowIfError(
            absl::InvalidArgumentError(absl::StrCat("fingerprint ", name, ": unknown dtype '", dtype_name, "'")));
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
      for (size_t i = 0; i < views.size() && s.ok(); ++i)
        s = rec.RecordFingerprint(step, std::get<0>(items[i]), views[i]);
    }
    ThrowIfError(s);
  }

  // Records load-time weight hashes computed earlier (hash_tensors, or one
  // tensor at a time for device weights); the root is computed here.
  nb::dict RecordWeightHashes(uint32_t rank,
                              const std::vector<std::tuple<std::string, std::string, uint64_t>>& entries) {
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
  static void Record(capture::Recorder& rec, const capture::StepView& v) {
    absl::Status s;
    {
      nb::gil_scoped_release release;
      s = rec.RecordStep(v);
    }
    ThrowIfError(s);
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
           nb::arg("extend_lens").none(), nb::arg("req_pool_indices").none(), nb::arg("page_table_offsets").none(),
           nb::arg("page_table_slots").none(), nb::arg("out_cache_loc").none(), nb::arg("temperatures").none(),
           nb::arg("top_ps").none(), nb::arg("top_ks").none(), nb::arg("min_ps").none(), nb::arg("seeds").none(),
           nb::arg("has_seed").none(), nb::arg("rng_seed"), nb::arg("rng_offset"), nb::arg("output_token_ids").none(),
           nb::arg("digests"), nb::arg("timestamp_nanos"), nb::arg("page_table_starts").none() = nb::none())
      .def("_record_step_fast", &PyRecorder::RecordStepFast, nb::arg("step").none(), nb::arg("mode").none(),
           nb::arg("request_ids").none(), nb::arg("token_ids").none(), nb::arg("positions").none(),
           nb::arg("seq_lens").none(), nb::arg("extend_lens").none(), nb::arg("req_pool_indices").none(),
           nb::arg("page_table").none(), nb::arg("out_cache_loc").none(), nb::arg("sampling").none(),
           nb::arg("rng_seed").none(), nb::arg("rng_offset").none(), nb::arg("output_token_ids").none(),
           nb::arg("digests").none(), nb::arg("timestamp_nanos").none())
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
