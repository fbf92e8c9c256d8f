// One expert's SiLU-gated MLP for one token, the body both MoE kernels
// (routed experts and shared experts) run per (rank, token) work item:
//
//   g = gate x,  u = up x,  a = silu(g) * u,  out += weight * (down a)
//
// gpt-oss's experts (ExpertView's biases and glu_limit > 0) add each
// projection's bias to its dot product and take the clamped SwiGLU
// (elementwise.h, ClampedSwiglu) for silu(g) * u:
//   g = gate x + bg,  u = up x + bu,  a = swiglu(g, u),  out += weight * (down a + bd)
//
// in that order, every dot through LinearElement/LinearElementQ. Under w4a4
// (the weights' act_fp4) the gate/up GEMVs read `xq`, the token's input
// quantized by the step's act_quant kernel, and the intermediate `a` is
// quantized here, inside the MoE kernel, with down's act_scale, as fused MoE
// kernels (CUTLASS, FlashInfer) quantize the intermediate between their two
// grouped GEMMs.
//
// Scratch: ExpertScratchFloats(inter) floats. The accumulation into `out` is
// MulAdd(out, weight, y): with weight 1 it is out + y exactly.
#pragma once

#include <cstdint>

#include "crashreplay/base/hd.h"
#include "crashreplay/replay/kernels/act_quant.h"
#include "crashreplay/replay/kernels/check.h"
#include "crashreplay/replay/kernels/elementwise.h"
#include "crashreplay/replay/kernels/linear.h"

namespace crashreplay::replay {

CR_HD int64_t ExpertScratchFloats(int64_t inter) { return 3 * inter + Nvfp4ActScratchFloats(inter); }

// x: the token's input row [hidden]; xq: the same row quantized (or null when
// the layer's input is not quantized). A failed check leaves `out` partial;
// the status names it.
// One expert's (or shared expert's) weights as the MoE kernels read them.
struct ExpertView {
  QWeight gate, up, down;
  // gpt_oss: each projection's bias ([its rows]; null: none) and the clamped
  // SwiGLU's alpha and limit (limit 0: silu(g) * u).
  const float *gate_bias = nullptr, *up_bias = nullptr, *down_bias = nullptr;
  float glu_alpha = 0.0f, glu_limit = 0.0f;
};

// A projection row's bias (0 without one): added to the dot product, as
// torch adds a Linear's bias after its matmul.
CR_HD float BiasAt(const float* bias, int64_t i) { return bias != nullptr ? bias[i] : 0.0f; }

CR_HD void ExpertMlp(DotKind dot, const ExpertView& e, const float* x, const QWeight* xq, float weight, int64_t hidden,
                     float* scratch, float* out, int64_t item, KernelStatus* st) {
  const QWeight &gate = e.gate, &up = e.up, &down = e.down;
  const int64_t mi = gate.rows;
  float* g = scratch;
  float* u = g + mi;
  float* a = u + mi;
  const bool q_in = xq != nullptr && gate.act_fp4;
  for (int64_t i = 0; i < mi; ++i) {
    g[i] = q_in ? LinearElementQ(dot, gate, *xq, i, item, st) : LinearElement(dot, gate, x, i, item, st);
    u[i] = q_in ? LinearElementQ(dot, up, *xq, i, item, st) : LinearElement(dot, up, x, i, item, st);
    if (e.gate_bias != nullptr) g[i] = g[i] + e.gate_bias[i];
    if (e.up_bias != nullptr) u[i] = u[i] + e.up_bias[i];
  }
  GatedActRow(g, u, mi, e.glu_alpha, e.glu_limit, a);
  if (!down.act_fp4) {
    for (int64_t i = 0; i < hidden; ++i) {
      float y = LinearElement(dot, down, a, i, item, st);
      if (e.down_bias != nullptr) y = y + e.down_bias[i];
      out[i] = MulAdd(out[i], weight, y);
    }
    return;
  }
  uint8_t* values = reinterpret_cast<uint8_t*>(a + mi);
  uint8_t* scales = values + Nvfp4ActValueBytes(mi);
  if (!QuantizeNvfp4ActRow(a, mi, down.act_scale, values, scales, item, st)) return;
  const QWeight aq = Nvfp4ActRow(values, scales, mi, down.act_scale);
  for (int64_t i = 0; i < hidden; ++i) {
    float y = LinearElementQ(dot, down, aq, i, item, st);
    if (e.down_bias != nullptr) y = y + e.down_bias[i];
    out[i] = MulAdd(out[i], weight, y);
  }
}

}  // namespace crashreplay::replay
