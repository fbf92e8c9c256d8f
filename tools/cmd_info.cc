// `crashreplay info CAPTURE [--json]`: what a capture file or a session
// directory holds. Exit 0 when every file could be summarised, including
// crash captures that were never closed (ok=false) and torn or corrupt ones
// (the summary says so; `verify` gives the verdict); 3 when a file cannot
// be read at all (not a capture, header corrupt, newer major version).
#include <cstdint>
#include <cstdio>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "command.h"
#include "commands_decl.h"
#include "crashreplay/formats/capture_reader.h"
#include "crashreplay/formats/fingerprint.h"
#include "exit_codes.h"
#include "gpu_fault.h"

namespace crashreplay::tools {
namespace {

// K, the steps a full pass over the weights takes: the recorder learns it
// only after the weights are registered (after the manifest was written),
// so the latest WeightCheckRecord says it; the manifest's value is the
// fallback.
uint32_t WeightCheckPeriod(const CaptureReader& r) {
  if (!r.weight_checks().empty() && r.weight_checks().back().period_steps > 0) {
    return r.weight_checks().back().period_steps;
  }
  return r.manifest().has_value() ? r.manifest()->weight_check_period_steps : 0;
}

std::string HumanBytes(uint64_t n) {
  if (n < 10 * 1024) return absl::StrFormat("%d B", n);
  if (n < 10ull * 1024 * 1024) return absl::StrFormat("%.1f KiB", n / 1024.0);
  if (n < 10ull << 30) return absl::StrFormat("%.1f MiB", n / 1048576.0);
  return absl::StrFormat("%.1f GiB", n / 1073741824.0);
}

// Fingerprints (format 2.1): per step, the first boundary whose tensor held a
// NaN or Inf and, for a step that did not finish, the last boundary that did
// and the one a finished step ran next (which never ran).
struct StepFingerprints {
  const FingerprintRecord* record = nullptr;
  const Fingerprint* first_nonfinite = nullptr;
  std::string never_ran;  // incomplete records: the boundary after the last one, from a complete step
};

std::vector<StepFingerprints> FingerprintSteps(const CaptureReader& r) {
  std::vector<StepFingerprints> out;
  const FingerprintRecord* complete = nullptr;
  for (const FingerprintRecord& fr : r.fingerprints()) {
    if (fr.complete) complete = &fr;
  }
  for (const FingerprintRecord& fr : r.fingerprints()) {
    StepFingerprints s;
    s.record = &fr;
    for (const Fingerprint& f : fr.fingerprints) {
      if (f.nonfinite() > 0) {
        s.first_nonfinite = &f;
        break;
      }
    }
    if (!fr.complete && !fr.fingerprints.empty() && complete != nullptr) {
      const std::vector<Fingerprint>& order = complete->fingerprints;
      for (size_t i = 0; i + 1 < order.size(); ++i) {
        if (order[i].name == fr.fingerprints.back().name) s.never_ran = order[i + 1].name;
      }
    }
    out.push_back(s);
  }
  return out;
}

nlohmann::json NonFiniteJson(const Fingerprint& f) {
  nlohmann::json j = {{"boundary", f.name},   {"dtype", f.dtype},     {"nan", f.nan},
                      {"pos_inf", f.pos_inf}, {"neg_inf", f.neg_inf}, {"numel", f.numel}};
  if (f.first_nonfinite_token >= 0) {
    j["token"] = f.first_nonfinite_token;
    j["column"] = f.first_nonfinite_column;
  }
  return j;
}

nlohmann::json FingerprintsJson(const CaptureReader& r) {
  nlohmann::json a = nlohmann::json::array();
  for (const StepFingerprints& s : FingerprintSteps(r)) {
    nlohmann::json j = {{"step", s.record->step},
                        {"rank", s.record->rank},
                        {"complete", s.record->complete},
                        {"source", s.record->source},
                        {"boundaries", s.record->fingerprints.size()}};
    j["first_nonfinite"] = s.first_nonfinite ? NonFiniteJson(*s.first_nonfinite) : nlohmann::json();
    if (!s.record->complete) {
      j["last_boundary"] = s.record->fingerprints.empty() ? "" : s.record->fingerprints.back().name;
      if (!s.never_ran.empty()) j["never_ran"] = s.never_ran;
    }
    a.push_back(std::move(j));
  }
  return a;
}

nlohmann::json FileJson(const CaptureReader& r) {
  const CaptureSummary s = r.Summary();
  nlohmann::json j = {
      {"path", s.path},
      {"format", absl::StrFormat("%d.%d", s.format_major, s.format_minor)},
      {"ok", s.ok},
      {"truncated", s.truncated},
      {"corrupt", s.corrupt},
      {"steps", s.steps},
      {"step_stored_bytes", s.step_stored_bytes},
      {"step_raw_bytes", s.step_raw_bytes},
      {"ranks", s.ranks},
      {"records", s.records},
      {"blobs", s.blobs},
      {"blob_raw_bytes", s.blob_raw_bytes},
      {"blob_stored_bytes", s.blob_stored_bytes},
      {"bytes", s.bytes},
      {"snapshots", s.snapshots},
      {"failures", s.failures},
      {"weight_checks", s.weight_checks},
      {"corrupt_weight_slices", s.corrupt_weight_slices},
      {"snapshots_dropped", s.snapshots_dropped},
      {"bytes_dropped", s.bytes_dropped},
      {"steps_dropped", s.steps_dropped},
      {"records_dropped", s.records_dropped},
      {"write_errors", s.write_errors},
      {"skipped_unknown", s.skipped_unknown},
      {"fingerprint_records", s.fingerprint_records},
  };
  j["fingerprints"] = FingerprintsJson(r);
  if (s.steps > 0) {
    j["first_step"] = s.first_step;
    j["last_step"] = s.last_step;
  }
  if (!s.problem.empty()) {
    j["problem"] = s.problem;
    j["problem_offset"] = s.problem_offset;
  }
  if (r.manifest().has_value()) {
    const SessionManifest& m = *r.manifest();
    j["session_id"] = m.session_id;
    j["engine"] = m.engine;
    j["engine_version"] = m.engine_version;
    j["model_type"] = m.model.model_type;
    j["device"] = {{"name", m.device.name},
                   {"sm_arch", m.device.sm_arch},
                   {"memory_capacity_bytes", m.device.memory_capacity_bytes}};
    j["tp_size"] = m.parallel.tp_size;
    j["rank"] = m.parallel.rank;
    j["weight_check_period_steps"] = WeightCheckPeriod(r);
    j["quirks"] = m.quirks;
  }
  nlohmann::json failures = nlohmann::json::array();
  for (const FailureRecord& f : r.failures()) {
    nlohmann::json fj = {{"reason", f.reason},
                         {"stage", f.stage},
                         {"class", FailureClassName(f.failure_class)},
                         {"signal", f.signal},
                         {"rank", f.rank}};
    if (f.step.has_value()) fj["step"] = *f.step;
    if (!f.coredump.empty()) {
      fj["coredump"] = {{"file", f.coredump}, {"complete", f.coredump_complete}, {"note", f.coredump_note}};
    }
    failures.push_back(std::move(fj));
  }
  j["failure_records"] = std::move(failures);
  if (r.manifest().has_value()) {
    const SessionManifest& m = *r.manifest();
    j["coredump_arming"] = {{"mode", m.coredump.mode.empty() ? "off" : m.coredump.mode},
                            {"reason", m.coredump.reason},
                            {"file_pattern", m.coredump.file_pattern}};
    const FailureRecord* last = r.failures().empty() ? nullptr : &r.failures().back();
    std::optional<GpuFault> g = FindGpuFault(s.path, m, last);
    j["gpu_fault"] = g.has_value() ? g->ToJson() : nlohmann::json(nullptr);
  }
  nlohmann::json corrupt = nlohmann::json::array();
  for (const WeightCheckRecord& w : r.weight_checks()) {
    for (const WeightSlice& sl : w.slices) {
      if (sl.corrupt) {
        corrupt.push_back({{"step", w.step},
                           {"tensor", sl.tensor},
                           {"byte_begin", sl.byte_begin},
                           {"byte_end", sl.byte_end},
                           {"hash", sl.hash.Hex()},
                           {"expected", sl.expected.Hex()}});
      }
    }
  }
  j["weight_corruption"] = std::move(corrupt);
  return j;
}

void PrintText(const CaptureReader& r) {
  const CaptureSummary s = r.Summary();
  const char* state = s.ok          ? "closed cleanly (ok)"
                      : s.truncated ? "NOT ok: torn tail"
                      : s.corrupt   ? "NOT ok: corrupt"
                                    : "NOT ok: never closed (the recorder stopped)";
  std::printf("%s: capture format %d.%d, %s, %s\n", s.path.c_str(), s.format_major, s.format_minor,
              HumanBytes(s.bytes).c_str(), state);
  if (r.manifest().has_value()) {
    const SessionManifest& m = *r.manifest();
    std::printf("  session %s  engine %s %s  model %s\n", m.session_id.c_str(), m.engine.c_str(),
                m.engine_version.c_str(), m.model.model_type.c_str());
    std::printf("  device %s (sm_%u, %s), rank %u of tp %u, %zu toggles\n", m.device.name.c_str(), m.device.sm_arch,
                HumanBytes(m.device.memory_capacity_bytes).c_str(), m.parallel.rank, m.parallel.tp_size,
                m.toggles.size());
    if (!m.coredump.mode.empty() && m.coredump.mode != "off") {
      std::printf("  GPU core dumps: %s (%s)%s\n", m.coredump.mode.c_str(), m.coredump.reason.c_str(),
                  m.coredump.file_pattern.empty() ? "" : absl::StrCat(", file ", m.coredump.file_pattern).c_str());
    }
  }
  if (s.steps > 0) {
    std::printf("  steps %llu..%llu (%llu step records; step log %s, %s a step, %.2fx compressed)\n",
                static_cast<unsigned long long>(s.first_step), static_cast<unsigned long long>(s.last_step),
                static_cast<unsigned long long>(s.steps), HumanBytes(s.step_stored_bytes).c_str(),
                HumanBytes(s.step_stored_bytes / s.steps).c_str(),
                s.step_stored_bytes > 0 ? static_cast<double>(s.step_raw_bytes) / s.step_stored_bytes : 1.0);
  } else {
    std::printf("  no steps\n");
  }
  const double ratio = s.blob_stored_bytes > 0 ? static_cast<double>(s.blob_raw_bytes) / s.blob_stored_bytes : 0.0;
  std::printf("  %llu records, %llu blobs (%s stored for %s of tensors, %.2fx), %llu snapshots\n",
              static_cast<unsigned long long>(s.records), static_cast<unsigned long long>(s.blobs),
              HumanBytes(s.blob_stored_bytes).c_str(), HumanBytes(s.blob_raw_bytes).c_str(), ratio,
              static_cast<unsigned long long>(s.snapshots));
  if (s.weight_checks > 0) {
    const uint32_t k = WeightCheckPeriod(r);
    std::printf("  weight checks: %llu (full coverage every %u steps), corrupt slices: %llu\n",
                static_cast<unsigned long long>(s.weight_checks), k,
                static_cast<unsigned long long>(s.corrupt_weight_slices));
    for (const WeightCheckRecord& w : r.weight_checks()) {
      for (const WeightSlice& sl : w.slices) {
        if (sl.corrupt) {
          std::printf("    WEIGHT CORRUPTION at step %llu: %s bytes [%llu, %llu) hash %s, expected %s\n",
                      static_cast<unsigned long long>(w.step), sl.tensor.c_str(),
                      static_cast<unsigned long long>(sl.byte_begin), static_cast<unsigned long long>(sl.byte_end),
                      sl.hash.Hex().c_str(), sl.expected.Hex().c_str());
        }
      }
    }
  }
  if (s.snapshots_dropped > 0) {
    std::printf(
        "  snapshots evicted from the ring, not in the file: %llu (%s); the ring keeps only the newest steps "
        "(its step count and byte budget), so this is expected on a long run\n",
        static_cast<unsigned long long>(s.snapshots_dropped), HumanBytes(s.bytes_dropped).c_str());
  }
  if (s.write_errors > 0 || s.steps_dropped > 0 || s.records_dropped > 0) {
    // The counters are as of the last record that carried them: a capture
    // whose disk never recovered may miss the steps after its last one too.
    std::printf(
        "  the recorder's disk: %llu failed writes, %llu steps and %llu other records dropped (the disk was "
        "full or too slow: docs/capture.md, \"Disk full and slow disks\"); the steps present are whole and "
        "in order%s\n",
        static_cast<unsigned long long>(s.write_errors), static_cast<unsigned long long>(s.steps_dropped),
        static_cast<unsigned long long>(s.records_dropped),
        r.end().has_value()
            ? ""
            : absl::StrFormat(", and steps after %d may be missing (no end record)", s.last_step).c_str());
  }
  for (const StepFingerprints& fs : FingerprintSteps(r)) {
    const FingerprintRecord& fr = *fs.record;
    std::string line = absl::StrFormat("  fingerprints of step %d (%d boundaries%s)", fr.step, fr.fingerprints.size(),
                                       fr.complete ? "" : ", the step did not finish");
    if (fs.first_nonfinite != nullptr) {
      line += absl::StrFormat(": first non-finite at %s, %s", fs.first_nonfinite->name,
                              FingerprintText(*fs.first_nonfinite));
    } else {
      line += ": all finite";
    }
    std::printf("%s\n", line.c_str());
    if (!fr.complete) {
      std::printf("    last boundary written: %s%s\n",
                  fr.fingerprints.empty() ? "(none)" : fr.fingerprints.back().name.c_str(),
                  fs.never_ran.empty() ? "" : absl::StrFormat("; %s never ran", fs.never_ran).c_str());
    }
  }
  for (const FailureRecord& f : r.failures()) {
    std::printf("  failure (%s, stage %s, step %s%s): %s\n", FailureClassName(f.failure_class), f.stage.c_str(),
                f.step.has_value() ? std::to_string(*f.step).c_str() : "?",
                f.signal != 0 ? absl::StrFormat(", signal %d", f.signal).c_str() : "", f.reason.c_str());
  }
  // The GPU's own account of the failure, beside the failed step.
  if (r.manifest().has_value()) {
    const FailureRecord* last = r.failures().empty() ? nullptr : &r.failures().back();
    if (std::optional<GpuFault> g = FindGpuFault(s.path, *r.manifest(), last); g.has_value()) {
      for (const std::string& line : g->Lines()) std::printf("  %s\n", line.c_str());
    }
  }
  if (s.skipped_unknown > 0) {
    std::printf("  %llu records of newer types were skipped\n", static_cast<unsigned long long>(s.skipped_unknown));
  }
  if (!s.problem.empty()) {
    std::printf("  stopped at byte %llu: %s\n", static_cast<unsigned long long>(s.problem_offset), s.problem.c_str());
    std::printf("  every complete record before it is shown; run 'crashreplay verify %s' for the full check\n",
                s.path.c_str());
  }
}

}  // namespace

int RunInfo(int argc, char** argv) {
  CLI::App app(
      "Summarise a capture file or a session directory of rank files.\n"
      "Exit 0 when summarised (even if not ok), 3 when a file cannot be read at all.",
      "info");
  std::string path;
  bool json = false;
  app.add_option("CAPTURE", path, "a .crcap file or a session directory")->required();
  app.add_flag("--json", json, "print JSON: ok, steps, ranks, records, blobs, bytes, truncated, files[...]");
  if (auto rc = ParseArgs(app, argc, argv)) return *rc;

  absl::StatusOr<std::vector<std::string>> files = ListCaptureFiles(path);
  if (!files.ok()) return ReportError(files.status());
  std::vector<std::unique_ptr<CaptureReader>> readers;
  for (const std::string& f : *files) {
    absl::StatusOr<std::unique_ptr<CaptureReader>> r = CaptureReader::Open(f);
    if (!r.ok()) return ReportError(r.status());
    readers.push_back(std::move(*r));
  }
  // Session totals: steps are distinct step indices, ranks distinct ranks.
  bool ok = true, truncated = false, corrupt = false;
  uint64_t records = 0, blobs = 0, bytes = 0, failures = 0, step_records = 0, corrupt_slices = 0, dropped = 0;
  std::set<uint64_t> steps;
  std::set<uint32_t> ranks;
  // The session's first non-finite boundary: earliest step, then rank.
  nlohmann::json first_nonfinite;
  std::pair<uint64_t, uint32_t> first_at{UINT64_MAX, UINT32_MAX};
  nlohmann::json per_file = nlohmann::json::array();
  for (const auto& r : readers) {
    const CaptureSummary s = r->Summary();
    ok &= s.ok;
    truncated |= s.truncated;
    corrupt |= s.corrupt;
    records += s.records;
    blobs += s.blobs;
    bytes += s.bytes;
    failures += s.failures;
    step_records += s.steps;
    corrupt_slices += s.corrupt_weight_slices;
    dropped += s.snapshots_dropped;
    for (const StepRecord& st : r->steps()) steps.insert(st.step);
    ranks.insert(s.ranks.begin(), s.ranks.end());
    for (const StepFingerprints& fs : FingerprintSteps(*r)) {
      const std::pair<uint64_t, uint32_t> at{fs.record->step, fs.record->rank};
      if (fs.first_nonfinite != nullptr && at < first_at) {
        first_at = at;
        first_nonfinite = NonFiniteJson(*fs.first_nonfinite);
        first_nonfinite["step"] = at.first;
        first_nonfinite["rank"] = at.second;
      }
    }
    if (json) per_file.push_back(FileJson(*r));
  }
  if (json) {
    nlohmann::json j = {{"path", path},
                        {"ok", ok},
                        {"truncated", truncated},
                        {"corrupt", corrupt},
                        {"steps", steps.size()},
                        {"step_records", step_records},
                        {"ranks", ranks.size()},
                        {"records", records},
                        {"blobs", blobs},
                        {"bytes", bytes},
                        {"failures", failures},
                        {"corrupt_weight_slices", corrupt_slices},
                        {"snapshots_dropped", dropped},
                        {"first_nonfinite_boundary", first_nonfinite},
                        {"files", std::move(per_file)}};
    std::printf("%s\n", j.dump(2).c_str());
    return kExitOk;
  }
  if (readers.size() > 1) {
    std::printf("session %s: %zu rank files, %zu ranks, %zu steps, %s, %s\n\n", path.c_str(), readers.size(),
                ranks.size(), steps.size(), HumanBytes(bytes).c_str(), ok ? "all closed cleanly (ok)" : "NOT ok");
  }
  for (const auto& r : readers) PrintText(*r);
  return kExitOk;
}

}  // namespace crashreplay::tools
