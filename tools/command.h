// The subcommand table of the `crashreplay` executable.
//
// Every subcommand is one entry {name, summary, handler} in kCommands
// (commands.cc), the only list there is: `crashreplay --help` prints it and
// unknown names get a "did you mean". A handler receives argv starting at the
// subcommand's name and returns an ExitCode. Handlers parse their flags with
// CLI11 through ParseArgs, so `--help` goes to stdout and misuse to stderr.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace crashreplay::tools {

using Handler = int (*)(int argc, char** argv);

struct Command {
  std::string_view name;
  std::string_view summary;
  Handler handler;
};

std::span<const Command> Commands();

// Parses argv into `app`. Returns nullopt to continue, or the exit code the
// handler should return right away (0 after --help, kExitUsage on misuse).
std::optional<int> ParseArgs(CLI::App& app, int argc, char** argv);

// Prints "crashreplay: <message>" to stderr and returns the exit code that
// fits the status (kExitDataError for corruption/not-found/unsupported data,
// kExitUsage for invalid arguments, kExitFailed otherwise).
int ReportError(const absl::Status& status);
// An engine that cannot be set up on the configured device (`device=cuda`
// on a build or machine without a usable GPU): the message, and exit
// kExitNoDevice, never a silent fallback to the CPU.
int ReportDeviceError(const absl::Status& status);

// This executable's path (/proc/self/exe), for running its own subcommands
// as child processes; `fallback` when it cannot be read.
std::string SelfPath(const char* fallback);

// A byte count given to `flag`: digits, optionally followed by K, M, G or T
// (powers of 1024). InvalidArgument naming the flag for anything else or 0.
absl::StatusOr<uint64_t> ParseBytes(const std::string& flag, const std::string& text);

// "1,2,3" -> ids; each an int32 (sign allowed: a negative id is data for the
// kernels' checks, not a usage error). InvalidArgument naming `flag`.
absl::StatusOr<std::vector<int32_t>> ParseIds(const std::string& flag, const std::string& text);

}  // namespace crashreplay::tools
