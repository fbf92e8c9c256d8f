#include "run_trial.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "crashreplay/bisect/process.h"

namespace crashreplay::tools {

std::string RunJsonToSignatureFile(const std::string& run_stdout) {
  const nlohmann::json run = nlohmann::json::parse(run_stdout, nullptr, /*allow_exceptions=*/false);
  if (run.is_discarded() || !run.is_object()) return "";
  nlohmann::json out = nlohmann::json::object();
  if (run.contains("signature") && run["signature"].is_object()) {
    nlohmann::json sig = run["signature"];
    if (run.contains("fault") && run["fault"].value("step", int64_t{-1}) >= 0) sig["step"] = run["fault"]["step"];
    if (run.contains("fault") && run["fault"].contains("message")) sig["detail"] = run["fault"]["message"];
    out["signature"] = sig;
  } else {
    out["signature"] = {{"class", "none"}};
  }
  if (run.contains("kernels") && run["kernels"].is_array()) out["kernels"] = run["kernels"];
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
  bisect::TrialResult r = bisect::ClassifyProcess(launch.process, options_.limits, sig, options_.rules.get());
  r.config_path = launch.config_path;
  return r;
}

std::string RunTrialRunner::ReproduceCommand(const std::string& config_path, std::optional<int64_t> step) const {
  std::vector<std::string> argv = options_.runner;
  for (const std::string& w : bisect::SubstituteCommand(options_.command, config_path, step)) argv.push_back(w);
  return bisect::ShellJoin(argv);
}

}  // namespace crashreplay::tools
