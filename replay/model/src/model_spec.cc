#include "crashreplay/replay/model/model_spec.h"

#include <string>

namespace crashreplay::replay {

LayerNames NamesFor(const ModelSpec& spec, int64_t layer) {
  LayerNames n;
  n.model_type = spec.model_type;
  n.prefix = "model.layers." + std::to_string(layer) + ".";
  n.moe_prefix = spec.model_type == "mixtral" ? "block_sparse_moe." : "mlp.";
  return n;
}

std::string LayerNames::expert(int64_t j, const std::string& proj) const {
  if (model_type == "mixtral") {
    // Mixtral: w1 = gate, w3 = up, w2 = down.
    const char* w = proj == "gate" ? "w1" : proj == "up" ? "w3" : "w2";
    return prefix + moe_prefix + "experts." + std::to_string(j) + "." + w + ".weight";
  }
  return prefix + moe_prefix + "experts." + std::to_string(j) + "." + proj + "_proj.weight";
}

std::string LayerNames::shared(const std::string& proj) const {
  return prefix + "mlp.shared_experts." + proj + "_proj.weight";
}

std::string LayerNames::router() const {
  return prefix + moe_prefix + (model_type == "gpt_oss" ? "router.weight" : "gate.weight");
}
std::string LayerNames::sinks() const { return prefix + "self_attn.sinks"; }
std::string LayerNames::bias() const { return prefix + moe_prefix + "gate.e_score_correction_bias"; }

}  // namespace crashreplay::replay
