#include "crashreplay/bisect/delta.h"

#include "absl/strings/str_cat.h"

namespace crashreplay::bisect {

std::vector<Change> Differences(const Config& good, const Config& bad) {
  std::vector<Change> out;
  auto g = good.begin();
  auto b = bad.begin();
  while (g != good.end() || b != bad.end()) {
    if (b == bad.end() || (g != good.end() && g->first < b->first)) {
      out.push_back({g->first, g->second, std::nullopt});
      ++g;
    } else if (g == good.end() || b->first < g->first) {
      out.push_back({b->first, std::nullopt, b->second});
      ++b;
    } else {
      if (!(g->second == b->second) || g->second.ToToml() != b->second.ToToml()) {
        out.push_back({g->first, g->second, b->second});
      }
      ++g;
      ++b;
    }
  }
  return out;
}

Config ApplyChanges(const Config& good, const std::vector<Change>& changes, const ChangeSet& set) {
  Config c = good;
  for (size_t i : set) {
    const Change& ch = changes.at(i);
    if (ch.bad) c[ch.name] = *ch.bad;
    else c.erase(ch.name);
  }
  return c;
}

std::string DescribeChanges(const std::vector<Change>& changes, const ChangeSet& set) {
  std::string out;
  for (size_t i : set) {
    const Change& ch = changes.at(i);
    if (!out.empty()) out += ", ";
    if (ch.bad) absl::StrAppend(&out, ch.name, "=", ch.bad->ToToml());
    else absl::StrAppend(&out, "-", ch.name);
  }
  return out;
}

nlohmann::json ConfigValueToJson(const ConfigValue& v) {
  switch (v.type()) {
    case ConfigValue::Type::kBool: return v.as_bool();
    case ConfigValue::Type::kInt: return v.as_int();
    case ConfigValue::Type::kFloat: return v.as_float();
    case ConfigValue::Type::kString: return v.as_string();
  }
  return nullptr;
}

nlohmann::json ChangesToJson(const std::vector<Change>& changes, const ChangeSet& set) {
  nlohmann::json j = nlohmann::json::object();
  for (size_t i : set) {
    const Change& ch = changes.at(i);
    j[ch.name] = ch.bad ? ConfigValueToJson(*ch.bad) : nlohmann::json(nullptr);
  }
  return j;
}

nlohmann::json ConfigToJson(const Config& config) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : config) j[k] = ConfigValueToJson(v);
  return j;
}

}  // namespace crashreplay::bisect
