// Whether a loaded capture holds anything `replay` can run, checked before
// any step is chosen: a capture cut off inside its first step record has a
// manifest and no step, and that is a data error (exit 3) naming the cut,
// not a usage error about a --step nobody gave.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "crashreplay/replay/captures/capture_io.h"

namespace crashreplay::tools {

// OK when the capture has a complete step or a recorded failure (a failure
// at load has no step and still replays). Otherwise DataLoss when the file
// was cut off (naming where), NotFound when it simply recorded no step.
absl::Status CheckReplayable(const replay::LoadedCapture& capture, const std::string& path);

}  // namespace crashreplay::tools
