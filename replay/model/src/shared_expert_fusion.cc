#include "crashreplay/replay/model/shared_expert_fusion.h"

#include "crashreplay/base/text.h"

namespace crashreplay::replay {
namespace {

using text::Cat;

struct Stored {
  const char* dtype;
  int64_t rows, cols;  // as the tensor is stored: e2m1 packs two values per byte
};

Stored StoredOf(const QWeight& w) {
  switch (w.format) {
    case WFormat::kF32: return {"float32", w.rows, w.cols};
    case WFormat::kBF16: return {"bfloat16", w.rows, w.cols};
    case WFormat::kF16: return {"float16", w.rows, w.cols};
    case WFormat::kE4m3: return {"float8_e4m3fn", w.rows, w.cols};
    case WFormat::kE2m1: return {"uint8 (packed e2m1)", w.rows, (w.cols + 1) / 2};
  }
  return {"?", w.rows, w.cols};
}

}  // namespace

std::optional<Fault> CheckSharedExpertFusion(const Model& model) {
  for (size_t li = 0; li < model.layers.size(); ++li) {
    const Layer& layer = model.layers[li];
    for (size_t r = 0; r < layer.ranks.size(); ++r) {
      const RankLayer& rl = layer.ranks[r];
      if (!rl.has_shared || rl.experts.empty()) continue;
      const ExpertShard& routed = rl.experts.front();
      const std::pair<const char*, std::pair<const LinearShard*, const LinearShard*>> parts[] = {
          {"gate_proj", {&rl.shared.gate, &routed.gate}},
          {"up_proj", {&rl.shared.up, &routed.up}},
          {"down_proj", {&rl.shared.down, &routed.down}}};
      for (const auto& [name, pair] : parts) {
        const Stored a = StoredOf(pair.first->w), b = StoredOf(pair.second->w);
        int dim = -1;
        int64_t sa = 0, sb = 0;
        if (a.rows != b.rows)
          dim = 0, sa = a.rows, sb = b.rows;
        else if (a.cols != b.cols)
          dim = 1, sa = a.cols, sb = b.cols;
        if (dim < 0 && std::string_view(a.dtype) == b.dtype) continue;
        Fault f;
        f.klass = "error";
        f.stage = "load";
        f.kernel = "shared_experts_fusion";
        f.check = "shared_expert_stored_like_routed";
        f.layer = static_cast<int>(li);
        f.rank = static_cast<int>(r);
        f.index = dim;
        f.message = Cat("loading layer ", li, " rank ", r, " with shared-experts fusion: the shared expert's ", name,
                        " is stored ", a.dtype, " [", a.rows, ", ", a.cols, "], a routed expert's ", b.dtype, " [",
                        b.rows, ", ", b.cols, "]",
                        dim >= 0 ? Cat(": the size of tensor a (", sb, ") must match the size of tensor b (", sa,
                                       ") at non-singleton dimension ", dim)
                                 : std::string(": the dtypes differ"),
                        " (a checkpoint that keeps shared experts unquantized needs shared_experts_fusion = false, "
                        "sglang's --disable-shared-experts-fusion)");
        return f;
      }
    }
  }
  return std::nullopt;
}

}  // namespace crashreplay::replay
