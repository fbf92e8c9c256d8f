#include "command.h"

#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "crashreplay/formats/hf_config.h"

#include "exit_codes.h"

namespace crashreplay::tools {

std::optional<int> ParseArgs(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    std::fputs(app.help().c_str(), stdout);
    return kExitOk;
  } catch (const CLI::CallForAllHelp& e) {
    std::fputs(app.help("", CLI::AppFormatMode::All).c_str(), stdout);
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "crashreplay %s: %s\nrun 'crashreplay %s --help' for usage\n", app.get_name().c_str(),
                 e.what(), app.get_name().c_str());
    return kExitUsage;
  }
  return std::nullopt;
}

// On a terminal a progress line (base/status_line.h) may be drawn: erase it
// so the message starts on a clean line.
void ClearStatusLine() {
  if (::isatty(::fileno(stderr)) == 1) std::fputs("\r\033[K", stderr);
}

int ReportError(const absl::Status& status) {
  ClearStatusLine();
  std::fprintf(stderr, "crashreplay: %s\n", std::string(status.message()).c_str());
  if (IsUnsupportedModel(status)) return kExitUnsupported;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument: return kExitUsage;
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kResourceExhausted: return kExitDataError;
    default: return kExitFailed;
  }
}

int ReportDeviceError(const absl::Status& status) {
  ClearStatusLine();
  std::fprintf(stderr, "crashreplay: %s\n", std::string(status.message()).c_str());
  return kExitNoDevice;
}

absl::StatusOr<uint64_t> ParseBytes(const std::string& flag, const std::string& text) {
  std::string digits = text;
  uint64_t mult = 1;
  if (!digits.empty()) {
    switch (digits.back()) {
      case 'K':
      case 'k': mult = 1ull << 10; break;
      case 'M':
      case 'm': mult = 1ull << 20; break;
      case 'G':
      case 'g': mult = 1ull << 30; break;
      case 'T':
      case 't': mult = 1ull << 40; break;
      default: break;
    }
    if (mult != 1) digits.pop_back();
  }
  uint64_t v = 0;
  if (!absl::SimpleAtoi(digits, &v) || v == 0) {
    return absl::InvalidArgumentError(flag + " '" + text + "': expected bytes, e.g. 8G or 8589934592");
  }
  return v * mult;
}

absl::StatusOr<std::vector<int32_t>> ParseIds(const std::string& flag, const std::string& text) {
  std::vector<int32_t> ids;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    const std::string piece = text.substr(start, comma - start);
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(piece.c_str(), &end, 10);
    if (piece.empty() || *end != '\0' || errno == ERANGE || v < INT32_MIN || v > INT32_MAX) {
      return absl::InvalidArgumentError(flag + " expects comma-separated 32-bit integers, got '" + text + "'");
    }
    ids.push_back(static_cast<int32_t>(v));
    start = comma + 1;
  }
  return ids;
}

std::string SelfPath(const char* fallback) {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n > 0) return std::string(buf, static_cast<size_t>(n));
  return fallback;
}

}  // namespace crashreplay::tools
