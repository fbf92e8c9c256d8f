// crashreplay._crashreplay: the compiled half of the `crashreplay` package.
// The Python half (python/crashreplay/) wraps it; users import `crashreplay`.
#include <nanobind/nanobind.h>

#include "bindings.h"
#include "status_bridge.h"

NB_MODULE(_crashreplay, m) {
  m.doc() = "crashreplay's compiled core: capture reading, DLPack intake, hashing, the recorder";
  crashreplay::python::RegisterExceptions(m);
  crashreplay::python::BindTensors(m);
  crashreplay::python::BindCaptureFile(m);
  crashreplay::python::BindRecorder(m);
  crashreplay::python::BindDeviceFingerprints(m);
}
