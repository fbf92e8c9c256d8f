// The JSON header of a safetensors file, parsed strictly in one linear pass.
// Private to formats/.
//
// A header maps each tensor name to a small object, and a large checkpoint
// shard holds tens of thousands of them. json_util::ParseStrict (a DOM parse
// with a callback that catches duplicate keys) is quadratic in that number:
// nlohmann's callback parser scans the parent object for discarded values
// each time a child object closes (16k tensors: 3.7 s, 32k: 53 s). This
// parser uses nlohmann's SAX interface instead: each top-level value becomes
// its own small DOM and the top level stays a list, so the work is linear in
// the header's size. It enforces what ParseStrict does: well-formed JSON
// (UTF-8 included), no key twice in one object, nesting at most `max_depth`.
// Thread-safe (no shared state).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace crashreplay::safetensors_header {

using Entries = std::vector<std::pair<std::string, nlohmann::json>>;

// The members of the header's top-level object, sorted by name. DataLoss
// naming `source` for malformed JSON, a duplicate key, too deep a nesting or
// a top level that is not an object.
absl::StatusOr<Entries> Parse(std::string_view header, const std::string& source, int max_depth);

}  // namespace crashreplay::safetensors_header
