// The device fault record: what a failing device-side check writes before it
// traps, in mapped pinned host memory so the host can still read it after the
// CUDA context is dead (DESIGN decision 1: never read the device after a
// sticky error).
//
// Protocol: the first failing thread wins `claim` with atomicCAS(0 -> 1),
// writes the fields, __threadfence_system(), then sets `complete` = 1 and
// fences again; every failing thread then executes a real device assert, so
// the process sees cudaErrorAssert exactly as a serving engine does. The host
// trusts the fields only when `complete` == 1. Plain data, 8-byte aligned,
// the same layout for host and device.
#pragma once

#include <cstdint>

namespace crashreplay::replay::cuda {

struct DeviceFaultRecord {
  uint32_t claim;     // 0 free, 1 taken by the first failing thread
  uint32_t complete;  // 1 once the fields below are written and fenced
  uint32_t launch;    // launch sequence number (see Executor::launches)
  uint32_t op;        // OpKind
  uint32_t check;     // Check
  int32_t layer;
  int64_t item;
  int64_t index;
  double value;
};

}  // namespace crashreplay::replay::cuda
