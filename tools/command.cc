#include "command.h"

#include <cstdio>

#include "absl/strings/numbers.h"

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
    std::fprintf(stderr, "crashreplay %s: %s\nrun 'crashreplay %s --help' for usage\n",
                 app.get_name().c_str(), e.what(), app.get_name().c_str());
    return kExitUsage;
  }
  return std::nullopt;
}

int ReportError(const absl::Status& status) {
  std::fprintf(stderr, "crashreplay: %s\n", std::string(status.message()).c_str());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
      return kExitUsage;
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kResourceExhausted:
      return kExitDataError;
    default:
      return kExitFailed;
  }
}

absl::StatusOr<uint64_t> ParseBytes(const std::string& flag, const std::string& text) {
  std::string digits = text;
  uint64_t mult = 1;
  if (!digits.empty()) {
    switch (digits.back()) {
      case 'K': case 'k': mult = 1ull << 10; break;
      case 'M': case 'm': mult = 1ull << 20; break;
      case 'G': case 'g': mult = 1ull << 30; break;
      case 'T': case 't': mult = 1ull << 40; break;
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

}  // namespace crashreplay::tools
