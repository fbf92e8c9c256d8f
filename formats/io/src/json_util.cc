#include "json_util.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"

namespace crashreplay::json_util {
namespace {

// Deepest [ / { nesting outside strings. Stops early once over `limit`.
int MaxDepth(std::string_view text, int limit) {
  int depth = 0;
  int max_depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) max_depth = depth;
      if (max_depth > limit) return max_depth;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max_depth;
}

}  // namespace

absl::StatusOr<nlohmann::json> ParseStrict(std::string_view text, const std::string& source, int max_depth,
                                           absl::StatusCode code) {
  if (MaxDepth(text, max_depth) > max_depth) {
    return absl::Status(
        code, absl::StrCat(source, ": JSON nests deeper than ", max_depth, " levels; this reader refuses it"));
  }
  // Duplicate-key detection: one key set per open object.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  auto callback = [&](int /*depth*/, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    switch (event) {
      case nlohmann::json::parse_event_t::object_start: open_objects.emplace_back(); break;
      case nlohmann::json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case nlohmann::json::parse_event_t::key:
        if (!open_objects.empty() && parsed.is_string()) {
          const std::string& key = parsed.get_ref<const std::string&>();
          if (!open_objects.back().insert(key).second && duplicate.empty()) duplicate = key;
        }
        break;
      default: break;
    }
    return true;
  };
  nlohmann::json value;
  try {
    value = nlohmann::json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/true,
                                  /*ignore_comments=*/false);
  } catch (const nlohmann::json::exception& e) {
    return absl::Status(code, absl::StrCat(source, ": malformed JSON: ", e.what()));
  } catch (const std::exception& e) {
    // Allocation failure and the like: still never let it escape.
    return absl::Status(code, absl::StrCat(source, ": cannot parse JSON: ", e.what()));
  }
  if (!duplicate.empty()) {
    return absl::Status(code, absl::StrCat(source, ": key '", duplicate, "' appears twice in one JSON object"));
  }
  return value;
}

const char* TypeName(const nlohmann::json& v) {
  if (v.is_number_integer()) return "integer";
  return v.type_name();
}

absl::StatusOr<std::string> ReadTextFile(const std::string& path, uint64_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat("'", path, "' does not exist"));
    return absl::FailedPreconditionError(absl::StrCat("cannot open '", path, "': ", std::strerror(err)));
  }
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot read '", path, "' (not a file?)"));
  }
  if (static_cast<uint64_t>(size) > max_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("'", path, "' is ", size, " bytes; the limit for this file is ", max_bytes));
  }
  in.seekg(0, std::ios::beg);
  std::string text(static_cast<size_t>(size), '\0');
  in.read(text.data(), size);
  if (!in) return absl::DataLossError(absl::StrCat("short read on '", path, "'"));
  return text;
}

}  // namespace crashreplay::json_util
