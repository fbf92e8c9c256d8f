// Live progress of a search on stderr.
//
// On a terminal the status line ("trials 7 done, 2 running | candidates:
// ...") is redrawn in place with \r, and notes scroll above it; when stderr
// is not a terminal (CI logs, pipes) every event is one plain line and
// nothing is redrawn. Thread-safe: scheduler workers report concurrently.
#pragma once

#include <cstdio>
#include <mutex>
#include <string>

namespace crashreplay::bisect {

class Progress {
 public:
  // `live` decides redraw vs plain lines; Progress::ForStderr() picks it with isatty.
  Progress(FILE* out, bool live, bool quiet = false) : out_(out), live_(live), quiet_(quiet) {}
  static Progress ForStderr(bool quiet);
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  Progress(Progress&& other) noexcept : out_(other.out_), live_(other.live_), quiet_(other.quiet_) {}

  void SetPhase(const std::string& phase);
  void SetCandidates(const std::string& candidates);
  void TrialStarted(int index, const std::string& what);
  void TrialFinished(int index, const std::string& what, const std::string& verdict);
  void Note(const std::string& line);  // a line that stays
  void Finish();                       // ends the live line

  bool live() const { return live_; }

 private:
  void RedrawLocked();
  void ClearLocked();

  std::mutex mu_;
  FILE* out_;
  bool live_;
  bool quiet_;
  bool drawn_ = false;
  int done_ = 0;
  int running_ = 0;
  std::string phase_;
  std::string candidates_;
};

}  // namespace crashreplay::bisect
