#include <cstdio>

#include "command.h"
#include "commands_decl.h"
#include "exit_codes.h"

namespace crashreplay::tools {

int RunVersion(int argc, char** argv) {
  CLI::App app("Print the crashreplay version.", "version");
  if (auto rc = ParseArgs(app, argc, argv)) return *rc;
  std::printf("crashreplay %s\n", CRASHREPLAY_VERSION);
  return kExitOk;
}

}  // namespace crashreplay::tools
