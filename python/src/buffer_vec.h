// Host vectors read through the buffer protocol, for the recorder's hot path.
//
// numpy exports a buffer in about 0.1 us; nanobind's ndarray caster asks for
// a DLPack capsule instead (__dlpack__, about 1 us an array), which made the
// argument conversion most of record_step's cost for a decode step's dozen
// arrays (bench/python_recorder_bench.py). A BufferVec takes only what needs
// no conversion - one dimension (or two, for page-table rows), C order along
// the last, the exact element type - and says no to anything else (a torch
// tensor, int32, a strided view, an object without the buffer protocol), so
// that the caller takes the general path, which converts or names what is
// wrong. It never raises: a refused export's Python error is cleared.
#ifndef CRASHREPLAY_PYTHON_SRC_BUFFER_VEC_H_
#define CRASHREPLAY_PYTHON_SRC_BUFFER_VEC_H_

#include <Python.h>

#include <cstdint>
#include <span>

namespace crashreplay::python {

class BufferVec {
 public:
  // The element types the recorder's vectors use.
  enum class Kind { kI64, kF32, kU8 };

  BufferVec() = default;
  ~BufferVec() {
    if (held_) PyBuffer_Release(&view_);
  }
  BufferVec(const BufferVec&) = delete;
  BufferVec& operator=(const BufferVec&) = delete;

  // True when `o` is None (nothing taken, empty()) or exports a buffer of
  // `dims` dimensions (1 or 2) of `kind` whose last dimension is contiguous.
  // The buffer is held until this object dies.
  bool Take(PyObject* o, Kind kind, int dims = 1) {
    if (o == Py_None) return true;
    if (held_ || !PyObject_CheckBuffer(o)) return false;
    if (PyObject_GetBuffer(o, &view_, PyBUF_STRIDES | PyBUF_FORMAT) != 0) {
      PyErr_Clear();
      return false;
    }
    held_ = true;
    present_ = true;
    if (view_.ndim != dims || !FormatIs(view_.format, view_.itemsize, kind)) return false;
    const Py_ssize_t item = view_.itemsize;
    if (dims == 1) return view_.shape[0] <= 1 || view_.strides[0] == item;
    // Rows: each row contiguous, rows at any non-negative stride.
    return (view_.shape[1] <= 1 || view_.strides[1] == item) && view_.strides[0] >= 0;
  }

  bool present() const { return present_; }
  int64_t size() const { return present_ ? view_.shape[0] : 0; }
  int64_t cols() const { return present_ && view_.ndim == 2 ? view_.shape[1] : 0; }
  int64_t row_stride_bytes() const { return present_ && view_.ndim == 2 ? view_.strides[0] : 0; }
  const char* bytes() const { return present_ ? static_cast<const char*>(view_.buf) : nullptr; }

  template <class T>
  std::span<const T> span() const {
    if (!present_ || view_.ndim != 1) return {};
    return {static_cast<const T*>(view_.buf), static_cast<size_t>(view_.shape[0])};
  }

 private:
  static bool FormatIs(const char* format, Py_ssize_t itemsize, Kind kind) {
    if (format == nullptr) return kind == Kind::kU8 && itemsize == 1;  // "B" by default
    if (*format == '@' || *format == '=' || *format == '<') ++format;  // native, little-endian hosts
    if (format[0] == '\0' || format[1] != '\0') return false;
    switch (kind) {
      case Kind::kI64: return itemsize == 8 && (format[0] == 'l' || format[0] == 'q');
      case Kind::kF32: return itemsize == 4 && format[0] == 'f';
      case Kind::kU8: return itemsize == 1 && format[0] == 'B';
    }
    return false;
  }

  Py_buffer view_{};
  bool held_ = false;
  bool present_ = false;
};

}  // namespace crashreplay::python

#endif  // CRASHREPLAY_PYTHON_SRC_BUFFER_VEC_H_
