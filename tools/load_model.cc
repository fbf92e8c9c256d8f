#include "load_model.h"

#include <sys/resource.h>

#include "crashreplay/replay/model/host_memory.h"

namespace crashreplay::tools {

absl::StatusOr<LoadedModel> LoadModel(const std::string& dir, const replay::EngineConfig& config,
                                      StatusLine& progress) {
  LoadedModel out;
  std::string why;
  out.streaming = config.weights == replay::WeightResidency::kStream;
  if (config.weights == replay::WeightResidency::kAuto) {
    auto bytes = replay::CheckpointFileBytes(dir);
    if (!bytes.ok()) return bytes.status();
    if (replay::ShouldStreamWeights(*bytes, replay::ReadHostMemory(), &why)) {
      out.streaming = true;
      out.notes.push_back("weights=auto: " + why + "; streaming the weights one layer at a time (weights=stream)");
    }
  }
  if (out.streaming) {
    // A deferred checkpoint keeps one descriptor per shard file open (a
    // 1000-shard checkpoint would pass the usual soft limit of 1024).
    struct rlimit rl;
    if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
      rl.rlim_cur = rl.rlim_max;
      ::setrlimit(RLIMIT_NOFILE, &rl);
    }
  }
  progress.Update("loading " + dir, 0, 0);
  auto ckpt = replay::LoadCheckpointDir(dir, {.deferred = out.streaming});
  if (!ckpt.ok() && absl::IsResourceExhausted(ckpt.status()) && !out.streaming) {
    return absl::ResourceExhaustedError(std::string(ckpt.status().message()) +
                                        "; --set weights=stream reads the checkpoint one layer at a time");
  }
  if (!ckpt.ok()) return ckpt.status();
  out.checkpoint = *std::move(ckpt);
  progress.Update(out.streaming ? "reading, sharding and hashing the weights (layer streaming)"
                                : "sharding and hashing the weights",
                  0, 0);
  auto model = replay::BuildModel(out.checkpoint.spec, out.checkpoint.tensors, config, {.stream = out.streaming});
  if (!model.ok()) return model.status();
  out.model = *std::move(model);
  out.notes.insert(out.notes.begin(), out.checkpoint.notes.begin(), out.checkpoint.notes.end());
  out.notes.insert(out.notes.end(), out.model->notes.begin(), out.model->notes.end());
  return out;
}

}  // namespace crashreplay::tools
