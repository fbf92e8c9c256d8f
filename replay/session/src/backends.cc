#include "crashreplay/replay/session/backends.h"

#include "crashreplay/base/text.h"

namespace crashreplay::replay {

using text::Cat;

#if defined(CRASHREPLAY_HAVE_CUDA)
// replay/cuda/src/cuda_executor.cc
absl::StatusOr<std::unique_ptr<Executor>> MakeCudaExecutor(ExecMode mode);
#endif
std::unique_ptr<Executor> MakeCpuExecutor(int threads);  // replay/cpu/src/cpu_executor.cc

std::vector<std::string_view> CompiledBackends() {
#if defined(CRASHREPLAY_HAVE_CUDA)
  return {"cpu", "cuda"};
#else
  return {"cpu"};
#endif
}

absl::StatusOr<std::unique_ptr<Executor>> MakeExecutor(std::string_view device, ExecMode mode, int threads) {
  if (device == "cpu") return MakeCpuExecutor(threads);
  if (device == "cuda") {
#if defined(CRASHREPLAY_HAVE_CUDA)
    return MakeCudaExecutor(mode);
#else
    (void)mode;
    return absl::InvalidArgumentError(
        "device cuda: this crashreplay was built without the CUDA backend (configure with "
        "-DCRASHREPLAY_CUDA=ON where nvcc is installed); use the CPU backend instead (device=cpu, the default: "
        "`--set device=cpu`, or `devices --device cpu`)");
#endif
  }
  return absl::InvalidArgumentError(Cat("unknown device '", device, "'; choose cpu or cuda"));
}

}  // namespace crashreplay::replay
