// libFuzzer target: tokenizer.json parsing and encoding.
//
// Property beyond "no crash, no hang": whatever ParseTokenizerJson accepts
// encodes a fixed set of texts (ASCII, multi-byte, whitespace runs) without
// error or with a status, and every id it returns decodes.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "crashreplay/replay/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto t = crashreplay::replay::ParseTokenizerJson(text, "fuzz-tokenizer.json");
  if (!t.ok()) return 0;
  for (std::string_view s : {"Say hello in one sentence", "  a\n\n\tb  ",
                             "Gr\xc3\xbc\xc3\x9f"
                             "e 123456",
                             ""}) {
    auto ids = (*t)->Encode(s, true);
    if (!ids.ok()) continue;
    if (!(*t)->Decode(*ids).ok()) __builtin_trap();
  }
  return 0;
}
