// Running one command in its own process, with a time and memory limit
// (DESIGN decision 2: a trial that hits a device assert poisons its process,
// so every trial gets a fresh one).
//
// RunProcess forks and execs argv[0] (searched in PATH) in a new process
// group with stdin from /dev/null, captures stdout (the first
// `stdout_limit` bytes) and stderr (the first `stderr_head_limit` and the
// last `stderr_limit` bytes: the first error a program prints is usually the
// cause, the last its final exception), and waits. On timeout or cancellation it sends SIGTERM to the whole group,
// then SIGKILL after `kill_grace_s`. When the main process has exited, any
// member of its group still running is killed, so a trial never leaves
// stragglers behind. An optional memory limit is applied in the child with
// setrlimit(RLIMIT_AS).
//
// Thread-safe: several threads may run processes at once (pipes are
// close-on-exec, so one trial's child never holds another's pipe open). The
// child runs only async-signal-safe calls between fork and exec.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace crashreplay::bisect {

struct ProcessSpec {
  std::vector<std::string> argv;                              // argv[0] searched in PATH
  std::vector<std::pair<std::string, std::string>> env_set;   // added to/overriding environ
  std::string working_dir;                                    // "" = inherit
  std::optional<double> timeout_s;                            // none = no limit
  double kill_grace_s = 2.0;                                  // SIGTERM -> SIGKILL delay
  std::optional<uint64_t> memory_limit_bytes;                 // RLIMIT_AS in the child
  size_t stdout_limit = 16u << 20;                            // keep the first bytes
  size_t stderr_limit = 64u << 10;                            // keep the last bytes
  size_t stderr_head_limit = 64u << 10;                       // and the first bytes
  const std::atomic<bool>* cancel = nullptr;                  // set -> kill the group
};

struct ProcessResult {
  bool started = false;       // false: argv[0] not found / not executable / fork failed
  std::string start_error;    // why it did not start
  bool exited = false;        // exited normally (exit_code valid)
  int exit_code = -1;
  int term_signal = 0;        // signal that ended it, 0 if it exited
  bool timed_out = false;     // we killed it for the time limit
  bool cancelled = false;     // we killed it because `cancel` was set
  double duration_s = 0;
  std::string stdout_text;    // head, at most stdout_limit bytes
  bool stdout_truncated = false;
  std::string stderr_tail;    // tail, at most stderr_limit bytes
  std::string stderr_head;    // head, at most stderr_head_limit bytes
  uint64_t stderr_bytes = 0;  // how much stderr there was in all
};

// All of stderr that was kept, head and tail joined without repeating the
// bytes they share ("\n[...]\n" where bytes were dropped between them).
std::string KeptStderr(const ProcessResult& r);

ProcessResult RunProcess(const ProcessSpec& spec);

// Splits a command line the way a POSIX shell splits words: whitespace
// separates, '...' is literal, "..." allows \" \\ \$ \`, a backslash outside
// quotes escapes the next character. No expansion of any kind.
// InvalidArgument on an unterminated quote.
absl::StatusOr<std::vector<std::string>> SplitCommandLine(std::string_view line);

// Quotes one word for a POSIX shell (left as is when it needs no quoting).
std::string ShellQuote(std::string_view word);
std::string ShellJoin(const std::vector<std::string>& argv);

// "SIGSEGV", "SIGKILL", ... ("signal 42" for unnamed ones).
std::string SignalName(int sig);

}  // namespace crashreplay::bisect
