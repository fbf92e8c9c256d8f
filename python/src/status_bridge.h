// The edge between absl::Status and Python exceptions.
//
// Library code returns absl::Status; a binding that receives a non-OK status
// raises the Python exception that fits its code, with the status message
// unchanged (it already says what, where and what to do):
//   InvalidArgument, OutOfRange    -> ValueError
//   NotFound                       -> FileNotFoundError
//   DataLoss                       -> crashreplay.CaptureCorruptError
//   everything else                -> crashreplay.Error
// (CaptureCorruptError derives from crashreplay.Error, which derives from
// RuntimeError.) Nothing else in the extension throws.
#pragma once

#include <nanobind/nanobind.h>

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace crashreplay::python {

// Registers crashreplay.Error and crashreplay.CaptureCorruptError on `m`.
void RegisterExceptions(nanobind::module_& m);

// Raises the Python exception for `status`; no-op when it is OK.
void ThrowIfError(const absl::Status& status);

template <typename T>
T ValueOrThrow(absl::StatusOr<T> v) {
  ThrowIfError(v.status());
  return std::move(v).value();
}

}  // namespace crashreplay::python
