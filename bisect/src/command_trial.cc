#include "crashreplay/bisect/command_trial.h"

#include <unistd.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"

namespace crashreplay::bisect {

std::vector<std::string> SubstituteCommand(const std::vector<std::string>& words, const std::string& config_path,
                                           std::optional<int64_t> step) {
  std::vector<std::string> out;
  out.reserve(words.size());
  for (const std::string& w : words) {
    std::string s = absl::StrReplaceAll(w, {{"{config}", config_path}});
    if (step) s = absl::StrReplaceAll(s, {{"{step}", absl::StrCat(*step)}});
    out.push_back(std::move(s));
  }
  return out;
}

LaunchOutput LaunchTrialProcess(const CommandTrialOptions& options, const TrialRequest& request,
                                const std::atomic<bool>* cancel) {
  LaunchOutput out;
  const std::string stem = absl::StrFormat("%s/trial-%04d", options.workdir, request.index);
  out.config_path = stem + ".toml";
  const std::string sig_path = stem + ".sig.json";
  ::unlink(sig_path.c_str());
  std::string comment = absl::StrCat("crashreplay bisect trial ", request.index);
  if (request.step) absl::StrAppend(&comment, ", step ", *request.step);
  if (absl::Status st = WriteConfigFile(out.config_path, request.config, comment); !st.ok()) {
    out.process.start_error = std::string(st.message());
    return out;
  }
  ProcessSpec spec;
  spec.argv = options.runner;
  for (std::string& w : SubstituteCommand(options.command, out.config_path, request.step)) {
    spec.argv.push_back(std::move(w));
  }
  spec.env_set = {{"CRASHREPLAY_CONFIG", out.config_path}, {"CRASHREPLAY_SIGNATURE_OUT", sig_path}};
  if (request.step) spec.env_set.emplace_back("CRASHREPLAY_STEP", absl::StrCat(*request.step));
  if (!request.gpus.empty()) spec.env_set.emplace_back("CUDA_VISIBLE_DEVICES", request.gpus);
  spec.timeout_s = options.limits.timeout_s;
  spec.kill_grace_s = options.limits.kill_grace_s;
  spec.memory_limit_bytes = options.limits.memory_limit_bytes;
  spec.cancel = cancel;
  out.process = RunProcess(spec);
  std::ifstream sig(sig_path, std::ios::binary);
  if (sig) {
    std::ostringstream ss;
    ss << sig.rdbuf();
    out.signature_file_text = ss.str();
  }
  return out;
}

std::string CommandTrialRunner::SubjectId() const {
  return absl::StrCat("command:", ShellJoin(options_.runner), " | ", ShellJoin(options_.command));
}

TrialResult CommandTrialRunner::Run(const TrialRequest& request, const std::atomic<bool>* cancel) {
  LaunchOutput launch = LaunchTrialProcess(options_, request, cancel);
  TrialResult r = ClassifyProcess(launch.process, options_.limits, launch.signature_file_text, options_.rules.get());
  r.config_path = launch.config_path;
  return r;
}

std::string CommandTrialRunner::ReproduceCommand(const std::string& config_path, std::optional<int64_t> step) const {
  std::string env = absl::StrCat("CRASHREPLAY_CONFIG=", ShellQuote(config_path));
  if (step) absl::StrAppend(&env, " CRASHREPLAY_STEP=", *step);
  std::vector<std::string> argv = options_.runner;
  for (std::string& w : SubstituteCommand(options_.command, config_path, step)) argv.push_back(std::move(w));
  return absl::StrCat(env, " ", ShellJoin(argv));
}

}  // namespace crashreplay::bisect
