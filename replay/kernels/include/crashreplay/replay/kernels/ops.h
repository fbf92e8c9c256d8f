// Kernel invocations as plain data: one struct per kernel of the step, and
// one CR_HD function per struct that computes one work item of it by calling
// the shared kernel bodies (kernels/*.h). This is what both backends launch
// (DESIGN decision 8): the CPU executor loops over the items on its thread
// pool, the CUDA executor runs one thread per item (or a tiled variant that
// still calls the same body per item), so the two differ in launch geometry
// only, never in what an item computes or checks.
//
// The work-item decomposition and the `item` each body is given match
// StepProgram's CPU launches (step.cc), so a fault names the same work item on
// either backend. Every pointer in an op points into the memory of the
// executor that runs it (host memory for the CPU executor, device memory for
// the CUDA executor), including the small per-rank arrays (shards, KV views).
//
// Determinism: every output element is written by exactly one item, with the
// body's fixed summation order; no op uses atomics.
#pragma once

#include <cstdint>

#include "crashreplay/base/hd.h"
#include "crashreplay/replay/kernels/act_quant.h"
#include "crashreplay/replay/kernels/attention.h"
#include "crashreplay/replay/kernels/check.h"
#include "crashreplay/replay/kernels/elementwise.h"
#include "crashreplay/replay/kernels/expert.h"
#include "crashreplay/replay/kernels/indexer.h"
#include "crashreplay/replay/kernels/linear.h"
#include "crashreplay/replay/kernels/mla.h"
#include "crashreplay/replay/kernels/router.h"
#include "crashreplay/replay/kernels/sampling.h"

namespace crashreplay::replay {

// Stable ids, recorded by the CUDA fault buffer.
enum class OpKind : uint32_t {
  kEmbedding,
  kRmsNorm,
  kLinear,
  kRope,
  kKvWrite,
  kAttention,
  kSiluMul,
  kReduce,
  kRouter,
  kTopK,
  kExperts,
  kSharedExpert,
  kGatherLogits,
  kProcessLogits,
  kSample,
  kActQuant,
  kLatentWrite,
  kLatentGather,
  kMlaAttention,
  kMlaQAbsorb,
  kLatentAttention,
  kMlaVUp,
  kIndexKWrite,
  kIndexer,
  kStore,
  kCount,
};
const char* OpKindName(OpKind k);

// The batch's request layout, shared by the ops that resolve pages or rows.
struct BatchView {
  const int32_t* positions = nullptr;     // [tokens]
  const int32_t* token_row = nullptr;     // [tokens] request row of each token
  const int32_t* page_tables = nullptr;   // all rows' page tables, concatenated
  const int64_t* table_offset = nullptr;  // [rows + 1] start of row r in page_tables
  int64_t tokens = 0;
};

CR_HD PageTableRow RowTableOf(const BatchView& b, int64_t r) {
  return PageTableRow{b.page_tables + b.table_offset[r], b.table_offset[r + 1] - b.table_offset[r]};
}

CR_HD PageTableRow RowTable(const BatchView& b, int64_t t) { return RowTableOf(b, b.token_row[t]); }

struct LinearShardView {
  QWeight w;
  const float* bias = nullptr;  // [rows] or null
};

struct EmbeddingOp {
  static constexpr OpKind kKind = OpKind::kEmbedding;
  QWeight table;
  const int32_t* tokens = nullptr;
  float* out = nullptr;  // [tokens, table.cols]
  int64_t n_tokens = 0;
};

// out[r] = RMSNorm(x[gather ? gather[r] : r]) over rows of n elements, rows
// `stride` floats apart (0: n), so a norm can cover the head of wider rows
// (MLA's kv_a_layernorm over the latent part of [c | k_rot]). With `bias`
// set it is a LayerNorm (the DSA indexer's key norm) instead.
struct RmsNormOp {
  static constexpr OpKind kKind = OpKind::kRmsNorm;
  const float* x = nullptr;
  const float* w = nullptr;
  const float* bias = nullptr;
  float* out = nullptr;
  const int32_t* gather = nullptr;
  int64_t rows = 0, n = 0, stride = 0;
  float eps = 1e-6f;
};

// NVFP4 activation quantization (kernels/act_quant.h) of `rows` rows of
// `cols`: values [rows, cols/2] packed e2m1, scales [rows, ceil(cols/16)] e4m3.
struct ActQuantOp {
  static constexpr OpKind kKind = OpKind::kActQuant;
  const float* x = nullptr;
  uint8_t* values = nullptr;
  uint8_t* scales = nullptr;
  int64_t rows = 0, cols = 0;
  float input_scale = 0.0f;
};

// y[rank, token, row] for every rank's shard; x is [tokens, cols] shared by
// the ranks, or [ranks, tokens, cols] when x_per_rank. Under w4a4 (xq set)
// shards whose act_fp4 is set read the same rows quantized (ActQuantOp's
// layout) instead of x.
struct LinearOp {
  static constexpr OpKind kKind = OpKind::kLinear;
  const LinearShardView* shards = nullptr;  // [ranks], all of the same shape
  DotKind dot = DotKind::kDequant;
  const float* x = nullptr;
  const uint8_t* xq = nullptr;
  const uint8_t* xq_scales = nullptr;
  bool x_per_rank = false;
  float* y = nullptr;
  int64_t ranks = 0, tokens = 0, rows = 0, cols = 0;
  // The shards' weight format, readable on the host (shards may be device
  // memory): the CUDA launcher picks its kernel by it. Never read by bodies.
  WFormat weight_format = WFormat::kF32;
};

// Rotates `heads` heads of head_dim in every row [ranks * tokens] of x: the
// rotary_dim values from `rot_offset` of each head (MLA: the rope part after
// the nope dims), rotate-half or interleaved pairs.
struct RopeOp {
  static constexpr OpKind kKind = OpKind::kRope;
  float* x = nullptr;
  const int32_t* positions = nullptr;
  const float* inv_freq = nullptr;
  int64_t rows = 0, tokens = 0, heads = 0, head_dim = 0, rotary_dim = 0, rot_offset = 0;
  float mscale = 1.0f;
  bool interleaved = false;
};

struct KvWriteOp {
  static constexpr OpKind kKind = OpKind::kKvWrite;
  const KvPoolView* views = nullptr;  // [ranks]
  const float* k = nullptr;           // [ranks, tokens, kvd]
  const float* v = nullptr;
  BatchView batch;
  int64_t ranks = 0, kvd = 0;
};

struct AttentionOp {
  static constexpr OpKind kKind = OpKind::kAttention;
  const KvPoolView* views = nullptr;  // [ranks]
  const float* q = nullptr;           // [ranks, tokens, heads * head_dim]
  float* out = nullptr;
  BatchView batch;
  int32_t backend = 0;                // AttentionBackend as int
  int64_t ranks = 0, heads = 0, group = 1, head_dim = 0;
  int64_t max_len = 0;                // longest attended length (scratch sizing)
  float scale = 1.0f;
  // gpt_oss: each query attends its last `window` positions (0: all), and
  // sinks[rank * heads + head] (null: none; the model's heads in rank order)
  // joins its softmax (kernels/attention.h).
  int64_t window = 0;
  const float* sinks = nullptr;
};

struct SiluMulOp {
  static constexpr OpKind kKind = OpKind::kSiluMul;
  const float* gate = nullptr;
  const float* up = nullptr;
  float* out = nullptr;
  int64_t rows = 0, n = 0;
};

// Activation storage (the activation_dtype toggle): a kernel's float output
// rounded in place to the dtype the engine stores activations in, as a bf16
// or fp16 engine's kernels write their outputs (accumulation stays fp32).
// fp16 overflows to +-Inf past 65504 exactly as an fp16 store does.
enum class StoreDType : int32_t { kF32 = 0, kBf16 = 1, kF16 = 2 };
struct StoreOp {
  static constexpr OpKind kKind = OpKind::kStore;
  float* x = nullptr;
  int64_t n = 0;
  StoreDType dtype = StoreDType::kF32;
};

// hidden[i] += sum over ranks of partial[r * n + i], in rank order.
struct ReduceOp {
  static constexpr OpKind kKind = OpKind::kReduce;
  float* hidden = nullptr;
  const float* partial = nullptr;
  int32_t ranks = 1;
  int64_t n = 0;
};

struct RouterOp {
  static constexpr OpKind kKind = OpKind::kRouter;
  QWeight router;  // [experts, hidden]
  const float* bias = nullptr;  // [experts] (gpt_oss) or null
  const float* x = nullptr;
  float* logits = nullptr;
  int64_t tokens = 0;
};

struct TopKOp {
  static constexpr OpKind kKind = OpKind::kTopK;
  const float* logits = nullptr;  // [tokens, experts]
  const float* bias = nullptr;    // sigmoid routing correction bias or null
  int32_t* ids = nullptr;         // [tokens, k]
  float* weights = nullptr;
  int64_t tokens = 0;
  int32_t experts = 0, k = 0, n_group = 1, topk_group = 1;
  bool sigmoid = false, renormalize = true;
  // gpt_oss: the k largest logits, then a softmax over those k (router.h,
  // RouteTopKSoftmax); sigmoid and renormalize do not apply.
  bool softmax_after_topk = false;
  float scaling = 1.0f;
};

struct ExpertsOp {
  static constexpr OpKind kKind = OpKind::kExperts;
  const ExpertView* experts = nullptr;  // [ranks, stride]
  const int32_t* local_count = nullptr; // [ranks]
  const int64_t* expert_begin = nullptr;// [ranks]
  const float* x = nullptr;             // [tokens, hidden]
  const uint8_t* xq = nullptr;          // w4a4: x quantized (ActQuantOp layout), else null
  const uint8_t* xq_scales = nullptr;
  const int32_t* ids = nullptr;
  const float* weights = nullptr;
  float* partial = nullptr;             // [ranks, tokens, hidden]
  int64_t ranks = 0, tokens = 0, hidden = 0, k = 0, stride = 0, inter = 0;
  DotKind dot = DotKind::kDequant;
};

struct SharedExpertOp {
  static constexpr OpKind kKind = OpKind::kSharedExpert;
  const ExpertView* shared = nullptr;  // [ranks]
  const float* x = nullptr;
  const uint8_t* xq = nullptr;         // w4a4: x quantized, else null
  const uint8_t* xq_scales = nullptr;
  float* partial = nullptr;
  int64_t ranks = 0, tokens = 0, hidden = 0, inter = 0;
  DotKind dot = DotKind::kDequant;
};

// logits[row, rank * vocab_local + j] = local[rank, row, j].
struct GatherLogitsOp {
  static constexpr OpKind kKind = OpKind::kGatherLogits;
  const float* local = nullptr;
  float* logits = nullptr;
  int64_t ranks = 0, rows = 0, vocab_local = 0;
};

struct ProcessLogitsOp {
  static constexpr OpKind kKind = OpKind::kProcessLogits;
  const float* logits = nullptr;
  float* probs = nullptr;
  const SamplingParams* params = nullptr;  // [rows]
  int64_t rows = 0;
  int32_t vocab = 0;
  bool sorted = true;
};

struct SampleOp {
  static constexpr OpKind kKind = OpKind::kSample;
  const float* logits = nullptr;
  const float* probs = nullptr;
  const SamplingParams* params = nullptr;  // [rows]
  const int64_t* request_id = nullptr;     // [rows]
  const uint64_t* sample_offset = nullptr; // [rows]
  int32_t* next = nullptr;
  int64_t rows = 0;
  int32_t vocab = 0;
};

// ---- MLA and DSA ops (kernels/mla.h, kernels/indexer.h) ---------------------

// kv_a = [c | k_rot] of every token ([tokens, kv_lora + rope], c normed, k_rot
// rotated) into every rank's latent cache (each rank holds the whole latent).
struct LatentWriteOp {
  static constexpr OpKind kKind = OpKind::kLatentWrite;
  const LatentPoolView* views = nullptr;  // [ranks]
  const float* kv_a = nullptr;
  BatchView batch;
  int64_t ranks = 0;
};

// The latents of n gathered positions (position pos[s] of row row[s]) out of
// each rank's cache: c [ranks, n, kv_lora], rot [ranks, n, rope].
struct LatentGatherOp {
  static constexpr OpKind kKind = OpKind::kLatentGather;
  const LatentPoolView* views = nullptr;  // [ranks]
  BatchView batch;
  const int32_t* row = nullptr;  // [n]
  const int32_t* pos = nullptr;  // [n]
  float* c = nullptr;
  float* rot = nullptr;
  int64_t ranks = 0, n = 0, kv_lora = 0, rope = 0;
};

// Expanded ("naive") MLA attention: per (rank, token, head) over the token's
// row's gathered positions (row_begin[row] + j for position j), dense or over
// the indexer's top-k (topk set: [ranks, tokens, topk_width]).
struct MlaAttentionOp {
  static constexpr OpKind kKind = OpKind::kMlaAttention;
  const float* q = nullptr;    // [ranks, tokens, heads * (nope + rope)]
  const float* kv = nullptr;   // [ranks, n, heads * (nope + v)]
  const float* rot = nullptr;  // [ranks, n, rope]
  const int32_t* row_begin = nullptr;  // [rows]
  const int32_t* topk = nullptr;
  float* out = nullptr;        // [ranks, tokens, heads * v]
  BatchView batch;
  int64_t ranks = 0, n = 0, heads = 0, nope = 0, rope = 0, v_dim = 0, topk_width = 0, max_len = 0;
  float scale = 1.0f;
};

// The absorbed query: q576 [ranks, tokens, heads, kv_lora + rope].
struct MlaQAbsorbOp {
  static constexpr OpKind kKind = OpKind::kMlaQAbsorb;
  const LinearShardView* kv_b = nullptr;  // [ranks]
  const float* q = nullptr;               // [ranks, tokens, heads * (nope + rope)]
  float* q576 = nullptr;
  int64_t ranks = 0, tokens = 0, heads = 0, nope = 0, rope = 0, v_dim = 0, kv_lora = 0;
};

// Latent (absorbed) attention: out [ranks, tokens, heads, kv_lora].
struct LatentAttentionOp {
  static constexpr OpKind kKind = OpKind::kLatentAttention;
  const LatentPoolView* views = nullptr;  // [ranks]
  const float* q576 = nullptr;
  const int32_t* topk = nullptr;          // sparse variants: [ranks, tokens, topk_width]
  float* out = nullptr;
  BatchView batch;
  int32_t variant = 0;                    // LatentAttention
  int64_t ranks = 0, heads = 0, kv_lora = 0, rope = 0, topk_width = 0, max_len = 0;
  float scale = 1.0f;
};

// W_UV: out[rank, token, h * v + e] = kv_b row (h * (nope + v) + nope + e) .
// o_lat[rank, token, h].
struct MlaVUpOp {
  static constexpr OpKind kKind = OpKind::kMlaVUp;
  const LinearShardView* kv_b = nullptr;  // [ranks]
  const float* o_lat = nullptr;           // [ranks, tokens, heads * kv_lora]
  float* out = nullptr;                   // [ranks, tokens, heads * v]
  DotKind dot = DotKind::kDequant;
  int64_t ranks = 0, tokens = 0, heads = 0, nope = 0, v_dim = 0, kv_lora = 0;
};

// The index keys k [tokens, dim] into every rank's index-key cache.
struct IndexKWriteOp {
  static constexpr OpKind kKind = OpKind::kIndexKWrite;
  const IndexPoolView* views = nullptr;  // [ranks]
  const float* k = nullptr;
  BatchView batch;
  int64_t ranks = 0, dim = 0;
  bool fp8 = false;  // the views' dtype, for the host (views live in executor memory)
};

// The lightning indexer's top-k of every token on every rank:
// ids [ranks, tokens, topk].
struct IndexerOp {
  static constexpr OpKind kKind = OpKind::kIndexer;
  const IndexPoolView* views = nullptr;  // [ranks]
  const float* q = nullptr;              // [tokens, heads * dim]
  const float* w = nullptr;              // [tokens, heads]
  int32_t* ids = nullptr;
  BatchView batch;
  int64_t ranks = 0, heads = 0, dim = 0, topk = 0, max_len = 0;
  bool fp8 = false;  // the views' dtype, for the host (views live in executor memory)
};

// ---- work items ------------------------------------------------------------
// Items(op): how many; ScratchFloats(op): per-item scratch the launcher gives;
// RunItem(op, i, scratch, st): compute item i.

CR_HD int64_t Items(const EmbeddingOp& o) { return o.n_tokens; }
CR_HD int64_t ScratchFloats(const EmbeddingOp&) { return 0; }
CR_HD void RunItem(const EmbeddingOp& o, int64_t t, float*, KernelStatus* st) {
  EmbeddingRow(o.table, o.tokens[t], o.out + t * o.table.cols, t, st);
}

CR_HD int64_t Items(const RmsNormOp& o) { return o.rows; }
CR_HD int64_t ScratchFloats(const RmsNormOp&) { return 0; }
CR_HD void RunItem(const RmsNormOp& o, int64_t r, float*, KernelStatus*) {
  const int64_t src = o.gather != nullptr ? o.gather[r] : r;
  const int64_t stride = o.stride > 0 ? o.stride : o.n;
  if (o.bias != nullptr) {
    LayerNormRow(o.x + src * stride, o.w, o.bias, o.n, o.eps, o.out + r * stride);
  } else {
    RmsNormRow(o.x + src * stride, o.w, o.n, o.eps, o.out + r * stride);
  }
}

CR_HD int64_t Items(const ActQuantOp& o) { return o.rows; }
CR_HD int64_t ScratchFloats(const ActQuantOp&) { return 0; }
CR_HD void RunItem(const ActQuantOp& o, int64_t r, float*, KernelStatus* st) {
  QuantizeNvfp4ActRow(o.x + r * o.cols, o.cols, o.input_scale, o.values + r * Nvfp4ActValueBytes(o.cols),
                      o.scales + r * Nvfp4ActScaleBytes(o.cols), r, st);
}

// Row `r` of a quantized activation buffer as the linear kernels read it.
CR_HD QWeight Fp4Row(const uint8_t* values, const uint8_t* scales, int64_t r, int64_t cols, float input_scale) {
  return Nvfp4ActRow(values + r * Nvfp4ActValueBytes(cols), scales + r * Nvfp4ActScaleBytes(cols), cols, input_scale);
}

// One output element; the body is told the (rank, token) item as step.cc does.
CR_HD int64_t Items(const LinearOp& o) { return o.ranks * o.tokens * o.rows; }
CR_HD int64_t ScratchFloats(const LinearOp&) { return 0; }
CR_HD void LinearRow(const LinearOp& o, int64_t rt, int64_t row, const float* xi, KernelStatus* st) {
  const LinearShardView& s = o.shards[rt / o.tokens];
  float v;
  if (o.xq != nullptr && s.w.act_fp4) {
    const QWeight xq = Fp4Row(o.xq, o.xq_scales, o.x_per_rank ? rt : rt % o.tokens, o.cols, s.w.act_scale);
    v = LinearElementQ(o.dot, s.w, xq, row, rt, st);
  } else {
    v = LinearElement(o.dot, s.w, xi, row, rt, st);
  }
  if (s.bias != nullptr) v += s.bias[row];
  o.y[rt * o.rows + row] = v;
}
CR_HD const float* LinearInput(const LinearOp& o, int64_t rt) {
  return o.x + (o.x_per_rank ? rt : rt % o.tokens) * o.cols;
}
// LinearRow of tokens [t0, t0 + nt) of rank `rank` (nt <= kT) on lane j of
// eight (kernels/linear.h, LinearElementsLane and LinearElementsLaneQ): every
// lane computes the elements, lane 0 writes them. `x0`: with kT == 1, token
// t0's input row (the CUDA kernel's staged copy); ignored otherwise. A fault
// names the first token's work item.
template <int kT, class Lanes>
CR_HD void LinearRowsLane(const LinearOp& o, int64_t rank, int64_t t0, int nt, int64_t row, const float* x0, int j,
                          const Lanes& lanes, KernelStatus* st) {
  const LinearShardView& s = o.shards[rank];
  const int64_t rt0 = rank * o.tokens + t0;
  float v[kT] = {};
  if (o.xq != nullptr && s.w.act_fp4) {
    QWeight xq[kT];
    for (int t = 0; t < kT; ++t) {
      const int64_t rt = rt0 + (t < nt ? t : 0);
      xq[t] = Fp4Row(o.xq, o.xq_scales, o.x_per_rank ? rt : rt % o.tokens, o.cols, s.w.act_scale);
    }
    LinearElementsLaneQ<kT>(o.dot, s.w, xq, nt, row, j, rt0, st, lanes, v);
  } else {
    const float* x[kT];
    if constexpr (kT == 1) {
      x[0] = x0;  // a pointer the compiler sees, on a GPU a shared-memory one
    } else {
      for (int t = 0; t < kT; ++t) x[t] = LinearInput(o, rt0 + (t < nt ? t : 0));
    }
    LinearElementsLane<kT>(o.dot, s.w, x, nt, row, j, rt0, st, lanes, v);
  }
  if (j != 0) return;
  for (int t = 0; t < kT; ++t) {
    if (t >= nt) break;
    float e = v[t];
    if (s.bias != nullptr) e += s.bias[row];
    o.y[(rt0 + t) * o.rows + row] = e;
  }
}
CR_HD void RunItem(const LinearOp& o, int64_t i, float*, KernelStatus* st) {
  const int64_t rt = i / o.rows;
  LinearRow(o, rt, i % o.rows, LinearInput(o, rt), st);
}

CR_HD int64_t Items(const RopeOp& o) { return o.rows * o.heads; }
CR_HD int64_t ScratchFloats(const RopeOp&) { return 0; }
CR_HD void RunItem(const RopeOp& o, int64_t i, float*, KernelStatus*) {
  const int64_t rt = i / o.heads, h = i % o.heads;
  float* x = o.x + (rt * o.heads + h) * o.head_dim + o.rot_offset;
  if (o.interleaved) {
    RopeHeadInterleaved(x, o.rotary_dim, o.positions[rt % o.tokens], o.inv_freq, o.mscale);
  } else {
    RopeHead(x, o.rotary_dim, o.positions[rt % o.tokens], o.inv_freq, o.mscale);
  }
}

CR_HD int64_t Items(const KvWriteOp& o) { return o.ranks * o.batch.tokens; }
CR_HD int64_t ScratchFloats(const KvWriteOp&) { return 0; }
CR_HD void RunItem(const KvWriteOp& o, int64_t rt, float*, KernelStatus* st) {
  const int64_t r = rt / o.batch.tokens, t = rt % o.batch.tokens;
  KvWriteToken(o.views[r], RowTable(o.batch, t), o.batch.positions[t], o.k + rt * o.kvd, o.v + rt * o.kvd, rt, st);
}

CR_HD int64_t Items(const AttentionOp& o) { return o.ranks * o.batch.tokens * o.heads; }
CR_HD int64_t ScratchFloats(const AttentionOp& o) {
  return FlashScratchFloats(o.max_len, o.head_dim) + o.max_len + kPaged64Tile;
}
CR_HD void RunItem(const AttentionOp& o, int64_t i, float* scratch, KernelStatus* st) {
  const int64_t rt = i / o.heads, h = i % o.heads, r = rt / o.batch.tokens, t = rt % o.batch.tokens;
  const int64_t qd = o.heads * o.head_dim;
  const int64_t len = static_cast<int64_t>(o.batch.positions[t]) + 1;
  const float* qh = o.q + rt * qd + h * o.head_dim;
  float* out = o.out + rt * qd + h * o.head_dim;
  const PageTableRow pt = RowTable(o.batch, t);
  const int64_t begin = WindowBegin(len, o.window);
  const float sink = o.sinks != nullptr ? o.sinks[r * o.heads + h] : -INFINITY;
  switch (o.backend) {
    case 1: AttendFlashDecode(o.views[r], pt, qh, h / o.group, len, o.scale, out, scratch, rt, st, begin, sink); break;
    case 2: AttendPaged64(o.views[r], pt, qh, h / o.group, len, o.scale, out, scratch, rt, st, begin, sink); break;
    default: AttendReference(o.views[r], pt, qh, h / o.group, len, o.scale, out, scratch, rt, st, begin, sink); break;
  }
}

// Phase `phase` of item i's reference attention (backend 0) on thread tid of
// n cooperating threads (kernels/attention.h, AttendReferencePhase): the
// item's RunItem bits. False: the item is done (a fault), on every thread.
CR_HD bool AttentionItemPhase(const AttentionOp& o, int64_t i, int phase, int64_t tid, int64_t n, float* scratch,
                              KernelStatus* st) {
  const int64_t rt = i / o.heads, h = i % o.heads, r = rt / o.batch.tokens, t = rt % o.batch.tokens;
  const int64_t qd = o.heads * o.head_dim;
  const int64_t len = static_cast<int64_t>(o.batch.positions[t]) + 1;
  return AttendReferencePhase(phase, tid, n, o.views[r], RowTable(o.batch, t), o.q + rt * qd + h * o.head_dim,
                              h / o.group, len, o.scale, o.out + rt * qd + h * o.head_dim, scratch, rt, st,
                              WindowBegin(len, o.window), o.sinks != nullptr ? o.sinks[r * o.heads + h] : -INFINITY);
}

CR_HD int64_t Items(const SiluMulOp& o) { return o.rows; }
CR_HD int64_t ScratchFloats(const SiluMulOp&) { return 0; }
CR_HD void RunItem(const SiluMulOp& o, int64_t r, float*, KernelStatus*) {
  SiluMulRow(o.gate + r * o.n, o.up + r * o.n, o.n, o.out + r * o.n);
}

// One item a block of 256 elements (a store is a few ns an element).
inline constexpr int64_t kStoreBlock = 256;
CR_HD float StoreRound(float v, StoreDType d) {
  if (d == StoreDType::kBf16) return Bf16ToFloat(FloatToBf16(v));
  if (d == StoreDType::kF16) return Fp16ToFloat(FloatToFp16(v));
  return v;
}
CR_HD int64_t Items(const StoreOp& o) { return (o.n + kStoreBlock - 1) / kStoreBlock; }
CR_HD int64_t ScratchFloats(const StoreOp&) { return 0; }
CR_HD void RunItem(const StoreOp& o, int64_t b, float*, KernelStatus*) {
  const int64_t end = (b + 1) * kStoreBlock < o.n ? (b + 1) * kStoreBlock : o.n;
  for (int64_t i = b * kStoreBlock; i < end; ++i) o.x[i] = StoreRound(o.x[i], o.dtype);
}

CR_HD int64_t Items(const ReduceOp& o) { return o.n; }
CR_HD int64_t ScratchFloats(const ReduceOp&) { return 0; }
CR_HD void RunItem(const ReduceOp& o, int64_t i, float*, KernelStatus*) {
  o.hidden[i] = o.hidden[i] + FixedOrderSum(o.partial, o.ranks, o.n, i);
}

CR_HD int64_t Items(const RouterOp& o) { return o.tokens * o.router.rows; }
CR_HD int64_t ScratchFloats(const RouterOp&) { return 0; }
CR_HD void RunItem(const RouterOp& o, int64_t i, float*, KernelStatus*) {
  const int64_t e = o.router.rows, t = i / e;
  const float dot = DotRaw(o.router, o.x + t * o.router.cols, i % e, 0, o.router.cols);
  o.logits[i] = o.bias != nullptr ? dot + o.bias[i % e] : dot;
}

CR_HD int64_t Items(const TopKOp& o) { return o.tokens; }
CR_HD int64_t ScratchFloats(const TopKOp& o) { return 2 * o.experts + o.experts / 4 + 1; }
CR_HD void RunItem(const TopKOp& o, int64_t t, float* scratch, KernelStatus* st) {
  const int64_t E = o.experts, K = o.k;
  if (o.softmax_after_topk) {
    RouteTopKSoftmax(o.logits + t * E, o.experts, o.k, o.ids + t * K, o.weights + t * K, t, st);
  } else if (o.sigmoid) {
    uint8_t* mask = reinterpret_cast<uint8_t*>(scratch + 2 * E);
    RouteSigmoidGrouped(o.logits + t * E, o.bias, o.experts, o.k, o.n_group, o.topk_group, o.renormalize, o.scaling,
                        o.ids + t * K, o.weights + t * K, scratch, mask, t, st);
  } else {
    RouteSoftmaxTopK(o.logits + t * E, o.experts, o.k, o.renormalize, o.ids + t * K, o.weights + t * K, scratch, t, st);
  }
}

CR_HD int64_t Items(const ExpertsOp& o) { return o.ranks * o.tokens; }
CR_HD int64_t ScratchFloats(const ExpertsOp& o) { return ExpertScratchFloats(o.inter); }
CR_HD void RunItem(const ExpertsOp& o, int64_t rt, float* scratch, KernelStatus* st) {
  const int64_t r = rt / o.tokens, t = rt % o.tokens, H = o.hidden;
  float* out = o.partial + rt * H;
  for (int64_t i = 0; i < H; ++i) out[i] = 0.0f;
  for (int64_t k = 0; k < o.k; ++k) {
    const int64_t j = o.ids[t * o.k + k] - o.expert_begin[r];
    if (j < 0 || j >= o.local_count[r]) continue;  // another rank's expert
    const ExpertView& e = o.experts[r * o.stride + j];
    const QWeight xq = o.xq != nullptr ? Fp4Row(o.xq, o.xq_scales, t, H, e.gate.act_scale) : QWeight{};
    ExpertMlp(o.dot, e, o.x + t * H, o.xq != nullptr ? &xq : nullptr, o.weights[t * o.k + k], H, scratch, out, rt, st);
  }
}

CR_HD int64_t Items(const SharedExpertOp& o) { return o.ranks * o.tokens; }
CR_HD int64_t ScratchFloats(const SharedExpertOp& o) { return ExpertScratchFloats(o.inter); }
CR_HD void RunItem(const SharedExpertOp& o, int64_t rt, float* scratch, KernelStatus* st) {
  const int64_t r = rt / o.tokens, t = rt % o.tokens, H = o.hidden;
  const ExpertView& e = o.shared[r];
  const QWeight xq = o.xq != nullptr ? Fp4Row(o.xq, o.xq_scales, t, H, e.gate.act_scale) : QWeight{};
  ExpertMlp(o.dot, e, o.x + t * H, o.xq != nullptr ? &xq : nullptr, 1.0f, H, scratch, o.partial + rt * H, rt, st);
}

// ---- the experts in three stages ------------------------------------------
// RunItem computes a token's whole expert MLPs in one work item, which on a
// GPU is one thread. An executor with many threads runs them in three
// stages instead, over a workspace of ExpertStageItems(o, 0) slots of
// ExpertSlotFloats(o.inter) floats (one per rank-token and expert slot k):
//   0: per (rank-token, slot, intermediate row): the gate and up elements;
//   1: per (rank-token, slot): SiLU(gate) * up and, under w4a4, its NVFP4
//      quantization (a failed check marks the slot, as ExpertMlp returns);
//   2: per (rank-token, hidden row): the down elements summed into the
//      partial over the slots in order.
// Every element gets RunItem's functions, operands and order, so the bits
// are RunItem's (tests/replay/expert_stages_test.cc).
CR_HD int64_t ExpertSlots(const ExpertsOp& o) { return o.k; }
CR_HD int64_t ExpertSlots(const SharedExpertOp&) { return 1; }
CR_HD const ExpertView* SlotExpert(const ExpertsOp& o, int64_t r, int64_t t, int64_t k) {
  const int64_t j = o.ids[t * o.k + k] - o.expert_begin[r];
  if (j < 0 || j >= o.local_count[r]) return nullptr;  // another rank's expert
  return &o.experts[r * o.stride + j];
}
CR_HD const ExpertView* SlotExpert(const SharedExpertOp& o, int64_t r, int64_t, int64_t) { return &o.shared[r]; }
CR_HD float SlotWeight(const ExpertsOp& o, int64_t t, int64_t k) { return o.weights[t * o.k + k]; }
CR_HD float SlotWeight(const SharedExpertOp&, int64_t, int64_t) { return 1.0f; }
// The routed experts' partial starts at zero; the shared expert adds to it.
CR_HD bool ZeroesPartial(const ExpertsOp&) { return true; }
CR_HD bool ZeroesPartial(const SharedExpertOp&) { return false; }
CR_HD int64_t ExpertSlotFloats(int64_t inter) { return ExpertScratchFloats(inter) + 1; }  // + the skip mark

template <typename E>
CR_HD int64_t ExpertStageItems(const E& o, int stage) {
  const int64_t rt = o.ranks * o.tokens;
  return stage == 0 ? rt * ExpertSlots(o) * o.inter : stage == 1 ? rt * ExpertSlots(o) : rt * o.hidden;
}

// Stage 2's slot k of rank-token rt: its expert, with its activation row
// (`a`, and under w4a4 the row's NVFP4 codes in `aq`), or null when the slot
// is another rank's expert or its quantization failed (ExpertMlp stopped
// there).
template <typename E>
CR_HD const ExpertView* DownSlot(const E& o, int64_t rt, int64_t k, const float* ws, const float** a, QWeight* aq) {
  const int64_t S = ExpertSlotFloats(o.inter);
  const ExpertView* e = SlotExpert(o, rt / o.tokens, rt % o.tokens, k);
  if (e == nullptr) return nullptr;
  const float* base = ws + (rt * ExpertSlots(o) + k) * S;
  if (base[S - 1] != 0.0f) return nullptr;
  const int64_t mi = e->gate.rows;
  *a = base + 2 * mi;
  if (e->down.act_fp4) {
    const uint8_t* values = reinterpret_cast<const uint8_t*>(*a + mi);
    *aq = Nvfp4ActRow(values, values + Nvfp4ActValueBytes(mi), mi, e->down.act_scale);
  }
  return e;
}

// Stage 1 alone: slot i's SiLU(gate) * up and, under w4a4, its NVFP4
// quantization (the CUDA executor's stage-1 kernel calls it directly, so that
// it carries no dot-product code).
template <typename E>
CR_HD void ExpertActivationItem(const E& o, int64_t i, float* ws, KernelStatus* st) {
  const int64_t K = ExpertSlots(o), S = ExpertSlotFloats(o.inter);
  const int64_t k = i % K, rt = i / K, r = rt / o.tokens, t = rt % o.tokens;
  const ExpertView* e = SlotExpert(o, r, t, k);
  if (e == nullptr) return;
  float* base = ws + i * S;
  const int64_t mi = e->gate.rows;
  float* a = base + 2 * mi;
  GatedActRow(base, base + mi, mi, e->glu_alpha, e->glu_limit, a);
  base[S - 1] = 0.0f;
  if (e->down.act_fp4) {
    uint8_t* values = reinterpret_cast<uint8_t*>(a + mi);
    if (!QuantizeNvfp4ActRow(a, mi, e->down.act_scale, values, values + Nvfp4ActValueBytes(mi), rt, st)) {
      base[S - 1] = 1.0f;
    }
  }
}

// Stage 2 of item i (a token-rank's hidden row): each routed slot's down
// projection row, `down(expert, a, aq, rt, row)` (the serial or the lane
// dot product of the slot's activation row a, or its NVFP4 form aq), times
// the slot's weight, added in slot order onto the partial; returned, not
// stored.
template <typename E, class Down>
CR_HD float DownSum(const E& o, int64_t i, float* ws, const Down& down) {
  const int64_t K = ExpertSlots(o), H = o.hidden;
  const int64_t rt = i / H, row = i % H, t = rt % o.tokens;
  float acc = ZeroesPartial(o) ? 0.0f : o.partial[i];
  for (int64_t k = 0; k < K; ++k) {
    const float* a = nullptr;
    QWeight aq;
    const ExpertView* e = DownSlot(o, rt, k, ws, &a, &aq);
    if (e == nullptr) continue;
    float y = down(*e, a, aq, rt, row);
    if (e->down_bias != nullptr) y = y + e->down_bias[row];
    acc = MulAdd(acc, SlotWeight(o, t, k), y);
  }
  return acc;
}

template <typename E>
CR_HD void ExpertStageItem(const E& o, int stage, int64_t i, float* ws, KernelStatus* st) {
  const int64_t K = ExpertSlots(o), H = o.hidden, S = ExpertSlotFloats(o.inter);
  if (stage == 0) {
    const int64_t row = i % o.inter, slot = i / o.inter, k = slot % K, rt = slot / K;
    const int64_t r = rt / o.tokens, t = rt % o.tokens;
    const ExpertView* e = SlotExpert(o, r, t, k);
    if (e == nullptr || row >= e->gate.rows) return;
    float* g = ws + slot * S;
    float* u = g + e->gate.rows;
    if (o.xq != nullptr && e->gate.act_fp4) {
      const QWeight xq = Fp4Row(o.xq, o.xq_scales, t, H, e->gate.act_scale);
      g[row] = LinearElementQ(o.dot, e->gate, xq, row, rt, st);
      u[row] = LinearElementQ(o.dot, e->up, xq, row, rt, st);
    } else {
      g[row] = LinearElement(o.dot, e->gate, o.x + t * H, row, rt, st);
      u[row] = LinearElement(o.dot, e->up, o.x + t * H, row, rt, st);
    }
    if (e->gate_bias != nullptr) g[row] = g[row] + e->gate_bias[row];
    if (e->up_bias != nullptr) u[row] = u[row] + e->up_bias[row];
    return;
  }
  if (stage == 1) return ExpertActivationItem(o, i, ws, st);
  o.partial[i] =
      DownSum(o, i, ws, [&](const ExpertView& e, const float* a, const QWeight& aq, int64_t rt, int64_t row) {
        return e.down.act_fp4 ? LinearElementQ(o.dot, e.down, aq, row, rt, st)
                              : LinearElement(o.dot, e.down, a, row, rt, st);
      });
}

// Stages 0 and 2 of ExpertStageItem on lane j of eight (kernels/linear.h,
// LinearElementsLane and LinearElementsLaneQ; `lanes.Sum` as there): every
// lane computes each element, lane 0 writes it, so the bits and the first
// fault are ExpertStageItem's. Whether a slot is skipped depends on the
// item only, so the eight lanes take the same branches. Stage 1 has no dot
// product: run it with ExpertActivationItem.
template <typename E, class Lanes>
CR_HD void ExpertStageItemLane(const E& o, int stage, int64_t i, float* ws, int j, const Lanes& lanes,
                               KernelStatus* st) {
  const int64_t K = ExpertSlots(o), H = o.hidden, S = ExpertSlotFloats(o.inter);
  if (stage == 0) {
    const int64_t row = i % o.inter, slot = i / o.inter, k = slot % K, rt = slot / K;
    const int64_t r = rt / o.tokens, t = rt % o.tokens;
    const ExpertView* e = SlotExpert(o, r, t, k);
    if (e == nullptr || row >= e->gate.rows) return;
    float g = 0.0f, u = 0.0f;
    if (o.xq != nullptr && e->gate.act_fp4) {
      const QWeight xq = Fp4Row(o.xq, o.xq_scales, t, H, e->gate.act_scale);
      LinearElementsLaneQ<1>(o.dot, e->gate, &xq, 1, row, j, rt, st, lanes, &g);
      LinearElementsLaneQ<1>(o.dot, e->up, &xq, 1, row, j, rt, st, lanes, &u);
    } else {
      const float* x = o.x + t * H;
      LinearElementsLane<1>(o.dot, e->gate, &x, 1, row, j, rt, st, lanes, &g);
      LinearElementsLane<1>(o.dot, e->up, &x, 1, row, j, rt, st, lanes, &u);
    }
    if (e->gate_bias != nullptr) g = g + e->gate_bias[row];
    if (e->up_bias != nullptr) u = u + e->up_bias[row];
    if (j == 0) {
      float* gs = ws + slot * S;
      gs[row] = g;
      gs[e->gate.rows + row] = u;
    }
    return;
  }
  if (stage == 1) return;  // no dot product: ExpertActivationItem
  const float acc =
      DownSum(o, i, ws, [&](const ExpertView& e, const float* a, const QWeight& aq, int64_t rt, int64_t row) {
        float v = 0.0f;
        if (e.down.act_fp4) {
          LinearElementsLaneQ<1>(o.dot, e.down, &aq, 1, row, j, rt, st, lanes, &v);
        } else {
          LinearElementsLane<1>(o.dot, e.down, &a, 1, row, j, rt, st, lanes, &v);
        }
        return v;
      });
  if (j == 0) o.partial[i] = acc;
}

CR_HD int64_t Items(const GatherLogitsOp& o) { return o.rows * o.ranks; }
CR_HD int64_t ScratchFloats(const GatherLogitsOp&) { return 0; }
CR_HD void RunItem(const GatherLogitsOp& o, int64_t i, float*, KernelStatus*) {
  const int64_t row = i / o.ranks, r = i % o.ranks, vl = o.vocab_local;
  const float* src = o.local + (r * o.rows + row) * vl;
  float* dst = o.logits + row * vl * o.ranks + r * vl;
  for (int64_t j = 0; j < vl; ++j) dst[j] = src[j];
}

CR_HD int64_t Items(const ProcessLogitsOp& o) { return o.rows; }
CR_HD int64_t ScratchFloats(const ProcessLogitsOp& o) { return o.vocab; }
CR_HD void RunItem(const ProcessLogitsOp& o, int64_t r, float* scratch, KernelStatus*) {
  const SamplingParams& sp = o.params[r];
  if (sp.temperature <= 0.0f) return;  // greedy rows take the argmax of the logits
  ProcessLogits(o.logits + r * o.vocab, o.vocab, sp, o.sorted, o.probs + r * o.vocab,
                reinterpret_cast<int32_t*>(scratch));
}

CR_HD int64_t Items(const SampleOp& o) { return o.rows; }
CR_HD int64_t ScratchFloats(const SampleOp&) { return 0; }
CR_HD void RunItem(const SampleOp& o, int64_t r, float*, KernelStatus* st) {
  const SamplingParams& sp = o.params[r];
  if (sp.temperature <= 0.0f) {
    o.next[r] = ArgMaxRow(o.logits + r * o.vocab, o.vocab, r, st);
  } else {
    const float u = CounterUniform(sp.seed, static_cast<uint64_t>(o.request_id[r]), o.sample_offset[r]);
    o.next[r] = SampleRow(o.probs + r * o.vocab, o.vocab, u, r, st);
  }
}

CR_HD int64_t Items(const LatentWriteOp& o) { return o.ranks * o.batch.tokens; }
CR_HD int64_t ScratchFloats(const LatentWriteOp&) { return 0; }
CR_HD void RunItem(const LatentWriteOp& o, int64_t rt, float*, KernelStatus* st) {
  const int64_t r = rt / o.batch.tokens, t = rt % o.batch.tokens;
  const LatentPoolView& v = o.views[r];
  const float* row = o.kv_a + t * (v.kv_lora + v.rope);
  LatentWriteToken(v, RowTable(o.batch, t), o.batch.positions[t], row, row + v.kv_lora, rt, st);
}

CR_HD int64_t Items(const LatentGatherOp& o) { return o.ranks * o.n; }
CR_HD int64_t ScratchFloats(const LatentGatherOp& o) { return o.kv_lora + o.rope; }
CR_HD void RunItem(const LatentGatherOp& o, int64_t i, float* scratch, KernelStatus* st) {
  const int64_t r = i / o.n, s = i % o.n;
  LatentGatherRow(o.views[r], RowTableOf(o.batch, o.row[s]), o.pos[s], o.c + i * o.kv_lora, o.rot + i * o.rope, scratch,
                  i, st);
}

CR_HD int64_t Items(const MlaAttentionOp& o) { return o.ranks * o.batch.tokens * o.heads; }
CR_HD int64_t ScratchFloats(const MlaAttentionOp& o) { return o.topk_width > o.max_len ? o.topk_width : o.max_len; }
CR_HD void RunItem(const MlaAttentionOp& o, int64_t i, float* scratch, KernelStatus* st) {
  const int64_t rt = i / o.heads, h = i % o.heads, r = rt / o.batch.tokens, t = rt % o.batch.tokens;
  const int64_t qk = o.nope + o.rope, kvw = o.heads * (o.nope + o.v_dim);
  const int64_t begin = o.row_begin[o.batch.token_row[t]];
  const int64_t len = static_cast<int64_t>(o.batch.positions[t]) + 1;
  const int32_t* ids = o.topk != nullptr ? o.topk + rt * o.topk_width : nullptr;
  MlaAttendExpanded(o.q + (rt * o.heads + h) * qk, o.kv + (r * o.n + begin) * kvw, o.rot + (r * o.n + begin) * o.rope,
                    kvw, h, o.nope, o.rope, o.v_dim, len, ids, o.topk_width, o.scale,
                    o.out + (rt * o.heads + h) * o.v_dim, scratch, rt, st);
}

CR_HD int64_t Items(const MlaQAbsorbOp& o) { return o.ranks * o.tokens * o.heads; }
CR_HD int64_t ScratchFloats(const MlaQAbsorbOp&) { return 0; }
CR_HD void RunItem(const MlaQAbsorbOp& o, int64_t i, float*, KernelStatus*) {
  const int64_t rt = i / o.heads, h = i % o.heads;
  MlaQAbsorb(o.kv_b[rt / o.tokens].w, o.q + (rt * o.heads + h) * (o.nope + o.rope), h, o.nope, o.rope, o.v_dim,
             o.q576 + i * (o.kv_lora + o.rope));
}

CR_HD int64_t Items(const LatentAttentionOp& o) { return o.ranks * o.batch.tokens * o.heads; }
CR_HD int64_t ScratchFloats(const LatentAttentionOp& o) {
  return LatentScratchFloats(o.kv_lora, o.rope, o.topk_width > o.max_len ? o.topk_width : o.max_len);
}
CR_HD void RunItem(const LatentAttentionOp& o, int64_t i, float* scratch, KernelStatus* st) {
  const int64_t rt = i / o.heads, r = rt / o.batch.tokens, t = rt % o.batch.tokens;
  const int64_t len = static_cast<int64_t>(o.batch.positions[t]) + 1;
  const int32_t* ids = o.topk != nullptr ? o.topk + rt * o.topk_width : nullptr;
  MlaAttendLatent(static_cast<LatentAttention>(o.variant), o.views[r], RowTable(o.batch, t),
                  o.q576 + i * (o.kv_lora + o.rope), len, ids, o.topk_width, o.heads, o.scale, o.out + i * o.kv_lora,
                  scratch, rt, st);
}

CR_HD int64_t Items(const MlaVUpOp& o) { return o.ranks * o.tokens * o.heads * o.v_dim; }
CR_HD int64_t ScratchFloats(const MlaVUpOp&) { return 0; }
CR_HD void RunItem(const MlaVUpOp& o, int64_t i, float*, KernelStatus* st) {
  const int64_t rth = i / o.v_dim, e = i % o.v_dim, rt = rth / o.heads, h = rth % o.heads;
  const QWeight& w = o.kv_b[rt / o.tokens].w;
  o.out[i] = LinearElement(o.dot, w, o.o_lat + rth * o.kv_lora, h * (o.nope + o.v_dim) + o.nope + e, rt, st);
}

CR_HD int64_t Items(const IndexKWriteOp& o) { return o.ranks * o.batch.tokens; }
CR_HD int64_t ScratchFloats(const IndexKWriteOp& o) { return o.dim; }
CR_HD void RunItem(const IndexKWriteOp& o, int64_t rt, float* scratch, KernelStatus* st) {
  const int64_t r = rt / o.batch.tokens, t = rt % o.batch.tokens;
  IndexKWriteToken(o.views[r], RowTable(o.batch, t), o.batch.positions[t], o.k + t * o.dim, scratch, rt, st);
}

CR_HD int64_t Items(const IndexerOp& o) { return o.ranks * o.batch.tokens; }
CR_HD int64_t ScratchFloats(const IndexerOp& o) { return IndexerScratchFloats(o.max_len, o.heads, o.dim, o.topk); }
CR_HD void RunItem(const IndexerOp& o, int64_t rt, float* scratch, KernelStatus* st) {
  const int64_t r = rt / o.batch.tokens, t = rt % o.batch.tokens;
  IndexerTopK(o.views[r], RowTable(o.batch, t), o.batch.positions[t], o.q + t * o.heads * o.dim, o.w + t * o.heads,
              o.heads, o.topk, o.ids + rt * o.topk, scratch, rt, st);
}

}  // namespace crashreplay::replay
