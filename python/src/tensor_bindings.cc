// DLPack intake and tensor hashing exposed to Python.
//
// describe_tensor() shows how the recorder sees a tensor (dtype name, shape,
// bytes, device) without copying it; hash_tensor() is the XXH3-128 of its
// bytes, the same hash capture files and `crashreplay hash` use. Hashing
// releases the GIL, so Python threads can hash several tensors at once.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "crashreplay/formats/hash.h"
#include "status_bridge.h"
#include "tensor_intake.h"

namespace nb = nanobind;

namespace crashreplay::python {
namespace {

HostTensorView ViewOrThrow(const AnyTensor& t, const std::string& name, const std::string& dtype) {
  std::optional<DType> override_dtype = ValueOrThrow(ParseDTypeOverride(dtype));
  return ValueOrThrow(HostView(t, name, override_dtype));
}

}  // namespace

void BindTensors(nb::module_& m) {
  m.def(
      "describe_tensor",
      [](const AnyTensor& t, const std::string& name, const std::string& dtype) {
        HostTensorView v = ViewOrThrow(t, name, dtype);
        nb::dict d;
        d["dtype"] = std::string(DTypeName(v.dtype));
        d["shape"] = v.shape;
        d["nbytes"] = v.nbytes;
        d["device"] = v.device;
        return d;
      },
      nb::arg("tensor"), nb::arg("name") = "tensor", nb::arg("dtype") = "",
      "How the recorder sees a host tensor: {dtype, shape, nbytes, device}. No copy.");

  m.def(
      "hash_tensor",
      [](const AnyTensor& t, const std::string& name, const std::string& dtype) {
        HostTensorView v = ViewOrThrow(t, name, dtype);
        Hash128 h;
        {
          nb::gil_scoped_release release;
          h = XXH128Of(v.data, v.nbytes);
        }
        return h.Hex();
      },
      nb::arg("tensor"), nb::arg("name") = "tensor", nb::arg("dtype") = "",
      "XXH3-128 of a host tensor's bytes as 32 canonical hex digits (as `xxhsum -H2` prints).");

  m.def(
      "hash_bytes", [](nb::bytes b) { return XXH128Of(b.c_str(), b.size()).Hex(); }, nb::arg("data"),
      "XXH3-128 of a bytes object, canonical hex.");
}

}  // namespace crashreplay::python
