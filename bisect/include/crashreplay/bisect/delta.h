// The differences between a good and a bad configuration, as a list of
// changes that can be applied to the good one in any combination.
//
// A change is one toggle: its value in the good configuration and in the bad
// one, either of which may be absent (the toggle is set in only one file).
// Applying a set of changes to the good configuration gives a trial
// configuration; applying all of them gives the bad one. Pure functions over
// values; thread-safe.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "crashreplay/formats/config_file.h"

namespace crashreplay::bisect {

struct Change {
  std::string name;
  std::optional<ConfigValue> good;  // nullopt: not set in the good configuration
  std::optional<ConfigValue> bad;   // nullopt: not set in the bad configuration
};

// Indices into a change list, sorted ascending.
using ChangeSet = std::vector<size_t>;

// Changes in name order (so the search is deterministic).
std::vector<Change> Differences(const Config& good, const Config& bad);

// The good configuration with the given changes applied.
Config ApplyChanges(const Config& good, const std::vector<Change>& changes, const ChangeSet& set);

// "a=1, b=\"x\", -c" (a removed toggle is prefixed with '-').
std::string DescribeChanges(const std::vector<Change>& changes, const ChangeSet& set);

// DescribeChanges when it fits in `max_chars`; otherwise the count and the
// names grouped into runs of neighbours in name order, "512 changes:
// k0000..k0511", cut with "(+N more)" so a 10,000-change set stays one line.
std::string SummarizeChanges(const std::vector<Change>& changes, const ChangeSet& set, size_t max_chars = 160);

// `config` summarized as changes from `good`; "(good configuration)" when equal.
std::string SummarizeConfig(const Config& good, const Config& config, size_t max_chars = 160);

// Indices of `config`'s differences from `good` in `changes` (by name; a
// difference not in `changes` is left out).
ChangeSet ChangeSetOf(const std::vector<Change>& changes, const Config& good, const Config& config);

// {"name": bad value, ...}; a removed toggle maps to null.
nlohmann::json ChangesToJson(const std::vector<Change>& changes, const ChangeSet& set);

nlohmann::json ConfigValueToJson(const ConfigValue& v);
nlohmann::json ConfigToJson(const Config& config);

}  // namespace crashreplay::bisect
