// The one table of subcommands. Add a command here and in commands.h's
// declarations; keep the list in the order `--help` should show it.
#include "command.h"
#include "commands_decl.h"

namespace crashreplay::tools {

namespace {
constexpr Command kCommands[] = {
    {"version", "print the version", RunVersion},
    {"toggles", "print the configuration toggle table", RunToggles},
    {"devices", "list the compiled backends and CUDA devices; --device checks one can run", RunDevices},
    // (capture, replay and bisect commands are added here as they land)
};
}  // namespace

std::span<const Command> Commands() { return kCommands; }

}  // namespace crashreplay::tools
