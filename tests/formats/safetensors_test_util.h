// Helpers shared by the safetensors tests: scratch directories, raw file
// construction, the byte pattern the Python driver also produces, and
// running tests/formats/safetensors_py.py (the real `safetensors` package).
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace crashreplay::testing_util {

inline std::filesystem::path ScratchRoot() {
  return std::filesystem::path(::testing::TempDir()) / ("crashreplay_" + std::to_string(::getpid()));
}

// Removes this process's scratch directories when the test program ends
// (kept when a test failed, so the files can be inspected).
class ScratchCleanup : public ::testing::Environment {
 public:
  void TearDown() override {
    if (::testing::UnitTest::GetInstance()->Passed()) {
      std::error_code ec;
      std::filesystem::remove_all(ScratchRoot(), ec);
    }
  }
};
inline const bool kScratchCleanupRegistered = (::testing::AddGlobalTestEnvironment(new ScratchCleanup), true);

// A fresh directory under the gtest temp dir, named after the running test.
inline std::string ScratchDir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::filesystem::path dir = ScratchRoot() / (std::string(info->test_suite_name()) + "." + info->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

inline void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// 8-byte little-endian length + header + data, exactly as given (no padding).
inline std::string RawSafetensors(const std::string& header, const std::string& data) {
  std::string out;
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return out + header + data;
}

// Same formula as pattern() in safetensors_py.py.
inline std::vector<std::byte> Pattern(int seed, size_t n, bool is_bool = false) {
  std::vector<std::byte> out(n);
  for (size_t i = 0; i < n; ++i) {
    unsigned v = (static_cast<unsigned>(seed) * 131u + static_cast<unsigned>(i) * 31u + 7u) & 0xffu;
    if (is_bool) v &= 1u;
    out[i] = static_cast<std::byte>(v);
  }
  return out;
}

inline std::string SourceDir() {
  const char* dir = std::getenv("CRASHREPLAY_SOURCE_DIR");
  return dir != nullptr ? dir : CRASHREPLAY_TEST_SOURCE_DIR;
}

// Runs the Python driver; returns its stdout. Fails the test on a non-zero
// exit (the driver's stderr shows in the test log).
inline std::string RunPython(const std::string& args) {
  const char* py = std::getenv("PYTHON");
  const std::string cmd =
      std::string(py != nullptr ? py : "python3") + " " + SourceDir() + "/tests/formats/safetensors_py.py " + args;
  std::string out;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "cannot run: " << cmd;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  const int rc = ::pclose(pipe);
  EXPECT_EQ(rc, 0) << "failed (the Python `safetensors` package is installed by "
                      "scripts/setup.sh): "
                   << cmd;
  return out;
}

}  // namespace crashreplay::testing_util
