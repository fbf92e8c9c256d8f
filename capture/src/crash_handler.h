// Process-wide fatal-signal handling for recorders (internal).
//
// InstallFatalSignalHandlers() installs, once per process, handlers for
// SIGSEGV, SIGBUS, SIGILL, SIGFPE and SIGABRT with SA_SIGINFO | SA_ONSTACK,
// keeping the previous actions. It also gives the installing thread an
// alternate signal stack (sigaltstack is per thread; other threads run the
// handler on their own stack), and sets a std::terminate handler that
// records the escaping exception's text through the targets' normal
// failure path before the default terminate (abort) runs.
//
// On a fatal signal the handler calls OnFatalSignal() of every registered
// target (async-signal-safe code only: write(2), atomics, nanosleep), then
// restores the previous action (SIG_DFL when it was SIG_IGN) and re-raises,
// so the process dies as it would have without us, or the previous handler
// (Python's faulthandler, the engine's own) runs next.
//
// Thread safety: Register/Unregister may be called from any thread; the
// registry is a fixed array of atomic pointers (kMaxTargets).
#pragma once

#include <string>

#include "absl/status/status.h"

namespace crashreplay::capture::internal {

class CrashTarget {
 public:
  virtual ~CrashTarget() = default;
  // Async-signal context: no locks, no allocation.
  virtual void OnFatalSignal(int sig) noexcept = 0;
  // Ordinary context (std::terminate): may allocate and lock.
  virtual void OnTerminate(const std::string& exception_type, const std::string& what) = 0;
  // At exit(): close cleanly.
  virtual void OnExit() = 0;
};

inline constexpr int kMaxTargets = 16;

absl::Status InstallFatalSignalHandlers();
// Registers at exit() closing as well (atexit, once per process).
absl::Status RegisterCrashTarget(CrashTarget* target);
void UnregisterCrashTarget(CrashTarget* target);

// "SIGSEGV" etc.; "signal" for others. Async-signal-safe.
const char* FatalSignalName(int sig);

}  // namespace crashreplay::capture::internal
