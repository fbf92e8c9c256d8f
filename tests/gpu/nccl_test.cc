// Multi-GPU replay's reduction: one process per GPU, ncclAllGather plus the
// fixed-order sum, gives the same bits as one process emulating the ranks
// (the CPU executor's ReduceOp). Needs NCCL and at least two CUDA devices;
// skips otherwise. The parent spawns one child per rank (this binary, filtered
// to NcclRankChild, with CR_NCCL_RANK/CR_NCCL_RANKS/CR_NCCL_DIR set); each
// child writes its result to a file the parent compares.
#include <gtest/gtest.h>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "exec_replay_test_util.h"
#include "gpu_test_util.h"
#if defined(CRASHREPLAY_HAVE_NCCL)
#include "crashreplay/replay/cuda/nccl_comm.h"
#endif

extern char** environ;

namespace crashreplay::replay {
namespace {

constexpr int64_t kN = 8192 + 5;

std::vector<float> Partial(int rank) {
  std::vector<float> p(kN);
  for (int64_t i = 0; i < kN; ++i) p[i] = std::sin(0.013f * static_cast<float>(i) + static_cast<float>(rank)) * 100.0f;
  return p;
}
std::vector<float> Hidden() {
  std::vector<float> h(kN);
  for (int64_t i = 0; i < kN; ++i) h[i] = std::cos(0.07f * static_cast<float>(i));
  return h;
}

#if defined(CRASHREPLAY_HAVE_NCCL)
TEST(NcclRankChild, AllGatherReduce) {
  const char* rank_s = std::getenv("CR_NCCL_RANK");
  if (rank_s == nullptr) GTEST_SKIP() << "runs only as a child of NcclMultiGpu";
  const int rank = std::atoi(rank_s), ranks = std::atoi(std::getenv("CR_NCCL_RANKS"));
  const std::string dir = std::getenv("CR_NCCL_DIR");
  auto ex = cuda::CudaExecutor::Create(ExecMode::kKernelByKernel, rank);
  ASSERT_TRUE(ex.ok()) << ex.status();
  auto comm = cuda::NcclRanks::Init(ex->get(), rank, ranks, dir + "/nccl_id");
  ASSERT_TRUE(comm.ok()) << comm.status();
  ExecMemory mem(ex->get());
  auto local = mem.Copy(Partial(rank));
  auto hidden = mem.Copy(Hidden());
  auto gathered = mem.Alloc(kN * ranks * 4);
  ASSERT_TRUE(local.ok() && hidden.ok() && gathered.ok());
  ASSERT_TRUE(
      (*comm)
          ->AllGatherReduce(*hidden, *local, static_cast<float*>(*gathered), kN, LaunchTag{"attn_all_reduce", 0})
          .ok());
  std::vector<float> out(kN);
  ASSERT_TRUE((*ex)->CopyToHost(out.data(), *hidden, kN * 4).ok());
  std::ofstream f(dir + "/rank" + std::to_string(rank), std::ios::binary);
  f.write(reinterpret_cast<const char*>(out.data()), kN * 4);
}
#endif

TEST(NcclMultiGpu, OneProcessPerGpuMatchesEmulatedRanksBitForBit) {
  CR_REQUIRE_CUDA_DEVICE();
#if !defined(CRASHREPLAY_HAVE_NCCL)
  GTEST_SKIP() << "built without NCCL";
#else
  if (std::getenv("CR_NCCL_RANK") != nullptr) GTEST_SKIP() << "child";
  const int ranks = std::min(*cuda::DeviceCount(), 4);
  if (ranks < 2) GTEST_SKIP() << "needs at least 2 CUDA devices, found " << ranks;
  const std::string dir = ::testing::TempDir() + "/cr_nccl_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    std::vector<std::string> env_s = {"CR_NCCL_RANK=" + std::to_string(r), "CR_NCCL_RANKS=" + std::to_string(ranks),
                                      "CR_NCCL_DIR=" + dir};
    for (char** e = environ; *e != nullptr; ++e) env_s.push_back(*e);
    std::vector<char*> envp;
    for (auto& s : env_s) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string exe = std::filesystem::read_symlink("/proc/self/exe"), filter = "--gtest_filter=NcclRankChild.*";
    char* argv[] = {exe.data(), filter.data(), nullptr};
    pid_t pid;
    ASSERT_EQ(posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv, envp.data()), 0);
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank process failed";
  }
  // The emulation: all partials in one buffer, summed in rank order on the CPU.
  std::vector<float> all;
  for (int r = 0; r < ranks; ++r) {
    auto p = Partial(r);
    all.insert(all.end(), p.begin(), p.end());
  }
  std::vector<float> want = Hidden();
  ReduceOp op;
  op.hidden = want.data();
  op.partial = all.data();
  op.ranks = ranks;
  op.n = kN;
  for (int64_t i = 0; i < kN; ++i) RunItem(op, i, nullptr, nullptr);
  for (int r = 0; r < ranks; ++r) {
    std::vector<float> got(kN);
    std::ifstream f(dir + "/rank" + std::to_string(r), std::ios::binary);
    ASSERT_TRUE(f.read(reinterpret_cast<char*>(got.data()), kN * 4)) << "rank " << r << " wrote no result";
    EXPECT_EQ(got, want) << "rank " << r;
  }
  std::filesystem::remove_all(dir);
#endif
}

}  // namespace
}  // namespace crashreplay::replay
