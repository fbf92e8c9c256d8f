// Shared pieces of the GPU tests: skipping cleanly without a device, and the
// per-dtype tolerance of the CUDA-vs-CPU comparison.
//
// Tolerance (docs/cuda.md): |cuda - cpu| <= atol + |cpu| * eps.
// Device code is built with --fmad=false and IEEE division/sqrt, so kernels
// made of multiplies and adds (linear layers, dequantization, RMSNorm, the
// fixed-order TP sum, the logits gather, embedding) must match bit for bit.
// Kernels that call expf/sinf/cosf (attention softmax, RoPE, SiLU, router
// softmax/sigmoid, logits processing) may differ by a few fp32 ulps,
// amplified by the sums that follow in the same kernel:
//   per kernel, inputs fed from the CPU:  fp32 activations  atol 1e-6, eps 1e-5
//                                         int32 outputs     exact
//                                         NVFP4 activations (bytes) exact
//   a whole step, nothing fed back: the difference may pass through one
//   rounding to the KV-cache / weight storage dtype per layer, so eps is that
//   dtype's unit roundoff: bf16 2^-8, fp8 e4m3 2^-4, e2m1 2^-2 (atol 1e-5).
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "crashreplay/formats/dtype.h"
#include "crashreplay/replay/cuda/cuda_executor.h"

#define CR_REQUIRE_CUDA_DEVICE()                                                                     \
  do {                                                                                               \
    auto cr_count_ = ::crashreplay::replay::cuda::DeviceCount();                                     \
    if (!cr_count_.ok()) GTEST_SKIP() << "no CUDA device, GPU test skipped: " << cr_count_.status(); \
  } while (0)

namespace crashreplay::replay::testing {

struct Tolerance {
  double atol;
  double eps;
};

inline constexpr Tolerance kKernelTolerance{1e-6, 1e-5};

// End to end, by the storage dtype activations may round through.
inline Tolerance ToleranceFor(DType storage) {
  switch (storage) {
    case DType::kF32: return {1e-6, 1e-5};
    case DType::kBF16: return {1e-5, 1.0 / 256};        // one bf16 rounding
    case DType::kF8E4M3: return {1e-5, 1.0 / 16};       // one e4m3 rounding
    default: return {1e-5, 1.0 / 4};                    // e2m1 (NVFP4/MXFP4)
  }
}

// Kernels whose arithmetic has no transcendental function: bitwise equal.
inline bool ExactKernel(const std::string& name) {
  for (const char* k :
       {"embedding", "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "attn_all_reduce",
        "mlp_all_reduce", "moe_all_reduce", "router", "lm_head", "logits_all_gather", "kv_write", "input_norm",
        "post_attention_norm", "final_norm", "qkv_act_quant", "o_act_quant", "gate_up_act_quant", "down_act_quant",
        "experts_act_quant", "shared_expert_act_quant",
                        // MLA / DSA: projections, norms, the latent's moves, the
                        // absorption matmuls and the indexer's integer top-k
                        // carry no transcendental function.
        "q_a_proj", "q_b_proj", "kv_a_proj", "q_a_norm", "kv_a_norm", "latent_gather", "kv_b_proj", "q_absorb", "v_up",
        "indexer_q_proj", "indexer_k_proj", "indexer_k_norm", "indexer_weights_proj", "indexer", "qkv_a_act_quant"}) {
    if (name == k) return true;
  }
  return false;
}

// llm.c-style check: skips non-finite references, stops after 10 mismatches.
inline int CompareWithTolerance(const std::vector<float>& ref, const std::vector<float>& got, Tolerance tol,
                                const std::string& what) {
  int bad = 0;
  for (size_t i = 0; i < ref.size() && bad < 10; ++i) {
    if (!std::isfinite(ref[i])) continue;
    const double d = std::abs(static_cast<double>(got[i]) - ref[i]);
    if (!(d <= tol.atol + std::abs(ref[i]) * tol.eps)) {
      ADD_FAILURE() << what << "[" << i << "]: cpu " << ref[i] << " cuda " << got[i] << " (|diff| " << d << ")";
      bad += 1;
    }
  }
  return bad;
}

}  // namespace crashreplay::replay::testing
