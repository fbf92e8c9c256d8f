#include "replayable.h"

#include "absl/strings/str_cat.h"

namespace crashreplay::tools {

absl::Status CheckReplayable(const replay::LoadedCapture& capture, const std::string& path) {
  if (!capture.steps.empty() || capture.failure) return absl::OkStatus();
  if (capture.reader != nullptr) {
    const CaptureSummary s = capture.reader->Summary();
    if (s.truncated || s.corrupt) {
      return absl::DataLossError(
          absl::StrCat(path, " holds no complete step: the file stops at byte ", s.problem_offset, " (", s.problem,
                       "); there is nothing to replay. Run 'crashreplay info ", path, "' to see what it holds"));
    }
  }
  return absl::NotFoundError(absl::StrCat(path,
                                          " holds no step and no failure: the session recorded none; "
                                          "there is nothing to replay"));
}

}  // namespace crashreplay::tools
