// `crashreplay verify CAPTURE`: checks every frame checksum and every blob
// hash of a capture file or of each rank file of a session directory.
// Exit 0 when all hold (a capture that was never closed still verifies: its
// records are intact, it just ends early); 3 with a message naming the
// first bad record and its byte offset otherwise.
#include <cstdio>
#include <string>
#include <vector>

#include "command.h"
#include "commands_decl.h"
#include "crashreplay/formats/capture_reader.h"
#include "exit_codes.h"

namespace crashreplay::tools {

int RunVerify(int argc, char** argv) {
  CLI::App app(
      "Check every checksum and blob hash of a capture file or session directory.\n"
      "Exit 0 when all hold, 3 naming the first bad record and its byte offset.",
      "verify");
  std::string path;
  bool quiet = false;
  app.add_option("CAPTURE", path, "a .crcap file or a session directory")->required();
  app.add_flag("-q,--quiet", quiet, "print nothing when the capture verifies");
  if (auto rc = ParseArgs(app, argc, argv)) return *rc;

  absl::StatusOr<std::vector<std::string>> files = ListCaptureFiles(path);
  if (!files.ok()) return ReportError(files.status());
  int rc = kExitOk;
  for (const std::string& f : *files) {
    absl::StatusOr<std::unique_ptr<CaptureReader>> r = CaptureReader::Open(f);
    if (!r.ok()) {
      rc = ReportError(r.status());
      continue;
    }
    const VerifyResult v = (*r)->Verify();
    if (!v.status.ok()) {
      std::fprintf(stderr,
                   "crashreplay verify: %s: first bad record is #%llu at byte offset %llu\n"
                   "  %s\n"
                   "  the %llu records before it are intact ('crashreplay info %s' shows them)\n",
                   f.c_str(), static_cast<unsigned long long>(v.bad_record.value_or(0)),
                   static_cast<unsigned long long>(v.bad_offset), std::string(v.status.message()).c_str(),
                   static_cast<unsigned long long>(v.bad_record.value_or(0)), f.c_str());
      rc = kExitDataError;
      continue;
    }
    if (!quiet) {
      const CaptureSummary s = (*r)->Summary();
      std::printf("%s: ok: %llu records, %llu blobs verified%s\n", f.c_str(),
                  static_cast<unsigned long long>(v.records_checked), static_cast<unsigned long long>(v.blobs_checked),
                  s.ok ? "" : " (not closed cleanly: the recorder stopped before its end record)");
    }
  }
  return rc;
}

}  // namespace crashreplay::tools
