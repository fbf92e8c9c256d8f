// Device-side checks for real: a step that trips a check dies with
// cudaErrorAssert, and the replay still names the kernel, check, layer and
// value from the mapped pinned fault record, in both modes. Each case runs in
// a child process (a "threadsafe" death test re-executes this binary, so the
// child starts before any CUDA initialisation and its context may die
// without harming the parent). Skips without a CUDA device.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "exec_replay_test_util.h"
#include "gpu_test_util.h"

namespace crashreplay::replay {
namespace {

// Runs the recorded steps on CUDA in `mode` and exits 3 after printing the
// fault, or 0 if nothing failed. Runs in the child.
[[noreturn]] void ReplayAndReport(const std::vector<std::string>& sets, const char* arch, ExecMode mode) {
  MakeModelOptions o;
  o.arch = arch;
  auto run = testing::RecordRun(o, sets, 3, 0.0f);
  if (!run.engine) std::_Exit(10);
  auto gpu = MakeExecutor("cuda", mode);
  if (!gpu.ok()) std::_Exit(11);
  auto rep = testing::ReplayOnExecutor(run, gpu->get(), false);
  if (rep.status.ok()) std::_Exit(0);
  const auto& f = (*gpu)->fault();
  if (!f) {
    std::fprintf(stderr, "no fault record: %s\n", std::string(rep.status.message()).c_str());
    std::_Exit(12);
  }
  if (!run.result.fault) {
    std::fprintf(stderr, "cuda failed where the cpu did not: %s\n", f->Describe().c_str());
    std::_Exit(14);
  }
  // The CPU engine's fault for the same run, for the parent to compare.
  const Fault& want = *run.result.fault;
  std::fprintf(stderr, "cuda: kernel=%s layer=%d check=%s index=%lld value=%g error=%s surfaced=%s\n",
               f->tag.kernel.c_str(), f->tag.layer, CheckName(f->status.check), static_cast<long long>(f->status.index),
               f->status.value, f->device_error.c_str(), f->surfaced_in.c_str());
  std::fprintf(stderr, "cpu: kernel=%s layer=%d check=%s index=%lld value=%g\n", want.kernel.c_str(), want.layer,
               want.check.c_str(), static_cast<long long>(want.index), want.value);
  const bool same = f->tag.kernel == want.kernel && f->tag.layer == want.layer &&
                    CheckName(f->status.check) == want.check && f->status.index == want.index &&
                    f->status.value == want.value;
  std::fprintf(stderr, "match=%s launch=%u surfaced_after=%u\n", same ? "yes" : "no", f->launch,
               f->surfaced_after_launch);
  // After the sticky error every call fails the same way.
  if ((*gpu)->Synchronize().code() != absl::StatusCode::kAborted) std::_Exit(13);
  std::_Exit(3);
}

// The child's report is matched by substrings, not by a death-test regex:
// on the first H200 run (Ubuntu's glibc 2.39, gtest built on Debian 12) every
// regex with a group, even "", failed to match output that held the text,
// while group-free ones matched.
using ::testing::AllOf;
using ::testing::HasSubstr;

class DeviceAssert : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(DeviceAssert, Paged64OnSmallPagesTrapsInDecodeAttentionKernelByKernel) {
  CR_REQUIRE_CUDA_DEVICE();
  EXPECT_EXIT(
      ReplayAndReport({"attention_backend=paged64"}, "llama", ExecMode::kKernelByKernel), ::testing::ExitedWithCode(3),
      AllOf(HasSubstr("cuda: kernel=attention layer=0 check=page_size_is_64 "),
            HasSubstr(" error=cudaErrorAssert (710)"), HasSubstr(" surfaced=Launch\n"), HasSubstr("\nmatch=yes ")));
}

TEST_F(DeviceAssert, AsyncModeSurfacesLaterButTheRecordNamesTheFailingKernel) {
  CR_REQUIRE_CUDA_DEVICE();
  // Async: the assert surfaces at a later call (a following launch, a copy or
  // the step's synchronize); the record still says attention, layer 0.
  EXPECT_EXIT(ReplayAndReport({"attention_backend=paged64"}, "llama", ExecMode::kAsync), ::testing::ExitedWithCode(3),
              AllOf(HasSubstr("cuda: kernel=attention layer=0 check=page_size_is_64 "),
                    HasSubstr(" error=cudaErrorAssert (710)"), HasSubstr("\nmatch=yes ")));
}

TEST_F(DeviceAssert, Ue8m0KernelTrapsOnNvfp4ScalesWithTheScaleValue) {
  CR_REQUIRE_CUDA_DEVICE();
  auto child = [] {
    MakeModelOptions o;
    o.arch = "llama";
    o.quant = "nvfp4";
    auto run = testing::RecordRun(o, {"scale_format=ue8m0"}, 2, 0.0f);
    if (!run.engine || !run.result.fault) std::_Exit(10);
    auto gpu = MakeExecutor("cuda", ExecMode::kKernelByKernel);
    if (!gpu.ok()) std::_Exit(11);
    auto rep = testing::ReplayOnExecutor(run, gpu->get(), false);
    const auto& f = (*gpu)->fault();
    if (rep.status.ok() || !f) std::_Exit(12);
    // Several threads fail; the first to claim the record wins, so the value
    // is one of the offending scales, not necessarily the CPU's first.
    const float v = static_cast<float>(f->status.value);
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    std::fprintf(stderr, "check=%s kernel=%s cpu_kernel=%s not_ue8m0=%d\n", CheckName(f->status.check),
                 f->tag.kernel.c_str(), run.result.fault->kernel.c_str(), (bits & 0x807fffffu) != 0);
    std::_Exit(3);
  };
  EXPECT_EXIT(child(), ::testing::ExitedWithCode(3),
              "check=ue8m0_scale_layout kernel=q_proj cpu_kernel=q_proj not_ue8m0=1");
}

TEST_F(DeviceAssert, GoodConfigurationRunsToTheEndWithoutATrap) {
  CR_REQUIRE_CUDA_DEVICE();
  EXPECT_EXIT(ReplayAndReport({"attention_backend=paged64", "page_size=64"}, "llama", ExecMode::kAsync),
              ::testing::ExitedWithCode(0), ::testing::A<const std::string&>());
}

}  // namespace
}  // namespace crashreplay::replay
