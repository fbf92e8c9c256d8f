// Python values to the recorder's inputs: the session manifest, recorder
// options and failure classes.
//
// The Python layer (crashreplay/_manifest.py) builds plain dicts; this file
// turns them into the C++ structs with strict checks, so a misspelt key or a
// wrongly typed value is an error naming the key rather than a silently
// empty field. Callers hold the GIL.
//
// Manifest dict keys: session_id, engine, engine_version, model (dict of
// ModelConfigInfo fields), toggles (list of (name, value) pairs, value None,
// bool, int, float or str), device (dict of DeviceInfo fields), parallel
// (dict of ParallelLayout fields), features (list of str),
// weight_check_period_steps. Options dict keys: the RecorderOptions fields
// of the same names (see recorder.h).
#pragma once

#include <nanobind/nanobind.h>

#include <string>

#include "absl/status/statusor.h"
#include "crashreplay/capture/recorder.h"
#include "crashreplay/formats/capture_records.h"

namespace crashreplay::python {

absl::StatusOr<SessionManifest> ManifestFromPython(const nanobind::dict& d);
absl::StatusOr<capture::RecorderOptions> OptionsFromPython(const nanobind::dict& d);
// "device-assert" -> kDeviceAssert, ... (FailureClassName spellings).
absl::StatusOr<FailureClass> ParseFailureClass(const std::string& name);
// "decode" -> kDecode, ... (ForwardModeName spellings).
absl::StatusOr<ForwardMode> ParseForwardMode(const std::string& name);

}  // namespace crashreplay::python
