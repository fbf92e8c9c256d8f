#include "command.h"

#include <cstdio>

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

}  // namespace crashreplay::tools
