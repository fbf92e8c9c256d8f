#include "crashreplay/replay/model/tensor_bytes.h"

#include <cstdio>
#include <cstdlib>

namespace crashreplay::replay {

void TensorBytes::ReadOfDeferred() {
  std::fprintf(stderr,
               "crashreplay: internal error: the bytes of a deferred tensor (a checkpoint opened for layer "
               "streaming) were read without TensorBytes::Resolve()\n");
  std::abort();
}

}  // namespace crashreplay::replay
