// The recorder exposed to Python (filled in when capture/'s recorder lands).
#include "bindings.h"

namespace crashreplay::python {

void BindRecorder(nanobind::module_&) {}

}  // namespace crashreplay::python
