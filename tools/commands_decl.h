// Handlers of the subcommands, one per cmd_*.cc file.
#pragma once

namespace crashreplay::tools {

int RunVersion(int argc, char** argv);
int RunToggles(int argc, char** argv);
int RunMakeModel(int argc, char** argv);
int RunRun(int argc, char** argv);
int RunReplay(int argc, char** argv);
int RunTokenize(int argc, char** argv);
int RunSampleCapture(int argc, char** argv);
int RunInfo(int argc, char** argv);
int RunVerify(int argc, char** argv);
int RunCoredump(int argc, char** argv);
int RunHash(int argc, char** argv);
int RunBisectCommand(int argc, char** argv);
int RunShrink(int argc, char** argv);
int RunExportKernel(int argc, char** argv);
int RunDevices(int argc, char** argv);
int RunDemo(int argc, char** argv);

}  // namespace crashreplay::tools
