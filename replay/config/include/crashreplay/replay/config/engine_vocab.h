// Serving engines' own configuration words -> the replay engine's toggles.
//
// A capture recorded by the sglang or vLLM adapter carries the server's
// arguments and kernel-relevant environment under the engine's own names
// (sglang ServerArgs fields such as attention_backend = "dsa",
// dsa_decode_backend = "flashmla_kv", moe_runner_backend = "deep_gemm",
// env.SGLANG_ENABLE_JIT_DEEPGEMM; vLLM's flattened vllm_config such as
// cache_config.cache_dtype). A configuration file may use the same words
// (`engine = "sglang"` as its first key). This table maps each engine
// setting onto the replay engine's kernel variants (the arithmetic) and the
// library kernel it stands for (kernel_archs.h: its supported GPU
// architectures); its kernels' other preconditions (page size, head dims, KV
// dtype) are checks inside the variants themselves.
//
// A value the table does not know is a note naming the setting, never an
// error: the step replays under the rest. `crashreplay toggles --engine NAME`
// prints the table (docs/engines.md).
//
// Thread safety: the table is immutable; functions are pure.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace crashreplay::replay {

class Config;

struct VocabRow {
  std::string_view engine;  // "sglang" or "vllm"
  std::string_view key;     // the engine's name, e.g. "dsa_decode_backend", "env.SGLANG_ENABLE_JIT_DEEPGEMM"
  std::string_view value;   // the engine's value; "*": any value, passed on as "$" in `sets`
  std::vector<std::pair<std::string_view, std::string_view>> sets;  // replay toggle -> value ("$": the engine's)
  std::string_view meaning;                                          // one line: what the engine does with it
};

std::span<const VocabRow> EngineVocabulary();
bool HasVocabulary(std::string_view engine);

// Settings as (key, value text); a value of "None" or "" means unset.
using EngineSettings = std::vector<std::pair<std::string, std::string>>;

struct VocabResult {
  std::vector<std::string> notes;  // values without a counterpart, derived decisions, unset values
  std::vector<std::string> keys;   // the replay toggles that were set
};

// Applies `settings` (the engine's words) to `config` in the table's order,
// so later, more specific settings win (decode_attention_backend over
// attention_backend, dsa_* over nsa_*). `crashreplay.NAME` keys are the
// replay's own toggles. Then the derived decisions the engine makes from
// several settings and the device (sglang: DEEPGEMM_SCALE_UE8M0 from
// SGLANG_ENABLE_JIT_DEEPGEMM and device_arch). InvalidArgument for a value
// outside a replay toggle's domain that the engine's word passes through
// (page_size = -3), naming the key; with `lenient` (a recorded capture) that
// value is a note instead and the toggle keeps its value.
absl::Status ApplyEngineSettings(std::string_view engine, const EngineSettings& settings, Config* config,
                                 VocabResult* result, bool lenient = false);

}  // namespace crashreplay::replay
