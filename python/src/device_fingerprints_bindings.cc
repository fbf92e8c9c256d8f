// The device fingerprint table (capture/device_fingerprints.h) exposed to
// Python as _crashreplay.DeviceFingerprints, for crashreplay._fingerprint_hooks.
//
// A hook hands a CUDA tensor to enqueue() by address on the stream its
// module ran on: our summary kernel is queued behind the module's kernels
// and writes the record into pinned host memory mapped into the device. No
// copy, no synchronisation, and the records of every boundary that ran stay
// readable after a sticky CUDA error: collect()/write() read host memory
// only. Creating a table needs a CUDA device (else crashreplay.Error, whose
// message says why), and a build with the CUDA backend.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bindings.h"
#include "crashreplay/capture/device_fingerprints.h"
#include "crashreplay/formats/dtype.h"
#include "records_to_python.h"
#include "status_bridge.h"

namespace nb = nanobind;

namespace crashreplay::python {
namespace {

class PyDeviceFingerprints {
 public:
  explicit PyDeviceFingerprints(uint32_t max_boundaries)
      : table_(ValueOrThrow(capture::DeviceFingerprints::Create(max_boundaries))) {}

  // `stream`: a cudaStream_t as an integer (torch's Stream.cuda_stream); 0 is
  // the legacy default stream.
  void BeginStep(uint64_t step, uintptr_t stream) {
    ThrowIfError(table_->BeginStep(step, reinterpret_cast<void*>(stream)));
  }

  void NoteGraphStep(uint64_t step) { table_->NoteGraphStep(step); }

  // The summary of the dense device tensor of `numel` elements of `dtype`
  // (a safetensors name: "BF16", "I64") at `address`, in rows of `columns`,
  // queued on `stream` at boundary `name`. The caller keeps the tensor's
  // memory for the stream's later work (torch's caching allocator does:
  // a freed block is reused in stream order).
  void Enqueue(const std::string& name, uintptr_t address, int64_t numel, const std::string& dtype_name,
               int64_t columns, uintptr_t stream) {
    std::optional<DType> dtype = ParseDType(dtype_name);
    if (!dtype) {
      ThrowIfError(
          absl::InvalidArgumentError(absl::StrCat("device fingerprint ", name, ": unknown dtype '", dtype_name, "'")));
    }
    if (numel < 0 || columns < 1 || numel % columns != 0) {
      ThrowIfError(absl::InvalidArgumentError(
          absl::StrCat("device fingerprint ", name, ": ", numel, " elements in rows of ", columns)));
    }
    const std::array<int64_t, 2> shape = {numel / columns, columns};
    capture::TensorView v;
    v.name = name;
    v.dtype = *dtype;
    v.shape = shape;
    v.data = reinterpret_cast<const void*>(address);
    v.byte_size = DTypeBytes(*dtype, static_cast<uint64_t>(numel));
    ThrowIfError(table_->Enqueue(v, reinterpret_cast<void*>(stream)));
  }

  // The record of the step now running, as read_capture() shows records.
  nb::dict Collect(bool complete) const { return ToPython(table_->Collect(complete)); }

  // Appends the record of step `step` to `recorder`'s capture (a
  // _crashreplay.Recorder), complete when it holds all `noted` boundaries
  // the caller queued for the step (noted < 0: a step that failed). Returns
  // how many it held. Nothing is written when none ran, or when the table
  // still shows an earlier step (a fault before this step's begin kernel
  // ran: that step's record was written already). Reads host memory only.
  size_t Write(nb::handle recorder, int64_t noted, uint64_t step) const {
    FingerprintRecord record = table_->Collect(false);
    if (record.step != step) return 0;
    record.complete = noted >= 0 && record.fingerprints.size() == static_cast<uint64_t>(noted);
    if (!record.fingerprints.empty()) ThrowIfError(RecorderOf(recorder).RecordFingerprints(record));
    return record.fingerprints.size();
  }

  std::vector<std::string> Boundaries() const { return table_->boundaries(); }

 private:
  std::unique_ptr<capture::DeviceFingerprints> table_;
};

}  // namespace

void BindDeviceFingerprints(nb::module_& m) {
  nb::class_<PyDeviceFingerprints>(m, "DeviceFingerprints",
                                   "Fingerprints of CUDA tensors written by our kernel into mapped host memory.")
      .def(nb::init<uint32_t>(), nb::arg("max_boundaries"))
      .def("begin_step", &PyDeviceFingerprints::BeginStep, nb::arg("step"), nb::arg("stream"))
      .def("note_graph_step", &PyDeviceFingerprints::NoteGraphStep, nb::arg("step"))
      .def("enqueue", &PyDeviceFingerprints::Enqueue, nb::arg("name"), nb::arg("address"), nb::arg("numel"),
           nb::arg("dtype"), nb::arg("columns"), nb::arg("stream"))
      .def("collect", &PyDeviceFingerprints::Collect, nb::arg("complete"))
      .def("write", &PyDeviceFingerprints::Write, nb::arg("recorder"), nb::arg("noted"), nb::arg("step"))
      .def_prop_ro("boundaries", &PyDeviceFingerprints::Boundaries);
}

}  // namespace crashreplay::python
