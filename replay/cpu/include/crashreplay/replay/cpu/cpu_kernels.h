// Fast CPU launchers for the ops that dominate a step: projections
// (LinearOp), MoE experts (ExpertsOp, SharedExpertOp) and the reference
// attention (AttentionOp). The CPU executor
// calls them from Launch; the CUDA executor keeps launching the work items of
// ops.h.
//
// Same bits as the work items. Every output element is computed with the
// arithmetic of the element functions in kernels/linear.h and
// kernels/expert.h (LinearElement / LinearElementQ / ExpertMlp): each dot
// product sums its products in 8 lanes (lane = column mod 8, each lane in
// column order), the lanes combine in LaneSum8's fixed tree, and a * b + c is
// two roundings. What changes is only how the work is laid out: rows x tokens
// are blocked so a weight is decoded once for several tokens, eight lanes are
// one SIMD register, and the experts of a MoE layer run as one GEMM per
// expert over the tokens routed to it. So the results are those of the
// reference, on any host and thread count; cpu_kernels_test compares them
// over every weight format, dot variant and odd shape.
//
// Fused multiply-add: where every product of a dot is exact in fp32 (both
// operands of few significant bits, e.g. bf16 inputs - activation_dtype=bf16
// - against bf16, fp8 or fp4 weights, and magnitudes where no product
// underflows or overflows), a * b + c rounds once either way, so the AVX2
// and AVX-512 kernels use FMA there and the bits stay those above (cpu_dot.h
// says how it is decided). CRASHREPLAY_CPU_FMA=off turns it off (to compare).
//
// Instruction sets: kAvx2 (x86-64 with AVX2 and FMA) or kGeneric (the same code for the baseline target: SSE2
// on x86-64, NEON on aarch64), chosen at run time. kReference turns the fast
// path off (the executor runs the work items). CRASHREPLAY_CPU_KERNELS=
// reference|generic|avx2 overrides the choice (a request the CPU cannot run
// falls back to the best it can).
//
// Checks: the launchers never fire a check themselves. Before running, they
// look at every scale the op's dot products will read; when one would fail
// a check (the UE8M0 layout, an NVFP4 input_scale) or the op has a shape the
// fast kernels do not cover (a block size that is not a multiple of 8, odd
// e2m1 rows), they return false without writing anything, and the caller
// runs the work items, which report the failure exactly as before.
// Scratch: a launcher's working memory (inputs decoded for the dot engine,
// the experts' per-slot rows) is bounded by CpuScratchBytes(); an op whose
// tokens need more runs in chunks of tokens, each as one launch. Every
// output element is still computed alone, so chunks change how often a
// weight is read, never the bits.
// Thread safety: a launch uses the pool's threads; one launch at a time per
// pool, as CpuPool requires.
#pragma once

#include "crashreplay/replay/cpu/cpu_pool.h"
#include "crashreplay/replay/kernels/check.h"
#include "crashreplay/replay/kernels/ops.h"

namespace crashreplay::replay {

// kAvx512: the AVX2 kernels' arithmetic built for AVX-512 (F, VL, BW, DQ):
// 32 vector registers (larger tiles) and two-table permutes; same bits.
enum class CpuIsa { kReference, kGeneric, kAvx2, kAvx512 };

const char* CpuIsaName(CpuIsa isa);
// Whether this CPU runs `isa` (kReference and kGeneric: always).
bool CpuIsaSupported(CpuIsa isa);
// The best supported ISA, or CRASHREPLAY_CPU_KERNELS when set and supported.
CpuIsa DefaultCpuIsa();
// False when CRASHREPLAY_CPU_FMA=off (read once): no dot fuses.
bool CpuFusedMulAdd();

// The launchers' scratch bound in bytes (default 512 MiB, at least one token's
// worth is always used). SetCpuScratchBytes changes it for the whole process
// (tests force chunking with a small one); not to be called during a launch.
size_t CpuScratchBytes();
void SetCpuScratchBytes(size_t bytes);

// Each returns false when it did not run the op (isa is kReference, or the
// op is not covered: see above); then nothing was written. True: the op ran
// and `status` is clear (no check can fire on a covered op).
bool LaunchLinearFast(const LinearOp& op, CpuPool& pool, CpuIsa isa, KernelStatus* status);
bool LaunchExpertsFast(const ExpertsOp& op, CpuPool& pool, CpuIsa isa, KernelStatus* status);
bool LaunchSharedExpertFast(const SharedExpertOp& op, CpuPool& pool, CpuIsa isa, KernelStatus* status);
// The reference attention kernel (AttentionOp backend 0) in SIMD form
// (cpu_attention.cc): covered unless another backend, head_dim % 8 != 0, or
// a page the work items would reject.
bool LaunchAttentionFast(const AttentionOp& op, CpuPool& pool, CpuIsa isa, KernelStatus* status);
// The expanded MLA attention (MlaAttentionOp) likewise: covered unless
// nope, rope or v_dim % 8 != 0 or a top-k index the work items would reject.
bool LaunchMlaAttentionFast(const MlaAttentionOp& op, CpuPool& pool, CpuIsa isa, KernelStatus* status);
// The absorbed MLA query (MlaQAbsorbOp, every absorbed and DSA decode):
// covered when kv_lora % 8 == 0 and a scaled kv_b_proj's blocks span whole
// groups of 8 columns.
bool LaunchMlaQAbsorbFast(const MlaQAbsorbOp& op, CpuPool& pool, CpuIsa isa, KernelStatus* status);
// DSA's lightning indexer (IndexerOp) at tp > 1: rank 0's work items, and
// rank 0's ids for every rank whose index-key pages (those the step reads)
// hold rank 0's bytes (cpu_indexer.cc); covered unless a check would fire.
bool LaunchIndexerFast(const IndexerOp& op, CpuPool& pool, CpuIsa isa, KernelStatus* status);
// DSA decode's sparse reference attention over the latent cache
// (LatentAttentionOp, kSparseReference): covered when kv_lora and
// kv_lora + rope are multiples of 8 and every top-k index and its page is
// one the work items accept.
bool LaunchLatentAttentionFast(const LatentAttentionOp& op, CpuPool& pool, CpuIsa isa, KernelStatus* status);

}  // namespace crashreplay::replay
