// How much memory this process may still use, and weights=auto's choice
// between resident weights and layer streaming (toggles.h "weights").
//
// Three limits are read, each when present: the address-space limit
// (RLIMIT_AS, `ulimit -v`) less what the process has mapped already; the
// memory cgroup's limit less its usage (cgroup v2 memory.max/current, v1
// memory.limit_in_bytes/usage_in_bytes of the process's cgroup); the
// kernel's MemAvailable. Resident weights map the whole checkpoint (address
// space) and touch every page of it in a step (memory); streaming needs one
// layer's.
#pragma once

#include <cstdint>
#include <string>

namespace crashreplay::replay {

struct HostMemory {
  uint64_t address_space = UINT64_MAX;  // RLIMIT_AS less the mapped size; UINT64_MAX: unlimited
  uint64_t memory = UINT64_MAX;         // min(cgroup limit - usage, MemAvailable); UINT64_MAX: unknown
  std::string memory_from;              // "cgroup memory limit", "MemAvailable"
};

HostMemory ReadHostMemory();

// weights=auto: stream when the checkpoint's files (`checkpoint_bytes`)
// exceed three quarters of the address space left or of the memory
// available (room for the KV cache, activations and the program). `why`
// gets the reason when it returns true.
bool ShouldStreamWeights(uint64_t checkpoint_bytes, const HostMemory& host, std::string* why);

}  // namespace crashreplay::replay
