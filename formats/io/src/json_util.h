// Strict JSON parsing for files that come from outside the process
// (safetensors headers, config.json, index.json). Private to formats/.
//
// nlohmann::json throws; this is the edge where its exceptions become a
// Status. On top of plain parsing it enforces what nlohmann does not:
//   - a nesting depth limit, checked by a linear pre-scan before parsing, so
//     no input can make any later recursive walk (ours or the library's)
//     run deep;
//   - duplicate keys in one object are an error (nlohmann keeps the last one
//     silently, which would let a file smuggle in a second definition).
// Thread-safe (no shared state).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace crashreplay::json_util {

// Parses `text` as one JSON value. `source` names the input in messages
// ("safetensors header of 'x.safetensors'"); `code` is the status code used
// for malformed input (DataLoss for corrupt files, InvalidArgument for
// user-written configs).
absl::StatusOr<nlohmann::json> ParseStrict(std::string_view text, const std::string& source, int max_depth,
                                           absl::StatusCode code);

// The JSON type name ("string", "number", ...) for messages.
const char* TypeName(const nlohmann::json& v);

// Reads a whole (small) text file. NotFound when absent; ResourceExhausted
// when it is larger than `max_bytes`.
absl::StatusOr<std::string> ReadTextFile(const std::string& path, uint64_t max_bytes);

// absl 20220623 as Debian ships it has its own string_view type, which
// std::string_view does not convert to; StrCat arguments go through this.
inline absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace crashreplay::json_util
