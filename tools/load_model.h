// Loading a checkpoint into a Model the way `run` and `replay` do: the
// weights toggle decides between resident weights and layer streaming
// (weights=auto asks host_memory.h), the checkpoint is opened mapped or
// deferred to match, and the notes of every stage are collected.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "crashreplay/base/status_line.h"
#include "crashreplay/replay/config/toggles.h"
#include "crashreplay/replay/model/checkpoint_io.h"
#include "crashreplay/replay/model/model.h"

namespace crashreplay::tools {

struct LoadedModel {
  replay::LoadedCheckpoint checkpoint;
  std::unique_ptr<replay::Model> model;
  bool streaming = false;
  // The checkpoint's, the model's and the weights choice's notes, in order.
  std::vector<std::string> notes;
};

// Errors: LoadCheckpointDir's and BuildModel's.
absl::StatusOr<LoadedModel> LoadModel(const std::string& dir, const replay::EngineConfig& config, StatusLine& progress);

}  // namespace crashreplay::tools
