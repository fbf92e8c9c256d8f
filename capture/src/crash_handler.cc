#include "crash_handler.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <typeinfo>

#include <cxxabi.h>

#include "absl/strings/str_cat.h"

namespace crashreplay::capture::internal {
namespace {

constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
constexpr int kNumSignals = sizeof(kSignals) / sizeof(kSignals[0]);

std::atomic<CrashTarget*> g_targets[kMaxTargets];
struct sigaction g_previous[kNumSignals];
std::atomic<bool> g_installed{false};
std::atomic<int> g_in_handler{0};
std::terminate_handler g_previous_terminate = nullptr;
std::mutex g_install_mu;
void* g_alt_stack = nullptr;  // kept reachable: it must outlive any signal

int SignalSlot(int sig) {
  for (int i = 0; i < kNumSignals; ++i) {
    if (kSignals[i] == sig) return i;
  }
  return -1;
}

void FatalSignalHandler(int sig, siginfo_t* info, void* /*context*/) {
  const int saved_errno = errno;
  // Only the first fatal signal writes; a fault inside our own handler (or
  // a second thread crashing at the same time) goes straight to re-raise.
  if (g_in_handler.fetch_add(1) == 0) {
    for (auto& slot : g_targets) {
      CrashTarget* t = slot.load(std::memory_order_acquire);
      if (t != nullptr) t->OnFatalSignal(sig);
    }
  }
  const int i = SignalSlot(sig);
  struct sigaction previous = i >= 0 ? g_previous[i] : (struct sigaction){};
  if (i < 0 || (!(previous.sa_flags & SA_SIGINFO) && previous.sa_handler == SIG_IGN)) {
    previous = {};
    previous.sa_handler = SIG_DFL;
    sigemptyset(&previous.sa_mask);
  }
  sigaction(sig, &previous, nullptr);
  errno = saved_errno;
  // A fault raised by the hardware (si_code > 0) recurs when the faulting
  // instruction is re-executed on return, now under the previous action; a
  // signal sent by kill/raise/abort (si_code <= 0) has to be sent again.
  if (info == nullptr || info->si_code <= 0 || sig == SIGABRT) raise(sig);
}

void TerminateHandler() {
  std::string type = "std::terminate";
  std::string what = "std::terminate called without an active exception";
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      int status = 0;
      char* demangled = abi::__cxa_demangle(typeid(ex).name(), nullptr, nullptr, &status);
      type = demangled != nullptr ? demangled : typeid(ex).name();
      std::free(demangled);
      what = ex.what();
    } catch (...) {
      type = "unknown exception";
      what = "an exception not derived from std::exception escaped";
    }
  }
  for (auto& slot : g_targets) {
    CrashTarget* t = slot.load(std::memory_order_acquire);
    if (t != nullptr) t->OnTerminate(type, "uncaught exception: " + what);
  }
  if (g_previous_terminate != nullptr && g_previous_terminate != TerminateHandler) g_previous_terminate();
  std::abort();
}

void AtExit() {
  for (auto& slot : g_targets) {
    CrashTarget* t = slot.load(std::memory_order_acquire);
    if (t != nullptr) t->OnExit();
  }
}

}  // namespace

const char* FatalSignalName(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGILL: return "SIGILL";
    case SIGFPE: return "SIGFPE";
    case SIGABRT: return "SIGABRT";
    default: return "signal";
  }
}

absl::Status InstallFatalSignalHandlers() {
  std::lock_guard<std::mutex> lock(g_install_mu);
  if (g_installed.load()) return absl::OkStatus();
  // An alternate stack for this thread, so a stack overflow in it can still
  // be recorded. Never freed: it must outlive any signal.
  static constexpr size_t kAltStackBytes = 64 * 1024;
  stack_t ss{};
  g_alt_stack = std::malloc(kAltStackBytes);
  ss.ss_sp = g_alt_stack;
  ss.ss_size = kAltStackBytes;
  ss.ss_flags = 0;
  if (ss.ss_sp != nullptr) sigaltstack(&ss, nullptr);
  for (int i = 0; i < kNumSignals; ++i) {
    struct sigaction sa{};
    sa.sa_sigaction = FatalSignalHandler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    if (sigaction(kSignals[i], &sa, &g_previous[i]) != 0) {
      return absl::ErrnoToStatus(errno, absl::StrCat("installing the handler for ", FatalSignalName(kSignals[i])));
    }
  }
  g_previous_terminate = std::set_terminate(TerminateHandler);
  g_installed.store(true);
  return absl::OkStatus();
}

absl::Status RegisterCrashTarget(CrashTarget* target) {
  static std::once_flag once;
  std::call_once(once, [] { std::atexit(AtExit); });
  for (auto& slot : g_targets) {
    CrashTarget* expected = nullptr;
    if (slot.compare_exchange_strong(expected, target)) return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("more than ", kMaxTargets, " recorders are open in this process; close one first"));
}

void UnregisterCrashTarget(CrashTarget* target) {
  for (auto& slot : g_targets) {
    CrashTarget* expected = target;
    slot.compare_exchange_strong(expected, nullptr);
  }
}

}  // namespace crashreplay::capture::internal
