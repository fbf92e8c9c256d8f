// The crashreplay command's exit codes. They are part of the interface:
// scripts and `git bisect run`-style drivers depend on them (docs/cli.md).
#pragma once

namespace crashreplay::tools {

enum ExitCode : int {
  kExitOk = 0,          // success; for `replay`, the step reproduced exactly
  kExitFailed = 1,      // the thing examined failed: replay failed or diverged
  kExitUsage = 2,       // bad command line or configuration
  kExitDataError = 3,   // corrupt or unreadable input, version mismatch
  kExitNotReproduced = 4,  // bisect: the bad configuration does not fail
  kExitGoodFails = 5,      // bisect: the good configuration fails too
  kExitFlaky = 6,          // bisect: flaky or unjudgeable trials; no culprit claimed
  kExitNoDevice = 7,       // the configuration's device (device=cuda) cannot run here
  kExitUnsupported = 9,    // a valid model or format the engine does not implement
  kExitInterrupted = 130,  // stopped by SIGINT
};

}  // namespace crashreplay::tools
