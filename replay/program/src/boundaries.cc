// The step's boundaries: the named points whose tensors are fingerprinted
// (formats/fingerprint.h) so that an engine's records line up with the
// replay's own. The table (docs/replay.md "Boundaries"):
//
//   embedding        the embedding kernel's hidden states       [tokens, hidden]
//   L{n}.attention   attention output before o_proj ("attn")    [tokens, heads * v_dim]
//   L{n}.o_proj      o_proj's output (the attention block's)    [tokens, hidden]
//   L{n}.topk        the router's top-k expert ids (int)        [tokens, k]
//   L{n}.indexer     the DSA indexer's top-k positions (int)    [tokens, index_topk]
//   L{n}.experts     the routed experts' weighted sum           [tokens, hidden]
//   L{n}.mlp         the MLP / MoE block's output (+ shared)    [tokens, hidden]
//   L{n}.layer       the residual stream after the layer        [tokens, hidden]
//   final_norm       the final norm of each row's last token    [rows, hidden]
//   lm_head          the logits                                 [rows, vocab]
//
// Per-rank buffers are mapped onto the engine's unsharded tensor (Boundary::
// Layout), so the names and shapes do not depend on tp_size.
#include <cstring>

#include "crashreplay/replay/program/step.h"

namespace crashreplay::replay {

void StepProgram::AssignBoundaries() {
  using L = Boundary::Layout;
  auto label = [](const KernelCall& k, const char* what) {
    return k.layer >= 0 ? "L" + std::to_string(k.layer) + "." + what : std::string(what);
  };
  auto writes = [](const KernelCall& k, const std::string& buffer) {
    for (const std::string& o : k.outputs) {
      if (o == buffer) return true;
    }
    return false;
  };
  for (size_t i = 0; i < kernels_.size(); ++i) {
    KernelCall& k = kernels_[i];
    const std::string& n = k.name;
    if (n == "embedding") k.boundaries.push_back({"embedding", "hidden", L::kTokens});
    if ((n == "attention" || n == "v_up") && writes(k, "attn")) {
      k.boundaries.push_back({label(k, "attention"), "attn", L::kRankConcat});
    }
    if (n == "o_proj") k.boundaries.push_back({label(k, "o_proj"), "partial", L::kRankSum});
    if (n == "topk") k.boundaries.push_back({label(k, "topk"), "topk_ids", L::kTokens});
    if (n == "indexer") k.boundaries.push_back({label(k, "indexer"), "index_topk", L::kRank0});
    if (n == "experts") k.boundaries.push_back({label(k, "experts"), "partial", L::kRankSum});
    if (n == "mlp_all_reduce" || n == "moe_all_reduce") {
      // The block's output is what the kernel before the all-reduce left in
      // the partials (down_proj, experts or the shared expert).
      if (i > 0 && writes(kernels_[i - 1], "partial")) {
        kernels_[i - 1].boundaries.push_back({label(k, "mlp"), "partial", L::kRankSum});
      }
      k.boundaries.push_back({label(k, "layer"), "hidden", L::kTokens});
    }
    if (n == "final_norm") k.boundaries.push_back({"final_norm", "last_hidden", L::kTokens});
    if (n == "logits_all_gather") k.boundaries.push_back({"lm_head", "logits", L::kTokens});
  }
}

crashreplay::Fingerprint StepProgram::Summarize(const Boundary& b) const {
  const Buffer& m = mirror_.at(b.buffer);
  const std::vector<int64_t>& shape = m.shape;
  const int64_t columns = shape.empty() ? 1 : shape.back();
  if (b.layout == Boundary::Layout::kTokens || shape.size() != 3) {
    const uint64_t n = m.is_int ? m.i.size() : m.f.size();
    crashreplay::Fingerprint f =
        SummarizeTensor(b.name, m.is_int ? DType::kI32 : DType::kF32, m.data(), n, static_cast<uint64_t>(columns),
                        /*hash=*/m.is_int);
    if (!m.is_int) f.dtype = std::string(DTypeName(stored_dtype_));
    return f;
  }
  const int64_t ranks = shape[0], tokens = shape[1], c = shape[2];
  if (b.layout == Boundary::Layout::kRank0) {
    const uint64_t n = static_cast<uint64_t>(tokens * c);
    if (m.is_int) return SummarizeTensor(b.name, DType::kI32, m.i.data(), n, c, /*hash=*/true);
    crashreplay::Fingerprint f = SummarizeTensor(b.name, DType::kF32, m.f.data(), n, c);
    f.dtype = std::string(DTypeName(stored_dtype_));
    return f;
  }
  std::vector<float> t;
  if (b.layout == Boundary::Layout::kRankConcat) {
    t.resize(static_cast<size_t>(ranks * tokens * c));
    for (int64_t r = 0; r < ranks; ++r) {
      for (int64_t tok = 0; tok < tokens; ++tok) {
        std::memcpy(t.data() + (tok * ranks + r) * c, m.f.data() + (r * tokens + tok) * c, c * sizeof(float));
      }
    }
    crashreplay::Fingerprint f =
        SummarizeTensor(b.name, DType::kF32, t.data(), t.size(), static_cast<uint64_t>(ranks * c));
    f.dtype = std::string(DTypeName(stored_dtype_));
    return f;
  }
  // kRankSum: the all-reduce's sum, in rank order (ReduceOp's order).
  t.assign(m.f.begin(), m.f.begin() + tokens * c);
  for (int64_t r = 1; r < ranks; ++r) {
    const float* p = m.f.data() + r * tokens * c;
    for (int64_t i = 0; i < tokens * c; ++i) t[i] += p[i];
  }
  crashreplay::Fingerprint f = SummarizeTensor(b.name, DType::kF32, t.data(), t.size(), static_cast<uint64_t>(c));
  f.dtype = std::string(DTypeName(stored_dtype_));
  return f;
}

}  // namespace crashreplay::replay
