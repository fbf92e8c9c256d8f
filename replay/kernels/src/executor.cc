#include "crashreplay/replay/kernels/executor.h"

#include "crashreplay/base/text.h"

namespace crashreplay::replay {

using text::Cat;

const char* OpKindName(OpKind k) {
  switch (k) {
    case OpKind::kEmbedding: return "embedding";
    case OpKind::kRmsNorm: return "rms_norm";
    case OpKind::kLinear: return "linear";
    case OpKind::kRope: return "rope";
    case OpKind::kKvWrite: return "kv_write";
    case OpKind::kAttention: return "attention";
    case OpKind::kSiluMul: return "silu_mul";
    case OpKind::kReduce: return "fixed_order_reduce";
    case OpKind::kRouter: return "router";
    case OpKind::kTopK: return "topk";
    case OpKind::kExperts: return "experts";
    case OpKind::kSharedExpert: return "shared_expert";
    case OpKind::kGatherLogits: return "gather_logits";
    case OpKind::kProcessLogits: return "logits_processor";
    case OpKind::kSample: return "sampler";
    case OpKind::kActQuant: return "nvfp4_act_quant";
    case OpKind::kLatentWrite: return "mla_latent_write";
    case OpKind::kLatentGather: return "mla_latent_gather";
    case OpKind::kMlaAttention: return "mla_attention_expanded";
    case OpKind::kMlaQAbsorb: return "mla_q_absorb";
    case OpKind::kLatentAttention: return "mla_latent_attention";
    case OpKind::kMlaVUp: return "mla_v_up";
    case OpKind::kIndexKWrite: return "dsa_index_k_write";
    case OpKind::kIndexer: return "dsa_indexer_topk";
    case OpKind::kStore: return "activation_store";
    case OpKind::kCount: break;
  }
  return "unknown";
}

OpKind KindOf(const Op& op) {
  return std::visit([](const auto& o) { return std::decay_t<decltype(o)>::kKind; }, op);
}

const char* ExecModeName(ExecMode m) { return m == ExecMode::kAsync ? "async" : "kernel_by_kernel"; }

std::string ExecFault::Describe() const {
  const std::string label = tag.layer >= 0 ? Cat("L", tag.layer, ".", tag.kernel) : tag.kernel;
  std::string s = Cat("check ", CheckName(status.check), " failed in kernel ", label, " (launch #", launch, ", op ",
                      OpKindName(op), ") at item ", status.item, ": index ", status.index, ", value ", status.value);
  if (!device_error.empty()) s += Cat("; ", device_error);
  if (surfaced_in != "Launch" || surfaced_after_launch != launch + 1) {
    s += Cat("; surfaced later, in ", surfaced_in, " after launch #", surfaced_after_launch - 1);
  }
  return s;
}

}  // namespace crashreplay::replay
