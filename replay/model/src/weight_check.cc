#include "crashreplay/replay/model/weight_check.h"

#include <cstdlib>
#include <set>

#include "crashreplay/base/status.h"
#include "crashreplay/base/text.h"

namespace crashreplay::replay {
namespace {

using text::Cat;

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += Cat(i ? ", " : "", shape[i]);
  return out + "]";
}

int64_t Elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool IsFloatWeight(DType t) { return t == DType::kBF16 || t == DType::kF16 || t == DType::kF32; }

// "model.layers.12.mlp.gate_proj.weight" -> 12; -1 outside the decoder layers.
int64_t LayerOf(const std::string& name) {
  static const std::string kPrefix = "model.layers.";
  if (name.rfind(kPrefix, 0) != 0) return -1;
  const char* start = name.c_str() + kPrefix.size();
  char* end = nullptr;
  const long long v = std::strtoll(start, &end, 10);
  if (end == start || *end != '.') return -1;
  return v;
}

bool EndsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

class Checker {
 public:
  Checker(const ModelConfig& c, const ModelSpec& s, const std::string& where, TensorSet* t)
      : c_(c), s_(s), where_(where), t_(*t) {}

  absl::Status Run() {
    const int64_t H = s_.hidden, hd = s_.head_dim, V = s_.vocab;
    const std::string Hw = Cat("hidden_size ", H);
    const std::string Vw = Cat("vocab_size ", V);
    CR_RETURN_IF_ERROR(Float("model.embed_tokens.weight", {V, H}, Cat(Vw, ", ", Hw)));
    CR_RETURN_IF_ERROR(Float("model.norm.weight", {H}, Hw));
    if (!s_.tie_embeddings || t_.count("lm_head.weight")) {
      CR_RETURN_IF_ERROR(
          Linear("lm_head", V, H, false, Vw, Hw, s_.tie_embeddings ? "" : "; tie_word_embeddings is false"));
    }
    if (s_.tie_embeddings && t_.count("lm_head.weight")) {
      const HostTensor& head = t_.at("lm_head.weight");
      const HostTensor& embed = t_.at("model.embed_tokens.weight");
      if (head.dtype != embed.dtype || head.bytes != embed.bytes) {
        notes.push_back(
            "config.json ties lm_head to embed_tokens (tie_word_embeddings), but the checkpoint has its "
            "own, different lm_head.weight: using it, as transformers 5 does (it unties them)");
      }
    }
    const std::string q_rows = Cat("num_attention_heads ", s_.heads, " x head_dim ", hd);
    const std::string kv_rows = Cat("num_key_value_heads ", s_.kv_heads, " x head_dim ", hd);
    for (int64_t l = 0; l < s_.layers; ++l) {
      const LayerNames n = NamesFor(s_, l);
      const std::string a = n.prefix + "self_attn.";
      CR_RETURN_IF_ERROR(Float(n.prefix + "input_layernorm.weight", {H}, Hw));
      CR_RETURN_IF_ERROR(Float(n.prefix + "post_attention_layernorm.weight", {H}, Hw));
      if (s_.mla.enabled()) {
        CR_RETURN_IF_ERROR(MlaAttention(a, l));
      } else {
        CR_RETURN_IF_ERROR(Linear(a + "q_proj", s_.heads * hd, H, s_.attention_bias, q_rows, Hw));
        CR_RETURN_IF_ERROR(Linear(a + "k_proj", s_.kv_heads * hd, H, s_.attention_bias, kv_rows, Hw));
        CR_RETURN_IF_ERROR(Linear(a + "v_proj", s_.kv_heads * hd, H, s_.attention_bias, kv_rows, Hw));
        CR_RETURN_IF_ERROR(Linear(a + "o_proj", H, s_.heads * hd, s_.attention_out_bias, Hw, q_rows));
      }
      if (s_.attention_sinks) {
        CR_RETURN_IF_ERROR(Float(n.sinks(), {s_.heads}, Cat("num_attention_heads ", s_.heads, ": one sink each")));
      }
      if (s_.qk_norm) {
        CR_RETURN_IF_ERROR(Float(a + "q_norm.weight", {hd}, Cat("head_dim ", hd)));
        CR_RETURN_IF_ERROR(Float(a + "k_norm.weight", {hd}, Cat("head_dim ", hd)));
      }
      if (!s_.layer_is_moe(l)) {
        const std::string I = Cat("intermediate_size ", s_.intermediate);
        const std::string m = n.prefix + "mlp.";
        CR_RETURN_IF_ERROR(Linear(m + "gate_proj", s_.intermediate, H, s_.mlp_bias, I, Hw));
        CR_RETURN_IF_ERROR(Linear(m + "up_proj", s_.intermediate, H, s_.mlp_bias, I, Hw));
        CR_RETURN_IF_ERROR(Linear(m + "down_proj", H, s_.intermediate, s_.mlp_bias, Hw, I));
        continue;
      }
      const std::string E = Cat("num_experts ", s_.num_experts);
      const std::string router = n.router();
      CR_RETURN_IF_ERROR(Linear(router.substr(0, router.size() - 7), s_.num_experts, H, s_.moe_bias, E, Hw));
      // transformers zero-initialises a missing e_score_correction_bias, as the
      // engine runs without one; when present it must fit.
      if (s_.scoring == "sigmoid" && t_.count(n.bias())) CR_RETURN_IF_ERROR(Float(n.bias(), {s_.num_experts}, E));
      const std::string MI = Cat(
          s_.model_type == "mixtral" || s_.model_type == "gpt_oss" ? "intermediate_size " : "moe_intermediate_size ",
          s_.moe_intermediate);
      for (int64_t j = 0; j < s_.num_experts; ++j) {
        for (const char* proj : {"gate", "up", "down"}) {
          const std::string w = n.expert(j, proj);
          const bool down = std::string_view(proj) == "down";
          CR_RETURN_IF_ERROR(Linear(w.substr(0, w.size() - 7), down ? H : s_.moe_intermediate,
                                    down ? s_.moe_intermediate : H, s_.moe_bias, down ? Hw : MI, down ? MI : Hw));
        }
      }
      if (s_.n_shared_experts > 0) {
        const int64_t SI = s_.moe_intermediate * s_.n_shared_experts;
        const std::string SIw = Cat("n_shared_experts ", s_.n_shared_experts, " x ", MI);
        for (const char* proj : {"gate", "up", "down"}) {
          const std::string w = n.shared(proj);
          const bool down = std::string_view(proj) == "down";
          CR_RETURN_IF_ERROR(
              Linear(w.substr(0, w.size() - 7), down ? H : SI, down ? SI : H, false, down ? Hw : SIw, down ? SIw : Hw));
        }
      }
    }
    return Leftovers();
  }

  std::vector<std::string> notes;

 private:
  // MLA attention (transformers' DeepseekV3Attention) and, on layers that
  // run one, the DSA indexer (DeepseekV32Indexer). attention_bias gives
  // q_a_proj, kv_a_proj_with_mqa (and q_proj) and o_proj a bias, never
  // q_b_proj or kv_b_proj.
  absl::Status MlaAttention(const std::string& a, int64_t l) {
    const MlaSpec& m = s_.mla;
    const int64_t H = s_.hidden, qk = m.qk_head_dim();
    const bool bias = s_.attention_bias;
    const std::string Hw = Cat("hidden_size ", H);
    const std::string Q = Cat("num_attention_heads ", s_.heads, " x (qk_nope_head_dim ", m.qk_nope_head_dim,
                              " + qk_rope_head_dim ", m.qk_rope_head_dim, ")");
    if (m.q_lora_rank > 0) {
      const std::string R = Cat("q_lora_rank ", m.q_lora_rank);
      CR_RETURN_IF_ERROR(Linear(a + "q_a_proj", m.q_lora_rank, H, bias, R, Hw));
      CR_RETURN_IF_ERROR(Float(a + "q_a_layernorm.weight", {m.q_lora_rank}, R));
      CR_RETURN_IF_ERROR(Linear(a + "q_b_proj", s_.heads * qk, m.q_lora_rank, false, Q, R));
    } else {
      CR_RETURN_IF_ERROR(Linear(a + "q_proj", s_.heads * qk, H, bias, Q, Hw));
    }
    const std::string KVA = Cat("kv_lora_rank ", m.kv_lora_rank, " + qk_rope_head_dim ", m.qk_rope_head_dim);
    const std::string R = Cat("kv_lora_rank ", m.kv_lora_rank);
    CR_RETURN_IF_ERROR(Linear(a + "kv_a_proj_with_mqa", m.kv_lora_rank + m.qk_rope_head_dim, H, bias, KVA, Hw));
    CR_RETURN_IF_ERROR(Float(a + "kv_a_layernorm.weight", {m.kv_lora_rank}, R));
    CR_RETURN_IF_ERROR(Linear(a + "kv_b_proj", s_.heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank, false,
                              Cat("num_attention_heads ", s_.heads, " x (qk_nope_head_dim ", m.qk_nope_head_dim,
                                  " + v_head_dim ", m.v_head_dim, ")"),
                              R));
    const std::string O = Cat("num_attention_heads ", s_.heads, " x v_head_dim ", m.v_head_dim);
    CR_RETURN_IF_ERROR(Linear(a + "o_proj", H, s_.heads * m.v_head_dim, bias, Hw, O));
    if (!m.layer_has_indexer(l)) return absl::OkStatus();
    const std::string x = a + "indexer.";
    const std::string D = Cat("index_head_dim ", m.index_head_dim);
    CR_RETURN_IF_ERROR(Linear(x + "wq_b", m.index_n_heads * m.index_head_dim, m.q_lora_rank, false,
                              Cat("index_n_heads ", m.index_n_heads, " x ", D), Cat("q_lora_rank ", m.q_lora_rank)));
    CR_RETURN_IF_ERROR(Linear(x + "wk", m.index_head_dim, H, false, D, Hw));
    CR_RETURN_IF_ERROR(Float(x + "k_norm.weight", {m.index_head_dim}, D));
    CR_RETURN_IF_ERROR(Float(x + "k_norm.bias", {m.index_head_dim}, D));
    return Linear(x + "weights_proj", m.index_n_heads, H, false, Cat("index_n_heads ", m.index_n_heads), Hw);
  }

  absl::Status Missing(const std::string& name, const std::string& why) {
    std::string hint;
    // transformers 5 holds experts fused in memory ([E, 2I, H] gate_up_proj);
    // save_pretrained writes them back per expert, which is what is read here
    // (gpt_oss's fused ones are split before: SplitFusedExperts).
    const size_t at = name.find("experts.");
    if (at != std::string::npos && s_.model_type != "gpt_oss") {
      const std::string fused = name.substr(0, at) + "experts.gate_up_proj";
      if (t_.count(fused)) {
        hint = Cat("; the file has fused expert tensors ('", fused,
                   "'), transformers 5's in-memory layout, "
                   "which save_pretrained writes back per expert: re-save the checkpoint with save_pretrained");
      }
    }
    return absl::NotFoundError(
        Cat(where_, ": checkpoint has no tensor '", name, "', which config.json implies (", why, ")", hint));
  }

  absl::Status WrongShape(const std::string& name, const HostTensor& t, const std::vector<int64_t>& want,
                          const std::string& why) {
    return absl::DataLossError(Cat(where_, ": tensor '", name, "' has shape ", ShapeText(t.shape), ", config.json (",
                                   s_.model_type, ") implies ", ShapeText(want), " (", why, ")"));
  }

  absl::Status WrongDType(const std::string& name, const HostTensor& t, const std::string& want) {
    return absl::DataLossError(
        Cat(where_, ": tensor '", name, "' has dtype ", DTypeName(t.dtype), "; config.json implies ", want));
  }

  // A required unquantized tensor (embeddings, norms, biases).
  absl::Status Float(const std::string& name, const std::vector<int64_t>& shape, const std::string& why) {
    auto it = t_.find(name);
    if (it == t_.end()) return Missing(name, why);
    claimed_.insert(name);
    if (!IsFloatWeight(it->second.dtype)) return WrongDType(name, it->second, "BF16, F16 or F32");
    if (it->second.shape != shape) return WrongShape(name, it->second, shape, why);
    return absl::OkStatus();
  }

  // A companion scale of one element (shape [] or [1]).
  absl::Status Scalar(const std::string& name, bool required, const std::string& why) {
    auto it = t_.find(name);
    if (it == t_.end()) return required ? Missing(name, why) : absl::OkStatus();
    claimed_.insert(name);
    if (it->second.dtype != DType::kF32) return WrongDType(name, it->second, "F32 (one scale)");
    if (Elements(it->second.shape) != 1 || it->second.shape.size() > 1) {
      return WrongShape(name, it->second, {}, why);
    }
    return absl::OkStatus();
  }

  absl::Status Scale(const std::string& name, std::initializer_list<DType> dtypes, const std::vector<int64_t>& shape,
                     const std::string& why) {
    auto it = t_.find(name);
    if (it == t_.end()) return Missing(name, why);
    claimed_.insert(name);
    bool ok = false;
    std::string names;
    for (DType d : dtypes) {
      ok = ok || it->second.dtype == d;
      names += Cat(names.empty() ? "" : " or ", DTypeName(d));
    }
    if (!ok) return WrongDType(name, it->second, names);
    if (it->second.shape != shape) return WrongShape(name, it->second, shape, why);
    return absl::OkStatus();
  }

  // One projection `module` ([out, in]) in any form the config allows, with
  // its scales, and its bias when `bias`.
  absl::Status Linear(const std::string& module, int64_t out, int64_t in, bool bias, const std::string& rows_why,
                      const std::string& cols_why, const std::string& missing_why = "") {
    const std::string name = module + ".weight";
    const std::string why = Cat(rows_why, " x ", cols_why);
    auto it = t_.find(name);
    if (it == t_.end()) return Missing(name, why + missing_why);
    claimed_.insert(name);
    const HostTensor& w = it->second;
    CR_RETURN_IF_ERROR(Weight(module, w, out, in, why));
    if (bias) return Float(module + ".bias", {out}, rows_why);
    if (t_.count(module + ".bias")) {
      return absl::DataLossError(Cat(where_, ": tensor '", module, ".bias' is in the checkpoint, but config.json (",
                                     s_.model_type, ") gives this projection no bias", BiasFlagHint(module)));
    }
    return absl::OkStatus();
  }

  // The weight of `module` and its scales.
  absl::Status Weight(const std::string& module, const HostTensor& w, int64_t out, int64_t in, const std::string& why) {
    const std::string name = module + ".weight";
    const QuantConfig& q = c_.quant;
    const bool quantized = q.IsQuantized(module);
    if (IsFloatWeight(w.dtype)) {
      if (w.shape != std::vector<int64_t>{out, in}) return WrongShape(name, w, {out, in}, why);
      return absl::OkStatus();
    }
    const std::string how = Cat("config.json's quantization (", QuantMethodName(q.method),
                                q.quant_algo.empty() ? "" : Cat(" ", q.quant_algo), ")");
    if (q.method == QuantMethod::kNone || !quantized) {
      return absl::DataLossError(Cat(where_, ": tensor '", name, "' is ", DTypeName(w.dtype), " (quantized), but ",
                                     q.method == QuantMethod::kNone
                                         ? "config.json has no quantization"
                                         : "config.json leaves module '" + module + "' unquantized (its ignore list)",
                                     "; expected BF16, F16 or F32"));
    }
    switch (q.method) {
      case QuantMethod::kFp8Block:
      case QuantMethod::kFp8Tensor: {
        if (w.dtype != DType::kF8E4M3) return WrongDType(name, w, Cat("F8_E4M3 or a float type under ", how));
        if (w.shape != std::vector<int64_t>{out, in}) return WrongShape(name, w, {out, in}, why);
        if (q.method == QuantMethod::kFp8Tensor) {
          CR_RETURN_IF_ERROR(Scalar(module + ".weight_scale", true, "ModelOpt FP8: one fp32 scale per tensor"));
          return Scalar(module + ".input_scale", false, "ModelOpt FP8: one fp32 input scale per tensor");
        }
        const int64_t br = q.weight_block_size[0], bc = q.weight_block_size[1];
        const std::vector<int64_t> grid = {(out + br - 1) / br, (in + bc - 1) / bc};
        const std::string gwhy = Cat("one fp32 scale per ", br, "x", bc, " block of ", ShapeText({out, in}));
        if (q.quant_algo != "fp8_pb_wo") return Scale(module + ".weight_scale_inv", {DType::kF32}, grid, gwhy);
        // ModelOpt writes [rows/128, 1, cols/128, 1], squeezed to [] for one block.
        auto s = t_.find(module + ".weight_scale");
        if (s != t_.end() && s->second.dtype == DType::kF32 && Elements(s->second.shape) == grid[0] * grid[1] &&
            (s->second.shape == std::vector<int64_t>{grid[0], 1, grid[1], 1} ||
             (s->second.shape.empty() && grid[0] * grid[1] == 1))) {
          s->second.shape = grid;
        }
        return Scale(module + ".weight_scale", {DType::kF32}, grid, gwhy);
      }
      case QuantMethod::kNvfp4:
      case QuantMethod::kMxfp4: {
        const int64_t group = q.method == QuantMethod::kNvfp4 ? 16 : 32;
        if (w.dtype != DType::kU8) return WrongDType(name, w, Cat("U8 (packed e2m1) or a float type under ", how));
        if (in % group != 0) {
          return absl::DataLossError(Cat(where_, ": tensor '", name, "' is packed e2m1, but its input dimension ", in,
                                         " (", why, ") is not a multiple of the ", group, "-element scale group"));
        }
        if (w.shape != std::vector<int64_t>{out, in / 2}) {
          return WrongShape(name, w, {out, in / 2}, Cat(why, "; two e2m1 values per byte"));
        }
        if (q.method == QuantMethod::kMxfp4) {
          return Scale(module + ".weight_scale", {DType::kU8, DType::kF8E8M0}, {out, in / 32},
                       "one e8m0 scale per 32 columns");
        }
        CR_RETURN_IF_ERROR(
            Scale(module + ".weight_scale", {DType::kF8E4M3}, {out, in / 16}, "one e4m3 scale per 16 columns"));
        CR_RETURN_IF_ERROR(Scalar(module + ".weight_scale_2", true, "NVFP4: one fp32 global scale per tensor"));
        return Scalar(module + ".input_scale", false, "NVFP4: one fp32 input scale per tensor");
      }
      case QuantMethod::kNone: break;
    }
    return absl::OkStatus();
  }

  std::string BiasFlagHint(const std::string& module) const {
    if (EndsWith(module, "o_proj") && s_.attention_bias) return " (its q/k/v projections have biases; o_proj has none)";
    if (s_.model_type == "llama" && EndsWith(module, "_proj") && module.find(".mlp.") != std::string::npos) {
      return " (mlp_bias is false)";
    }
    if (module.find("self_attn") != std::string::npos) return " (attention_bias is false)";
    return "";
  }

  // Tensors nothing above claimed.
  absl::Status Leftovers() {
    std::vector<std::string> mtp, other;
    for (auto it = t_.begin(); it != t_.end();) {
      const std::string& name = it->first;
      if (claimed_.count(name)) {
        ++it;
        continue;
      }
      const int64_t layer = LayerOf(name);
      if (layer >= s_.layers) {
        if (layer >= s_.layers + c_.num_nextn_predict_layers) {
          return absl::DataLossError(Cat(where_, ": tensor '", name, "' belongs to layer ", layer,
                                         ", but config.json has num_hidden_layers ", s_.layers,
                                         c_.num_nextn_predict_layers > 0
                                             ? Cat(" (+ ", c_.num_nextn_predict_layers, " MTP layers)")
                                             : std::string()));
        }
        mtp.push_back(name);
      } else {
        other.push_back(name);
      }
      it = t_.erase(it);
    }
    if (!mtp.empty()) {
      notes.push_back(Cat("ignoring ", mtp.size(), " tensors of the multi-token-prediction layer(s) after layer ",
                          s_.layers - 1, " (num_nextn_predict_layers ", c_.num_nextn_predict_layers,
                          "), as transformers does"));
    }
    if (!other.empty()) {
      std::string list;
      for (size_t i = 0; i < other.size() && i < 4; ++i) list += Cat(i ? ", " : "", other[i]);
      if (other.size() > 4) list += Cat(", ... (", other.size() - 4, " more)");
      notes.push_back(Cat("ignoring ", other.size(),
                          " tensor(s) the config does not imply and the engine does not "
                          "read, as transformers does: ",
                          list));
    }
    return absl::OkStatus();
  }

  const ModelConfig& c_;
  const ModelSpec& s_;
  const std::string& where_;
  TensorSet& t_;
  std::set<std::string> claimed_;
};

}  // namespace

absl::Status CheckWeights(const ModelConfig& config, const ModelSpec& spec, const std::string& where,
                          TensorSet* tensors, std::vector<std::string>* notes) {
  Checker c(config, spec, where, tensors);
  CR_RETURN_IF_ERROR(c.Run());
  notes->insert(notes->end(), c.notes.begin(), c.notes.end());
  return absl::OkStatus();
}

}  // namespace crashreplay::replay
