// Handlers of the subcommands, one per cmd_*.cc file.
#pragma once

namespace crashreplay::tools {

int RunVersion(int argc, char** argv);
int RunToggles(int argc, char** argv);
int RunDevices(int argc, char** argv);

}  // namespace crashreplay::tools
