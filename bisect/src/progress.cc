#include "crashreplay/bisect/progress.h"

#include <unistd.h>

#include "absl/strings/str_format.h"

namespace crashreplay::bisect {

Progress Progress::ForStderr(bool quiet) { return Progress(stderr, ::isatty(::fileno(stderr)) == 1, quiet); }

void Progress::ClearLocked() {
  if (live_ && drawn_) {
    std::fputs("\r\033[K", out_);
    drawn_ = false;
  }
}

void Progress::RedrawLocked() {
  if (!live_ || quiet_) return;
  std::string line = absl::StrFormat("[bisect %s] trials %d done, %d running", phase_, done_, running_);
  if (!candidates_.empty()) line += " | candidates: " + candidates_;
  if (line.size() > 160) line = line.substr(0, 157) + "...";
  std::fprintf(out_, "\r\033[K%s", line.c_str());
  std::fflush(out_);
  drawn_ = true;
}

void Progress::SetPhase(const std::string& phase) {
  std::lock_guard<std::mutex> lock(mu_);
  phase_ = phase;
  if (!live_ && !quiet_) std::fprintf(out_, "bisect: phase %s\n", phase.c_str());
  RedrawLocked();
}

void Progress::SetCandidates(const std::string& candidates) {
  std::lock_guard<std::mutex> lock(mu_);
  if (candidates == candidates_) return;
  candidates_ = candidates;
  if (!live_ && !quiet_) std::fprintf(out_, "bisect: candidates now: %s\n", candidates.c_str());
  RedrawLocked();
}

void Progress::TrialStarted(int index, const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  ++running_;
  if (!live_ && !quiet_) std::fprintf(out_, "bisect: trial %d started: %s\n", index, what.c_str());
  RedrawLocked();
}

void Progress::TrialFinished(int index, const std::string& what, const std::string& verdict) {
  std::lock_guard<std::mutex> lock(mu_);
  --running_;
  ++done_;
  if (quiet_) return;
  if (live_) {
    ClearLocked();
    std::fprintf(out_, "trial %d: %s  %s\n", index, verdict.c_str(), what.c_str());
  } else {
    std::fprintf(out_, "bisect: trial %d %s: %s\n", index, verdict.c_str(), what.c_str());
  }
  RedrawLocked();
}

void Progress::Note(const std::string& line) {
  std::lock_guard<std::mutex> lock(mu_);
  if (quiet_) return;
  ClearLocked();
  std::fprintf(out_, "%s%s\n", live_ ? "" : "bisect: ", line.c_str());
  RedrawLocked();
}

void Progress::Finish() {
  std::lock_guard<std::mutex> lock(mu_);
  ClearLocked();
  std::fflush(out_);
}

}  // namespace crashreplay::bisect
