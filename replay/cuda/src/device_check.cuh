// Device side of a failed check: record the fault in mapped pinned memory,
// then a real device assert (cudaErrorAssert, 710).
//
// Checks must trap in every build type, so this header re-includes assert.h
// with NDEBUG undefined: include it first in a .cu file, and only there.
#pragma once

#ifdef NDEBUG
#undef NDEBUG
#endif
#include <assert.h>

#include "crashreplay/replay/cuda/fault_record.h"
#include "crashreplay/replay/kernels/check.h"
#include "crashreplay/replay/kernels/ops.h"

namespace crashreplay::replay::cuda {

__device__ __noinline__ void RecordFaultAndAssert(DeviceFaultRecord* rec, uint32_t launch, int32_t layer, OpKind op,
                                                  const KernelStatus& st) {
  if (atomicCAS(&rec->claim, 0u, 1u) == 0u) {
    volatile DeviceFaultRecord* v = rec;
    v->launch = launch;
    v->op = static_cast<uint32_t>(op);
    v->check = static_cast<uint32_t>(st.check);
    v->layer = layer;
    v->item = st.item;
    v->index = st.index;
    v->value = st.value;
    __threadfence_system();
    v->complete = 1u;
    __threadfence_system();
  }
  assert(!"crashreplay: kernel check failed (see the fault record)");
}

}  // namespace crashreplay::replay::cuda
