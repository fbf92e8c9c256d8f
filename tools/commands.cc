// The one table of subcommands. Add a command here and in commands.h's
// declarations; keep the list in the order `--help` should show it.
#include "command.h"
#include "commands_decl.h"

namespace crashreplay::tools {

namespace {
constexpr Command kCommands[] = {
    {"demo", "record, replay and bisect the demo crash end to end", RunDemo},
    {"toggles", "print the configuration toggle table", RunToggles},
    {"make-model", "write a small random HF checkpoint", RunMakeModel},
    {"run", "run the built-in engine on a checkpoint", RunRun},
    {"replay", "replay a recorded step kernel by kernel", RunReplay},
    {"tokenize", "text to token ids and back with a checkpoint's tokenizer", RunTokenize},
    {"sample-capture", "write a small valid two-rank capture session", RunSampleCapture},
    {"info", "summarise a capture file or session directory", RunInfo},
    {"verify", "check every checksum and blob hash of a capture", RunVerify},
    {"coredump", "what a CUDA GPU core dump says: faulting warp, exception, function, grid", RunCoredump},
    {"hash", "per-rank weight-shard hashes of a safetensors checkpoint", RunHash},
    {"bisect", "find the configuration change that causes a failure", RunBisectCommand},
    {"shrink", "the smallest capture that still fails the same way, without the user's prompts", RunShrink},
    {"export-kernel", "one kernel of a replayed step as tensors, parameters and a torch script", RunExportKernel},
    {"version", "print the version", RunVersion},
    {"devices", "list the compiled backends and CUDA devices; --device checks one can run", RunDevices},
};
}  // namespace

std::span<const Command> Commands() { return kCommands; }

}  // namespace crashreplay::tools
