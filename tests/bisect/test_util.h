// Helpers for the bisect tests: a temporary directory that cleans up after
// itself, and synthetic trial scripts written into it.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
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
            "printf '%s\\n' \"$line\" >> '" + dir.path() + "/invocations.log'\n" +
                body + "\n",
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

}  // namespace crashreplay::bisect::testing
