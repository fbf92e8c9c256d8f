// libFuzzer target for the CUDA core dump reader (formats/coredump): any
// bytes must give a Status, never a crash, hang, leak or unbounded
// allocation. A dump that reads is also summarised, which looks up every
// fault's function in the module images and demangles its name.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "crashreplay/formats/coredump/coredump.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  absl::StatusOr<crashreplay::coredump::Coredump> dump = crashreplay::coredump::ReadCoredump(bytes, "fuzz-input");
  if (!dump.ok()) return 0;
  static volatile size_t sink = 0;  // keeps the summary from being optimised away
  for (const std::string& line : crashreplay::coredump::SummaryLines(*dump)) sink = sink + line.size();
  return 0;
}
