// libFuzzer target: config.json and hf_quant_config.json parsing.
//
// Property beyond "no crash": whatever ParseHfConfig accepts, HfConfigToJson
// writes a config that parses back to the same ModelConfig.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "crashreplay/formats/hf_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)crashreplay::ParseHfQuantConfig(text, "fuzz-hf_quant_config.json");
  auto config = crashreplay::ParseHfConfig(text, "fuzz-config.json");
  if (!config.ok()) return 0;
  auto again = crashreplay::ParseHfConfig(crashreplay::HfConfigToJson(*config), "fuzz-config.json");
  if (!again.ok() || !(*again == *config)) __builtin_trap();
  return 0;
}
