// CUDA launchers of the ops; see op_kernels.h. Kept to one template instance
// per op type (plus the tiled linear kernel) to bound compile time.
#include "device_check.cuh"  // first: re-enables assert for this file

#include "op_kernels.h"

namespace crashreplay::replay::cuda {

namespace {

template <typename OpT>
__global__ void __launch_bounds__(kBlockThreads) ItemKernel(OpT op, int64_t items, LaunchArgs a) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  float* scratch = a.scratch != nullptr ? a.scratch + tid * a.scratch_stride : nullptr;
  for (int64_t i = tid; i < items; i += stride) {
    KernelStatus st;
    RunItem(op, i, scratch, &st);
    if (st.fired) RecordFaultAndAssert(a.fault, a.launch, a.layer, OpT::kKind, st);
  }
}

// A row's eight lanes (kernels/linear.h, LinearElementsLane) on eight
// adjacent threads of a warp: LaneSum8 by xor shuffles within the group.
struct ShuffleLanes {
  unsigned mask;  // the group's eight threads
  __device__ float Sum(float v) const {
    v = v + __shfl_xor_sync(mask, v, 1, 8);
    v = v + __shfl_xor_sync(mask, v, 2, 8);
    v = v + __shfl_xor_sync(mask, v, 4, 8);
    return v;
  }
};

// Eight threads per output row (blockDim.x / 8 rows a pass), so that a
// GEMV keeps eight times the loads in flight of a thread per row; the item
// kernel's LinearRow bits (ops.h, LinearRowsLane). Block row x: one rank's
// chunk of kT tokens, each weight term decoded once for all of them. kT 1
// stages the token's input row in shared memory; kT > 1 reads the rows from
// global memory (through L1). w4a4 rows read their quantized input from
// global memory.
template <int kT>
__global__ void __launch_bounds__(kBlockThreads) LinearLanesKernel(LinearOp op, LaunchArgs a) {
  extern __shared__ float xs[];
  const int64_t chunks = (op.tokens + kT - 1) / kT;
  const int64_t rank = blockIdx.x / chunks, t0 = (blockIdx.x % chunks) * kT;
  const int nt = static_cast<int>(op.tokens - t0 < kT ? op.tokens - t0 : kT);
  const float* x0 = nullptr;
  if constexpr (kT == 1) {
    const float* x = LinearInput(op, rank * op.tokens + t0);
    for (int64_t c = threadIdx.x; c < op.cols; c += blockDim.x) xs[c] = x[c];
    __syncthreads();
    x0 = xs;
  }
  const int j = static_cast<int>(threadIdx.x & 7);
  const ShuffleLanes lanes{0xffu << (threadIdx.x & 24)};
  const int64_t per_pass = blockDim.x / 8;
  for (int64_t row = static_cast<int64_t>(blockIdx.y) * per_pass + threadIdx.x / 8; row < op.rows;
       row += static_cast<int64_t>(gridDim.y) * per_pass) {
    KernelStatus st;  // the group's eight threads take this loop together
    LinearRowsLane<kT>(op, rank, t0, nt, row, x0, j, lanes, &st);
    if (st.fired && j == 0) RecordFaultAndAssert(a.fault, a.launch, a.layer, OpKind::kLinear, st);
  }
}

// Reference attention (backend 0), a block per item: the positions' scores
// and exponentials and the output dimensions spread over the block's
// threads, the order-dependent sums on thread 0 (ops.h, AttentionItemPhase):
// the item kernel's bits. A decode step of 32 rows x 16 heads was 512
// threads each walking every position.
__global__ void __launch_bounds__(kAttendThreads) AttentionBlockKernel(AttentionOp op, int64_t items, LaunchArgs a) {
  float* scratch = a.scratch + static_cast<int64_t>(blockIdx.x) * a.scratch_stride;
  for (int64_t it = blockIdx.x; it < items; it += gridDim.x) {
    KernelStatus st;
    for (int phase = 0; phase < kAttendPhases; ++phase) {
      const bool go = AttentionItemPhase(op, it, phase, threadIdx.x, blockDim.x, scratch, &st);
      __syncthreads();
      if (!go) break;  // the same on every thread (phase 1 reads what phase 0 wrote)
    }
    if (st.fired) RecordFaultAndAssert(a.fault, a.launch, a.layer, OpKind::kAttention, st);
  }
}

// The experts' stage 1 (ops.h, ExpertActivationItem) a thread a slot,
// grid-stride.
template <typename E>
__global__ void __launch_bounds__(kBlockThreads) ExpertActivationKernel(E op, int64_t items, LaunchArgs a) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = tid; i < items; i += stride) {
    KernelStatus st;
    ExpertActivationItem(op, i, a.scratch, &st);
    if (st.fired) RecordFaultAndAssert(a.fault, a.launch, a.layer, E::kKind, st);
  }
}

// Stage 0 or 2 of the experts (ops.h, ExpertStageItemLane) on eight
// adjacent threads per item, grid-stride: the eight threads of an item take
// the loop together, so their shuffles meet.
template <typename E>
__global__ void __launch_bounds__(kBlockThreads) ExpertStageLanesKernel(E op, int stage, int64_t items, LaunchArgs a) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x / 8;
  const int j = static_cast<int>(threadIdx.x & 7);
  const ShuffleLanes lanes{0xffu << (threadIdx.x & 24)};
  for (int64_t i = tid / 8; i < items; i += stride) {
    KernelStatus st;
    ExpertStageItemLane(op, stage, i, a.scratch, j, lanes, &st);
    if (st.fired && j == 0) RecordFaultAndAssert(a.fault, a.launch, a.layer, E::kKind, st);
  }
}

int64_t Blocks(int64_t threads, int per_block = kBlockThreads) { return (threads + per_block - 1) / per_block; }

// The three stages in stream order; the workspace is the launch scratch.
// The dot-product stages (0: gate/up rows, 2: down rows) run eight threads
// an item: on an H200 the qwen3_moe NVFP4 decode step's experts took 8.3 of
// its 31 ms with a thread an item.
template <typename E>
cudaError_t EnqueueExpertStages(const E& op, const LaunchArgs& a, cudaStream_t stream) {
  for (int stage = 0; stage < 3; ++stage) {
    const int64_t items = ExpertStageItems(op, stage);
    if (items <= 0) return cudaSuccess;
    const int64_t threads = stage == 1 ? items : 8 * items;
    const int64_t blocks = Blocks(threads) < (int64_t{1} << 30) ? Blocks(threads) : (int64_t{1} << 30);
    if (stage == 1) {
      ExpertActivationKernel<E><<<static_cast<unsigned>(blocks), kBlockThreads, 0, stream>>>(op, items, a);
    } else {
      ExpertStageLanesKernel<E><<<static_cast<unsigned>(blocks), kBlockThreads, 0, stream>>>(op, stage, items, a);
    }
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

template <typename OpT>
cudaError_t EnqueueItems(const OpT& op, const LaunchArgs& a, cudaStream_t stream) {
  const int64_t items = Items(op);
  if (items <= 0) return cudaSuccess;
  const int64_t threads = ScratchThreads(items, ScratchFloats(op));
  const int64_t blocks = Blocks(threads) < (int64_t{1} << 30) ? Blocks(threads) : (int64_t{1} << 30);
  ItemKernel<OpT><<<static_cast<unsigned>(blocks), kBlockThreads, 0, stream>>>(op, items, a);
  return cudaGetLastError();
}

}  // namespace

int64_t ScratchThreads(int64_t items, int64_t scratch_floats) {
  return scratch_floats > 0 && items > kMaxScratchThreads ? kMaxScratchThreads : items;
}

cudaError_t Enqueue(const LinearOp& op, const LaunchArgs& a, cudaStream_t stream) {
  const int64_t rt = op.ranks * op.tokens;
  if (rt <= 0 || op.rows <= 0) return cudaSuccess;
  int device = 0, sms = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) return e;
  // 256-thread blocks (32 rows), unless that leaves SMs idle: then 64 (8 rows).
  auto launch = [&](auto kernel, int64_t xblocks, size_t shared) {
    const int threads = xblocks * Blocks(op.rows * 8) < sms ? kLinearThreadsFew : kBlockThreads;
    const int64_t ychunks = Blocks(op.rows * 8, threads) < 65535 ? Blocks(op.rows * 8, threads) : 65535;
    kernel<<<dim3(static_cast<unsigned>(xblocks), static_cast<unsigned>(ychunks)), threads, shared, stream>>>(op, a);
    return cudaGetLastError();
  };
  if (op.tokens > 1 && op.weight_format == WFormat::kE2m1) {
    // Tokens in chunks of kLinearTokens, each weight term decoded once a
    // chunk: on an H200, 8192x8192 NVFP4 at 8 tokens 1.98 -> 0.82 ms
    // (dequant), 2.35 -> 1.52 ms (fused), MXFP4 1.27 -> 0.73 ms. Not for
    // bf16 and fp8, whose terms are cheap to decode: there the chunk's eight
    // input loads per term cost more than a token per block re-reading the
    // weights from L2 (bf16 at 8 tokens 0.36 -> 0.68 ms).
    const int64_t xblocks = op.ranks * ((op.tokens + kLinearTokens - 1) / kLinearTokens);
    if (xblocks > 0x7fffffff) return EnqueueItems(op, a, stream);
    return launch(LinearLanesKernel<kLinearTokens>, xblocks, 0);
  }
  const size_t shared = static_cast<size_t>(op.cols) * sizeof(float);
  int optin = 0;
  e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (e != cudaSuccess) return e;
  if (rt > 0x7fffffff || shared > static_cast<size_t>(optin)) return EnqueueItems(op, a, stream);
  if (shared > 48 * 1024) {
    e = cudaFuncSetAttribute(LinearLanesKernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(shared));
    if (e != cudaSuccess) return e;
  }
  return launch(LinearLanesKernel<1>, rt, shared);
}

cudaError_t Enqueue(const AttentionOp& op, const LaunchArgs& a, cudaStream_t stream) {
  if (op.backend != 0) return EnqueueItems(op, a, stream);
  const int64_t items = Items(op);
  if (items <= 0) return cudaSuccess;
  const int64_t blocks = ScratchThreads(items, ScratchFloats(op));  // one scratch slot a block
  AttentionBlockKernel<<<static_cast<unsigned>(blocks), kAttendThreads, 0, stream>>>(op, items, a);
  return cudaGetLastError();
}

#define CR_DEFINE_ENQUEUE(OpT) \
  cudaError_t Enqueue(const OpT& op, const LaunchArgs& a, cudaStream_t s) { return EnqueueItems(op, a, s); }
CR_DEFINE_ENQUEUE(EmbeddingOp)
CR_DEFINE_ENQUEUE(RmsNormOp)
CR_DEFINE_ENQUEUE(RopeOp)
CR_DEFINE_ENQUEUE(KvWriteOp)
CR_DEFINE_ENQUEUE(SiluMulOp)
CR_DEFINE_ENQUEUE(ReduceOp)
CR_DEFINE_ENQUEUE(RouterOp)
CR_DEFINE_ENQUEUE(TopKOp)
CR_DEFINE_ENQUEUE(GatherLogitsOp)
CR_DEFINE_ENQUEUE(ProcessLogitsOp)
CR_DEFINE_ENQUEUE(SampleOp)
CR_DEFINE_ENQUEUE(ActQuantOp)
CR_DEFINE_ENQUEUE(LatentWriteOp)
CR_DEFINE_ENQUEUE(LatentGatherOp)
CR_DEFINE_ENQUEUE(MlaAttentionOp)
CR_DEFINE_ENQUEUE(MlaQAbsorbOp)
CR_DEFINE_ENQUEUE(LatentAttentionOp)
CR_DEFINE_ENQUEUE(MlaVUpOp)
CR_DEFINE_ENQUEUE(IndexKWriteOp)
CR_DEFINE_ENQUEUE(IndexerOp)
CR_DEFINE_ENQUEUE(StoreOp)
#undef CR_DEFINE_ENQUEUE

cudaError_t Enqueue(const ExpertsOp& op, const LaunchArgs& a, cudaStream_t s) { return EnqueueExpertStages(op, a, s); }
cudaError_t Enqueue(const SharedExpertOp& op, const LaunchArgs& a, cudaStream_t s) {
  return EnqueueExpertStages(op, a, s);
}

}  // namespace crashreplay::replay::cuda
