// The executors this binary can make (kernels/executor.h is the interface
// they implement): the CPU executor always, the CUDA executor when the build
// has the CUDA backend. Thread-safe (pure functions).
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "crashreplay/replay/kernels/executor.h"

namespace crashreplay::replay {

// Backends compiled into this binary: "cpu", and "cuda" when built with CUDA.
std::vector<std::string_view> CompiledBackends();

// "cpu" or "cuda". threads: CPU worker threads (<= 0: CRASHREPLAY_THREADS).
// For "cuda": InvalidArgument "no CUDA device ..." when the build has CUDA but
// the machine has no usable device, InvalidArgument naming the build option
// when the build has none.
absl::StatusOr<std::unique_ptr<Executor>> MakeExecutor(std::string_view device, ExecMode mode, int threads = 0);

}  // namespace crashreplay::replay
