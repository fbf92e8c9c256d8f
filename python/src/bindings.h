// The parts of the _crashreplay extension, each registering its functions
// and classes on the module. module.cc calls them in order.
#pragma once

#include <nanobind/nanobind.h>

#include "crashreplay/capture/recorder.h"

namespace crashreplay::python {

void BindTensors(nanobind::module_& m);      // tensor_bindings.cc: DLPack intake, hashing
void BindCaptureFile(nanobind::module_& m);  // capture_file_bindings.cc: the reader
void BindRecorder(nanobind::module_& m);     // recorder_bindings.cc: the recorder
void BindDeviceFingerprints(nanobind::module_& m);  // device_fingerprints_bindings.cc

// The live C++ recorder of a _crashreplay.Recorder (recorder_bindings.cc);
// raises if `recorder` is not one, or is closed.
capture::Recorder& RecorderOf(nanobind::handle recorder);

}  // namespace crashreplay::python
