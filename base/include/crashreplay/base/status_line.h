// A one-line progress display for long work (loading a checkpoint,
// re-executing a step log, running a step kernel by kernel, writing a
// checkpoint).
//
// On a terminal the line ("replay: re-executing steps  12/40  step 11
// decode") is redrawn in place with "\r\033[K", at most ten times a second
// and never wider than kMaxWidth, and Finish() erases it. Elsewhere (CI logs,
// pipes) nothing is redrawn: a plain line is written when a phase starts,
// each time a tenth of it is done, and when it ends, so a log of a long
// replay stays a few dozen lines. Once a phase with a known total has run
// 2 s, the line ends with the time left at its pace so far ("~1m 20s
// left"). Quiet writes nothing.
//
// Not thread-safe: one thread reports (the engine is serial).
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace crashreplay {

class StatusLine {
 public:
  static constexpr size_t kMaxWidth = 120;

  // `prefix` starts every line ("replay", "make-model").
  StatusLine(FILE* out, bool live, std::string prefix, bool quiet = false)
      : out_(out), live_(live), quiet_(quiet), prefix_(std::move(prefix)) {}
  // Live exactly when stderr is a terminal.
  static StatusLine ForStderr(std::string prefix, bool quiet = false) {
    return StatusLine(stderr, ::isatty(::fileno(stderr)) == 1, std::move(prefix), quiet);
  }
  ~StatusLine() { Finish(); }
  StatusLine(const StatusLine&) = delete;
  StatusLine& operator=(const StatusLine&) = delete;
  StatusLine(StatusLine&& o) noexcept : out_(o.out_), live_(o.live_), quiet_(o.quiet_), prefix_(std::move(o.prefix_)) {
    o.quiet_ = true;
  }

  bool live() const { return live_; }

  // "  ~1m 20s left": the pace of `elapsed_s` seconds over `done` units
  // applied to what remains of `total`; "" before 2 s (the pace says
  // little yet, and short work needs no estimate) or without a total.
  static std::string TimeLeft(double elapsed_s, int64_t done, int64_t total) {
    if (total <= 0 || done <= 0 || done >= total || elapsed_s < 2.0) return "";
    const int64_t left =
        static_cast<int64_t>(elapsed_s * static_cast<double>(total - done) / static_cast<double>(done) + 0.5);
    if (left < 60) return "  ~" + std::to_string(left) + "s left";
    if (left < 3600) return "  ~" + std::to_string(left / 60) + "m " + std::to_string(left % 60) + "s left";
    return "  ~" + std::to_string(left / 3600) + "h " + std::to_string(left % 3600 / 60) + "m left";
  }

  // `done` of `total` units of `phase` are complete (total <= 0: unknown).
  void Update(std::string_view phase, int64_t done, int64_t total, std::string_view detail = "") {
    if (quiet_) return;
    const bool new_phase = phase != phase_;
    if (new_phase) {
      phase_ = std::string(phase);
      last_tenth_ = -1;
      phase_start_ = std::chrono::steady_clock::now();
    }
    const int64_t tenth = total > 0 ? done * 10 / total : -1;
    if (live_) {
      const auto now = std::chrono::steady_clock::now();
      if (!new_phase && done < total && now - last_draw_ < std::chrono::milliseconds(100)) return;
      last_draw_ = now;
      std::string line = Text(done, total, detail);
      if (line.size() > kMaxWidth) line = line.substr(0, kMaxWidth - 3) + "...";
      std::fprintf(out_, "\r\033[K%s", line.c_str());
      std::fflush(out_);
      drawn_ = true;
      return;
    }
    if (!new_phase && tenth == last_tenth_ && done != total) return;
    last_tenth_ = tenth;
    std::fprintf(out_, "%s\n", Text(done, total, detail).c_str());
  }

  // A line that stays (above the live line on a terminal).
  void Note(std::string_view line) {
    if (quiet_) return;
    Clear();
    std::fprintf(out_, "%s: %.*s\n", prefix_.c_str(), static_cast<int>(line.size()), line.data());
  }

  // Erases the live line; nothing to do for plain lines.
  void Finish() {
    if (quiet_) return;
    Clear();
    std::fflush(out_);
  }

 private:
  std::string Text(int64_t done, int64_t total, std::string_view detail) const {
    std::string s = prefix_ + ": " + phase_;
    if (total > 0) {
      s += "  " + std::to_string(done) + "/" + std::to_string(total);
    } else if (done > 0) {
      s += "  " + std::to_string(done);
    }
    if (!detail.empty()) s += "  " + std::string(detail);
    s += Left(done, total);
    return s;
  }
  std::string Left(int64_t done, int64_t total) const {
    return TimeLeft(std::chrono::duration<double>(std::chrono::steady_clock::now() - phase_start_).count(), done,
                    total);
  }
  void Clear() {
    if (live_ && drawn_) {
      std::fputs("\r\033[K", out_);
      drawn_ = false;
    }
  }

  FILE* out_;
  bool live_;
  bool quiet_;
  std::string prefix_;
  std::string phase_;
  int64_t last_tenth_ = -1;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point last_draw_{};
  std::chrono::steady_clock::time_point phase_start_{};
};

}  // namespace crashreplay
