#include "crashreplay/replay/cuda/nccl_comm.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include <nccl.h>

#include "../cuda_error.h"
#include "crashreplay/base/status.h"
#include "crashreplay/base/text.h"

namespace crashreplay::replay::cuda {

using text::Cat;

namespace {
absl::Status NcclStatus(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return absl::OkStatus();
  return absl::InternalError(Cat(what, " failed: ", ncclGetErrorString(r), " (", static_cast<int>(r), ")"));
}

absl::Status WriteId(const ncclUniqueId& id, const std::string& path) {
  const std::string tmp = Cat(path, ".tmp.", getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(id.internal, sizeof(id.internal));
    if (!f) return absl::InternalError(Cat("cannot write the NCCL id to ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return absl::InternalError(Cat("cannot rename ", tmp, " to ", path));
  return absl::OkStatus();
}

absl::StatusOr<ncclUniqueId> ReadId(const std::string& path, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    std::ifstream f(path, std::ios::binary);
    ncclUniqueId id;
    if (f.read(id.internal, sizeof(id.internal))) return id;
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError(
          Cat("rank 0 did not write the NCCL id to ", path, " within ", timeout_s, " s; is rank 0 running?"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}
}  // namespace

struct NcclRanks::Impl {
  ncclComm_t comm = nullptr;
};

absl::StatusOr<std::unique_ptr<NcclRanks>> NcclRanks::Init(CudaExecutor* exec, int rank, int ranks,
                                                           const std::string& id_path, double timeout_s) {
  if (ranks < 1 || rank < 0 || rank >= ranks) {
    return absl::InvalidArgumentError(Cat("NCCL rank ", rank, " of ", ranks, " is out of range"));
  }
  ncclUniqueId id;
  if (rank == 0) {
    CR_RETURN_IF_ERROR(NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"));
    CR_RETURN_IF_ERROR(WriteId(id, id_path));
  } else {
    auto read = ReadId(id_path, timeout_s);
    if (!read.ok()) return read.status();
    id = *read;
  }
  std::unique_ptr<NcclRanks> n(new NcclRanks);
  n->impl_ = std::make_unique<Impl>();
  n->exec_ = exec;
  n->rank_ = rank;
  n->ranks_ = ranks;
  CR_CUDA_RETURN_IF_ERROR(cudaSetDevice(exec->device()));
  CR_RETURN_IF_ERROR(NcclStatus(ncclCommInitRank(&n->impl_->comm, ranks, id, rank), "ncclCommInitRank"));
  return n;
}

NcclRanks::~NcclRanks() {
  if (impl_ && impl_->comm != nullptr) ncclCommDestroy(impl_->comm);
}

absl::Status NcclRanks::AllGather(const float* local, float* gathered, int64_t n) {
  CR_RETURN_IF_ERROR(
      NcclStatus(ncclAllGather(local, gathered, static_cast<size_t>(n), ncclFloat32, impl_->comm, exec_->stream()),
                 "ncclAllGather"));
  return exec_->mode() == ExecMode::kKernelByKernel ? exec_->Synchronize() : absl::OkStatus();
}

absl::Status NcclRanks::AllGatherReduce(float* hidden, const float* local, float* gathered, int64_t n,
                                        const LaunchTag& tag) {
  CR_RETURN_IF_ERROR(AllGather(local, gathered, n));
  ReduceOp op;
  op.hidden = hidden;
  op.partial = gathered;
  op.ranks = ranks_;
  op.n = n;
  return exec_->Launch(op, tag);
}

}  // namespace crashreplay::replay::cuda
