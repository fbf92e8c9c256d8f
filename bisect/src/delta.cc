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
    if (ch.bad)
      c[ch.name] = *ch.bad;
    else
      c.erase(ch.name);
  }
  return c;
}

std::string DescribeChanges(const std::vector<Change>& changes, const ChangeSet& set) {
  std::string out;
  for (size_t i : set) {
    const Change& ch = changes.at(i);
    if (!out.empty()) out += ", ";
    if (ch.bad)
      absl::StrAppend(&out, ch.name, "=", ch.bad->ToToml());
    else
      absl::StrAppend(&out, "-", ch.name);
  }
  return out;
}

std::string SummarizeChanges(const std::vector<Change>& changes, const ChangeSet& set, size_t max_chars) {
  if (set.size() <= 64) {
    std::string full = DescribeChanges(changes, set);
    if (full.size() <= max_chars) return full;
  }
  std::string out = absl::StrCat(set.size(), set.size() == 1 ? " change: " : " changes: ");
  const size_t budget = out.size() + max_chars;
  size_t i = 0;
  size_t shown = 0;
  while (i < set.size()) {
    size_t j = i;
    while (j + 1 < set.size() && set[j + 1] == set[j] + 1) ++j;
    const std::string& first = changes.at(set[i]).name;
    std::string run = j == i ? first : absl::StrCat(first, j == i + 1 ? ", " : "..", changes.at(set[j]).name);
    if (shown > 0 && out.size() + run.size() + 2 > budget) {
      absl::StrAppend(&out, " (+", set.size() - i, " more)");
      return out;
    }
    absl::StrAppend(&out, shown > 0 ? ", " : "", run);
    shown += j - i + 1;
    i = j + 1;
  }
  return out;
}

std::string SummarizeConfig(const Config& good, const Config& config, size_t max_chars) {
  const std::vector<Change> d = Differences(good, config);
  if (d.empty()) return "(good configuration)";
  ChangeSet all(d.size());
  for (size_t i = 0; i < d.size(); ++i) all[i] = i;
  return SummarizeChanges(d, all, max_chars);
}

ChangeSet ChangeSetOf(const std::vector<Change>& changes, const Config& good, const Config& config) {
  ChangeSet out;
  for (size_t i = 0; i < changes.size(); ++i) {
    const Change& c = changes[i];
    auto it = config.find(c.name);
    const bool applied = c.bad ? (it != config.end() && it->second == *c.bad && it->second.ToToml() == c.bad->ToToml())
                               : it == config.end();
    const bool as_good = c.good
                             ? (it != config.end() && it->second == *c.good && it->second.ToToml() == c.good->ToToml())
                             : it == config.end();
    if (applied && !as_good) out.push_back(i);
  }
  (void)good;  // the changes were computed against it
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
