#include "crashreplay/replay/random_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <thread>

#include "crashreplay/base/status.h"
#include "crashreplay/formats/block_quant.h"
#include "crashreplay/formats/hf_config.h"
#include "crashreplay/formats/numeric.h"
#include "crashreplay/replay/kernels/elementwise.h"
#include "crashreplay/replay/kernels/router.h"
#include "crashreplay/replay/kernels/sampling.h"
#include "crashreplay/replay/cpu_pool.h"
#include "crashreplay/replay/model.h"
#include "crashreplay/replay/step.h"
#include "text_util.h"

namespace crashreplay::replay {
namespace {

using text::Cat;

int MakeModelThreads(const MakeModelOptions& o) {
  if (o.threads > 0) return o.threads;
  const unsigned hw = std::thread::hardware_concurrency();
  return static_cast<int>(std::clamp(hw, 1u, 256u));
}

// The k-th normal draw of the stream `seed` (Box-Muller on counters 2k and
// 2k + 1): a pure function of (seed, k), so any slice of a tensor can be drawn
// on any thread and the bytes never depend on the thread count.
float NormalAt(uint64_t seed, uint64_t k) {
  const uint64_t c = 2 * k;
  const double u1 = (static_cast<double>(SplitMix64(seed ^ SplitMix64(c)) >> 11) + 1.0) * 0x1.0p-53;
  const double u2 = static_cast<double>(SplitMix64(seed ^ SplitMix64(c + 1)) >> 11) * 0x1.0p-53;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

// The stream of draws, handed out in order: each tensor takes the next
// `count` indices, exactly as drawing them one by one would.
class Normal {
 public:
  explicit Normal(uint64_t seed) : seed_(seed) {}
  uint64_t seed() const { return seed_; }
  // Reserves `count` draws; returns the first index.
  uint64_t Take(int64_t count) {
    const uint64_t first = next_;
    next_ += static_cast<uint64_t>(count);
    return first;
  }
  float Next() { return NormalAt(seed_, next_++); }

 private:
  uint64_t seed_;
  uint64_t next_ = 0;
};

template <typename T>
HostTensor Make(DType dt, std::vector<int64_t> shape, const std::vector<T>& v) {
  HostTensor t;
  t.dtype = dt;
  t.shape = std::move(shape);
  t.bytes.resize(v.size() * sizeof(T));
  std::memcpy(t.bytes.mutable_data(), v.data(), t.bytes.size());
  return t;
}

HostTensor Bf16(std::vector<int64_t> shape, const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = FloatToBf16(v[i]);
  return Make(DType::kBF16, std::move(shape), b);
}

HostTensor Empty(DType dt, std::vector<int64_t> shape, size_t bytes) {
  HostTensor t;
  t.dtype = dt;
  t.shape = std::move(shape);
  t.bytes.resize(bytes);
  return t;
}

// Rows [r0, r1) of a matrix's slices, run on the pool: chunks of
// `align`-row multiples (FP8 blocks are 128 rows), at least ~256K elements.
void ForRowChunks(CpuPool& pool, int64_t rows, int64_t cols, int64_t align,
                  const std::function<void(int64_t, int64_t)>& fn) {
  int64_t chunk = std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(cols, 1));
  chunk = (chunk + align - 1) / align * align;
  const int64_t n = (rows + chunk - 1) / chunk;
  pool.Launch(n, [&](int64_t i, KernelStatus*) { fn(i * chunk, std::min(rows, (i + 1) * chunk)); });
}

class Generator {
 public:
  Generator(const MakeModelOptions& o, ModelSpec spec, CpuPool* pool)
      : o_(o), spec_(std::move(spec)), rng_(o.seed), pool_(pool) {}

  // out x in weights of std 1/sqrt(in), drawn on the pool.
  std::vector<float> Matrix(int64_t out, int64_t in) {
    std::vector<float> w(out * in);
    const float s = 1.0f / std::sqrt(static_cast<float>(in));
    const uint64_t first = rng_.Take(out * in), seed = rng_.seed();
    ForRowChunks(*pool_, out, in, 1, [&](int64_t r0, int64_t r1) {
      for (int64_t i = r0 * in; i < r1 * in; ++i) w[i] = NormalAt(seed, first + static_cast<uint64_t>(i)) * s;
    });
    return w;
  }
  std::vector<float> Norm(int64_t n) {
    std::vector<float> w(n);
    for (auto& x : w) x = 1.0f + 0.1f * rng_.Next();
    return w;
  }

  // Whether the checkpoint quantizes module `base` (the ignore list, and
  // DeepSeek's bf16 indexer weights_proj in FP8 checkpoints).
  bool Quantized(const std::string& base) const {
    if (spec_.quant == QuantKind::kFp8Block) return base.find("indexer.weights_proj") == std::string::npos;
    QuantConfig q;
    q.method = QuantMethod::kNvfp4;
    q.ignore = spec_.quant_ignore;
    return q.IsQuantized(base);
  }

  // Adds `name` (+ its scale tensors) quantized as the checkpoint's linear
  // layers are, each row chunk on the pool (rows are independent; FP8 chunks
  // hold whole 128-row blocks, NVFP4's global scale is the amax over all).
  void Linear(const std::string& name, int64_t out, int64_t in) {
    const std::vector<float> w = Matrix(out, in);
    const std::string base = name.substr(0, name.size() - std::string(".weight").size());
    CpuPool& pool = *pool_;
    switch (Quantized(base) ? spec_.quant : QuantKind::kNone) {
      case QuantKind::kNone: {
        HostTensor t = Empty(DType::kBF16, {out, in}, w.size() * 2);
        uint8_t* dst = t.bytes.mutable_data();
        ForRowChunks(pool, out, in, 1, [&](int64_t r0, int64_t r1) {
          for (int64_t i = r0 * in; i < r1 * in; ++i) {
            const uint16_t h = FloatToBf16(w[i]);
            std::memcpy(dst + 2 * i, &h, 2);
          }
        });
        Add(name, std::move(t));
        return;
      }
      case QuantKind::kFp8Block: {
        const int64_t br = 128, bc = 128, sr = (out + br - 1) / br, sc = (in + bc - 1) / bc;
        std::vector<float> scale(sr * sc);
        std::vector<uint8_t> q(out * in);
        ForRowChunks(pool, out, in, br, [&](int64_t r0, int64_t r1) {
          std::vector<float> amax(sc);
          for (int64_t rb = r0 / br; rb * br < r1; ++rb) {
            std::fill(amax.begin(), amax.end(), 0.0f);
            const int64_t e = std::min(out, (rb + 1) * br);
            for (int64_t r = rb * br; r < e; ++r)
              for (int64_t c = 0; c < in; ++c) amax[c / bc] = AbsMaxAccumulate(amax[c / bc], w[r * in + c]);
            for (int64_t b = 0; b < sc; ++b) scale[rb * sc + b] = Fp8BlockScale(amax[b], 1e-12f, false);
            for (int64_t r = rb * br; r < e; ++r)
              for (int64_t c = 0; c < in; ++c) q[r * in + c] = QuantFp8(w[r * in + c], scale[rb * sc + c / bc]);
          }
        });
        Add(name, Make(DType::kF8E4M3, {out, in}, q));
        Add(base + ".weight_scale_inv", Make(DType::kF32, {sr, sc}, scale));
        return;
      }
      case QuantKind::kFp8Tensor: {  // ModelOpt FP8: one scale, amax / 448
        float amax = 0.0f;
        for (float v : w) amax = AbsMaxAccumulate(amax, v);
        const float scale = Fp8BlockScale(amax, 1e-12f, false);
        std::vector<uint8_t> q(out * in);
        ForRowChunks(pool, out, in, 1, [&](int64_t r0, int64_t r1) {
          for (int64_t i = r0 * in; i < r1 * in; ++i) q[i] = QuantFp8(w[i], scale);
        });
        Add(name, Make(DType::kF8E4M3, {out, in}, q));
        Add(base + ".weight_scale", Make(DType::kF32, {}, std::vector<float>{scale}));
        return;
      }
      case QuantKind::kNvfp4: {
        const float global = Nvfp4GlobalScale(w);
        std::vector<uint8_t> scales(out * (in / 16)), packed(out * in / 2, 0);
        ForRowChunks(pool, out, in, 1, [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r)
            for (int64_t b = 0; b < in / 16; ++b) {
              float bmax = 0.0f;
              for (int64_t c = b * 16; c < b * 16 + 16; ++c) bmax = AbsMaxAccumulate(bmax, w[r * in + c]);
              const uint8_t s8 = Nvfp4BlockScale(bmax, global);
              scales[r * (in / 16) + b] = s8;
              for (int64_t c = b * 16; c < b * 16 + 16; ++c)
                SetNibble(packed.data(), r * in + c, QuantNvfp4(w[r * in + c], s8, global));
            }
        });
        Add(name, Make(DType::kU8, {out, in / 2}, packed));
        Add(base + ".weight_scale", Make(DType::kF8E4M3, {out, in / 16}, scales));
        Add(base + ".weight_scale_2", Make(DType::kF32, {}, std::vector<float>{global}));
        // Placeholder until CalibrateInputScales measures the input's amax.
        Add(base + ".input_scale", Make(DType::kF32, {}, std::vector<float>{1.0f}));
        return;
      }
      case QuantKind::kMxfp4: {
        std::vector<uint8_t> scales(out * (in / 32)), packed(out * in / 2, 0);
        ForRowChunks(pool, out, in, 1, [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r)
            for (int64_t b = 0; b < in / 32; ++b) {
              float bmax = 0.0f;
              for (int64_t c = b * 32; c < b * 32 + 32; ++c) bmax = AbsMaxAccumulate(bmax, w[r * in + c]);
              const uint8_t s8 = Mxfp4BlockScale(bmax);
              scales[r * (in / 32) + b] = s8;
              for (int64_t c = b * 32; c < b * 32 + 32; ++c)
                SetNibble(packed.data(), r * in + c, QuantMxfp4(w[r * in + c], s8));
            }
        });
        Add(name, Make(DType::kU8, {out, in / 2}, packed));
        Add(base + ".weight_scale", Make(DType::kU8, {out, in / 32}, scales));
        return;
      }
    }
  }

  // MLA attention in transformers' names and layouts (DeepseekV3Attention,
  // DeepseekV32Indexer).
  void MlaAttention(const std::string& a, int64_t l) {
    const ModelSpec& s = spec_;
    const MlaSpec& m = s.mla;
    const int64_t H = s.hidden;
    if (m.q_lora_rank > 0) {
      Linear(a + "q_a_proj.weight", m.q_lora_rank, H);
      Add(a + "q_a_layernorm.weight", Bf16({m.q_lora_rank}, Norm(m.q_lora_rank)));
      Linear(a + "q_b_proj.weight", s.heads * m.qk_head_dim(), m.q_lora_rank);
    } else {
      Linear(a + "q_proj.weight", s.heads * m.qk_head_dim(), H);
    }
    Linear(a + "kv_a_proj_with_mqa.weight", m.kv_lora_rank + m.qk_rope_head_dim, H);
    Add(a + "kv_a_layernorm.weight", Bf16({m.kv_lora_rank}, Norm(m.kv_lora_rank)));
    Linear(a + "kv_b_proj.weight", s.heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank);
    Linear(a + "o_proj.weight", H, s.heads * m.v_head_dim);
    if (!m.layer_has_indexer(l)) return;
    Linear(a + "indexer.wq_b.weight", m.index_n_heads * m.index_head_dim, m.q_lora_rank);
    Linear(a + "indexer.wk.weight", m.index_head_dim, H);
    Linear(a + "indexer.weights_proj.weight", m.index_n_heads, H);
    Add(a + "indexer.k_norm.weight", Bf16({m.index_head_dim}, Norm(m.index_head_dim)));
    Bias(a + "indexer.k_norm.bias", m.index_head_dim);
  }

  void Bias(const std::string& name, int64_t n) {
    std::vector<float> b(n);
    for (auto& x : b) x = 0.1f * rng_.Next();
    Add(name, Bf16({n}, b));
  }

  // A bf16 matrix converted on the pool.
  HostTensor Bf16Matrix(int64_t out, int64_t in) {
    const std::vector<float> w = Matrix(out, in);
    HostTensor t = Empty(DType::kBF16, {out, in}, w.size() * 2);
    uint8_t* dst = t.bytes.mutable_data();
    ForRowChunks(*pool_, out, in, 1, [&](int64_t r0, int64_t r1) {
      for (int64_t i = r0 * in; i < r1 * in; ++i) {
        const uint16_t h = FloatToBf16(w[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
    });
    return t;
  }

  RandomCheckpoint Build() {
    const ModelSpec& s = spec_;
    const int64_t H = s.hidden, hd = s.head_dim;
    Report(0);
    Add("model.embed_tokens.weight", Bf16Matrix(s.vocab, H));
    for (int64_t l = 0; l < s.layers; ++l) {
      const LayerNames n = NamesFor(s, l);
      const std::string a = n.prefix + "self_attn.";
      Add(n.prefix + "input_layernorm.weight", Bf16({H}, Norm(H)));
      Add(n.prefix + "post_attention_layernorm.weight", Bf16({H}, Norm(H)));
      if (s.mla.enabled()) {
        MlaAttention(a, l);
      } else {
        Linear(a + "q_proj.weight", s.heads * hd, H);
        Linear(a + "k_proj.weight", s.kv_heads * hd, H);
        Linear(a + "v_proj.weight", s.kv_heads * hd, H);
        Linear(a + "o_proj.weight", H, s.heads * hd);
      }
      if (s.attention_bias && !s.mla.enabled()) {
        Bias(a + "q_proj.bias", s.heads * hd);
        Bias(a + "k_proj.bias", s.kv_heads * hd);
        Bias(a + "v_proj.bias", s.kv_heads * hd);
      }
      if (s.qk_norm) {
        Add(a + "q_norm.weight", Bf16({hd}, Norm(hd)));
        Add(a + "k_norm.weight", Bf16({hd}, Norm(hd)));
      }
      if (!s.layer_is_moe(l)) {
        Linear(n.prefix + "mlp.gate_proj.weight", s.intermediate, H);
        Linear(n.prefix + "mlp.up_proj.weight", s.intermediate, H);
        Linear(n.prefix + "mlp.down_proj.weight", H, s.intermediate);
        Report(l + 1);
        continue;
      }
      Add(n.router(), Bf16Matrix(s.num_experts, H));
      if (s.scoring == "sigmoid") {
        std::vector<float> bias(s.num_experts);
        for (auto& x : bias) x = 0.05f * rng_.Next();
        Add(n.bias(), Make(DType::kF32, {s.num_experts}, bias));
      }
      for (int64_t j = 0; j < s.num_experts; ++j) {
        Linear(n.expert(j, "gate"), s.moe_intermediate, H);
        Linear(n.expert(j, "up"), s.moe_intermediate, H);
        Linear(n.expert(j, "down"), H, s.moe_intermediate);
      }
      if (s.n_shared_experts > 0) {
        const int64_t si = s.moe_intermediate * s.n_shared_experts;
        Linear(n.shared("gate"), si, H);
        Linear(n.shared("up"), si, H);
        Linear(n.shared("down"), H, si);
      }
      Report(l + 1);
    }
    Add("model.norm.weight", Bf16({H}, Norm(H)));
    if (!s.tie_embeddings) Add("lm_head.weight", Bf16Matrix(s.vocab, H));
    Report(s.layers);
    return RandomCheckpoint{spec_, std::move(t_)};
  }

 private:
  void Add(const std::string& name, HostTensor t) {
    bytes_ += static_cast<int64_t>(t.bytes.size());
    t_[name] = std::move(t);
  }
  void Report(int64_t layers_done) {
    if (o_.progress) o_.progress("generating weights (layers)", layers_done, spec_.layers, bytes_);
  }

  MakeModelOptions o_;
  ModelSpec spec_;
  Normal rng_;
  CpuPool* pool_;
  TensorSet t_;
  int64_t bytes_ = 0;
};

float BufferAmax(const Buffer* b) {
  float m = 0.0f;
  for (float v : b->f) m = AbsMaxAccumulate(m, v);
  return m;
}

// amax of silu(gate x) * up x over every token of `x` ([tokens, hidden]), the
// input of the expert's down projection, computed with the engine's kernels
// on the w4a16 path: the gate and up projections run as LinearOps on the
// executor (its threads, the fast CPU kernels: the bits of LinearElement),
// then silu * up and the amax in token order.
absl::StatusOr<float> ExpertIntermediateAmax(Executor& exec, const ExpertShard& e, const float* x, int64_t tokens,
                                             int64_t hidden) {
  const int64_t mi = e.gate.w.rows;
  std::vector<float> g(tokens * mi), u(tokens * mi), a(mi);
  for (const auto& [shard, y] : {std::pair{&e.gate, &g}, std::pair{&e.up, &u}}) {
    LinearShardView view;
    view.w = shard->w;
    LinearOp op;
    op.shards = &view;
    op.dot = DotKind::kDequant;
    op.x = x;
    op.y = y->data();
    op.ranks = 1;
    op.tokens = tokens;
    op.rows = mi;
    op.cols = hidden;
    CR_RETURN_IF_ERROR(exec.Launch(op, LaunchTag{"calibration_expert", -1}));
  }
  float m = 0.0f;
  for (int64_t t = 0; t < tokens; ++t) {
    SiluMulRow(g.data() + t * mi, u.data() + t * mi, mi, a.data());
    for (float v : a) m = AbsMaxAccumulate(m, v);
  }
  return m;
}

// ModelOpt-style calibration of an NVFP4 checkpoint's activation scales: runs
// a calibration prompt through the model (fp4 weights, bf16 activations: the
// w4a16 path), takes the amax of every linear layer's input and writes
// input_scale = amax / (6 * 448), so that under w4a4 the calibrated amax maps
// to the largest e2m1 value times the largest e4m3 block scale. Layers that
// read the same activation (q/k/v, gate/up) get the same amax. Every expert
// is calibrated on every token (not only the ones routed to it), so no
// expert is left without a scale.
absl::Status CalibrateInputScales(const ModelSpec& spec, const MakeModelOptions& opts, TensorSet* tensors) {
  const uint64_t seed = opts.seed;
  EngineConfig cfg;
  cfg.nvfp4_activation = Nvfp4Activation::kW4a16;
  CR_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, BuildModel(spec, *tensors, cfg));
  StepInput in;
  in.rows.resize(1);
  StepRow& row = in.rows[0];
  row.tokens = CalibrationTokens(spec, seed);
  const int64_t n = static_cast<int64_t>(row.tokens.size());
  const int64_t pages = (n + cfg.page_size - 1) / cfg.page_size;
  for (int64_t p = 0; p < pages; ++p) row.page_table.push_back(static_cast<int32_t>(p));
  CR_ASSIGN_OR_RETURN(std::unique_ptr<Executor> exec,
                      MakeExecutor("cpu", ExecMode::kKernelByKernel, MakeModelThreads(opts)));
  CR_ASSIGN_OR_RETURN(std::unique_ptr<DeviceModel> dm, DeviceModel::Upload(*model, exec.get()));
  CR_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> kv, KvCache::Create(*model, cfg, pages, exec.get()));
  std::unique_ptr<StepProgram> program = StepProgram::Lower(*dm, cfg, kv.get(), in);
  StepProgram& prog = *program;
  const int64_t L = spec.layers, H = spec.hidden;
  std::vector<float> qkv(L, 0.0f), o(L, 0.0f), mlp_in(L, 0.0f), down(L, 0.0f), shared_down(L, 0.0f);
  std::vector<std::vector<float>> expert_down(L);
  const int64_t total = static_cast<int64_t>(prog.kernels().size());
  int64_t done = 0;
  for (const KernelCall& k : prog.kernels()) {
    if (opts.progress) opts.progress("calibrating input_scale (kernels)", done++, total, 0);
    if (prog.RunNext()) return absl::InternalError(Cat("make-model calibration failed in ", k.Label()));
    if (k.layer < 0) continue;
    const int64_t l = k.layer;
    // MLA's attention and the indexer stay bf16 in NVFP4 checkpoints (Generator::Quantized).
    if (k.name == "input_norm") qkv[l] = BufferAmax(prog.buffer("x"));
    if (k.name == "attention") o[l] = BufferAmax(prog.buffer("attn"));
    if (k.name == "silu_mul") down[l] = BufferAmax(prog.buffer("act"));
    if (k.name != "post_attention_norm") continue;
    const Buffer* x = prog.buffer("x");
    mlp_in[l] = BufferAmax(x);
    const RankLayer& rl = model->layers[l].ranks[0];
    for (const ExpertShard& e : rl.experts) {
      CR_ASSIGN_OR_RETURN(const float amax, ExpertIntermediateAmax(*exec, e, x->f.data(), n, H));
      expert_down[l].push_back(amax);
    }
    if (rl.has_shared) {
      CR_ASSIGN_OR_RETURN(shared_down[l], ExpertIntermediateAmax(*exec, rl.shared, x->f.data(), n, H));
    }
  }
  if (opts.progress) opts.progress("calibrating input_scale (kernels)", total, total, 0);
  auto set = [&](const std::string& base, float amax) {
    if (!tensors->count(base + ".weight_scale_2")) return;  // not NVFP4 (excluded, or MLA's attention)
    const float scale = std::max(amax, 1e-6f) / (kE2m1Max * kE4m3Max);
    (*tensors)[base + ".input_scale"] = Make(DType::kF32, {}, std::vector<float>{scale});
  };
  auto strip = [](const std::string& s) { return s.substr(0, s.size() - 7); };  // ".weight"
  for (int64_t l = 0; l < L; ++l) {
    const LayerNames nm = NamesFor(spec, l);
    const std::string a = nm.prefix + "self_attn.";
    for (const char* p : {"q_proj", "k_proj", "v_proj"}) set(a + p, qkv[l]);
    set(a + "o_proj", o[l]);
    if (!spec.layer_is_moe(l)) {
      set(nm.prefix + "mlp.gate_proj", mlp_in[l]);
      set(nm.prefix + "mlp.up_proj", mlp_in[l]);
      set(nm.prefix + "mlp.down_proj", down[l]);
      continue;
    }
    for (int64_t j = 0; j < spec.num_experts; ++j) {
      set(strip(nm.expert(j, "gate")), mlp_in[l]);
      set(strip(nm.expert(j, "up")), mlp_in[l]);
      set(strip(nm.expert(j, "down")), expert_down[l][j]);
    }
    if (spec.n_shared_experts > 0) {
      set(strip(nm.shared("gate")), mlp_in[l]);
      set(strip(nm.shared("up")), mlp_in[l]);
      set(strip(nm.shared("down")), shared_down[l]);
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<int32_t> CalibrationTokens(const ModelSpec& spec, uint64_t seed) {
  std::vector<int32_t> t;
  const int64_t n = std::min<int64_t>(64, spec.max_position);
  for (int64_t i = 0; i < n; ++i) {
    t.push_back(static_cast<int32_t>(SplitMix64(seed ^ SplitMix64(0xca11b0a7ULL + static_cast<uint64_t>(i))) %
                                     static_cast<uint64_t>(spec.vocab)));
  }
  return t;
}

absl::StatusOr<RandomCheckpoint> GenerateRandomCheckpoint(const MakeModelOptions& o) {
  ModelSpec s;
  s.hidden = o.hidden;
  s.layers = o.layers;
  s.heads = o.heads;
  s.kv_heads = o.kv_heads;
  s.head_dim = o.head_dim;
  s.intermediate = o.intermediate;
  s.vocab = o.vocab;
  s.rms_eps = 1e-6;
  s.max_position = 4096;
  RopeSpec rope;
  rope.theta = 10000.0;
  if (o.arch == "llama") {
    s.model_type = "llama";
    s.rms_eps = 1e-5;
    rope.theta = 500000.0;
    rope.type = "llama3";
    rope.factor = 8.0;
    rope.original_max_position = 64;  // small so the scaled band covers tiny head dims
  } else if (o.arch == "qwen3") {
    s.model_type = "qwen3";
    s.qk_norm = true;
    rope.theta = 1000000.0;
  } else if (o.arch == "qwen3_moe" || o.arch == "mixtral") {
    s.model_type = o.arch;
    s.qk_norm = o.arch == "qwen3_moe";
    s.num_experts = o.experts;
    s.experts_per_tok = o.experts_per_tok;
    s.moe_intermediate = o.arch == "mixtral" ? o.intermediate : o.moe_intermediate;
    s.norm_topk_prob = true;
    rope.theta = o.arch == "mixtral" ? 1000000.0 : 1000000.0;
  } else if (o.arch == "deepseek_v3" || o.arch == "deepseek_v32" || o.arch == "glm_moe_dsa") {
    // MLA (+ the DSA indexer for deepseek_v32 and glm_moe_dsa) with
    // DeepSeek-V3 routing: sigmoid scores, correction bias, grouped top-k,
    // one shared expert, a dense first layer.
    s.model_type = o.arch;
    s.kv_heads = s.heads;
    s.num_experts = o.experts;
    s.experts_per_tok = o.experts_per_tok;
    s.moe_intermediate = o.moe_intermediate;
    s.n_shared_experts = o.n_shared_experts;
    s.scoring = "sigmoid";
    s.n_group = o.arch == "glm_moe_dsa" ? 1 : o.n_group;
    s.topk_group = o.arch == "glm_moe_dsa" ? 1 : o.topk_group;
    s.routed_scaling_factor = 2.5;
    s.norm_topk_prob = true;
    s.first_k_dense = 1;
    MlaSpec& m = s.mla;
    m.q_lora_rank = o.q_lora_rank;
    m.kv_lora_rank = o.kv_lora_rank;
    m.qk_nope_head_dim = o.qk_nope_head_dim;
    m.qk_rope_head_dim = o.qk_rope_head_dim;
    m.v_head_dim = o.v_head_dim;
    m.rope_interleave = true;
    // transformers sets head_dim to the rope part: RoPE reads it.
    s.head_dim = m.qk_rope_head_dim;
    if (o.arch != "deepseek_v3") {
      if (m.q_lora_rank <= 0) return absl::InvalidArgumentError(Cat("make-model: ", o.arch, " needs --q-lora-rank > 0"));
      m.index_n_heads = o.index_n_heads;
      m.index_head_dim = o.index_head_dim;
      m.index_topk = o.index_topk;
      m.index_rope_interleave = o.arch == "glm_moe_dsa";
      for (char ch : o.index_pattern) {
        if (ch != 'F' && ch != 'S') {
          return absl::InvalidArgumentError(Cat("make-model: --index-pattern takes F and S, not '", ch, "'"));
        }
        m.index_full_layers.push_back(ch == 'F');
      }
      if (!o.index_pattern.empty() && static_cast<int64_t>(o.index_pattern.size()) != s.layers) {
        return absl::InvalidArgumentError(Cat("make-model: --index-pattern has ", o.index_pattern.size(),
                                              " letters for ", s.layers, " layers"));
      }
      if (m.index_head_dim < m.qk_rope_head_dim) {
        return absl::InvalidArgumentError("make-model: --index-head-dim must hold the qk rope dims");
      }
    }
    if (o.arch == "glm_moe_dsa") {
      s.rms_eps = 1e-5;
      rope.theta = 1000000.0;
    } else {
      // DeepSeek's YaRN (mscale = mscale_all_dim = 1: the softmax scale
      // grows by yarn_get_mscale(factor)^2, cos/sin stay unscaled).
      rope.type = "yarn";
      rope.factor = 4.0;
      rope.original_max_position = 256;
      rope.beta_fast = 32.0;
      rope.beta_slow = 1.0;
      rope.mscale = 1.0;
      rope.mscale_all_dim = 1.0;
    }
  } else if (o.arch == "glm4_moe") {
    // GLM-4.5: DeepSeek-V3-style routing with GQA attention.
    s.model_type = "glm4_moe";
    s.attention_bias = true;
    s.partial_rotary_factor = 0.5;
    s.num_experts = o.experts;
    s.experts_per_tok = o.experts_per_tok;
    s.moe_intermediate = o.moe_intermediate;
    s.n_shared_experts = o.n_shared_experts;
    s.scoring = "sigmoid";
    s.n_group = o.n_group;
    s.topk_group = o.topk_group;
    s.routed_scaling_factor = 2.5;
    s.norm_topk_prob = true;
    s.first_k_dense = 1;
  } else {
    return absl::InvalidArgumentError(
        Cat("make-model: unknown --arch '", o.arch,
            "' (llama, qwen3, qwen3_moe, mixtral, glm4_moe, deepseek_v3, deepseek_v32, glm_moe_dsa)"));
  }
  s.rope_legacy = rope;
  if (o.quant == "bf16") {
    s.quant = QuantKind::kNone;
  } else if (o.quant == "fp8") {
    s.quant = QuantKind::kFp8Block;
    s.quant_block_rows = s.quant_block_cols = 128;
  } else if (o.quant == "nvfp4") {
    s.quant = QuantKind::kNvfp4;
    s.quant_block_cols = 16;
  } else if (o.quant == "mxfp4") {
    s.quant = QuantKind::kMxfp4;
    s.quant_block_cols = 32;
  } else {
    return absl::InvalidArgumentError(Cat("make-model: unknown --quant '", o.quant, "' (bf16, fp8, nvfp4, mxfp4)"));
  }
  if ((s.quant == QuantKind::kNvfp4 || s.quant == QuantKind::kMxfp4) && s.mla.enabled()) {
    // As ModelOpt's GLM-5 NVFP4 exports: routed experts and dense MLPs in
    // fp4; attention (and the indexer), shared experts, router, lm_head bf16.
    s.quant_ignore = {"lm_head", "model.layers.*.self_attn*", "model.layers.*.mlp.shared_experts*",
                      "model.layers.*.mlp.gate"};
  }
  if (s.heads % s.kv_heads != 0) {
    return absl::InvalidArgumentError(Cat("make-model: --heads ", s.heads, " is not a multiple of --kv-heads ", s.kv_heads));
  }
  if (s.is_moe() && (s.num_experts % s.n_group != 0 || s.topk_group > s.n_group || s.experts_per_tok > kMaxTopK)) {
    return absl::InvalidArgumentError("make-model: experts must split evenly into --n-group groups, topk-group <= n-group");
  }
  const int64_t bc = s.quant_block_cols;
  const int64_t attn_in = s.mla.enabled() ? bc : s.heads * s.head_dim;  // MLA attention stays bf16 in fp4
  for (int64_t in : {s.hidden, attn_in, s.intermediate, s.is_moe() ? s.moe_intermediate : bc}) {
    if (s.quant != QuantKind::kFp8Block && in % bc != 0) {
      return absl::InvalidArgumentError(Cat("make-model: input dimension ", in, " is not a multiple of the ",
                                            o.quant, " block of ", bc));
    }
  }
  CpuPool pool(MakeModelThreads(o));
  Generator g(o, s, &pool);
  RandomCheckpoint ck = g.Build();
  if (s.quant == QuantKind::kNvfp4) CR_RETURN_IF_ERROR(CalibrateInputScales(ck.spec, o, &ck.tensors));
  return ck;
}

}  // namespace crashreplay::replay
