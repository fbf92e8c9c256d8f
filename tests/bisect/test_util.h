// Helpers for the bisect tests: a temporary directory that cleans up after
// itself, and synthetic trial scripts written into it.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "crashreplay/bisect/bisect.h"
#include "crashreplay/bisect/command_trial.h"
#include "crashreplay/formats/config_file.h"

namespace crashreplay::bisect::testing {

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/crashreplay-bisect-test-XXXXXX";
    const char* d = ::mkdtemp(tmpl);
    EXPECT_NE(d, nullptr);
    path_ = d != nullptr ? d : "/tmp";
  }
  ~TempDir() {
    if (::testing::Test::HasFailure()) {
      std::fprintf(stderr, "kept %s for inspection\n", path_.c_str());
      return;
    }
    const std::string cmd = "rm -rf '" + path_ + "'";
    if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", path_.c_str());
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A file beside the test sources. `here` is the test's __FILE__: absolute, or
// relative to the build root where the compiler ran (Ninja runs there; the
// test binary lives in <build root>/tests).
inline std::string SourcePath(const std::string& here, const std::string& name) {
  const std::string rel = here.substr(0, here.rfind('/') + 1) + name;
  if (!rel.empty() && rel[0] == '/') return rel;
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    std::string dir(exe, static_cast<size_t>(n));
    dir = dir.substr(0, dir.rfind('/'));                 // <build>/tests
    const std::string candidate = dir + "/../" + rel;  // relative to <build>
    if (::access(candidate.c_str(), R_OK) == 0) return candidate;
  }
  return rel;
}

inline void WriteFile(const std::string& path, const std::string& text, bool executable = false) {
  std::ofstream(path, std::ios::binary) << text;
  if (executable) ::chmod(path.c_str(), 0755);
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::vector<std::string> ReadLines(const std::string& path) {
  std::vector<std::string> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// A trial script: `body` is POSIX sh that may call `on NAME` (true when the
// boolean toggle NAME is true in the trial's configuration) and `val NAME`.
// Every invocation appends the configuration's canonical text (one line) to
// <dir>/invocations.log.
inline std::string WriteTrialScript(const TempDir& dir, const std::string& name, const std::string& body) {
  const std::string path = dir / name;
  WriteFile(path,
            "#!/bin/sh\n"
            "cfg=\"$CRASHREPLAY_CONFIG\"\n"
            "val() { sed -n \"s/^$1 = //p\" \"$cfg\"; }\n"
            "on() { [ \"$(val \"$1\")\" = true ]; }\n"
            // One printf, one write(2) on an O_APPEND file: parallel trials
            // never interleave their lines.
            "line=$(grep -v '^#' \"$cfg\" | tr '\\n' ' ')\n"
            "printf '%s\\n' \"$line\" >> '" +
                dir.path() + "/invocations.log'\n" + body + "\n",
            /*executable=*/true);
  return path;
}

// n boolean toggles t0..t{n-1}: all false in the good configuration, all true
// in the bad one.
inline std::pair<Config, Config> BoolToggles(int n) {
  Config good, bad;
  for (int i = 0; i < n; ++i) {
    const std::string name = "t" + std::to_string(i);
    good[name] = ConfigValue::Bool(false);
    bad[name] = ConfigValue::Bool(true);
  }
  return {good, bad};
}

inline std::set<std::string> CulpritNames(const BisectReport& r) {
  std::set<std::string> names;
  for (size_t i : r.culprit) names.insert(r.changes[i].name);
  return names;
}

inline std::set<std::string> SuspectNames(const BisectReport& r) {
  std::set<std::string> names;
  for (size_t i : r.suspect) names.insert(r.changes[i].name);
  return names;
}

// A counting oracle: an in-process TrialRunner whose verdict is a function
// of the configuration and of how many times that configuration ran before
// (for flaky oracles). Counts every run; thread-safe.
class FakeRunner : public TrialRunner {
 public:
  // Returns the failure signature, or nullopt for a pass.
  using Fn = std::function<std::optional<FailureSignature>(const Config&, int previous_runs)>;
  explicit FakeRunner(Fn fn) : fn_(std::move(fn)) {}
  std::string SubjectId() const override { return "fake"; }
  TrialResult Run(const TrialRequest& request, const std::atomic<bool>*) override {
    int previous;
    {
      std::lock_guard<std::mutex> lock(mu_);
      previous = runs_per_config_[FormatConfig(request.config)]++;
      ++runs_;
    }
    TrialResult r;
    if (auto sig = fn_(request.config, previous)) {
      r.verdict = Verdict::kBad;
      r.signature = *sig;
      r.bad_runs = 1;
      r.exit_code = 1;
    } else {
      r.verdict = Verdict::kGood;
      r.exit_code = 0;
    }
    return r;
  }
  std::string ReproduceCommand(const std::string& path, std::optional<int64_t>) const override {
    return "fake " + path;
  }
  int runs() const {
    std::lock_guard<std::mutex> lock(mu_);
    return runs_;
  }

 private:
  Fn fn_;
  mutable std::mutex mu_;
  std::map<std::string, int> runs_per_config_;
  int runs_ = 0;
};

inline FailureSignature Failure(FailureClass c, std::string check = "") {
  FailureSignature s;
  s.failure_class = c;
  s.check = std::move(check);
  return s;
}

inline bool On(const Config& c, const std::string& name) {
  auto it = c.find(name);
  return it != c.end() && it->second.is_bool() && it->second.as_bool();
}

// Keys k000..k{n-1} (zero-padded to `width` digits), false in good, true in bad.
inline std::pair<Config, Config> Keys(int n, int width = 3) {
  Config good, bad;
  for (int i = 0; i < n; ++i) {
    std::string num = std::to_string(i);
    const std::string name =
        "k" + std::string(static_cast<size_t>(std::max(0, width - static_cast<int>(num.size()))), '0') + num;
    good[name] = ConfigValue::Bool(false);
    bad[name] = ConfigValue::Bool(true);
  }
  return {good, bad};
}

inline std::string Key(int i, int width = 3) {
  std::string num = std::to_string(i);
  return "k" + std::string(static_cast<size_t>(std::max(0, width - static_cast<int>(num.size()))), '0') + num;
}

}  // namespace crashreplay::bisect::testing
