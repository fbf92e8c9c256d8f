// The manifest as JSON, for the C ABI (internal). The keys are listed in
// recorder_c.h and docs/capture.md; unknown keys are refused so that a typo
// in an adapter does not silently drop a field.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "crashreplay/formats/capture_records.h"

namespace crashreplay::capture::internal {

absl::StatusOr<SessionManifest> ManifestFromJson(std::string_view json);

}  // namespace crashreplay::capture::internal
