// Small string helpers for the replay library. Debian's abseil has its own
// string_view type, so its string functions do not take std::string_view;
// these do. Pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "absl/strings/string_view.h"

namespace crashreplay::text {

inline std::string Piece(std::string_view s) { return std::string(s); }
inline std::string Piece(const char* s) { return std::string(s); }
inline std::string Piece(const std::string& s) { return s; }
inline std::string Piece(absl::string_view s) { return std::string(s.data(), s.size()); }
inline std::string Piece(char c) { return std::string(1, c); }
template <typename T>
  requires std::is_arithmetic_v<T>
std::string Piece(T v) {
  if constexpr (std::is_floating_point_v<T>) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
    return buf;
  } else {
    return std::to_string(v);
  }
}

template <typename... A>
std::string Cat(const A&... a) {
  std::string out;
  (out.append(Piece(a)), ...);
  return out;
}

inline std::string_view Strip(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

inline std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == sep) {
      out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  return out;
}

}  // namespace crashreplay::text
