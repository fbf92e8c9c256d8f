#include "status_bridge.h"

#include <string>

namespace nb = nanobind;

namespace crashreplay::python {
namespace {
// Set once at import; the module object keeps the types alive.
PyObject* g_error = nullptr;
PyObject* g_corrupt = nullptr;
}  // namespace

void RegisterExceptions(nb::module_& m) {
  // Plain Python exception types, no C++ translator: only ThrowIfError
  // raises them. The references are kept for the life of the process.
  g_error = PyErr_NewException("crashreplay._crashreplay.Error", PyExc_RuntimeError, nullptr);
  g_corrupt = PyErr_NewException("crashreplay._crashreplay.CaptureCorruptError", g_error, nullptr);
  m.attr("Error") = nb::borrow(g_error);
  m.attr("CaptureCorruptError") = nb::borrow(g_corrupt);
}

void ThrowIfError(const absl::Status& status) {
  if (status.ok()) return;
  const std::string msg(status.message());
  PyObject* type = g_error;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange: type = PyExc_ValueError; break;
    case absl::StatusCode::kNotFound: type = PyExc_FileNotFoundError; break;
    case absl::StatusCode::kDataLoss: type = g_corrupt; break;
    default: break;
  }
  std::string text = msg;
  if (type == g_error) {
    text = absl::StatusCodeToString(status.code()) + ": " + msg;
  }
  PyErr_SetString(type, text.c_str());
  throw nb::python_error();
}

}  // namespace crashreplay::python
