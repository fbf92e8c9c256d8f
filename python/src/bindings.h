// The parts of the _crashreplay extension, each registering its functions
// and classes on the module. module.cc calls them in order.
#pragma once

#include <nanobind/nanobind.h>

namespace crashreplay::python {

void BindTensors(nanobind::module_& m);      // tensor_bindings.cc: DLPack intake, hashing
void BindCaptureFile(nanobind::module_& m);  // capture_file_bindings.cc: the reader
void BindRecorder(nanobind::module_& m);     // recorder_bindings.cc: the recorder

}  // namespace crashreplay::python
