// Handlers of the subcommands, one per cmd_*.cc file.
#pragma once

namespace crashreplay::tools {

int RunVersion(int argc, char** argv);
int RunHash(int argc, char** argv);
int RunSampleCapture(int argc, char** argv);
int RunInfo(int argc, char** argv);
int RunVerify(int argc, char** argv);

}  // namespace crashreplay::tools
