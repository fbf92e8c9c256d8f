// Arming GPU core dumps from the recorder (capture/coredump_arming.h) and
// naming the dump in the failure record, then `crashreplay info` showing
// the fault beside the failed step with the replay's op that does the
// faulting kernel's job. No GPU here: the dumps are written by the
// coredump tests' builder (tests/formats/coredump_test_util.h, from
// NVIDIA's public format description, independent of the reader), and
// every test that arms through the environment does it in a forked child,
// so this test process's own environment (and any CUDA it runs later, on a
// GPU machine) is left alone.
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../formats/coredump_test_util.h"
#include "crashreplay/capture/coredump_arming.h"
#include "crashreplay/capture/recorder.h"
#include "crashreplay/formats/capture_reader.h"
#include "recorder_test_util.h"

namespace crashreplay::capture {
namespace {

namespace ct = crashreplay::coredump_testing;
using ::crashreplay::testing::RecorderTempDir;
using ::crashreplay::testing::TestManifest;

constexpr const char* kNoDriver = "libcrashreplay-test-no-such-driver.so.1";

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteBytes(const std::string& path, const ct::Bytes& bytes, size_t n) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(n));
}

// Runs `body` in a forked child (a fresh process as far as the environment
// and the recorder's signal handlers go); returns its pid and exit status.
std::pair<pid_t, int> InChild(const std::function<int()>& body) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    int rc = 99;
    rc = body();
    std::fflush(nullptr);
    ::_exit(rc);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return {pid, WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status)};
}

TEST(CoredumpArming, EnvironmentInAFreshProcessSetsTheDocumentedVariables) {
  RecorderTempDir dir;
  const std::string out = dir.path() + "/child.txt";
  const std::string pattern = dir.path() + "/rank-00000.%p.cudacore";
  auto [pid, rc] = InChild([&] {
    CoredumpArmRequest req;
    req.file_pattern = pattern;
    req.driver_library = kNoDriver;  // kAuto: not loaded, so the environment
    CoredumpArming a = ArmCoredumps(req);
    std::ofstream o(out);
    auto env = [](const char* n) { return std::string(std::getenv(n) ? std::getenv(n) : "(unset)"); };
    o << a.mode << "\n"
      << a.reason << "\n"
      << env("CUDA_ENABLE_COREDUMP_ON_EXCEPTION") << "\n"
      << env("CUDA_COREDUMP_GENERATION_FLAGS") << "\n"
      << env("CUDA_COREDUMP_FILE") << "\n";
    return 0;
  });
  ASSERT_EQ(rc, 0);
  std::istringstream lines(Slurp(out));
  std::string mode, reason, enable, flags, file;
  std::getline(lines, mode);
  std::getline(lines, reason);
  std::getline(lines, enable);
  std::getline(lines, flags);
  std::getline(lines, file);
  EXPECT_EQ(mode, "env");
  EXPECT_NE(reason.find("not loaded yet"), std::string::npos) << reason;
  EXPECT_EQ(enable, "1");
  // The lightweight flags (cuda-gdb's names) plus skip_abort.
  EXPECT_EQ(flags,
            "skip_nonrelocated_elf_images,skip_global_memory,skip_shared_memory,skip_local_memory,skip_abort,"
            "skip_constbank_memory");
  EXPECT_EQ(file, pattern);
}

TEST(CoredumpArming, DriverApiWithoutADriverSaysWhyAndArmsNothing) {
  const char* before = std::getenv("CUDA_ENABLE_COREDUMP_ON_EXCEPTION");
  CoredumpArmRequest req;
  req.file_pattern = "/tmp/x.%p.cudacore";
  req.method = CoredumpArmMethod::kDriverApi;
  req.driver_library = kNoDriver;
  CoredumpArming a = ArmCoredumps(req);
  EXPECT_EQ(a.mode, "failed");
  EXPECT_NE(a.reason.find(kNoDriver), std::string::npos) << a.reason;
  EXPECT_NE(a.reason.find("cannot be loaded"), std::string::npos) << a.reason;
  EXPECT_EQ(std::getenv("CUDA_ENABLE_COREDUMP_ON_EXCEPTION"), before);
}

TEST(CoredumpArming, TheRealDriverLibraryOnAMachineWithoutOne) {
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib != nullptr) {
    ::dlclose(lib);
    GTEST_SKIP() << "a CUDA driver is installed: tests/gpu's coredump part arms it for real";
  }
  CoredumpArmRequest req;
  req.file_pattern = "/tmp/x.%p.cudacore";
  req.method = CoredumpArmMethod::kDriverApi;
  CoredumpArming a = ArmCoredumps(req);
  EXPECT_EQ(a.mode, "failed");
  EXPECT_NE(a.reason.find("libcuda.so.1"), std::string::npos) << a.reason;
}

TEST(CoredumpArming, PatternAndPathSitBesideTheCapture) {
  EXPECT_EQ(CoredumpPatternFor("/s/rank-00003.crcap"), "/s/rank-00003.%p.cudacore");
  EXPECT_EQ(CoredumpPatternFor("/s/one.file"), "/s/one.file.%p.cudacore");
  EXPECT_EQ(CoredumpPathFor("/s/rank-00003.%p.cudacore", 4242), "/s/rank-00003.4242.cudacore");
  EXPECT_EQ(CoredumpPathFor("/s/a%%b.%p.%h", 7), "/s/a%b.7.%h");
}

TEST(CoredumpArming, OffByDefaultAndTheManifestSaysSo) {
  RecorderTempDir dir;
  const char* before = std::getenv("CUDA_ENABLE_COREDUMP_ON_EXCEPTION");
  RecorderOptions o;
  o.session_dir = dir.path();
  o.install_signal_handlers = false;
  auto rec = Recorder::Begin(TestManifest(), o);
  ASSERT_TRUE(rec.ok()) << rec.status();
  ASSERT_TRUE((*rec)->Close().ok());
  EXPECT_EQ(std::getenv("CUDA_ENABLE_COREDUMP_ON_EXCEPTION"), before);
  auto r = CaptureReader::Open(SessionRankPath(dir.path(), 0));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE((*r)->manifest().has_value());
  EXPECT_EQ((*r)->manifest()->coredump.mode, "off");
  EXPECT_NE((*r)->manifest()->coredump.reason.find("not measured"), std::string::npos);
}

TEST(CoredumpArming, AFailedArmingIsRecordedNotFatal) {
  RecorderTempDir dir;
  RecorderOptions o;
  o.session_dir = dir.path();
  o.install_signal_handlers = false;
  o.arm_coredumps = true;
  o.coredump_method = CoredumpArmMethod::kDriverApi;
  o.coredump_driver_library = kNoDriver;
  auto rec = Recorder::Begin(TestManifest(), o);
  ASSERT_TRUE(rec.ok()) << rec.status();
  FailureInfo f;
  f.reason = "CUDA error: device-side assert triggered";
  f.stage = "decode";
  ASSERT_TRUE((*rec)->OnFailure(f).ok());
  ASSERT_TRUE((*rec)->Close().ok());
  auto r = CaptureReader::Open(SessionRankPath(dir.path(), 0));
  ASSERT_TRUE(r.ok()) << r.status();
  const CoredumpArming& a = (*r)->manifest()->coredump;
  EXPECT_EQ(a.mode, "failed");
  EXPECT_NE(a.reason.find("cannot be loaded"), std::string::npos) << a.reason;
  EXPECT_EQ(a.file_pattern, dir.path() + "/rank-00000.%p.cudacore");
  ASSERT_EQ((*r)->failures().size(), 1u);
  EXPECT_TRUE((*r)->failures()[0].coredump.empty());
}

// ---- the failure path and `crashreplay info` --------------------------------

struct CliResult {
  int exit_code = -1;
  std::string out, err;
};

class CoredumpFailure : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* bin = std::getenv("CRASHREPLAY_BINARY_DIR");
    ASSERT_NE(bin, nullptr) << "run under ctest (CRASHREPLAY_BINARY_DIR names the build directory)";
    binary_ = std::string(bin) + "/tools/crashreplay";
    ASSERT_TRUE(std::filesystem::exists(binary_)) << binary_;
  }

  enum class When { kBeforeFailure, kAfterFailure };
  // A recorder armed through the environment, in a child process; the
  // dump (its first `keep` bytes) is written where the driver would write
  // it, before or after the failure. Returns the child's pid.
  pid_t RecordFailure(const ct::Bytes& dump, size_t keep, When when) {
    auto [pid, rc] = InChild([&] {
      RecorderOptions o;
      o.session_dir = dir_.path();
      o.install_signal_handlers = false;
      o.arm_coredumps = true;
      o.coredump_method = CoredumpArmMethod::kEnvironment;
      o.coredump_wait_s = 0.2;
      auto rec = Recorder::Begin(TestManifest(), o);
      if (!rec.ok()) return 10;
      const char* file = std::getenv("CUDA_COREDUMP_FILE");
      if (file == nullptr) return 11;
      const std::string path = CoredumpPathFor(file, static_cast<uint32_t>(::getpid()));
      if (when == When::kBeforeFailure && keep > 0) WriteBytes(path, dump, keep);
      FailureInfo f;
      f.reason = "CUDA error: device-side assert triggered";
      f.stage = "decode";
      f.step = 3;
      f.exception_type = "torch.AcceleratorError";
      if (!(*rec)->OnFailure(f).ok()) return 12;
      if (when == When::kAfterFailure && keep > 0) WriteBytes(path, dump, keep);
      return (*rec)->Close().ok() ? 0 : 13;
    });
    EXPECT_EQ(rc, 0);
    return pid;
  }

  FailureRecord OnlyFailure() {
    auto r = CaptureReader::Open(SessionRankPath(dir_.path(), 0));
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_EQ((*r)->failures().size(), 1u);
    return (*r)->failures().empty() ? FailureRecord{} : (*r)->failures()[0];
  }

  // The binary's stdout in `out`, its stderr in `err`.
  CliResult Run(const std::string& args) {
    const std::string out = dir_.path() + "/cli.out", err = dir_.path() + "/cli.err";
    const int status = std::system((binary_ + " " + args + " >" + out + " 2>" + err).c_str());
    CliResult r;
    if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
    r.out = Slurp(out);
    r.err = Slurp(err);
    return r;
  }

  RecorderTempDir dir_;
  std::string binary_;
};

TEST_F(CoredumpFailure, AWholeDumpIsNamedAndInfoShowsTheFaultAndTheReplaysOp) {
  const ct::BuiltDump dump = ct::BuildDump(ct::OneFault());
  const pid_t pid = RecordFailure(dump.bytes, dump.bytes.size(), When::kBeforeFailure);
  const FailureRecord f = OnlyFailure();
  EXPECT_EQ(f.coredump, "rank-00000." + std::to_string(pid) + ".cudacore");
  EXPECT_TRUE(f.coredump_complete) << f.coredump_note;

  CliResult info = Run("info " + dir_.path());
  EXPECT_EQ(info.exit_code, 0) << info.out;
  EXPECT_NE(info.out.find("GPU core dumps: env"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("failure (exception, stage decode, step 3)"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("named by the failure record"), std::string::npos) << info.out;
  // The fault line: exception, kernel (demangled), offset, device/SM/warp, block, thread.
  EXPECT_NE(info.out.find("fault: warp assert in `void flash_attn_fwd<float>(float*, int)` +0x1a40, device 3 SM 12 "
                          "warp 5, block (12,0,0) thread (64,0,0) (lane 0)"),
            std::string::npos)
      << info.out;
  EXPECT_NE(info.out.find("the replay's attention at L*.attention runs that kernel's job (matched \"flash_attn\"; its "
                          "kernels L*.attention)"),
            std::string::npos)
      << info.out;

  CliResult js = Run("info --json " + dir_.path());
  ASSERT_EQ(js.exit_code, 0) << js.out;
  const nlohmann::json j = nlohmann::json::parse(js.out);
  const nlohmann::json& file = j["files"][0];
  EXPECT_EQ(file["coredump_arming"]["mode"], "env");
  EXPECT_EQ(file["gpu_fault"]["complete"], true);
  EXPECT_EQ(file["gpu_fault"]["kernel"], "void flash_attn_fwd<float>(float*, int)");
  EXPECT_EQ(file["gpu_fault"]["replay_op"]["op"], "attention");
  EXPECT_EQ(file["failure_records"][0]["coredump"]["complete"], true);
}

TEST_F(CoredumpFailure, AKernelOfTheExpertsAndOneNoOpTakes) {
  ct::DumpModel m = ct::OneFault();
  m.devices[1].modules[1].functions[1].name = "_Z16fused_moe_kernelPfi";  // fused_moe_kernel(float*, int)
  ct::BuiltDump dump = ct::BuildDump(m);
  RecordFailure(dump.bytes, dump.bytes.size(), When::kBeforeFailure);
  CliResult info = Run("info " + dir_.path());
  EXPECT_NE(info.out.find("`fused_moe_kernel(float*, int)` +0x1a40"), std::string::npos) << info.out;
  EXPECT_NE(
      info.out.find(
          "the replay's experts at L*.experts runs that kernel's job (matched \"fused_moe\"; its kernels L*.experts)"),
      std::string::npos)
      << info.out;

  std::filesystem::remove_all(dir_.path());
  std::filesystem::create_directories(dir_.path());
  m.devices[1].modules[1].functions[1].name = "_Z9my_reducePfi";
  dump = ct::BuildDump(m);
  RecordFailure(dump.bytes, dump.bytes.size(), When::kBeforeFailure);
  info = Run("info " + dir_.path());
  EXPECT_NE(info.out.find("no op of the replay is known to run `my_reduce(float*, int)`'s job"), std::string::npos)
      << info.out;
}

TEST_F(CoredumpFailure, ADumpCutMidWriteIsNamedAsIncompleteAndNoFaultIsTakenFromIt) {
  const ct::BuiltDump dump = ct::BuildDump(ct::OneFault());
  // Cut inside the tables: the driver still writing (section headers and
  // the tables are not all there yet).
  RecordFailure(dump.bytes, dump.bytes.size() / 2, When::kBeforeFailure);
  const FailureRecord f = OnlyFailure();
  EXPECT_FALSE(f.coredump.empty());
  EXPECT_FALSE(f.coredump_complete);
  EXPECT_FALSE(f.coredump_note.empty());
  CliResult info = Run("info " + dir_.path());
  EXPECT_NE(info.out.find("incomplete when it was written"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("no fault taken from it"), std::string::npos) << info.out;
  EXPECT_EQ(info.out.find("fault: "), std::string::npos) << info.out;
}

TEST_F(CoredumpFailure, ADumpFinishedAfterTheFailureRecordIsFoundByInfo) {
  const ct::BuiltDump dump = ct::BuildDump(ct::OneFault());
  RecordFailure(dump.bytes, dump.bytes.size(), When::kAfterFailure);
  EXPECT_TRUE(OnlyFailure().coredump.empty());
  CliResult info = Run("info " + dir_.path());
  EXPECT_NE(info.out.find("found beside the capture by its armed name"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("the replay's attention at L*.attention"), std::string::npos) << info.out;
}

TEST_F(CoredumpFailure, ArmedButNoDumpWrittenShowsTheArmingAndNoFault) {
  // A failure that was not a device exception: no dump, nothing waited for.
  RecordFailure({}, 0, When::kAfterFailure);
  EXPECT_TRUE(OnlyFailure().coredump.empty());
  CliResult info = Run("info " + dir_.path());
  EXPECT_EQ(info.out.find("GPU core dump:"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("GPU core dumps: env"), std::string::npos) << info.out;
}

TEST_F(CoredumpFailure, SomethingThatIsNotADumpAtTheArmedNameIsSaidSo) {
  ct::Bytes junk(200, 0x41);
  RecordFailure(junk, junk.size(), When::kBeforeFailure);
  const FailureRecord f = OnlyFailure();
  EXPECT_FALSE(f.coredump_complete);
  CliResult info = Run("info " + dir_.path());
  EXPECT_NE(info.out.find("no fault taken from it"), std::string::npos) << info.out;
  EXPECT_EQ(info.out.find("fault: "), std::string::npos) << info.out;
}

TEST_F(CoredumpFailure, ReplayShowsTheFaultBesideTheReplayedStep) {
  // The built-in engine's own failing run, recorded with dumps armed; the
  // dump is put where the driver would have written it for that process,
  // after the run (so found by its armed name, as after a fatal signal).
  const std::string model = dir_.path() + "/m", session = dir_.path() + "/s";
  ASSERT_EQ(Run("make-model " + model + " --arch llama").exit_code, 0);
  CliResult run = Run("run " + model + " --prompt 'Say hello' --max-new-tokens 3 --set attention_backend=paged64 " +
                      "--record " + session + " --coredumps");
  ASSERT_EQ(run.exit_code, 1) << run.out << run.err;
  auto r = CaptureReader::Open(SessionRankPath(session, 0));
  ASSERT_TRUE(r.ok()) << r.status();
  const SessionManifest& m = *(*r)->manifest();
  ASSERT_TRUE(m.coredump.mode == "env" || m.coredump.mode == "driver_api") << m.coredump.mode << m.coredump.reason;
  const ct::BuiltDump dump = ct::BuildDump(ct::OneFault());
  WriteBytes(CoredumpPathFor(m.coredump.file_pattern, m.pid), dump.bytes, dump.bytes.size());

  CliResult replay = Run("replay " + session);
  EXPECT_EQ(replay.exit_code, 1) << replay.out;  // the recorded failure fires again
  EXPECT_NE(replay.out.find("found beside the capture by its armed name"), std::string::npos) << replay.out;
  EXPECT_NE(replay.out.find("fault: warp assert in `void flash_attn_fwd<float>(float*, int)` +0x1a40"),
            std::string::npos)
      << replay.out;
  EXPECT_NE(replay.out.find("the replay's attention at L*.attention runs that kernel's job"), std::string::npos)
      << replay.out;
  // The command it points to is one the replay takes: the label pattern
  // matches kernels of the step (a pattern matching none is exit 2).
  const std::string next =
      "next: crashreplay replay " + SessionRankPath(session, 0) + " --dump DIR --dump-kernels 'L*.attention'";
  EXPECT_NE(replay.out.find(next), std::string::npos) << replay.out;
  CliResult dumped =
      Run("replay " + SessionRankPath(session, 0) + " --dump " + dir_.path() + "/dump --dump-kernels 'L*.attention'");
  EXPECT_EQ(dumped.exit_code, 1) << dumped.out << dumped.err;
  EXPECT_FALSE(std::filesystem::is_empty(dir_.path() + "/dump")) << dumped.out << dumped.err;
  CliResult js = Run("replay --json " + session);
  const nlohmann::json j = nlohmann::json::parse(js.out);
  EXPECT_EQ(j["gpu_fault"]["replay_op"]["op"], "attention");
  EXPECT_EQ(j["signature"]["kernel"], "attention");  // the exact engine's own failing kernel agrees
}

}  // namespace
}  // namespace crashreplay::capture
