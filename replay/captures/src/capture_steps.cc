#include "capture_steps.h"

#include <charconv>
#include <limits>

#include "crashreplay/base/text.h"
#include "crashreplay/formats/hash.h"

namespace crashreplay::replay::internal {

using text::Cat;

const Toggle* FindRecordedToggle(const SessionManifest& manifest, std::string_view name) {
  for (const Toggle& t : manifest.toggles) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

namespace {

std::optional<int64_t> IntValue(const Toggle* t) {
  if (t == nullptr) return std::nullopt;
  if (const auto* i = std::get_if<int64_t>(&t->value)) return *i;
  if (const auto* s = std::get_if<std::string>(&t->value)) {
    int64_t v = 0;
    auto [p, ec] = std::from_chars(s->data(), s->data() + s->size(), v);
    if (ec == std::errc() && p == s->data() + s->size()) return v;
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<PageUnit> PageUnitOf(const SessionManifest& m) {
  std::string unit = m.engine == "sglang" ? "token" : m.engine == "vllm" ? "block" : "page";
  if (const Toggle* t = FindRecordedToggle(m, m.engine + ".page_table_unit")) {
    if (const auto* s = std::get_if<std::string>(&t->value)) unit = *s;
  }
  PageUnit out;
  if (unit == "page") return out;
  if (unit == "token") {
    out.kind = PageUnit::Kind::kToken;
    return out;
  }
  if (unit != "block") {
    return absl::InvalidArgumentError(
        Cat(m.engine, ".page_table_unit = '", unit, "' is not a unit the replay knows (page, token, block)"));
  }
  out.kind = PageUnit::Kind::kBlock;
  std::optional<int64_t> b = IntValue(FindRecordedToggle(m, m.engine + ".block_size"));
  if (!b) b = IntValue(FindRecordedToggle(m, "cache_config.block_size"));
  if (!b || *b <= 0) {
    return absl::InvalidArgumentError(Cat("the ", m.engine,
                                          " capture records page-table rows of block ids but not the ", "block size (",
                                          m.engine, ".block_size or cache_config.block_size)"));
  }
  out.block = *b;
  return out;
}

std::string PageUnitName(const PageUnit& u) {
  switch (u.kind) {
    case PageUnit::Kind::kPage: return "page ids";
    case PageUnit::Kind::kToken: return "token slots";
    case PageUnit::Kind::kBlock: return Cat("block ids (", u.block, " tokens per block)");
  }
  return "";
}

absl::StatusOr<std::vector<int32_t>> RowPages(const PageUnit& unit, std::span<const int64_t> e, int64_t seq_len,
                                              int page_size, std::string_view where) {
  std::vector<int32_t> out;
  auto to_i32 = [&](int64_t v, int64_t pos) -> absl::StatusOr<int32_t> {
    if (v < 0 || v > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(Cat(where, ": page ", v, " of position ", pos, " is out of range"));
    }
    return static_cast<int32_t>(v);
  };
  if (unit.kind == PageUnit::Kind::kPage) {
    for (size_t j = 0; j < e.size(); ++j) {
      auto p = to_i32(e[j], static_cast<int64_t>(j) * page_size);
      if (!p.ok()) return p.status();
      out.push_back(*p);
    }
    return out;
  }
  if (page_size <= 0) return absl::InvalidArgumentError(Cat(where, ": page_size ", page_size));
  const int64_t b = unit.block;
  const int64_t covered =
      unit.kind == PageUnit::Kind::kToken ? static_cast<int64_t>(e.size()) : static_cast<int64_t>(e.size()) * b;
  if (seq_len < 0 || covered < seq_len) {
    return absl::InvalidArgumentError(
        Cat(where, ": the page-table row covers ", covered, " tokens, the request has ", seq_len));
  }
  auto slot = [&](int64_t pos) -> int64_t {
    return unit.kind == PageUnit::Kind::kToken ? e[pos] : e[pos / b] * b + pos % b;
  };
  const int64_t ps = page_size;
  for (int64_t start = 0; start < seq_len; start += ps) {
    const int64_t first = slot(start);
    if (first < 0 || first % ps != 0) {
      return absl::InvalidArgumentError(Cat(where, ": position ", start, " is in KV slot ", first,
                                            ", which does not start a page of ", ps, " tokens; the recorded rows are ",
                                            "not laid out in pages of this size (replay with the recorded page_size)"));
    }
    const int64_t end = std::min(seq_len, start + ps);
    for (int64_t pos = start + 1; pos < end; ++pos) {
      if (slot(pos) != first + (pos - start)) {
        return absl::InvalidArgumentError(Cat(where, ": position ", pos, " is in KV slot ", slot(pos), ", not ",
                                              first + (pos - start), " as a page of ", ps, " tokens starting at slot ",
                                              first, " needs (replay with the recorded page_size)"));
      }
    }
    auto p = to_i32(first / ps, start);
    if (!p.ok()) return p.status();
    out.push_back(*p);
  }
  return out;
}

int64_t RequestIdNumber(std::string_view id) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(id.data(), id.data() + id.size(), v);
  if (ec == std::errc() && p == id.data() + id.size() && !id.empty() && std::to_string(v) == id) return v;
  return static_cast<int64_t>(XXH64Of(id.data(), id.size()) & 0x7fffffffffffffffull);
}

}  // namespace crashreplay::replay::internal
