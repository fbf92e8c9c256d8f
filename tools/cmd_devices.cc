// `crashreplay devices [--device cpu|cuda] [--json]`: the backends this
// binary was built with and the CUDA devices it can see. With --device, exits
// non-zero (usage error) when that backend cannot run here, e.g. "no CUDA
// device" on a machine without a GPU.
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "command.h"
#include "commands_decl.h"
#include "crashreplay/replay/kernels/executor.h"
#include "crashreplay/replay/session/backends.h"
#include "exit_codes.h"
#if defined(CRASHREPLAY_HAVE_CUDA)
#include "crashreplay/replay/cuda/cuda_executor.h"
#endif

namespace crashreplay::tools {

int RunDevices(int argc, char** argv) {
  CLI::App app("List the compiled backends and the CUDA devices; --device checks that one can run here.", "devices");
  bool json = false;
  std::string device;
  app.add_flag("--json", json, "print JSON");
  app.add_option("--device", device, "require this backend to be usable (cpu or cuda)");
  if (auto rc = ParseArgs(app, argc, argv)) return *rc;
  nlohmann::json out;
  out["backends"] = nlohmann::json::array();
  for (auto b : replay::CompiledBackends()) out["backends"].push_back(std::string(b));
  out["cuda_devices"] = nlohmann::json::array();
  std::string cuda_note = "not built with CUDA";
#if defined(CRASHREPLAY_HAVE_CUDA)
  auto count = replay::cuda::DeviceCount();
  if (count.ok()) {
    cuda_note = "";
    for (int i = 0; i < *count; ++i) {
      auto d = replay::cuda::QueryDevice(i);
      if (!d.ok()) continue;
      out["cuda_devices"].push_back({{"ordinal", i},
                                     {"name", d->name},
                                     {"sm", std::to_string(d->sm_major) + std::to_string(d->sm_minor)},
                                     {"memory_bytes", d->total_bytes},
                                     {"driver_version", d->driver_version},
                                     {"runtime_version", d->runtime_version}});
    }
  } else {
    cuda_note = std::string(count.status().message());
  }
#endif
  if (!cuda_note.empty()) out["cuda_note"] = cuda_note;
  if (json) {
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::printf("backends:");
    for (const auto& b : out["backends"]) std::printf(" %s", b.get<std::string>().c_str());
    std::printf("\n");
    for (const auto& d : out["cuda_devices"]) {
      std::printf("cuda:%d  %s  sm_%s  %.1f GB\n", d["ordinal"].get<int>(), d["name"].get<std::string>().c_str(),
                  d["sm"].get<std::string>().c_str(), d["memory_bytes"].get<double>() / 1e9);
    }
    if (!cuda_note.empty()) std::printf("cuda: %s\n", cuda_note.c_str());
  }
  if (!device.empty()) {
    auto exec = replay::MakeExecutor(device, replay::ExecMode::kKernelByKernel, 1);
    if (!exec.ok()) return ReportError(exec.status());
  }
  return kExitOk;
}

}  // namespace crashreplay::tools
