#include "crashreplay/replay/checkpoint_io.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "crashreplay/base/status.h"
#include "crashreplay/formats/checkpoint.h"
#include "crashreplay/formats/safetensors_writer.h"
#include "text_util.h"

namespace crashreplay::replay {
namespace {

using text::Cat;
using nlohmann::json;

template <typename T>
T Or(const json& j, const char* key, T fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  return it->get<T>();
}

absl::StatusOr<int64_t> Required(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) {
    return absl::InvalidArgumentError(Cat("config.json: missing integer '", key, "'"));
  }
  return it->get<int64_t>();
}

RopeSpec ParseRope(const json& scaling, double theta) {
  RopeSpec r;
  r.theta = theta;
  if (!scaling.is_object()) return r;
  r.type = Or<std::string>(scaling, "rope_type", Or<std::string>(scaling, "type", "default"));
  r.theta = Or<double>(scaling, "rope_theta", theta);
  r.factor = Or<double>(scaling, "factor", 1.0);
  r.low_freq_factor = Or<double>(scaling, "low_freq_factor", 1.0);
  r.high_freq_factor = Or<double>(scaling, "high_freq_factor", 4.0);
  r.original_max_position = Or<int64_t>(scaling, "original_max_position_embeddings", 8192);
  r.beta_fast = Or<double>(scaling, "beta_fast", 32.0);
  r.beta_slow = Or<double>(scaling, "beta_slow", 1.0);
  r.mscale = Or<double>(scaling, "mscale", 0.0);
  r.mscale_all_dim = Or<double>(scaling, "mscale_all_dim", 0.0);
  r.attention_factor = Or<double>(scaling, "attention_factor", 0.0);
  return r;
}

json RopeToJson(const RopeSpec& r, bool with_theta) {
  json j = {{"rope_type", r.type}};
  if (with_theta) j["rope_theta"] = r.theta;
  if (r.type != "default") j["factor"] = r.factor;
  if (r.type == "llama3") {
    j["low_freq_factor"] = r.low_freq_factor;
    j["high_freq_factor"] = r.high_freq_factor;
  }
  if (r.type == "llama3" || r.type == "yarn") j["original_max_position_embeddings"] = r.original_max_position;
  if (r.type == "yarn") {
    j["beta_fast"] = r.beta_fast;
    j["beta_slow"] = r.beta_slow;
    if (r.mscale != 0) j["mscale"] = r.mscale;
    if (r.mscale_all_dim != 0) j["mscale_all_dim"] = r.mscale_all_dim;
    if (r.attention_factor != 0) j["attention_factor"] = r.attention_factor;
  }
  return j;
}

const char* ArchitectureName(const std::string& t) {
  if (t == "llama") return "LlamaForCausalLM";
  if (t == "mistral") return "MistralForCausalLM";
  if (t == "qwen2") return "Qwen2ForCausalLM";
  if (t == "qwen3") return "Qwen3ForCausalLM";
  if (t == "mixtral") return "MixtralForCausalLM";
  if (t == "qwen3_moe") return "Qwen3MoeForCausalLM";
  if (t == "glm4_moe") return "Glm4MoeForCausalLM";
  return "UnknownForCausalLM";
}

}  // namespace

absl::StatusOr<ModelSpec> ModelSpecFromHfJson(const json& c) {
  try {
    ModelSpec s;
    s.model_type = Or<std::string>(c, "model_type", "");
    static const char* kKnown[] = {"llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen3_moe", "glm4_moe"};
    if (std::find_if(std::begin(kKnown), std::end(kKnown), [&](const char* k) { return s.model_type == k; }) ==
        std::end(kKnown)) {
      return absl::UnimplementedError(
          Cat("config.json: model_type '", s.model_type, "' is not supported (llama, mistral, qwen2, qwen3, ",
              "mixtral, qwen3_moe, glm4_moe; deepseek_v3 needs MLA attention, not implemented)"));
    }
    CR_ASSIGN_OR_RETURN(s.hidden, Required(c, "hidden_size"));
    CR_ASSIGN_OR_RETURN(s.layers, Required(c, "num_hidden_layers"));
    CR_ASSIGN_OR_RETURN(s.heads, Required(c, "num_attention_heads"));
    CR_ASSIGN_OR_RETURN(s.vocab, Required(c, "vocab_size"));
    s.kv_heads = Or<int64_t>(c, "num_key_value_heads", s.heads);
    s.head_dim = Or<int64_t>(c, "head_dim", s.hidden / s.heads);
    s.intermediate = Or<int64_t>(c, "intermediate_size", 0);
    s.rms_eps = Or<double>(c, "rms_norm_eps", 1e-6);
    s.tie_embeddings = Or<bool>(c, "tie_word_embeddings", false);
    s.attention_bias = Or<bool>(c, "attention_bias", s.model_type == "qwen2");
    s.qk_norm = s.model_type == "qwen3" || s.model_type == "qwen3_moe" || Or<bool>(c, "use_qk_norm", false);
    s.max_position = Or<int64_t>(c, "max_position_embeddings", 4096);
    s.partial_rotary_factor = Or<double>(c, "partial_rotary_factor", 1.0);
    if (c.contains("rope_theta") || c.contains("rope_scaling")) {
      s.rope_legacy = ParseRope(c.value("rope_scaling", json()), Or<double>(c, "rope_theta", 10000.0));
    }
    if (c.contains("rope_parameters") && c["rope_parameters"].is_object()) {
      s.rope_parameters = ParseRope(c["rope_parameters"], Or<double>(c["rope_parameters"], "rope_theta", 10000.0));
    }
    // MoE fields under each family's names.
    s.num_experts = Or<int64_t>(c, "num_experts", Or<int64_t>(c, "num_local_experts", Or<int64_t>(c, "n_routed_experts", 0)));
    if (s.model_type == "qwen3" || s.model_type == "llama" || s.model_type == "mistral" || s.model_type == "qwen2") {
      s.num_experts = 0;
    }
    if (s.is_moe()) {
      s.experts_per_tok = Or<int64_t>(c, "num_experts_per_tok", 2);
      s.moe_intermediate = s.model_type == "mixtral" ? s.intermediate : Or<int64_t>(c, "moe_intermediate_size", 0);
      s.n_shared_experts = Or<int64_t>(c, "n_shared_experts", 0);
      s.scoring = Or<std::string>(c, "scoring_func", s.model_type == "glm4_moe" ? "sigmoid" : "softmax");
      s.n_group = Or<int64_t>(c, "n_group", 1);
      s.topk_group = Or<int64_t>(c, "topk_group", 1);
      s.routed_scaling_factor = Or<double>(c, "routed_scaling_factor", 1.0);
      s.norm_topk_prob = Or<bool>(c, "norm_topk_prob", s.model_type != "qwen3_moe" ? true : false);
      if (s.model_type == "mixtral") s.norm_topk_prob = true;  // softmax over the chosen k
      s.first_k_dense = Or<int64_t>(c, "first_k_dense_replace", 0);
      if (s.moe_intermediate <= 0) return absl::InvalidArgumentError("config.json: missing 'moe_intermediate_size'");
      if (s.n_group < 1 || s.num_experts % s.n_group != 0 || s.topk_group > s.n_group) {
        return absl::InvalidArgumentError("config.json: n_group must divide the experts and topk_group <= n_group");
      }
    }
    if (c.contains("quantization_config")) {
      const json& q = c["quantization_config"];
      const std::string method = Or<std::string>(q, "quant_method", "");
      const std::string algo = Or<std::string>(q, "quant_algo", "");
      if (method == "fp8") {
        s.quant = QuantKind::kFp8Block;
        auto bs = q.value("weight_block_size", json::array({128, 128}));
        s.quant_block_rows = bs.at(0).get<int64_t>();
        s.quant_block_cols = bs.at(1).get<int64_t>();
      } else if (method == "modelopt" && algo == "NVFP4") {
        s.quant = QuantKind::kNvfp4;
        s.quant_block_cols = Or<int64_t>(q, "group_size", 16);
      } else if (method == "mxfp4") {
        s.quant = QuantKind::kMxfp4;
        s.quant_block_cols = 32;
      } else {
        return absl::UnimplementedError(Cat("config.json: quantization_config '", method, "' ", algo,
                                            " is not supported (fp8 block, modelopt NVFP4, mxfp4)"));
      }
    }
    return s;
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(Cat("config.json: ", e.what()));
  }
}

json ModelSpecToHfJson(const ModelSpec& s) {
  json c;
  c["architectures"] = {ArchitectureName(s.model_type)};
  c["model_type"] = s.model_type;
  c["hidden_size"] = s.hidden;
  c["num_hidden_layers"] = s.layers;
  c["num_attention_heads"] = s.heads;
  c["num_key_value_heads"] = s.kv_heads;
  c["head_dim"] = s.head_dim;
  c["intermediate_size"] = s.intermediate;
  c["vocab_size"] = s.vocab;
  c["rms_norm_eps"] = s.rms_eps;
  c["tie_word_embeddings"] = s.tie_embeddings;
  c["max_position_embeddings"] = s.max_position;
  c["torch_dtype"] = "bfloat16";
  if (s.attention_bias) c["attention_bias"] = true;
  if (s.partial_rotary_factor != 1.0) c["partial_rotary_factor"] = s.partial_rotary_factor;
  if (s.rope_legacy) {
    c["rope_theta"] = s.rope_legacy->theta;
    c["rope_scaling"] = s.rope_legacy->type == "default" ? json() : RopeToJson(*s.rope_legacy, false);
  }
  if (s.rope_parameters) c["rope_parameters"] = RopeToJson(*s.rope_parameters, true);
  if (s.is_moe()) {
    if (s.model_type == "mixtral") {
      c["num_local_experts"] = s.num_experts;
    } else if (s.model_type == "glm4_moe") {
      c["n_routed_experts"] = s.num_experts;
    } else {
      c["num_experts"] = s.num_experts;
    }
    c["num_experts_per_tok"] = s.experts_per_tok;
    if (s.model_type != "mixtral") c["moe_intermediate_size"] = s.moe_intermediate;
    c["norm_topk_prob"] = s.norm_topk_prob;
    if (s.model_type == "glm4_moe") {
      c["n_shared_experts"] = s.n_shared_experts;
      c["scoring_func"] = s.scoring;
      c["n_group"] = s.n_group;
      c["topk_group"] = s.topk_group;
      c["routed_scaling_factor"] = s.routed_scaling_factor;
      c["first_k_dense_replace"] = s.first_k_dense;
      c["use_qk_norm"] = s.qk_norm;
    }
  }
  switch (s.quant) {
    case QuantKind::kNone: break;
    case QuantKind::kFp8Block:
      c["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
                                  {"weight_block_size", {s.quant_block_rows, s.quant_block_cols}}};
      break;
    case QuantKind::kNvfp4:
      c["quantization_config"] = {{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"},
                                  {"group_size", s.quant_block_cols},
                                  {"ignore", {"lm_head", "model.layers.*.mlp.gate"}}};
      break;
    case QuantKind::kMxfp4:
      c["quantization_config"] = {{"quant_method", "mxfp4"}};
      break;
  }
  return c;
}

absl::StatusOr<LoadedCheckpoint> LoadCheckpointDir(const std::string& dir) {
  CR_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ck, Checkpoint::Open(dir));
  if (ck->config_path().empty()) return absl::NotFoundError(Cat(dir, ": no config.json"));
  LoadedCheckpoint out;
  {
    std::ifstream in(ck->config_path());
    std::stringstream ss;
    ss << in.rdbuf();
    out.config = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
    if (out.config.is_discarded() || !out.config.is_object()) {
      return absl::DataLossError(Cat(ck->config_path(), ": not a JSON object"));
    }
  }
  CR_ASSIGN_OR_RETURN(out.spec, ModelSpecFromHfJson(out.config));
  for (const std::string& name : ck->names()) {
    const CheckpointTensor* t = ck->Find(name);
    CR_ASSIGN_OR_RETURN(std::span<const std::byte> data, ck->Data(name));
    HostTensor h;
    h.dtype = t->info->dtype;
    h.shape = t->info->shape;
    h.bytes.assign(reinterpret_cast<const uint8_t*>(data.data()), reinterpret_cast<const uint8_t*>(data.data()) + data.size());
    out.tensors.emplace(name, std::move(h));
  }
  return out;
}

absl::Status WriteCheckpointDir(const std::string& dir, const ModelSpec& spec, const TensorSet& tensors,
                                uint64_t max_shard_bytes) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::FailedPreconditionError(Cat("cannot create ", dir, ": ", ec.message()));
  SafetensorsWriter w;
  w.SetMetadata("format", "pt");
  for (const auto& [name, t] : tensors) {
    CR_RETURN_IF_ERROR(w.Add(name, t.dtype, t.shape,
                             std::span<const std::byte>(reinterpret_cast<const std::byte*>(t.bytes.data()), t.bytes.size())));
  }
  CR_RETURN_IF_ERROR(w.WriteSharded(dir, max_shard_bytes));
  return WriteFileAtomically(dir + "/config.json", ModelSpecToHfJson(spec).dump(2) + "\n");
}

}  // namespace crashreplay::replay
