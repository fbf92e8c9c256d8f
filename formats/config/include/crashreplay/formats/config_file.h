// Flat configuration files: the `key = value` subset of TOML that
// `--good`/`--bad`, `replay --config`, `--set k=v` and every bisection trial
// share (docs/formats/config.md).
//
// A file holds one `name = value` per line; values are integers, floats,
// booleans or "strings". `#` starts a comment; blank lines are ignored.
// Tables, arrays, dotted keys, inline tables, duplicate names and anything
// else are rejected with a message naming the file and line, because a
// configuration that silently means something else would send a bisection
// after the wrong culprit.
//
// A Config is a plain value type (an ordered map), cheap to copy and compare;
// FormatConfig writes it canonically (sorted names, shortest round-trip
// numbers), so two equal configurations always produce the same bytes and can
// key a cache. All functions are thread-safe (no shared state).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "absl/status/statusor.h"

namespace crashreplay {

class ConfigValue {
 public:
  enum class Type { kBool, kInt, kFloat, kString };

  ConfigValue() : value_(false) {}
  static ConfigValue Bool(bool b) { return ConfigValue(b); }
  static ConfigValue Int(int64_t i) { return ConfigValue(i); }
  static ConfigValue Float(double d) { return ConfigValue(d); }
  static ConfigValue String(std::string s) { return ConfigValue(std::move(s)); }

  Type type() const { return static_cast<Type>(value_.index()); }
  bool is_bool() const { return type() == Type::kBool; }
  bool is_int() const { return type() == Type::kInt; }
  bool is_float() const { return type() == Type::kFloat; }
  bool is_string() const { return type() == Type::kString; }
  bool is_number() const { return is_int() || is_float(); }

  // Accessors; calling the wrong one is a programming error (std::get throws).
  bool as_bool() const { return std::get<bool>(value_); }
  int64_t as_int() const { return std::get<int64_t>(value_); }
  double as_float() const { return std::get<double>(value_); }
  const std::string& as_string() const { return std::get<std::string>(value_); }
  // Integer or float as a double (for numeric searches).
  double as_number() const { return is_int() ? static_cast<double>(as_int()) : as_float(); }

  // The value as TOML writes it: true, 42, 0.95, "text" (escaped).
  std::string ToToml() const;
  // The value as a person types it after `--set k=`: strings unquoted.
  std::string ToDisplay() const;

  friend bool operator==(const ConfigValue&, const ConfigValue&) = default;

 private:
  explicit ConfigValue(bool b) : value_(b) {}
  explicit ConfigValue(int64_t i) : value_(i) {}
  explicit ConfigValue(double d) : value_(d) {}
  explicit ConfigValue(std::string s) : value_(std::move(s)) {}
  std::variant<bool, int64_t, double, std::string> value_;
};

using Config = std::map<std::string, ConfigValue>;

// Parses the text of a configuration file. `source` names it in errors
// ("good.toml:7: ..."). InvalidArgument on any malformed or unsupported line.
absl::StatusOr<Config> ParseConfig(std::string_view text, std::string_view source);

// Reads and parses a file. NotFound if it cannot be opened.
absl::StatusOr<Config> ReadConfigFile(const std::string& path);

// Parses one TOML value ("0.95", "true", "\"flash\""). InvalidArgument if it
// is not a supported scalar.
absl::StatusOr<ConfigValue> ParseConfigValue(std::string_view text);

// Parses `--set name=value`. The value is a TOML scalar; a bare word that is
// not one (`attention_backend=flash_decode`) is taken as a string, since that
// is what a person at a shell means.
absl::StatusOr<std::pair<std::string, ConfigValue>> ParseSetFlag(std::string_view flag);

// Canonical text: a header comment line when `comment` is non-empty, then one
// `name = value` line per entry in name order. ParseConfig(FormatConfig(c)) == c.
std::string FormatConfig(const Config& config, std::string_view comment = "");

// Writes FormatConfig(config) to `path` (replacing it). Internal on I/O error.
absl::Status WriteConfigFile(const std::string& path, const Config& config, std::string_view comment = "");

// True for names a file may use: [A-Za-z0-9_-]+.
bool IsValidConfigName(std::string_view name);

}  // namespace crashreplay
