// Tensor-parallel collectives across processes, one process per GPU, with
// NCCL (DESIGN decision 9). The reduction is the same as the CPU backend's
// emulated ranks: ncclAllGather of every rank's partial result into
// [ranks, n], then the fixed-order sum (ReduceOp: rank 0 + rank 1 + ...) run
// by every rank on identical gathered data, so N GPUs, one GPU emulating N
// ranks, and the CPU produce the same bits. ncclAllReduce is not used: its
// summation order depends on the algorithm and topology NCCL picks.
//
// Bootstrap: rank 0 writes the ncclUniqueId to `id_path` (write to a temp
// file, then rename); the other ranks poll for it up to `timeout_s`. The
// path must be on a file system all ranks see.
//
// Only in builds with CRASHREPLAY_HAVE_NCCL. Errors: ncclResult_t and
// cudaError_t become Status (Internal, naming the call); DeadlineExceeded if
// the id file never appears. One thread per communicator.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "crashreplay/replay/cuda/cuda_executor.h"

namespace crashreplay::replay::cuda {

class NcclRanks {
 public:
  static absl::StatusOr<std::unique_ptr<NcclRanks>> Init(CudaExecutor* exec, int rank, int ranks,
                                                         const std::string& id_path, double timeout_s = 60);
  ~NcclRanks();

  int rank() const { return rank_; }
  int ranks() const { return ranks_; }

  // gathered[r * n + i] = partial of rank r (this rank's is `local`), then
  // hidden[i] += sum over r in rank order, on the executor's stream.
  // `gathered` holds ranks * n floats of device memory.
  absl::Status AllGatherReduce(float* hidden, const float* local, float* gathered, int64_t n, const LaunchTag& tag);

  // gathered[r * n + i] = local of rank r (the logits all-gather).
  absl::Status AllGather(const float* local, float* gathered, int64_t n);

 private:
  NcclRanks() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  CudaExecutor* exec_ = nullptr;
  int rank_ = 0, ranks_ = 1;
};

}  // namespace crashreplay::replay::cuda
