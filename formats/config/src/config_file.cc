#include "crashreplay/formats/config_file.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "crashreplay/base/utf8.h"

namespace crashreplay {
namespace {

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}
bool IsSpace(char c) { return c == ' ' || c == '\t'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Parses a basic ("...") string starting at text[0] == '"'. Sets *consumed to
// the length including both quotes. Returns an error message or "".
std::string ParseBasicString(std::string_view text, std::string* out, size_t* consumed) {
  if (text.substr(0, 3) == "\"\"\"") return "multi-line strings (\"\"\") are not supported";
  size_t i = 1;
  while (i < text.size()) {
    const char c = text[i];
    if (c == '"') {
      *consumed = i + 1;
      return "";
    }
    if (static_cast<unsigned char>(c) < 0x20 && c != '\t') {
      return "control character inside a string; write it as an escape";
    }
    if (c != '\\') {
      *out += c;
      ++i;
      continue;
    }
    if (i + 1 >= text.size()) break;
    const char e = text[i + 1];
    i += 2;
    switch (e) {
      case '"': *out += '"'; break;
      case '\\': *out += '\\'; break;
      case 'b': *out += '\b'; break;
      case 't': *out += '\t'; break;
      case 'n': *out += '\n'; break;
      case 'f': *out += '\f'; break;
      case 'r': *out += '\r'; break;
      case 'u':
      case 'U': {
        const size_t digits = e == 'u' ? 4 : 8;
        if (i + digits > text.size()) return "truncated \\u escape";
        uint32_t cp = 0;
        for (size_t k = 0; k < digits; ++k) {
          const char h = text[i + k];
          uint32_t v;
          if (h >= '0' && h <= '9')
            v = h - '0';
          else if (h >= 'a' && h <= 'f')
            v = h - 'a' + 10;
          else if (h >= 'A' && h <= 'F')
            v = h - 'A' + 10;
          else
            return "bad hex digit in \\u escape";
          cp = cp * 16 + v;
        }
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return "\\u escape is not a Unicode scalar value";
        AppendUtf8(*out, cp);
        i += digits;
        break;
      }
      default: return absl::StrFormat("unknown escape '\\%c' in string", e);
    }
  }
  return "unterminated string (strings end on the same line)";
}

// Validates TOML's decimal digit runs: digits, single underscores between digits.
bool ValidDigits(std::string_view s, bool allow_leading_zero) {
  if (s.empty() || !IsDigit(s.front()) || !IsDigit(s.back())) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_') {
      if (!IsDigit(s[i - 1]) || !IsDigit(s[i + 1])) return false;
    } else if (!IsDigit(s[i])) {
      return false;
    }
  }
  if (!allow_leading_zero && s.size() > 1 && s[0] == '0') return false;
  return true;
}

std::string StripUnderscores(std::string_view s) {
  std::string r;
  for (char c : s)
    if (c != '_') r += c;
  return r;
}

// Parses an unquoted token (number, boolean, inf/nan). Returns error or "".
std::string ParseBareToken(std::string_view tok, ConfigValue* out) {
  if (tok == "true") {
    *out = ConfigValue::Bool(true);
    return "";
  }
  if (tok == "false") {
    *out = ConfigValue::Bool(false);
    return "";
  }
  if (tok == "inf" || tok == "+inf") {
    *out = ConfigValue::Float(INFINITY);
    return "";
  }
  if (tok == "-inf") {
    *out = ConfigValue::Float(-INFINITY);
    return "";
  }
  if (tok == "nan" || tok == "+nan" || tok == "-nan") {
    *out = ConfigValue::Float(NAN);
    return "";
  }
  if (tok.empty()) return "missing value after '='";
  const std::string bad =
      absl::StrCat("'", std::string(tok), "' is not a supported value (integer, float, true/false or \"string\")");
  // Hex, octal, binary integers.
  if (tok.size() > 2 && tok[0] == '0' && (tok[1] == 'x' || tok[1] == 'o' || tok[1] == 'b')) {
    const int base = tok[1] == 'x' ? 16 : tok[1] == 'o' ? 8 : 2;
    const std::string digits = StripUnderscores(tok.substr(2));
    int64_t v = 0;
    auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v, base);
    if (ec == std::errc::result_out_of_range)
      return absl::StrCat("integer '", std::string(tok), "' does not fit in 64 bits");
    if (ec != std::errc() || p != digits.data() + digits.size() || tok.back() == '_') return bad;
    *out = ConfigValue::Int(v);
    return "";
  }
  std::string_view body = tok;
  if (body[0] == '+' || body[0] == '-') body.remove_prefix(1);
  // Split into integer part, fraction, exponent.
  size_t end_int = 0;
  while (end_int < body.size() && (IsDigit(body[end_int]) || body[end_int] == '_')) ++end_int;
  std::string_view int_part = body.substr(0, end_int);
  std::string_view rest = body.substr(end_int);
  bool is_float = false;
  if (!rest.empty() && rest[0] == '.') {
    is_float = true;
    size_t e = 1;
    while (e < rest.size() && (IsDigit(rest[e]) || rest[e] == '_')) ++e;
    if (!ValidDigits(rest.substr(1, e - 1), true)) return bad;
    rest.remove_prefix(e);
  }
  if (!rest.empty() && (rest[0] == 'e' || rest[0] == 'E')) {
    is_float = true;
    std::string_view exp = rest.substr(1);
    if (!exp.empty() && (exp[0] == '+' || exp[0] == '-')) exp.remove_prefix(1);
    if (!ValidDigits(exp, true)) return bad;
    rest = {};
  }
  if (!rest.empty() || !ValidDigits(int_part, false)) return bad;
  const std::string clean = StripUnderscores(tok[0] == '+' ? tok.substr(1) : tok);
  if (is_float) {
    errno = 0;
    char* endp = nullptr;
    const double d = std::strtod(clean.c_str(), &endp);
    if (endp != clean.c_str() + clean.size()) return bad;
    if (errno == ERANGE && std::isinf(d)) return absl::StrCat("float '", std::string(tok), "' is out of range");
    *out = ConfigValue::Float(d);
    return "";
  }
  int64_t v = 0;
  auto [p, ec] = std::from_chars(clean.data(), clean.data() + clean.size(), v);
  if (ec == std::errc::result_out_of_range)
    return absl::StrCat("integer '", std::string(tok), "' does not fit in 64 bits");
  if (ec != std::errc() || p != clean.data() + clean.size()) return bad;
  *out = ConfigValue::Int(v);
  return "";
}

// Parses the value at the start of `text`; *consumed is its length. Returns
// an error message or "".
std::string ParseValuePrefix(std::string_view text, ConfigValue* out, size_t* consumed) {
  if (text.empty() || text[0] == '#') return "missing value after '='";
  const char c = text[0];
  if (c == '[') return "arrays are not supported: configuration files are flat (one scalar per name)";
  if (c == '{') return "inline tables are not supported: configuration files are flat (one scalar per name)";
  if (c == '"') {
    std::string s;
    std::string err = ParseBasicString(text, &s, consumed);
    if (!err.empty()) return err;
    *out = ConfigValue::String(std::move(s));
    return "";
  }
  if (c == '\'') {
    if (text.substr(0, 3) == "'''") return "multi-line strings (''') are not supported";
    const size_t close = text.find('\'', 1);
    if (close == std::string_view::npos) return "unterminated string (strings end on the same line)";
    *out = ConfigValue::String(std::string(text.substr(1, close - 1)));
    *consumed = close + 1;
    return "";
  }
  size_t n = 0;
  while (n < text.size() && !IsSpace(text[n]) && text[n] != '#') ++n;
  std::string_view tok = text.substr(0, n);
  if (tok.size() >= 10 && IsDigit(tok[0]) && tok[4] == '-') {
    return absl::StrCat("dates and times ('", std::string(tok), "') are not supported; quote it as a string");
  }
  std::string err = ParseBareToken(tok, out);
  if (!err.empty()) return err;
  *consumed = n;
  return "";
}

std::string TrimLine(std::string_view line) {
  size_t b = 0, e = line.size();
  while (b < e && IsSpace(line[b])) ++b;
  while (e > b && (IsSpace(line[e - 1]) || line[e - 1] == '\r')) --e;
  return std::string(line.substr(b, e - b));
}

}  // namespace

std::string ConfigValue::ToToml() const {
  switch (type()) {
    case Type::kBool: return as_bool() ? "true" : "false";
    case Type::kInt: return absl::StrCat(as_int());
    case Type::kFloat: {
      const double d = as_float();
      if (std::isnan(d)) return "nan";
      if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
      char buf[64];
      auto [p, ec] = std::to_chars(buf, buf + sizeof(buf), d);
      std::string s(buf, ec == std::errc() ? p : buf);
      // Keep it a float when read back: "1" would come back as an integer.
      if (s.find_first_of(".eE") == std::string::npos) s += ".0";
      return s;
    }
    case Type::kString: {
      std::string out = "\"";
      for (unsigned char ch : as_string()) {
        switch (ch) {
          case '"': out += "\\\""; break;
          case '\\': out += "\\\\"; break;
          case '\n': out += "\\n"; break;
          case '\t': out += "\\t"; break;
          case '\r': out += "\\r"; break;
          default:
            if (ch < 0x20 || ch == 0x7F)
              out += absl::StrFormat("\\u%04X", ch);
            else
              out += static_cast<char>(ch);
        }
      }
      return out + "\"";
    }
  }
  return "";
}

std::string ConfigValue::ToDisplay() const { return is_string() ? as_string() : ToToml(); }

// Bare-name segments joined by single dots: `page_size`, `env.SGLANG_ENABLE_JIT_DEEPGEMM`,
// `cache_config.block_size` (one flat name, as the engines' adapters record them).
bool IsValidConfigName(std::string_view name) {
  if (name.empty() || name.front() == '.' || name.back() == '.') return false;
  for (size_t i = 0; i < name.size(); ++i) {
    if (name[i] == '.' && name[i + 1] == '.') return false;
    if (name[i] != '.' && !IsNameChar(name[i])) return false;
  }
  return true;
}

absl::StatusOr<ConfigValue> ParseConfigValue(std::string_view text) {
  const std::string t = TrimLine(text);
  ConfigValue v;
  size_t consumed = 0;
  std::string err = ParseValuePrefix(t, &v, &consumed);
  if (err.empty() && consumed != t.size())
    err = absl::StrCat("unexpected text after the value: '", t.substr(consumed), "'");
  if (!err.empty()) return absl::InvalidArgumentError(err);
  return v;
}

absl::StatusOr<Config> ParseConfig(std::string_view text, std::string_view source) {
  Config config;
  std::map<std::string, size_t> line_of;
  size_t line_no = 0;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    const std::string line = TrimLine(text.substr(pos, nl - pos));
    ++line_no;
    pos = nl + 1;
    auto fail = [&](std::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat(std::string(source), ":", line_no, ": ", std::string(why)));
    };
    if (line.empty() || line[0] == '#') continue;
    if (line[0] == '[') {
      return fail("tables ([section]) are not supported: configuration files are flat `name = value` lines");
    }
    if (line[0] == '"' || line[0] == '\'') return fail("quoted names are not supported; use a bare name [A-Za-z0-9_-]");
    size_t i = 0;
    while (i < line.size() && (IsNameChar(line[i]) || line[i] == '.')) ++i;
    const std::string name = line.substr(0, i);
    while (i < line.size() && IsSpace(line[i])) ++i;
    if (name.empty()) return fail(absl::StrCat("expected `name = value`, found '", line, "'"));
    if (!IsValidConfigName(name)) {
      return fail(absl::StrCat("'", name, "' is not a valid name (bare segments [A-Za-z0-9_-] joined by single dots)"));
    }
    if (i >= line.size() || line[i] != '=') {
      return fail(absl::StrCat("expected '=' after '", name, "' (names use [A-Za-z0-9_-])"));
    }
    ++i;
    while (i < line.size() && IsSpace(line[i])) ++i;
    ConfigValue value;
    size_t consumed = 0;
    std::string err = ParseValuePrefix(std::string_view(line).substr(i), &value, &consumed);
    if (!err.empty()) return fail(absl::StrCat("'", name, "': ", err));
    i += consumed;
    while (i < line.size() && IsSpace(line[i])) ++i;
    if (i < line.size() && line[i] != '#') {
      return fail(absl::StrCat("'", name, "': unexpected text after the value: '", line.substr(i), "'"));
    }
    if (auto it = line_of.find(name); it != line_of.end()) {
      return fail(absl::StrCat("duplicate name '", name, "' (first set on line ", it->second, ")"));
    }
    line_of[name] = line_no;
    config[name] = std::move(value);
    if (nl == text.size()) break;
  }
  return config;
}

absl::StatusOr<Config> ReadConfigFile(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return absl::InvalidArgumentError(absl::StrCat("configuration file '", path, "' is a directory"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open configuration file '", path, "'"));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading configuration file '", path, "'"));
  return ParseConfig(ss.str(), path);
}

absl::StatusOr<std::pair<std::string, ConfigValue>> ParseSetFlag(std::string_view flag) {
  const size_t eq = flag.find('=');
  if (eq == std::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("--set '", std::string(flag), "': expected name=value"));
  }
  std::string name = TrimLine(flag.substr(0, eq));
  if (!IsValidConfigName(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--set '", std::string(flag), "': '", name,
                     "' is not a valid name (bare segments [A-Za-z0-9_-] joined by single dots)"));
  }
  const std::string raw = TrimLine(flag.substr(eq + 1));
  if (raw.empty())
    return absl::InvalidArgumentError(absl::StrCat("--set '", std::string(flag), "': missing value after '='"));
  absl::StatusOr<ConfigValue> v = ParseConfigValue(raw);
  if (v.ok()) return std::make_pair(std::move(name), *std::move(v));
  if (raw[0] == '"' || raw[0] == '\'' || raw[0] == '[' || raw[0] == '{') {
    return absl::InvalidArgumentError(absl::StrCat("--set '", std::string(flag), "': ", v.status().message()));
  }
  return std::make_pair(std::move(name), ConfigValue::String(raw));
}

std::string FormatConfig(const Config& config, std::string_view comment) {
  std::string out;
  if (!comment.empty()) {
    size_t pos = 0;
    while (pos <= comment.size()) {
      size_t nl = comment.find('\n', pos);
      if (nl == std::string_view::npos) nl = comment.size();
      absl::StrAppend(&out, "# ", std::string(comment.substr(pos, nl - pos)), "\n");
      pos = nl + 1;
    }
  }
  for (const auto& [name, value] : config) absl::StrAppend(&out, name, " = ", value.ToToml(), "\n");
  return out;
}

absl::Status WriteConfigFile(const std::string& path, const Config& config, std::string_view comment) {
  const std::string text = FormatConfig(config, comment);
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return absl::InternalError(absl::StrCat("cannot write configuration file '", path, "'"));
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) {
    return absl::InternalError(absl::StrCat("error writing configuration file '", path, "'"));
  }
  return absl::OkStatus();
}

}  // namespace crashreplay
