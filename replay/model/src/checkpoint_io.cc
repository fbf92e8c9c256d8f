#include "crashreplay/replay/model/checkpoint_io.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "crashreplay/base/status.h"
#include "crashreplay/base/text.h"
#include "crashreplay/formats/checkpoint.h"
#include "crashreplay/formats/safetensors_writer.h"
#include "crashreplay/replay/kernels/router.h"
#include "crashreplay/replay/model/weight_check.h"

namespace crashreplay::replay {
namespace {

using text::Cat;

RopeSpec ToRopeSpec(const RopeConfig& r) {
  RopeSpec o;
  o.type = std::string(RopeTypeName(r.type));
  o.theta = r.theta;
  o.factor = r.factor;
  o.low_freq_factor = r.low_freq_factor;
  o.high_freq_factor = r.high_freq_factor;
  if (r.original_max_position_embeddings > 0) o.original_max_position = r.original_max_position_embeddings;
  o.beta_fast = r.beta_fast;
  o.beta_slow = r.beta_slow;
  o.mscale = r.mscale;
  o.mscale_all_dim = r.mscale_all_dim;
  o.attention_factor = r.attention_factor;
  o.truncate = r.truncate;
  return o;
}

RopeConfig ToRopeConfig(const RopeSpec& r, RopeForm form, double partial) {
  RopeConfig c;
  c.form = form;
  c.type = r.type == "linear"   ? RopeType::kLinear
           : r.type == "llama3" ? RopeType::kLlama3
           : r.type == "yarn"   ? RopeType::kYarn
                                : RopeType::kDefault;
  c.theta = r.theta;
  c.factor = r.factor;
  c.low_freq_factor = r.low_freq_factor;
  c.high_freq_factor = r.high_freq_factor;
  c.original_max_position_embeddings = r.type == "default" || r.type == "linear" ? 0 : r.original_max_position;
  c.beta_fast = r.beta_fast;
  c.beta_slow = r.beta_slow;
  c.mscale = r.mscale;
  c.mscale_all_dim = r.mscale_all_dim;
  c.attention_factor = r.attention_factor;
  c.truncate = r.truncate;
  c.partial_rotary_factor = partial;
  c.scaling_object = form == RopeForm::kLegacy && c.type != RopeType::kDefault;
  return c;
}

absl::Status CheckRopeImplemented(const ModelConfig& c) {
  for (const RopeConfig* r :
       {&c.rope, c.rope_parameters ? &*c.rope_parameters : nullptr, c.rope_legacy ? &*c.rope_legacy : nullptr}) {
    if (r == nullptr) continue;
    if (r->type != RopeType::kDefault && r->type != RopeType::kLinear && r->type != RopeType::kLlama3 &&
        r->type != RopeType::kYarn) {
      return UnsupportedModelError(Cat(c.source, ": RoPE type '", RopeTypeName(r->type),
                                       "' is not implemented (default, linear, llama3, yarn)"));
    }
  }
  return absl::OkStatus();
}

std::string Shape(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += Cat(i ? ", " : "", v[i]);
  return out + "]";
}

// gpt-oss's experts in OpenAI's MXFP4 layout, as the released checkpoints
// ship them and transformers' Mxfp4 integration reads them
// (convert_moe_packed_tensors): gate_up_proj_blocks [E, 2I, H/32, 16] and
// down_proj_blocks [E, H, I/32, 16] are [out, in] rows of packed e2m1 (the
// low nibble first), gate_up's even rows gate and odd rows up;
// *_scales [E, out, in/32] are e8m0 exponents (bias 127); the biases as in
// bf16 checkpoints. Each expert's rows are copied as they are into the
// engine's MXFP4 projections (weight U8 [out, in/2], weight_scale U8
// [out, in/32]): nothing is decoded here.
absl::Status SplitMxfp4Experts(const ModelSpec& s, const LayerNames& n, const std::string& where, TensorSet* t) {
  const int64_t E = s.num_experts, H = s.hidden, I = s.moe_intermediate;
  const std::string p = n.prefix + "mlp.experts.";
  if (H % 32 != 0 || I % 32 != 0) {
    return absl::DataLossError(Cat(where, ": '", p, "gate_up_proj_blocks' is MXFP4, but hidden_size ", H,
                                   " and intermediate_size ", I, " must be multiples of its 32-element blocks"));
  }
  struct Part {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    TensorBytes bytes;
  } parts[] = {{"gate_up_proj_blocks", DType::kU8, {E, 2 * I, H / 32, 16}, {}},
               {"gate_up_proj_scales", DType::kU8, {E, 2 * I, H / 32}, {}},
               {"down_proj_blocks", DType::kU8, {E, H, I / 32, 16}, {}},
               {"down_proj_scales", DType::kU8, {E, H, I / 32}, {}},
               {"gate_up_proj_bias", DType::kBF16, {E, 2 * I}, {}},
               {"down_proj_bias", DType::kBF16, {E, H}, {}}};
  DType bias_dtype = DType::kBF16;
  for (Part& x : parts) {
    const std::string name = p + x.name;
    auto it = t->find(name);
    if (it == t->end()) {
      return absl::NotFoundError(
          Cat(where, ": checkpoint has no tensor '", name, "', which gpt-oss's MXFP4 experts (OpenAI's layout) imply"));
    }
    const bool bias = x.dtype == DType::kBF16;
    const DType d = it->second.dtype;
    const bool scale_ok = x.name.ends_with("_scales") && d == DType::kF8E8M0;
    if (bias ? (d != DType::kBF16 && d != DType::kF16 && d != DType::kF32) : (d != DType::kU8 && !scale_ok)) {
      return absl::DataLossError(Cat(where, ": tensor '", name, "' has dtype ", DTypeName(d), "; expected ",
                                     bias ? "BF16, F16 or F32" : "U8"));
    }
    if (bias && x.name == "down_proj_bias" && d != bias_dtype) {
      return absl::DataLossError(Cat(where, ": '", name, "' is ", DTypeName(d), ", '", p, "gate_up_proj_bias' ",
                                     DTypeName(bias_dtype), "; expected one dtype"));
    }
    if (bias) bias_dtype = d;
    if (it->second.shape != x.shape) {
      return absl::DataLossError(Cat(where, ": tensor '", name, "' has shape ", Shape(it->second.shape),
                                     ", config.json (gpt_oss, MXFP4 experts) implies ", Shape(x.shape)));
    }
    CR_ASSIGN_OR_RETURN(x.bytes, it->second.bytes.Resolve());
    uint64_t elements = 1;
    for (int64_t v : x.shape) elements *= static_cast<uint64_t>(v);
    if (x.bytes.size() != DTypeBytes(d, elements)) {
      return absl::DataLossError(
          Cat(where, ": tensor '", name, "' has ", x.bytes.size(), " bytes for shape ", Shape(x.shape)));
    }
  }
  const size_t bs = bias_dtype == DType::kF32 ? 4 : 2;
  auto put = [&](const std::string& name, DType d, std::vector<int64_t> shape, std::vector<uint8_t> bytes) {
    HostTensor h;
    h.dtype = d;
    h.shape = std::move(shape);
    h.bytes = std::move(bytes);
    (*t)[name] = std::move(h);
  };
  // Row r of expert j of a [E, R, row_bytes] tensor.
  auto row = [](const TensorBytes& b, int64_t R, int64_t row_bytes, int64_t j, int64_t r) {
    return b.data() + (j * R + r) * row_bytes;
  };
  const int64_t gw = H / 2, gs = H / 32, dw = I / 2, ds = I / 32;
  for (int64_t j = 0; j < E; ++j) {
    auto base = [&](const char* proj) {
      const std::string w = n.expert(j, proj);
      return w.substr(0, w.size() - 7);
    };
    std::vector<uint8_t> gate(I * gw), up(I * gw), gsc(I * gs), usc(I * gs), gb(I * bs), ub(I * bs);
    for (int64_t i = 0; i < I; ++i) {
      std::memcpy(gate.data() + i * gw, row(parts[0].bytes, 2 * I, gw, j, 2 * i), gw);
      std::memcpy(up.data() + i * gw, row(parts[0].bytes, 2 * I, gw, j, 2 * i + 1), gw);
      std::memcpy(gsc.data() + i * gs, row(parts[1].bytes, 2 * I, gs, j, 2 * i), gs);
      std::memcpy(usc.data() + i * gs, row(parts[1].bytes, 2 * I, gs, j, 2 * i + 1), gs);
      std::memcpy(gb.data() + i * bs, row(parts[4].bytes, 1, 2 * I * bs, j, 0) + 2 * i * bs, bs);
      std::memcpy(ub.data() + i * bs, row(parts[4].bytes, 1, 2 * I * bs, j, 0) + (2 * i + 1) * bs, bs);
    }
    std::vector<uint8_t> down(row(parts[2].bytes, 1, H * dw, j, 0), row(parts[2].bytes, 1, H * dw, j, 0) + H * dw);
    std::vector<uint8_t> dsc(row(parts[3].bytes, 1, H * ds, j, 0), row(parts[3].bytes, 1, H * ds, j, 0) + H * ds);
    std::vector<uint8_t> db(row(parts[5].bytes, 1, H * bs, j, 0), row(parts[5].bytes, 1, H * bs, j, 0) + H * bs);
    put(base("gate") + ".weight", DType::kU8, {I, gw}, std::move(gate));
    put(base("up") + ".weight", DType::kU8, {I, gw}, std::move(up));
    put(base("down") + ".weight", DType::kU8, {H, dw}, std::move(down));
    put(base("gate") + ".weight_scale", DType::kU8, {I, gs}, std::move(gsc));
    put(base("up") + ".weight_scale", DType::kU8, {I, gs}, std::move(usc));
    put(base("down") + ".weight_scale", DType::kU8, {H, ds}, std::move(dsc));
    put(base("gate") + ".bias", bias_dtype, {I}, std::move(gb));
    put(base("up") + ".bias", bias_dtype, {I}, std::move(ub));
    put(base("down") + ".bias", bias_dtype, {H}, std::move(db));
  }
  for (const Part& x : parts) t->erase(p + x.name);
  return absl::OkStatus();
}

}  // namespace

absl::Status SplitFusedExperts(const ModelSpec& s, const std::string& where, TensorSet* t) {
  if (s.model_type != "gpt_oss" || !s.is_moe()) return absl::OkStatus();
  const int64_t E = s.num_experts, H = s.hidden, I = s.moe_intermediate;
  for (int64_t l = 0; l < s.layers; ++l) {
    const LayerNames n = NamesFor(s, l);
    const std::string p = n.prefix + "mlp.experts.";
    if (t->count(p + "gate_up_proj_blocks") || t->count(p + "down_proj_blocks")) {
      CR_RETURN_IF_ERROR(SplitMxfp4Experts(s, n, where, t));
      continue;
    }
    struct Fused {
      const char* name;
      std::vector<int64_t> shape;
      const HostTensor* t = nullptr;
      TensorBytes bytes;
    } f[] = {{"gate_up_proj", {E, H, 2 * I}, nullptr, {}},
             {"gate_up_proj_bias", {E, 2 * I}, nullptr, {}},
             {"down_proj", {E, I, H}, nullptr, {}},
             {"down_proj_bias", {E, H}, nullptr, {}}};
    for (Fused& x : f) {
      const std::string name = p + x.name;
      auto it = t->find(name);
      if (it == t->end()) {
        return absl::NotFoundError(Cat(where, ": checkpoint has no tensor '", name, "', which config.json (gpt_oss, ",
                                       E, " experts of intermediate_size ", I, ", hidden_size ", H, ") implies"));
      }
      const DType d = it->second.dtype;
      if (d != DType::kBF16 && d != DType::kF16 && d != DType::kF32) {
        return absl::DataLossError(Cat(where, ": tensor '", name, "' has dtype ", DTypeName(d),
                                       "; gpt_oss's experts are read as BF16, F16 or F32"));
      }
      if (it->second.shape != x.shape) {
        return absl::DataLossError(Cat(where, ": tensor '", name, "' has shape ", Shape(it->second.shape),
                                       ", config.json (gpt_oss) implies ", Shape(x.shape)));
      }
      if (f[0].t != nullptr && d != f[0].t->dtype) {
        return absl::DataLossError(Cat(where, ": tensor '", name, "' has dtype ", DTypeName(d), ", '", p,
                                       "gate_up_proj' has ", DTypeName(f[0].t->dtype), "; expected one dtype"));
      }
      x.t = &it->second;
      CR_ASSIGN_OR_RETURN(x.bytes, it->second.bytes.Resolve());
      if (x.bytes.size() !=
          DTypeBytes(d, static_cast<uint64_t>(E) * (x.shape.size() == 3 ? x.shape[1] * x.shape[2] : x.shape[1]))) {
        return absl::DataLossError(
            Cat(where, ": tensor '", name, "' has ", x.bytes.size(), " bytes for shape ", Shape(x.shape)));
      }
    }
    const DType d = f[0].t->dtype;
    const size_t es = d == DType::kF32 ? 4 : 2;
    // Element (j, r, c) of a fused [E, R, C] tensor -> `dst` element i.
    auto copy = [es](const TensorBytes& src, int64_t R, int64_t C, int64_t j, int64_t r, int64_t c, uint8_t* dst,
                     int64_t i) { std::memcpy(dst + i * es, src.data() + ((j * R + r) * C + c) * es, es); };
    auto put = [&](const std::string& name, std::vector<int64_t> shape, std::vector<uint8_t> bytes) {
      HostTensor h;
      h.dtype = f[0].t->dtype;
      h.shape = std::move(shape);
      h.bytes = std::move(bytes);
      (*t)[name] = std::move(h);
    };
    std::vector<std::vector<uint8_t>> out;
    for (int64_t j = 0; j < E; ++j) {
      // gate_up_proj[j] is [H, 2I] (x @ W): gate is its even columns, up its
      // odd ones; the engine's projections are [out, in].
      std::vector<uint8_t> gate(I * H * es), up(I * H * es), down(H * I * es), gb(I * es), ub(I * es), db(H * es);
      for (int64_t i = 0; i < I; ++i) {
        for (int64_t h = 0; h < H; ++h) {
          copy(f[0].bytes, H, 2 * I, j, h, 2 * i, gate.data(), i * H + h);
          copy(f[0].bytes, H, 2 * I, j, h, 2 * i + 1, up.data(), i * H + h);
        }
        copy(f[1].bytes, 1, 2 * I, j, 0, 2 * i, gb.data(), i);
        copy(f[1].bytes, 1, 2 * I, j, 0, 2 * i + 1, ub.data(), i);
      }
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t i = 0; i < I; ++i) copy(f[2].bytes, I, H, j, i, h, down.data(), h * I + i);
        copy(f[3].bytes, 1, H, j, 0, h, db.data(), h);
      }
      auto base = [&](const char* proj) {
        const std::string w = n.expert(j, proj);
        return w.substr(0, w.size() - 7);
      };
      put(base("gate") + ".weight", {I, H}, std::move(gate));
      put(base("up") + ".weight", {I, H}, std::move(up));
      put(base("down") + ".weight", {H, I}, std::move(down));
      put(base("gate") + ".bias", {I}, std::move(gb));
      put(base("up") + ".bias", {I}, std::move(ub));
      put(base("down") + ".bias", {H}, std::move(db));
    }
    for (const Fused& x : f) t->erase(p + x.name);
  }
  return absl::OkStatus();
}

absl::Status FuseExperts(const ModelSpec& s, TensorSet* t) {
  if (s.model_type != "gpt_oss" || !s.is_moe()) return absl::OkStatus();
  const int64_t E = s.num_experts, H = s.hidden, I = s.moe_intermediate;
  for (int64_t l = 0; l < s.layers; ++l) {
    const LayerNames n = NamesFor(s, l);
    const std::string p = n.prefix + "mlp.experts.";
    DType d = DType::kBF16;
    size_t es = 2;
    std::vector<uint8_t> gu, gub, dn, dnb;
    for (int64_t j = 0; j < E; ++j) {
      for (const char* proj : {"gate", "up", "down"}) {
        const std::string w = n.expert(j, proj);
        const std::string base = w.substr(0, w.size() - 7);
        for (const std::string& name : {w, base + ".bias"}) {
          auto it = t->find(name);
          if (it == t->end()) return absl::NotFoundError(Cat("no tensor '", name, "' to fuse"));
          if (it->second.bytes.deferred()) return absl::InvalidArgumentError(Cat("'", name, "' is not in memory"));
          if (j == 0 && name == w && std::string_view(proj) == "gate") {
            d = it->second.dtype;
            if (d != DType::kBF16 && d != DType::kF16 && d != DType::kF32) {
              return absl::UnimplementedError(
                  Cat("gpt_oss experts are written as BF16, F16 or F32, not ", DTypeName(d)));
            }
            es = d == DType::kF32 ? 4 : 2;
            gu.resize(E * H * 2 * I * es);
            gub.resize(E * 2 * I * es);
            dn.resize(E * I * H * es);
            dnb.resize(E * H * es);
          }
          if (it->second.dtype != d) return absl::InvalidArgumentError(Cat("'", name, "' has another dtype"));
        }
      }
      auto at = [&](const std::string& proj, const char* what) {
        const std::string w = n.expert(j, proj);
        return t->at(std::string(what) == "w" ? w : w.substr(0, w.size() - 7) + ".bias").bytes.data();
      };
      const uint8_t *g = at("gate", "w"), *u = at("up", "w"), *dw = at("down", "w");
      const uint8_t *gb = at("gate", "b"), *ub = at("up", "b"), *db = at("down", "b");
      for (int64_t i = 0; i < I; ++i) {
        for (int64_t h = 0; h < H; ++h) {
          std::memcpy(gu.data() + ((j * H + h) * 2 * I + 2 * i) * es, g + (i * H + h) * es, es);
          std::memcpy(gu.data() + ((j * H + h) * 2 * I + 2 * i + 1) * es, u + (i * H + h) * es, es);
          std::memcpy(dn.data() + ((j * I + i) * H + h) * es, dw + (h * I + i) * es, es);
        }
        std::memcpy(gub.data() + (j * 2 * I + 2 * i) * es, gb + i * es, es);
        std::memcpy(gub.data() + (j * 2 * I + 2 * i + 1) * es, ub + i * es, es);
      }
      std::memcpy(dnb.data() + j * H * es, db, H * es);
    }
    for (int64_t j = 0; j < E; ++j) {
      for (const char* proj : {"gate", "up", "down"}) {
        const std::string w = n.expert(j, proj);
        t->erase(w);
        t->erase(w.substr(0, w.size() - 7) + ".bias");
      }
    }
    auto put = [&](const char* name, std::vector<int64_t> shape, std::vector<uint8_t> bytes) {
      HostTensor h;
      h.dtype = d;
      h.shape = std::move(shape);
      h.bytes = std::move(bytes);
      (*t)[p + name] = std::move(h);
    };
    put("gate_up_proj", {E, H, 2 * I}, std::move(gu));
    put("gate_up_proj_bias", {E, 2 * I}, std::move(gub));
    put("down_proj", {E, I, H}, std::move(dn));
    put("down_proj_bias", {E, H}, std::move(dnb));
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelSpec> ModelSpecFromHfConfig(const ModelConfig& c) {
  ModelSpec s;
  s.model_type = c.model_type;
  if (c.shared_expert_intermediate_size > 0) {
    return UnsupportedModelError(Cat(c.source, ": qwen2_moe's gated shared expert (shared_expert_intermediate_size ",
                                     c.shared_expert_intermediate_size, ") is not implemented"));
  }
  // gpt_oss's experts use their clamped SwiGLU whatever hidden_act says.
  if (c.hidden_act != "silu" && c.model_type != "gpt_oss") {
    return UnsupportedModelError(Cat(c.source, ": hidden_act '", c.hidden_act, "' is not implemented (silu)"));
  }
  CR_RETURN_IF_ERROR(CheckRopeImplemented(c));
  s.hidden = c.hidden_size;
  s.layers = c.num_hidden_layers;
  s.heads = c.num_attention_heads;
  s.kv_heads = c.num_key_value_heads;
  s.head_dim = c.head_dim;
  s.intermediate = c.intermediate_size;
  s.vocab = c.vocab_size;
  s.rms_eps = c.rms_norm_eps;
  s.qk_norm = c.qk_norm;
  s.attention_bias = c.attention_bias;
  s.attention_out_bias = c.attention_out_bias;
  s.mlp_bias = c.mlp_bias;
  s.tie_embeddings = c.tie_word_embeddings;
  s.sliding_window = c.sliding_window;
  if (!c.layer_types.empty()) {
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) s.layer_window.push_back(c.LayerWindow(static_cast<int>(l)));
  }
  s.attention_sinks = c.attention_sinks;
  s.partial_rotary_factor = c.rope.partial_rotary_factor;
  if (c.max_position_embeddings > 0) s.max_position = c.max_position_embeddings;
  if (c.rope_parameters) s.rope_parameters = ToRopeSpec(*c.rope_parameters);
  if (c.rope_legacy) {
    s.rope_legacy = ToRopeSpec(*c.rope_legacy);
    s.rope_scaling_wins = c.rope_legacy->scaling_object;
  }
  if (!c.rope_parameters && !c.rope_legacy) s.rope_legacy = ToRopeSpec(c.rope);  // no RoPE key: the defaults
  if (c.UsesMla()) {
    if (c.attention_bias) {
      return UnsupportedModelError(Cat(c.source, ": ", c.model_type,
                                       " with attention_bias true (biases on MLA's q_a/kv_a/o projections) is not "
                                       "implemented; released DeepSeek and GLM MLA models have none"));
    }
    MlaSpec& m = s.mla;
    m.q_lora_rank = c.q_lora_rank;
    m.kv_lora_rank = c.kv_lora_rank;
    m.qk_nope_head_dim = c.qk_nope_head_dim;
    m.qk_rope_head_dim = c.qk_rope_head_dim;
    m.v_head_dim = c.v_head_dim;
    m.rope_interleave = c.rope_interleave;
    // Every head reads the one shared latent; transformers' head_dim is the
    // rope part, which is what RoPE's frequencies are computed over.
    s.kv_heads = s.heads;
    s.head_dim = c.qk_rope_head_dim;
    if (c.UsesDsa()) {
      m.index_n_heads = c.index_n_heads;
      m.index_head_dim = c.index_head_dim;
      m.index_topk = c.index_topk;
      // DeepSeek-V3.2's indexer rotates half-split, GLM-5's interleaved
      // (transformers' DeepseekV32Indexer / GlmMoeDsaIndexer).
      m.index_rope_interleave = c.model_type == "glm_moe_dsa";
      if (!c.indexer_types.empty()) {
        for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
          m.index_full_layers.push_back(c.IsIndexerLayer(static_cast<int>(l)) ? 1 : 0);
        }
      }
    }
  }
  if (c.IsMoe()) {
    s.num_experts = c.num_experts;
    s.experts_per_tok = c.num_experts_per_tok;
    s.moe_intermediate = c.model_type == "mixtral" ? c.intermediate_size : c.moe_intermediate_size;
    s.n_shared_experts = c.n_shared_experts;
    s.scoring = c.scoring_func;
    s.n_group = c.n_group;
    s.topk_group = c.topk_group;
    s.routed_scaling_factor = c.routed_scaling_factor;
    // Mixtral's router always renormalises over the chosen k.
    s.norm_topk_prob = c.model_type == "mixtral" ? true : c.norm_topk_prob;
    s.first_k_dense = c.first_k_dense_replace;
    s.softmax_after_topk = c.softmax_after_topk;
    s.moe_bias = c.moe_bias;
    s.swiglu_alpha = c.swiglu_alpha;
    s.swiglu_limit = c.swiglu_limit;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) s.moe_layer_mask.push_back(c.IsMoeLayer(static_cast<int>(l)));
    if (s.experts_per_tok > kMaxTopK || s.num_experts > kMaxExperts || s.n_group > 4 * kMaxTopK) {
      return UnsupportedModelError(Cat(c.source, ": MoE routing beyond the kernels' limits (top-k <= ", kMaxTopK,
                                       ", experts <= ", kMaxExperts, ")"));
    }
  }
  s.quant_weight_only = c.quant.WeightOnly();
  switch (c.quant.method) {
    case QuantMethod::kNone: s.quant = QuantKind::kNone; break;
    case QuantMethod::kFp8Block:
      s.quant = QuantKind::kFp8Block;
      s.quant_block_rows = c.quant.weight_block_size.size() == 2 ? c.quant.weight_block_size[0] : 128;
      s.quant_block_cols = c.quant.weight_block_size.size() == 2 ? c.quant.weight_block_size[1] : 128;
      break;
    case QuantMethod::kFp8Tensor: s.quant = QuantKind::kFp8Tensor; break;
    case QuantMethod::kNvfp4:
      s.quant = QuantKind::kNvfp4;
      s.quant_block_cols = c.quant.group_size > 0 ? c.quant.group_size : 16;
      break;
    case QuantMethod::kMxfp4:
      s.quant = QuantKind::kMxfp4;
      s.quant_block_cols = 32;
      break;
  }
  return s;
}

ModelConfig HfConfigFromModelSpec(const ModelSpec& s) {
  ModelConfig c;
  c.model_type = s.model_type;
  static const std::map<std::string, std::string> kArch = {{"llama", "LlamaForCausalLM"},
                                                           {"mistral", "MistralForCausalLM"},
                                                           {"qwen2", "Qwen2ForCausalLM"},
                                                           {"qwen3", "Qwen3ForCausalLM"},
                                                           {"mixtral", "MixtralForCausalLM"},
                                                           {"qwen3_moe", "Qwen3MoeForCausalLM"},
                                                           {"glm4_moe", "Glm4MoeForCausalLM"},
                                                           {"deepseek_v3", "DeepseekV3ForCausalLM"},
                                                           {"deepseek_v32", "DeepseekV32ForCausalLM"},
                                                           {"glm_moe_dsa", "GlmMoeDsaForCausalLM"},
                                                           {"gpt_oss", "GptOssForCausalLM"}};
  if (kArch.count(s.model_type)) c.architectures = {kArch.at(s.model_type)};
  c.hidden_size = s.hidden;
  c.intermediate_size = s.intermediate;
  c.num_hidden_layers = s.layers;
  c.num_attention_heads = s.heads;
  c.num_key_value_heads = s.kv_heads;
  c.head_dim = s.head_dim;
  c.vocab_size = s.vocab;
  c.max_position_embeddings = s.max_position;
  c.rms_norm_eps = s.rms_eps;
  c.tie_word_embeddings = s.tie_embeddings;
  c.attention_bias = s.attention_bias;
  c.attention_out_bias = s.attention_out_bias;
  c.mlp_bias = s.mlp_bias;
  c.qk_norm = s.qk_norm;
  c.sliding_window = s.sliding_window;
  if (!s.layer_window.empty()) {
    for (int64_t w : s.layer_window) c.layer_types.push_back(w > 0 ? "sliding_attention" : "full_attention");
  }
  c.attention_sinks = s.attention_sinks;
  c.torch_dtype = "bfloat16";
  if (s.mla.enabled()) {
    const MlaSpec& m = s.mla;
    c.q_lora_rank = m.q_lora_rank;
    c.kv_lora_rank = m.kv_lora_rank;
    c.qk_nope_head_dim = m.qk_nope_head_dim;
    c.qk_rope_head_dim = m.qk_rope_head_dim;
    c.v_head_dim = m.v_head_dim;
    c.rope_interleave = m.rope_interleave;
    c.head_dim = m.qk_head_dim();
    if (m.dsa()) {
      c.index_n_heads = m.index_n_heads;
      c.index_head_dim = m.index_head_dim;
      c.index_topk = m.index_topk;
      for (uint8_t full : m.index_full_layers) c.indexer_types.push_back(full ? "full" : "shared");
    }
  }
  if (s.rope_parameters)
    c.rope_parameters = ToRopeConfig(*s.rope_parameters, RopeForm::kRopeParameters, s.partial_rotary_factor);
  if (s.rope_legacy) {
    c.rope_legacy = ToRopeConfig(*s.rope_legacy, RopeForm::kLegacy, s.partial_rotary_factor);
    c.rope_legacy->scaling_object = c.rope_legacy->scaling_object || s.rope_scaling_wins;
  }
  c.rope = c.rope_legacy && (c.rope_legacy->scaling_object || !c.rope_parameters) ? *c.rope_legacy
           : c.rope_parameters                                                    ? *c.rope_parameters
                               : ToRopeConfig(RopeSpec{}, RopeForm::kNone, s.partial_rotary_factor);
  if (s.is_moe()) {
    c.num_experts = s.num_experts;
    c.num_experts_per_tok = s.experts_per_tok;
    c.moe_intermediate_size = s.model_type == "mixtral" ? 0 : s.moe_intermediate;
    c.n_shared_experts = s.n_shared_experts;
    c.norm_topk_prob = s.norm_topk_prob;
    c.scoring_func = s.scoring;
    c.topk_method = s.scoring == "sigmoid" ? "noaux_tc" : "greedy";
    c.n_group = s.n_group;
    c.topk_group = s.topk_group;
    c.routed_scaling_factor = s.routed_scaling_factor;
    c.first_k_dense_replace = s.first_k_dense;
    c.softmax_after_topk = s.softmax_after_topk;
    c.moe_bias = s.moe_bias;
    c.swiglu_alpha = s.swiglu_alpha;
    c.swiglu_limit = s.swiglu_limit;
  }
  switch (s.quant) {
    case QuantKind::kNone: break;
    case QuantKind::kFp8Block:
      c.quant.method = QuantMethod::kFp8Block;
      c.quant.weight_block_size = {s.quant_block_rows, s.quant_block_cols};
      c.quant.fmt = "e4m3";
      c.quant.activation_scheme = "dynamic";
      if (s.quant_weight_only) {
        c.quant.quant_algo = "fp8_pb_wo";
        c.quant.ignore = {"lm_head", "model.embed_tokens"};
      }
      break;
    case QuantKind::kFp8Tensor:
      c.quant.method = QuantMethod::kFp8Tensor;
      c.quant.quant_algo = "FP8";
      c.quant.fmt = "e4m3";
      c.quant.activation_scheme = "static";
      c.quant.ignore = {"lm_head", "model.embed_tokens"};
      break;
    case QuantKind::kNvfp4:
      c.quant.method = QuantMethod::kNvfp4;
      c.quant.quant_algo = s.quant_weight_only ? "W4A16_NVFP4" : "NVFP4";
      c.quant.group_size = s.quant_block_cols;
      c.quant.ignore = {"lm_head", "model.layers.*.mlp.gate"};
      break;
    case QuantKind::kMxfp4:
      c.quant.method = QuantMethod::kMxfp4;
      c.quant.group_size = 32;
      c.quant.ignore = {"lm_head", "model.layers.*.mlp.gate"};
      break;
  }
  if (!s.quant_ignore.empty()) c.quant.ignore = s.quant_ignore;
  return c;
}

namespace {

// A tensor of a deferred checkpoint: mapped on its own when read.
class MappedTensorSource final : public TensorSource {
 public:
  MappedTensorSource(std::shared_ptr<const Checkpoint> ck, std::string name)
      : ck_(std::move(ck)), name_(std::move(name)) {}
  absl::StatusOr<TensorBytes> Read() const override {
    CR_ASSIGN_OR_RETURN(std::shared_ptr<const TensorMapping> m, ck_->MapTensor(name_));
    const std::span<const std::byte> b = m->bytes();
    return TensorBytes::View({reinterpret_cast<const uint8_t*>(b.data()), b.size()}, std::move(m));
  }

 private:
  std::shared_ptr<const Checkpoint> ck_;
  std::string name_;
};

}  // namespace

absl::StatusOr<uint64_t> CheckpointFileBytes(const std::string& dir) {
  CR_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ck, Checkpoint::Open(dir, Checkpoint::Mode::kDeferred));
  return ck->file_bytes();
}

absl::StatusOr<LoadedCheckpoint> LoadCheckpointDir(const std::string& dir, LoadOptions options) {
  CR_ASSIGN_OR_RETURN(
      std::unique_ptr<Checkpoint> opened,
      Checkpoint::Open(dir, options.deferred ? Checkpoint::Mode::kDeferred : Checkpoint::Mode::kMapped));
  // The tensors view the mapped shards; the last of them to go unmaps them.
  const std::shared_ptr<const Checkpoint> ck = std::move(opened);
  if (ck->config_path().empty()) return absl::NotFoundError(Cat(dir, ": no config.json"));
  LoadedCheckpoint out;
  CR_ASSIGN_OR_RETURN(out.config, LoadHfConfig(ck->config_path()));
  CR_ASSIGN_OR_RETURN(out.spec, ModelSpecFromHfConfig(out.config));
  out.deferred = options.deferred;
  for (const std::string& name : ck->names()) {
    const CheckpointTensor* t = ck->Find(name);
    HostTensor h;
    h.dtype = t->info->dtype;
    h.shape = t->info->shape;
    if (options.deferred) {
      h.bytes = TensorBytes::Deferred(t->info->byte_size, std::make_shared<MappedTensorSource>(ck, name));
    } else {
      CR_ASSIGN_OR_RETURN(std::span<const std::byte> data, ck->Data(name));
      h.bytes = TensorBytes::View({reinterpret_cast<const uint8_t*>(data.data()), data.size()}, ck);
    }
    out.tensors.emplace(name, std::move(h));
  }
  CR_RETURN_IF_ERROR(SplitFusedExperts(out.spec, dir, &out.tensors));
  CR_RETURN_IF_ERROR(CheckWeights(out.config, out.spec, dir, &out.tensors, &out.notes));
  if (out.spec.sliding_window > 0 && out.spec.layer_window.empty()) {
    out.notes.push_back(Cat("config.json sets sliding_window ", out.spec.sliding_window,
                            "; the engine attends over the whole context, which is the same only while every "
                            "sequence stays within ",
                            out.spec.sliding_window, " tokens"));
  }
  if (out.spec.quant == QuantKind::kFp8Tensor) {
    out.notes.push_back(
        "ModelOpt FP8 (per-tensor): the engine multiplies by the fp8 weights with unquantized "
        "activations (W8A16); input_scale is read and hashed but not applied, whereas serving "
        "engines quantize activations to fp8 with it (W8A8)");
  }
  return out;
}

absl::Status WriteCheckpointDir(const std::string& dir, const ModelSpec& spec, const TensorSet& tensors,
                                uint64_t max_shard_bytes) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::FailedPreconditionError(Cat("cannot create ", dir, ": ", ec.message()));
  // gpt_oss's experts are written fused, as transformers saves them.
  TensorSet fused;
  const TensorSet* out = &tensors;
  if (spec.model_type == "gpt_oss" && spec.is_moe() && tensors.count(NamesFor(spec, 0).expert(0, "gate"))) {
    fused = tensors;
    CR_RETURN_IF_ERROR(FuseExperts(spec, &fused));
    out = &fused;
  }
  SafetensorsWriter w;
  w.SetMetadata("format", "pt");
  for (const auto& [name, t] : *out) {
    CR_RETURN_IF_ERROR(
        w.Add(name, t.dtype, t.shape,
              std::span<const std::byte>(reinterpret_cast<const std::byte*>(t.bytes.data()), t.bytes.size())));
  }
  CR_RETURN_IF_ERROR(w.WriteSharded(dir, max_shard_bytes));
  return WriteFileAtomically(dir + "/config.json", HfConfigToJson(HfConfigFromModelSpec(spec)));
}

}  // namespace crashreplay::replay
