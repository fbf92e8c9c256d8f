#include "crashreplay/bisect/progress.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "crashreplay/bisect/failure_text.h"

namespace crashreplay::bisect {
namespace {

// Progress lines are bounded (a 10,000-change configuration must not print
// a 100 KB line) and printable whatever a configuration value holds.
constexpr size_t kMaxLine = 200;

std::string Fit(std::string_view text, size_t max = kMaxLine) {
  std::string s = PrintableText(text);
  for (char& c : s)
    if (c == '\n' || c == '\t') c = ' ';
  if (s.size() <= max) return s;
  size_t cut = max - 3;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return s.substr(0, cut) + "...";
}

}  // namespace

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
  std::fprintf(out_, "\r\033[K%s", Fit(line, 160).c_str());
  std::fflush(out_);
  drawn_ = true;
}

void Progress::SetPhase(const std::string& phase) {
  std::lock_guard<std::mutex> lock(mu_);
  phase_ = phase;
  if (!live_ && !quiet_) std::fprintf(out_, "bisect: phase %s\n", Fit(phase).c_str());
  RedrawLocked();
}

void Progress::SetCandidates(const std::string& candidates) {
  std::lock_guard<std::mutex> lock(mu_);
  if (candidates == candidates_) return;
  candidates_ = candidates;
  if (!live_ && !quiet_) std::fprintf(out_, "%s\n", Fit(absl::StrCat("bisect: candidates now: ", candidates)).c_str());
  RedrawLocked();
}

void Progress::TrialStarted(int index, const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  ++running_;
  if (!live_ && !quiet_)
    std::fprintf(out_, "%s\n", Fit(absl::StrFormat("bisect: trial %d started: %s", index, what)).c_str());
  RedrawLocked();
}

void Progress::TrialFinished(int index, const std::string& what, const std::string& verdict) {
  std::lock_guard<std::mutex> lock(mu_);
  --running_;
  ++done_;
  if (quiet_) return;
  if (live_) {
    ClearLocked();
    std::fprintf(out_, "%s\n", Fit(absl::StrFormat("trial %d: %s  %s", index, verdict, what)).c_str());
  } else {
    std::fprintf(out_, "%s\n", Fit(absl::StrFormat("bisect: trial %d %s: %s", index, verdict, what)).c_str());
  }
  RedrawLocked();
}

void Progress::Note(const std::string& line) {
  std::lock_guard<std::mutex> lock(mu_);
  if (quiet_) return;
  ClearLocked();
  std::fprintf(out_, "%s%s\n", live_ ? "" : "bisect: ", PrintableText(line).c_str());
  RedrawLocked();
}

void Progress::Finish() {
  std::lock_guard<std::mutex> lock(mu_);
  ClearLocked();
  std::fflush(out_);
}

}  // namespace crashreplay::bisect
