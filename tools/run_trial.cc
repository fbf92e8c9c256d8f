#include "run_trial.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "crashreplay/bisect/process.h"

namespace crashreplay::tools {

bisect::KernelRow KernelRowFromRunRecord(const nlohmann::json& record) {
  bisect::KernelRow row;
  row.name = record.value("kernel", record.value("name", std::string()));
  row.layer = record.value("layer", -1);
  row.nan_count = record.value("nan", int64_t{0});
  row.inf_count = record.value("inf", int64_t{0});
  row.digest = record.value("digest", std::string());
  // min/max are over finite values; a NaN/Inf shows in the counts instead.
  const auto finite_or_zero = [&](const char* key) {
    const auto it = record.find(key);
    return it != record.end() && it->is_number() ? std::fabs(it->get<double>()) : 0.0;
  };
  row.max_abs = std::max(finite_or_zero("min"), finite_or_zero("max"));
  return row;
}

std::string RunJsonToSignatureFile(const std::string& run_stdout) {
  const nlohmann::json run = nlohmann::json::parse(run_stdout, nullptr, /*allow_exceptions=*/false);
  if (run.is_discarded() || !run.is_object()) return "";
  nlohmann::json out = nlohmann::json::object();
  if (run.contains("signature") && run["signature"].is_object()) {
    nlohmann::json sig = run["signature"];
    // The engine calls a failed kernel check "assert"; on a GPU it is a
    // device-side assert, which is the bisector's class name.
    if (sig.value("class", std::string()) == "assert") sig["class"] = "device_assert";
    if (run.contains("fault") && run["fault"].contains("step")) sig["step"] = run["fault"]["step"];
    if (run.contains("fault") && run["fault"].contains("message")) sig["detail"] = run["fault"]["message"];
    out["signature"] = sig;
  } else {
    out["signature"] = {{"class", "none"}};
  }
  out["kernels"] = nlohmann::json::array();
  if (run.contains("kernels") && run["kernels"].is_array()) {
    for (const auto& k : run["kernels"]) out["kernels"].push_back(bisect::KernelRowToJson(KernelRowFromRunRecord(k)));
  }
  return out.dump();
}

std::string RunTrialRunner::SubjectId() const { return bisect::ShellJoin(options_.command); }

bisect::TrialResult RunTrialRunner::Run(const bisect::TrialRequest& request, const std::atomic<bool>* cancel) {
  bisect::LaunchOutput launch = bisect::LaunchTrialProcess(options_, request, cancel);
  // `run` prints its result on stdout; a signature file written by the
  // process itself (none today) wins, as it would for any command.
  std::optional<std::string> sig = launch.signature_file_text;
  if (!sig || sig->empty()) {
    std::string converted = RunJsonToSignatureFile(launch.process.stdout_text);
    if (!converted.empty()) sig = std::move(converted);
  }
  bisect::TrialResult r = bisect::ClassifyProcess(launch.process, options_.limits, sig);
  r.config_path = launch.config_path;
  return r;
}

std::string RunTrialRunner::ReproduceCommand(const std::string& config_path, std::optional<int64_t> step) const {
  std::vector<std::string> argv = options_.runner;
  for (const std::string& w : bisect::SubstituteCommand(options_.command, config_path, step)) argv.push_back(w);
  return bisect::ShellJoin(argv);
}

}  // namespace crashreplay::tools
