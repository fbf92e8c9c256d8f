// crashreplay: flight recorder, deterministic replayer and configuration
// bisector for LLM inference crashes. See README.md and docs/cli.md.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>

#include "command.h"
#include "exit_codes.h"

namespace crashreplay::tools {
namespace {

void PrintUsage(FILE* out) {
  std::fprintf(out,
               "usage: crashreplay <command> [options]\n"
               "       crashreplay <command> --help\n\ncommands:\n");
  for (const Command& c : Commands()) {
    std::fprintf(out, "  %-15.*s %.*s\n", static_cast<int>(c.name.size()), c.name.data(),
                 static_cast<int>(c.summary.size()), c.summary.data());
  }
  std::fprintf(out, "\nexit codes: 0 ok, 1 failed/diverged, 2 usage, 3 data error (docs/cli.md)\n");
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::basic_string<size_t> row(b.size() + 1, 0), last(b.size() + 1, 0);
  for (size_t j = 0; j <= b.size(); ++j) last[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t sub = last[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      row[j] = std::min({last[j] + 1, row[j - 1] + 1, sub});
    }
    std::swap(row, last);
  }
  return last[b.size()];
}

int Main(int argc, char** argv) {
  if (argc < 2) {
    PrintUsage(stderr);
    return kExitUsage;
  }
  const std::string_view name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    PrintUsage(stdout);
    return kExitOk;
  }
  if (name == "--version") {
    std::printf("crashreplay %s\n", CRASHREPLAY_VERSION);
    return kExitOk;
  }
  for (const Command& c : Commands()) {
    if (c.name == name) return c.handler(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "crashreplay: unknown command '%s'\n", argv[1]);
  const Command* best = nullptr;
  size_t best_distance = 3;
  for (const Command& c : Commands()) {
    const size_t d = EditDistance(name, c.name);
    if (d < best_distance || (c.name.starts_with(name) && name.size() >= 2)) {
      best = &c;
      best_distance = std::min(d, best_distance);
    }
  }
  if (best != nullptr) {
    std::fprintf(stderr, "did you mean '%.*s'?\n", static_cast<int>(best->name.size()), best->name.data());
  }
  std::fprintf(stderr, "run 'crashreplay --help' for the list of commands\n");
  return kExitUsage;
}

}  // namespace
}  // namespace crashreplay::tools

int main(int argc, char** argv) { return crashreplay::tools::Main(argc, argv); }
