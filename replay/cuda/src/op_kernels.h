// The CUDA launchers of the ops (ops.h): launch geometry and tiling only; each
// thread computes whole work items with the shared CR_HD bodies.
//
// Geometry: ItemKernel runs one work item per thread, 256 threads a block, a
// grid-stride loop; the routed and shared experts run in three stages
// (ops.h, ExpertStageItem: gate/up rows, activation, down rows) in a
// workspace, the rows' stages eight threads an element
// (ExpertStageItemLane), the activation a thread a slot; ops with per-item scratch cap the grid at
// kMaxScratchThreads threads so the scratch workspace (threads x
// ScratchFloats) stays bounded. LinearOp uses a tiled kernel: one block row
// per (rank, token), the input row staged in shared memory, threads over
// output rows; it falls back to ItemKernel when the row exceeds the shared
// memory the device allows, and under w4a4 (xq set: the operand is the
// quantized row, read from global memory by the same LinearRow body).
// A failed check writes the fault record and executes a device assert.
// Returns the launch's cudaError_t (configuration errors only; execution
// errors surface at a later synchronizing call).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "crashreplay/replay/cuda/fault_record.h"
#include "crashreplay/replay/kernels/ops.h"

namespace crashreplay::replay::cuda {

inline constexpr int kBlockThreads = 256;
// The tiled linear kernel's block (eight threads a row) when 256-thread
// blocks would leave SMs idle: 8 rows a block instead of 32.
inline constexpr int kLinearThreadsFew = 64;
// Tokens a thread group of the linear kernel computes from one read of the
// weights (op.tokens > 1).
inline constexpr int kLinearTokens = 8;
// Threads of the reference attention's block per item.
inline constexpr int kAttendThreads = 128;
inline constexpr int64_t kMaxScratchThreads = 1 << 16;

struct LaunchArgs {
  DeviceFaultRecord* fault = nullptr;  // device view of the mapped record
  uint32_t launch = 0;
  int32_t layer = -1;
  float* scratch = nullptr;            // threads * scratch_stride floats
  int64_t scratch_stride = 0;
};

// Threads the launch of `items` work items with `scratch_floats` each uses
// (what the caller must provide scratch for).
int64_t ScratchThreads(int64_t items, int64_t scratch_floats);
// The scratch a launch needs in all (cuda_executor.cc): ScratchThreads x
// ScratchFloats for the item kernels, and for the experts the workspace of
// their three stages: ExpertStageItems(op, 1) x ExpertSlotFloats(op.inter).

#define CR_DECLARE_ENQUEUE(OpT) cudaError_t Enqueue(const OpT& op, const LaunchArgs& args, cudaStream_t stream);
CR_DECLARE_ENQUEUE(EmbeddingOp)
CR_DECLARE_ENQUEUE(RmsNormOp)
CR_DECLARE_ENQUEUE(LinearOp)
CR_DECLARE_ENQUEUE(RopeOp)
CR_DECLARE_ENQUEUE(KvWriteOp)
CR_DECLARE_ENQUEUE(AttentionOp)
CR_DECLARE_ENQUEUE(SiluMulOp)
CR_DECLARE_ENQUEUE(ReduceOp)
CR_DECLARE_ENQUEUE(RouterOp)
CR_DECLARE_ENQUEUE(TopKOp)
CR_DECLARE_ENQUEUE(ExpertsOp)
CR_DECLARE_ENQUEUE(SharedExpertOp)
CR_DECLARE_ENQUEUE(GatherLogitsOp)
CR_DECLARE_ENQUEUE(ProcessLogitsOp)
CR_DECLARE_ENQUEUE(SampleOp)
CR_DECLARE_ENQUEUE(ActQuantOp)
CR_DECLARE_ENQUEUE(LatentWriteOp)
CR_DECLARE_ENQUEUE(LatentGatherOp)
CR_DECLARE_ENQUEUE(MlaAttentionOp)
CR_DECLARE_ENQUEUE(MlaQAbsorbOp)
CR_DECLARE_ENQUEUE(LatentAttentionOp)
CR_DECLARE_ENQUEUE(MlaVUpOp)
CR_DECLARE_ENQUEUE(IndexKWriteOp)
CR_DECLARE_ENQUEUE(IndexerOp)
CR_DECLARE_ENQUEUE(StoreOp)
#undef CR_DECLARE_ENQUEUE

}  // namespace crashreplay::replay::cuda
