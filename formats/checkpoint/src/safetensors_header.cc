#include "safetensors_header.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace crashreplay::safetensors_header {
namespace {

using json = nlohmann::json;

class EntrySax final : public nlohmann::json_sax<json> {
 public:
  EntrySax(int max_depth, Entries* out) : max_depth_(max_depth), out_(out) {}

  bool null() override { return Value(json(nullptr)); }
  bool boolean(bool v) override { return Value(json(v)); }
  bool number_integer(number_integer_t v) override { return Value(json(v)); }
  bool number_unsigned(number_unsigned_t v) override { return Value(json(v)); }
  bool number_float(number_float_t v, const string_t&) override { return Value(json(v)); }
  bool string(string_t& v) override { return Value(json(std::move(v))); }
  bool binary(binary_t& v) override { return Value(json::binary(std::move(v))); }
  bool start_object(std::size_t) override { return Open(json::object()); }
  bool start_array(std::size_t) override { return Open(json::array()); }
  bool end_object() override { return Close(); }
  bool end_array() override { return Close(); }

  bool key(string_t& k) override {
    Frame& f = frames_.back();
    // The top level's duplicates are found after the parse, by sorting (no
    // second copy of 100,000 names); an inner object holds a few keys.
    if (frames_.size() > 1) {
      if (std::find(f.keys.begin(), f.keys.end(), k) != f.keys.end()) return Duplicate(k);
      f.keys.push_back(k);
    }
    f.key = std::move(k);
    return true;
  }

  bool Duplicate(const std::string& k) { return Fail(absl::StrCat("key '", k, "' appears twice in one JSON object")); }

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& ex) override {
    if (error_.empty()) error_ = absl::StrCat("malformed JSON: ", ex.what());
    return false;
  }

  const std::string& error() const { return error_; }

 private:
  struct Frame {
    json* value = nullptr;      // the container being filled; null for the top level
    std::vector<std::string> keys;  // keys seen in this (inner) object
    std::string key;            // the key of the next value (objects)
  };

  bool Fail(std::string why) {
    if (error_.empty()) error_ = std::move(why);
    return false;
  }

  // Adds `v` to the innermost open container.
  json* Add(json v) {
    Frame& f = frames_.back();
    if (frames_.size() == 1) {
      out_->emplace_back(std::move(f.key), std::move(v));
      return &out_->back().second;
    }
    if (f.value->is_object()) return &((*f.value)[f.key] = std::move(v));
    f.value->push_back(std::move(v));
    return &f.value->back();
  }

  bool Value(json v) {
    if (frames_.empty()) return Fail(absl::StrCat("the header is a JSON ", v.type_name(), ", expected an object"));
    Add(std::move(v));
    return true;
  }

  bool Open(json container) {
    if (static_cast<int>(frames_.size()) + 1 > max_depth_) {
      return Fail(absl::StrCat("JSON nests deeper than ", max_depth_, " levels; this reader refuses it"));
    }
    if (frames_.empty()) {
      if (!container.is_object()) return Fail("the header is a JSON array, expected an object");
      frames_.emplace_back();
      return true;
    }
    // The top-level list may grow while this value is open only after it
    // closes, and a container is added to only after its open child closed,
    // so the pointer stays valid for the frame's life.
    json* added = Add(std::move(container));
    frames_.push_back(Frame{added, {}, {}});
    return true;
  }

  bool Close() {
    frames_.pop_back();
    return true;
  }

  int max_depth_;
  Entries* out_;
  std::vector<Frame> frames_;
  std::string error_;
};

}  // namespace

absl::StatusOr<Entries> Parse(std::string_view header, const std::string& source, int max_depth) {
  Entries entries;
  EntrySax sax(max_depth, &entries);
  bool ok = false;
  try {
    ok = json::sax_parse(header.begin(), header.end(), &sax, nlohmann::detail::input_format_t::json,
                         /*strict=*/true, /*ignore_comments=*/false);
  } catch (const std::exception& e) {
    // Allocation failure and the like: never let it escape.
    return absl::DataLossError(absl::StrCat(source, ": cannot parse JSON: ", e.what()));
  }
  if (!ok || !sax.error().empty()) {
    return absl::DataLossError(absl::StrCat(source, ": ", sax.error().empty() ? "malformed JSON" : sax.error()));
  }
  std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 1; i < entries.size(); ++i) {
    if (entries[i].first == entries[i - 1].first) {
      return absl::DataLossError(
          absl::StrCat(source, ": key '", entries[i].first, "' appears twice in one JSON object"));
    }
  }
  return entries;
}

}  // namespace crashreplay::safetensors_header
