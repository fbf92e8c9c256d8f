// Which checks each kernel of a step carries, for `replay --json` and the
// kernel table: the names of the Check values its op bodies can fire, given
// the op's parameters (a LinearOp checks the UE8M0 layout only when it runs
// the ue8m0 dot; a LatentAttentionOp FlashMLA's preconditions only in its
// tiled variants). Written by hand from the bodies' Fail() calls in
// replay/include/crashreplay/replay/kernels/; python/tests/test_mla_cli.py
// pins that a check that fires is among its kernel's.
#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

#include "crashreplay/replay/program/step.h"

namespace crashreplay::replay {
namespace {

constexpr Check kPage[] = {Check::kPositionInTable, Check::kPageInPool};

void Add(std::vector<Check>* out, std::initializer_list<Check> cs) {
  for (Check c : cs) {
    if (std::find(out->begin(), out->end(), c) == out->end()) out->push_back(c);
  }
}
void AddPage(std::vector<Check>* out) { Add(out, {kPage[0], kPage[1]}); }

void OpChecks(const Op& op, std::vector<Check>* out) {
  std::visit(
      [out](const auto& o) {
        using T = std::decay_t<decltype(o)>;
        if constexpr (std::is_same_v<T, EmbeddingOp>) {
          Add(out, {Check::kTokenInVocab});
        } else if constexpr (std::is_same_v<T, ActQuantOp>) {
          Add(out, {Check::kNvfp4InputScale});
        } else if constexpr (std::is_same_v<T, LinearOp> || std::is_same_v<T, MlaVUpOp>) {
          if (o.dot == DotKind::kUe8m0) Add(out, {Check::kUe8m0ScaleLayout});
        } else if constexpr (std::is_same_v<T, ExpertsOp> || std::is_same_v<T, SharedExpertOp>) {
          if (o.dot == DotKind::kUe8m0) Add(out, {Check::kUe8m0ScaleLayout});
          if (o.xq != nullptr) Add(out, {Check::kNvfp4InputScale});  // the intermediate, quantized inside
        } else if constexpr (std::is_same_v<T, KvWriteOp> || std::is_same_v<T, LatentWriteOp> ||
                             std::is_same_v<T, LatentGatherOp>) {
          AddPage(out);
        } else if constexpr (std::is_same_v<T, AttentionOp>) {
          AddPage(out);
          if (o.backend == static_cast<int32_t>(AttentionBackend::kPaged64)) Add(out, {Check::kPageSizeIs64});
        } else if constexpr (std::is_same_v<T, TopKOp>) {
          Add(out, {Check::kExpertInRange});
        } else if constexpr (std::is_same_v<T, SampleOp>) {
          Add(out, {Check::kLogitsFinite, Check::kProbFinite, Check::kProbNonNegative, Check::kProbSumPositive});
        } else if constexpr (std::is_same_v<T, MlaAttentionOp>) {
          if (o.topk != nullptr) Add(out, {Check::kTopkIndexInSequence});
        } else if constexpr (std::is_same_v<T, LatentAttentionOp>) {
          AddPage(out);
          const auto v = static_cast<LatentAttention>(o.variant);
          if (v != LatentAttention::kSparseReference) Add(out, {Check::kMlaHeadDim576, Check::kMlaVHeadDim512});
          if (v == LatentAttention::kPaged64) Add(out, {Check::kPageSizeIs64});
          if (v == LatentAttention::kSparseTiled64) Add(out, {Check::kSparseMlaHeads, Check::kTopkMultipleOf64});
          if (v != LatentAttention::kPaged64) Add(out, {Check::kTopkIndexInSequence});
        } else if constexpr (std::is_same_v<T, IndexKWriteOp> || std::is_same_v<T, IndexerOp>) {
          AddPage(out);
          if (o.fp8) Add(out, {Check::kIndexHeadDim});
        }
      },
      op);
}

}  // namespace

std::vector<std::string> KernelChecks(const KernelCall& k) {
  std::vector<Check> checks;
  for (const Op& op : k.ops) OpChecks(op, &checks);
  // The step's slots are checked once, before layer 0's cache write
  // (StepProgram::SlotFault).
  if (k.layer == 0 && k.name == "kv_write")
    Add(&checks, {Check::kKvSlotWrittenOnce, Check::kKvSlotNotReadWhileWritten});
  std::vector<std::string> names;
  for (Check c : checks) names.emplace_back(CheckName(c));
  return names;
}

}  // namespace crashreplay::replay
