// The checks kernel bodies carry, and the small status record a failing check
// writes (DESIGN decision 4).
//
// A kernel body that finds a violated check calls Fail(): the first failure
// wins and later ones are ignored, so the record names the first offending
// index the body met in its own iteration order. The CPU backend gives every
// worker its own KernelStatus and keeps the one with the lowest work item, so
// the reported index does not depend on the thread count. The CUDA backend
// writes the same record into mapped pinned memory and then traps.
#pragma once

#include <cstdint>

#include "crashreplay/base/hd.h"

namespace crashreplay::replay {

enum class Check : uint32_t {
  kNone = 0,
  kTokenInVocab,        // embedding: 0 <= token id < vocab size
  kPageInPool,          // KV write / attention: 0 <= page id < pool pages
  kPositionInTable,     // KV write / attention: position / page_size < page-table width
  kPageSizeIs64,        // paged64 attention: its tile is one 64-token page
  kExpertInRange,       // top-k: 0 <= expert id < experts
  kUe8m0ScaleLayout,    // UE8M0 GEMM: (scale bits & 0x807fffff) == 0
  kLogitsFinite,        // greedy sampling: logits finite
  kProbFinite,          // sampling: probabilities finite
  kProbNonNegative,     // sampling: probabilities >= 0
  kProbSumPositive,     // sampling: probabilities sum to > 0
  kNvfp4InputScale,     // NVFP4 activation quantization: input_scale finite and > 0
  kMlaHeadDim576,       // FlashMLA (absorbed MLA): q/k head dim kv_lora_rank + qk_rope_head_dim == 576
  kMlaVHeadDim512,      // FlashMLA (absorbed MLA): v head dim kv_lora_rank == 512
  kSparseMlaHeads,      // FlashMLA sparse decode: heads per rank, padded to 64, is 64 or 128
  kTopkMultipleOf64,    // FlashMLA sparse decode: index_topk is whole 64-index tiles
  kTopkIndexInSequence, // sparse attention: a top-k index is -1 (none) or a position of the sequence
  kIndexHeadDim,        // FP8 indexer: index_head_dim a power of two <= 128 (Hadamard, one scale a key)
  kKvSlotWrittenOnce,   // layer 0's KV write (host side, StepProgram::SlotFault): no slot written by two requests
  kKvSlotNotReadWhileWritten,  // ... and none read by one request while another writes it in the same step
  kNumChecks,
};

// Stable snake_case names, used in fault signatures and reports.
CR_HD const char* CheckName(Check c) {
  switch (c) {
    case Check::kNone: return "none";
    case Check::kTokenInVocab: return "token_id_in_vocab";
    case Check::kPageInPool: return "page_index_in_pool";
    case Check::kPositionInTable: return "position_in_page_table";
    case Check::kPageSizeIs64: return "page_size_is_64";
    case Check::kExpertInRange: return "expert_id_in_range";
    case Check::kUe8m0ScaleLayout: return "ue8m0_scale_layout";
    case Check::kLogitsFinite: return "logits_finite";
    case Check::kProbFinite: return "probs_finite";
    case Check::kProbNonNegative: return "probs_non_negative";
    case Check::kProbSumPositive: return "probs_sum_positive";
    case Check::kNvfp4InputScale: return "nvfp4_input_scale_valid";
    case Check::kMlaHeadDim576: return "mla_head_dim_576";
    case Check::kMlaVHeadDim512: return "mla_v_head_dim_512";
    case Check::kSparseMlaHeads: return "sparse_mla_heads_supported";
    case Check::kTopkMultipleOf64: return "topk_multiple_of_64";
    case Check::kTopkIndexInSequence: return "topk_index_in_sequence";
    case Check::kIndexHeadDim: return "index_head_dim_supported";
    case Check::kKvSlotWrittenOnce: return "kv_slot_written_once";
    case Check::kKvSlotNotReadWhileWritten: return "kv_slot_not_read_while_written";
    default: return "unknown";
  }
}

struct KernelStatus {
  uint32_t fired = 0;
  Check check = Check::kNone;
  int64_t item = 0;   // the work item (row, token) the body was computing
  int64_t index = 0;  // the offending index (token id, page id, scale index, ...)
  double value = 0;   // the offending value
};

CR_HD void Fail(KernelStatus* s, Check c, int64_t item, int64_t index, double value) {
  if (s->fired) return;
  s->fired = 1;
  s->check = c;
  s->item = item;
  s->index = index;
  s->value = value;
}

CR_HD bool IsFinite(float x) { return x == x && x - x == 0.0f; }

// a + b * c, rounded twice, never contracted into an FMA, so host and device
// give the same bits.
CR_HD float MulAdd(float acc, float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(acc, __fmul_rn(a, b));
#else
  return acc + a * b;
#endif
}

}  // namespace crashreplay::replay
