// Capture records as plain Python values (dicts, lists, ints, strings).
//
// The reader binding hands these to Python; the shapes are documented in
// docs/python.md (read_capture). Hashes are 32-digit canonical hex strings,
// enums are their names ("decode", "device-assert"). Callers hold the GIL.
#pragma once

#include <nanobind/nanobind.h>

#include "crashreplay/formats/capture_reader.h"
#include "crashreplay/formats/capture_records.h"

namespace crashreplay::python {

nanobind::dict ToPython(const SessionManifest& m);
nanobind::dict ToPython(const StepRecord& s);
nanobind::dict ToPython(const SnapshotRecord& s);
nanobind::dict ToPython(const FailureRecord& f);
nanobind::dict ToPython(const WeightCheckRecord& w);
nanobind::dict ToPython(const FingerprintRecord& r);
nanobind::dict ToPython(const WeightShardHashes& w);
nanobind::dict ToPython(const TensorDescriptor& t);
nanobind::dict ToPython(const CaptureSummary& s);
nanobind::object ToPython(const ToggleValue& v);

}  // namespace crashreplay::python
