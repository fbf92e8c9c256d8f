#include "crashreplay/replay/make_model/random_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "crashreplay/base/status.h"
#include "crashreplay/base/text.h"
#include "crashreplay/formats/block_quant.h"
#include "crashreplay/formats/hf_config.h"
#include "crashreplay/formats/numeric.h"
#include "crashreplay/formats/safetensors_writer.h"
#include "crashreplay/replay/cpu/cpu_pool.h"
#include "crashreplay/replay/kernels/elementwise.h"
#include "crashreplay/replay/kernels/router.h"
#include "crashreplay/replay/kernels/sampling.h"
#include "crashreplay/replay/model/checkpoint_io.h"
#include "crashreplay/replay/model/model.h"
#include "crashreplay/replay/program/step.h"
#include "crashreplay/replay/session/backends.h"
#include "streamed_safetensors.h"

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

int64_t Elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

uint64_t TensorByteSize(const PlannedTensor& t) {
  return DTypeBytes(t.dtype, static_cast<uint64_t>(Elements(t.shape)));
}

// Where the generator's tensors go. Begin() declares the next tensor, in
// generation order; Write() gives bytes [offset, offset + n) of the tensor
// begun last, every byte once. A sink that wants no bytes (the planning
// pass of the bounded writer) gets the declarations only: nothing large is
// drawn for it.
class TensorSink {
 public:
  virtual ~TensorSink() = default;
  virtual bool wants_bytes() const { return true; }
  virtual absl::Status Begin(const PlannedTensor& t) = 0;
  virtual absl::Status Write(uint64_t offset, std::span<const uint8_t> bytes) = 0;
};

// Names, dtypes and shapes only.
class PlanSink final : public TensorSink {
 public:
  bool wants_bytes() const override { return false; }
  absl::Status Begin(const PlannedTensor& t) override {
    plan.push_back(t);
    return absl::OkStatus();
  }
  absl::Status Write(uint64_t, std::span<const uint8_t>) override {
    return absl::InternalError("make-model: tensor bytes written while planning");
  }
  std::vector<PlannedTensor> plan;
};

// The whole checkpoint in memory (GenerateRandomCheckpoint).
class MemorySink final : public TensorSink {
 public:
  absl::Status Begin(const PlannedTensor& t) override {
    auto [it, fresh] = tensors.try_emplace(t.name);
    if (!fresh) return absl::InternalError(Cat("make-model: tensor '", t.name, "' generated twice"));
    it->second.dtype = t.dtype;
    it->second.shape = t.shape;
    it->second.bytes = std::vector<uint8_t>(TensorByteSize(t));
    current_ = &it->second;
    name_ = t.name;
    return absl::OkStatus();
  }
  absl::Status Write(uint64_t offset, std::span<const uint8_t> bytes) override {
    if (current_ == nullptr || offset > current_->bytes.size() || bytes.size() > current_->bytes.size() - offset) {
      return absl::InternalError(Cat("make-model: bytes outside tensor '", name_, "'"));
    }
    std::memcpy(current_->bytes.mutable_data() + offset, bytes.data(), bytes.size());
    return absl::OkStatus();
  }
  TensorSet tensors;

 private:
  HostTensor* current_ = nullptr;
  std::string name_;
};

// Straight into the files planned from the same generator (WriteRandomCheckpoint).
class FileSink final : public TensorSink {
 public:
  explicit FileSink(StreamedSafetensors* out) : out_(out) {}
  absl::Status Begin(const PlannedTensor& t) override {
    name_ = t.name;
    return out_->Check(t.name, t.dtype, t.shape);
  }
  absl::Status Write(uint64_t offset, std::span<const uint8_t> bytes) override {
    return out_->Write(name_, offset, bytes);
  }

 private:
  StreamedSafetensors* out_;
  std::string name_;
};

// Rows [r0, r1) of a matrix's slices, run on the pool: chunks of
// `align`-row multiples (FP8 blocks are 128 rows), at least ~256K elements.
void ForRowChunks(CpuPool& pool, int64_t rows, int64_t cols, int64_t align,
                  const std::function<void(int64_t, int64_t)>& fn) {
  int64_t chunk = std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(cols, 1));
  chunk = (chunk + align - 1) / align * align;
  const int64_t n = (rows + chunk - 1) / chunk;
  pool.Launch(n, [&](int64_t i, KernelStatus*) { fn(i * chunk, std::min(rows, (i + 1) * chunk)); });
}

// Draws every tensor of the checkpoint, in one fixed order (the order of the
// draws in the stream), and hands it to a sink. A bf16 matrix goes out in
// pieces as it is drawn; a quantized one is drawn whole in fp32 (NVFP4's
// global scale is the amax over all of it), quantized and handed over; so
// the generator holds at most one tensor (and a bf16 piece) at a time.
class Generator {
 public:
  // `fdt`: the dtype of the unquantized tensors (bf16, or --like a
  // checkpoint's float16 / float32).
  Generator(const MakeModelOptions& o, const ModelSpec& spec, DType fdt, CpuPool* pool, TensorSink* sink)
      : o_(o), spec_(spec), fdt_(fdt), rng_(o.seed), pool_(pool), sink_(sink), draw_(sink->wants_bytes()) {}

  absl::Status Build() {
    const ModelSpec& s = spec_;
    const int64_t H = s.hidden, hd = s.head_dim;
    Report();
    CR_RETURN_IF_ERROR(FloatMatrix("model.embed_tokens.weight", s.vocab, H));
    for (int64_t l = 0; l < s.layers; ++l) {
      const LayerNames n = NamesFor(s, l);
      const std::string a = n.prefix + "self_attn.";
      CR_RETURN_IF_ERROR(PutFloat(n.prefix + "input_layernorm.weight", Norm(H)));
      CR_RETURN_IF_ERROR(PutFloat(n.prefix + "post_attention_layernorm.weight", Norm(H)));
      if (s.mla.enabled()) {
        CR_RETURN_IF_ERROR(MlaAttention(a, l));
      } else {
        CR_RETURN_IF_ERROR(Linear(a + "q_proj.weight", s.heads * hd, H));
        CR_RETURN_IF_ERROR(Linear(a + "k_proj.weight", s.kv_heads * hd, H));
        CR_RETURN_IF_ERROR(Linear(a + "v_proj.weight", s.kv_heads * hd, H));
        CR_RETURN_IF_ERROR(Linear(a + "o_proj.weight", H, s.heads * hd));
      }
      if (s.attention_bias && !s.mla.enabled()) {
        CR_RETURN_IF_ERROR(Bias(a + "q_proj.bias", s.heads * hd));
        CR_RETURN_IF_ERROR(Bias(a + "k_proj.bias", s.kv_heads * hd));
        CR_RETURN_IF_ERROR(Bias(a + "v_proj.bias", s.kv_heads * hd));
      }
      if (s.attention_out_bias && !s.mla.enabled()) CR_RETURN_IF_ERROR(Bias(a + "o_proj.bias", H));
      if (s.attention_sinks) {
        std::vector<float> sinks(s.heads);
        for (auto& x : sinks) x = rng_.Next();
        CR_RETURN_IF_ERROR(PutFloat(n.sinks(), sinks));
      }
      if (s.qk_norm) {
        CR_RETURN_IF_ERROR(PutFloat(a + "q_norm.weight", Norm(hd)));
        CR_RETURN_IF_ERROR(PutFloat(a + "k_norm.weight", Norm(hd)));
      }
      if (!s.layer_is_moe(l)) {
        CR_RETURN_IF_ERROR(Linear(n.prefix + "mlp.gate_proj.weight", s.intermediate, H));
        CR_RETURN_IF_ERROR(Linear(n.prefix + "mlp.up_proj.weight", s.intermediate, H));
        CR_RETURN_IF_ERROR(Linear(n.prefix + "mlp.down_proj.weight", H, s.intermediate));
        layers_done_ = l + 1;
        Report();
        continue;
      }
      CR_RETURN_IF_ERROR(FloatMatrix(n.router(), s.num_experts, H));
      if (s.model_type == "gpt_oss") {
        CR_RETURN_IF_ERROR(GptOssExperts(n));
        layers_done_ = l + 1;
        Report();
        continue;
      }
      if (s.scoring == "sigmoid") {
        std::vector<float> bias(s.num_experts);
        for (auto& x : bias) x = 0.05f * rng_.Next();
        CR_RETURN_IF_ERROR(Put({n.bias(), DType::kF32, {s.num_experts}}, bias));
      }
      for (int64_t j = 0; j < s.num_experts; ++j) {
        CR_RETURN_IF_ERROR(Linear(n.expert(j, "gate"), s.moe_intermediate, H));
        CR_RETURN_IF_ERROR(Linear(n.expert(j, "up"), s.moe_intermediate, H));
        CR_RETURN_IF_ERROR(Linear(n.expert(j, "down"), H, s.moe_intermediate));
      }
      if (s.n_shared_experts > 0) {
        const int64_t si = s.moe_intermediate * s.n_shared_experts;
        CR_RETURN_IF_ERROR(Linear(n.shared("gate"), si, H));
        CR_RETURN_IF_ERROR(Linear(n.shared("up"), si, H));
        CR_RETURN_IF_ERROR(Linear(n.shared("down"), H, si));
      }
      layers_done_ = l + 1;
      Report();
    }
    CR_RETURN_IF_ERROR(PutFloat("model.norm.weight", Norm(H)));
    if (!s.tie_embeddings) CR_RETURN_IF_ERROR(FloatMatrix("lm_head.weight", s.vocab, H));
    layers_done_ = s.layers;
    Report();
    return absl::OkStatus();
  }

 private:
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

  // One tensor, whole (only declared when the sink wants no bytes).
  template <typename T>
  absl::Status Put(const PlannedTensor& t, const std::vector<T>& v) {
    CR_RETURN_IF_ERROR(sink_->Begin(t));
    const uint64_t n = TensorByteSize(t);
    bytes_ += static_cast<int64_t>(n);
    if (!draw_) return absl::OkStatus();
    if (v.size() * sizeof(T) != n) {
      return absl::InternalError(
          Cat("make-model: tensor '", t.name, "' has ", v.size() * sizeof(T), " bytes, not ", n));
    }
    CR_RETURN_IF_ERROR(sink_->Write(0, {reinterpret_cast<const uint8_t*>(v.data()), n}));
    Report();
    return absl::OkStatus();
  }
  absl::Status Declare(const std::vector<PlannedTensor>& ts) {
    for (const PlannedTensor& t : ts) CR_RETURN_IF_ERROR(Put(t, std::vector<uint8_t>{}));
    return absl::OkStatus();
  }
  // `v` in the unquantized dtype, at `out` (2 or 4 bytes an element).
  void Encode(float v, uint8_t* out) const {
    if (fdt_ == DType::kF32) {
      std::memcpy(out, &v, 4);
      return;
    }
    const uint16_t h = fdt_ == DType::kF16 ? FloatToFp16(v) : FloatToBf16(v);
    std::memcpy(out, &h, 2);
  }
  int64_t FloatBytes() const { return fdt_ == DType::kF32 ? 4 : 2; }

  // A 1-D tensor of `v` in the unquantized dtype.
  absl::Status PutFloat(const std::string& name, const std::vector<float>& v) {
    std::vector<uint8_t> b(v.size() * FloatBytes());
    for (size_t i = 0; i < v.size(); ++i) Encode(v[i], &b[i * FloatBytes()]);
    return Put({name, fdt_, {static_cast<int64_t>(v.size())}}, b);
  }

  // An out x in matrix (std 1/sqrt(in)) in the unquantized dtype, drawn and
  // converted on the pool in pieces of ~32 MB, each handed to the sink as
  // it is done.
  absl::Status FloatMatrix(const std::string& name, int64_t out, int64_t in) {
    CR_RETURN_IF_ERROR(sink_->Begin({name, fdt_, {out, in}}));
    const uint64_t first = rng_.Take(out * in), seed = rng_.seed();
    const int64_t eb = FloatBytes();
    bytes_ += out * in * eb;
    if (!draw_) return absl::OkStatus();
    const float s = 1.0f / std::sqrt(static_cast<float>(in));
    const int64_t piece = std::max<int64_t>(1, (int64_t{1} << 24) / std::max<int64_t>(in, 1));
    std::vector<uint8_t> buf(std::min(out, piece) * in * eb);
    for (int64_t p0 = 0; p0 < out; p0 += piece) {
      const int64_t p1 = std::min(out, p0 + piece);
      const uint64_t base = first + static_cast<uint64_t>(p0 * in);
      ForRowChunks(*pool_, p1 - p0, in, 1, [&](int64_t r0, int64_t r1) {
        for (int64_t i = r0 * in; i < r1 * in; ++i)
          Encode(NormalAt(seed, base + static_cast<uint64_t>(i)) * s, &buf[i * eb]);
      });
      CR_RETURN_IF_ERROR(
          sink_->Write(static_cast<uint64_t>(p0 * in * eb), {buf.data(), static_cast<size_t>((p1 - p0) * in * eb)}));
      Report();
    }
    return absl::OkStatus();
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

  // `name` (+ its scale tensors) quantized as the checkpoint's linear layers
  // are, each row chunk on the pool (rows are independent; FP8 chunks hold
  // whole 128-row blocks, NVFP4's global scale is the amax over all).
  absl::Status Linear(const std::string& name, int64_t out, int64_t in) {
    const std::string base = name.substr(0, name.size() - std::string(".weight").size());
    const QuantKind kind = Quantized(base) ? spec_.quant : QuantKind::kNone;
    if (kind == QuantKind::kNone) return FloatMatrix(name, out, in);
    std::vector<float> w;
    if (draw_) {
      w = Matrix(out, in);
    } else {
      rng_.Take(out * in);
    }
    CpuPool& pool = *pool_;
    switch (kind) {
      case QuantKind::kNone: break;
      case QuantKind::kFp8Block: {
        const int64_t br = 128, bc = 128, sr = (out + br - 1) / br, sc = (in + bc - 1) / bc;
        const std::vector<PlannedTensor> t = {{name, DType::kF8E4M3, {out, in}},
                                              {base + ".weight_scale_inv", DType::kF32, {sr, sc}}};
        if (!draw_) return Declare(t);
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
        w = {};
        CR_RETURN_IF_ERROR(Put(t[0], q));
        return Put(t[1], scale);
      }
      case QuantKind::kFp8Tensor: {  // ModelOpt FP8: one scale, amax / 448
        const std::vector<PlannedTensor> t = {{name, DType::kF8E4M3, {out, in}},
                                              {base + ".weight_scale", DType::kF32, {}}};
        if (!draw_) return Declare(t);
        float amax = 0.0f;
        for (float v : w) amax = AbsMaxAccumulate(amax, v);
        const float scale = Fp8BlockScale(amax, 1e-12f, false);
        std::vector<uint8_t> q(out * in);
        ForRowChunks(pool, out, in, 1, [&](int64_t r0, int64_t r1) {
          for (int64_t i = r0 * in; i < r1 * in; ++i) q[i] = QuantFp8(w[i], scale);
        });
        w = {};
        CR_RETURN_IF_ERROR(Put(t[0], q));
        return Put(t[1], std::vector<float>{scale});
      }
      case QuantKind::kNvfp4: {
        const std::vector<PlannedTensor> t = {{name, DType::kU8, {out, in / 2}},
                                              {base + ".weight_scale", DType::kF8E4M3, {out, in / 16}},
                                              {base + ".weight_scale_2", DType::kF32, {}},
                                              {base + ".input_scale", DType::kF32, {}}};
        if (!draw_) return Declare(t);
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
        w = {};
        CR_RETURN_IF_ERROR(Put(t[0], packed));
        CR_RETURN_IF_ERROR(Put(t[1], scales));
        CR_RETURN_IF_ERROR(Put(t[2], std::vector<float>{global}));
        // Placeholder until CalibrateInputScales measures the input's amax.
        return Put(t[3], std::vector<float>{1.0f});
      }
      case QuantKind::kMxfp4: {
        const std::vector<PlannedTensor> t = {{name, DType::kU8, {out, in / 2}},
                                              {base + ".weight_scale", DType::kU8, {out, in / 32}}};
        if (!draw_) return Declare(t);
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
        w = {};
        CR_RETURN_IF_ERROR(Put(t[0], packed));
        return Put(t[1], scales);
      }
    }
    return absl::InternalError(Cat("make-model: no quantization for '", name, "'"));
  }

  // MLA attention in transformers' names and layouts (DeepseekV3Attention,
  // DeepseekV32Indexer).
  absl::Status MlaAttention(const std::string& a, int64_t l) {
    const ModelSpec& s = spec_;
    const MlaSpec& m = s.mla;
    const int64_t H = s.hidden;
    if (m.q_lora_rank > 0) {
      CR_RETURN_IF_ERROR(Linear(a + "q_a_proj.weight", m.q_lora_rank, H));
      CR_RETURN_IF_ERROR(PutFloat(a + "q_a_layernorm.weight", Norm(m.q_lora_rank)));
      CR_RETURN_IF_ERROR(Linear(a + "q_b_proj.weight", s.heads * m.qk_head_dim(), m.q_lora_rank));
    } else {
      CR_RETURN_IF_ERROR(Linear(a + "q_proj.weight", s.heads * m.qk_head_dim(), H));
    }
    CR_RETURN_IF_ERROR(Linear(a + "kv_a_proj_with_mqa.weight", m.kv_lora_rank + m.qk_rope_head_dim, H));
    CR_RETURN_IF_ERROR(PutFloat(a + "kv_a_layernorm.weight", Norm(m.kv_lora_rank)));
    CR_RETURN_IF_ERROR(Linear(a + "kv_b_proj.weight", s.heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank));
    CR_RETURN_IF_ERROR(Linear(a + "o_proj.weight", H, s.heads * m.v_head_dim));
    if (!m.layer_has_indexer(l)) return absl::OkStatus();
    CR_RETURN_IF_ERROR(Linear(a + "indexer.wq_b.weight", m.index_n_heads * m.index_head_dim, m.q_lora_rank));
    CR_RETURN_IF_ERROR(Linear(a + "indexer.wk.weight", m.index_head_dim, H));
    CR_RETURN_IF_ERROR(Linear(a + "indexer.weights_proj.weight", m.index_n_heads, H));
    CR_RETURN_IF_ERROR(PutFloat(a + "indexer.k_norm.weight", Norm(m.index_head_dim)));
    return Bias(a + "indexer.k_norm.bias", m.index_head_dim);
  }

  // gpt_oss's MoE layer as transformers' GptOssExperts saves it: the
  // router's bias, then gate_up_proj [E, H, 2I] (x @ W; gate the even
  // columns, up the odd ones, each of std 1/sqrt(H)), its bias [E, 2I],
  // down_proj [E, I, H] (std 1/sqrt(I)) and its bias [E, H]; in the
  // unquantized dtype.
  absl::Status GptOssExperts(const LayerNames& n) {
    const ModelSpec& s = spec_;
    const int64_t E = s.num_experts, H = s.hidden, I = s.moe_intermediate;
    const std::string p = n.prefix + "mlp.experts.";
    CR_RETURN_IF_ERROR(Bias(n.prefix + "mlp.router.bias", E));
    auto fused = [&](const std::string& name, int64_t in, int64_t out) -> absl::Status {
      // [E, in, out] with std 1/sqrt(in): drawn as [E * out, in], transposed.
      std::vector<uint8_t> b;
      const int64_t eb = FloatBytes();
      if (draw_) {
        const std::vector<float> w = Matrix(E * out, in);
        b.resize(w.size() * eb);
        for (int64_t j = 0; j < E; ++j)
          for (int64_t i = 0; i < in; ++i)
            for (int64_t o = 0; o < out; ++o) Encode(w[(j * out + o) * in + i], &b[((j * in + i) * out + o) * eb]);
      } else {
        rng_.Take(E * out * in);
      }
      return Put({p + name, fdt_, {E, in, out}}, b);
    };
    auto bias2d = [&](const std::string& name, int64_t cols) {
      std::vector<uint8_t> b(E * cols * FloatBytes());
      for (int64_t i = 0; i < E * cols; ++i) Encode(0.1f * rng_.Next(), &b[i * FloatBytes()]);
      return Put({p + name, fdt_, {E, cols}}, b);
    };
    CR_RETURN_IF_ERROR(fused("gate_up_proj", H, 2 * I));
    CR_RETURN_IF_ERROR(bias2d("gate_up_proj_bias", 2 * I));
    CR_RETURN_IF_ERROR(fused("down_proj", I, H));
    CR_RETURN_IF_ERROR(bias2d("down_proj_bias", H));
    return absl::OkStatus();
  }

  absl::Status Bias(const std::string& name, int64_t n) {
    std::vector<float> b(n);
    for (auto& x : b) x = 0.1f * rng_.Next();
    return PutFloat(name, b);
  }

  void Report() {
    if (draw_ && o_.progress) o_.progress("generating weights (layers)", layers_done_, spec_.layers, bytes_);
  }

  const MakeModelOptions& o_;
  const ModelSpec& spec_;
  const DType fdt_;
  Normal rng_;
  CpuPool* pool_;
  TensorSink* sink_;
  bool draw_;
  int64_t layers_done_ = 0;
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

// A HostTensor over `t`'s bytes without copying them: a deferred tensor or a
// view as it is, an owned buffer as a view that does not own it (valid while
// `t` lives: the calibration's model never outlives the tensors it reads).
HostTensor Borrow(const HostTensor& t) {
  if (t.bytes.deferred() || t.bytes.is_view()) return t;
  static const auto kBorrowed = std::make_shared<int>(0);
  return HostTensor{t.dtype, t.shape, TensorBytes::View(t.bytes.span(), kBorrowed)};
}

// The embedding rows of `tokens`, in order: the calibration model's whole
// embedding (so neither the embedding nor lm_head is held: the layers'
// inputs are the same bits, and no layer reads the vocabulary).
absl::StatusOr<HostTensor> PromptEmbedding(const HostTensor& embed, const std::vector<int32_t>& tokens) {
  if (embed.shape.size() != 2 || embed.shape[0] <= 0) return absl::InternalError("make-model: bad embedding shape");
  CR_ASSIGN_OR_RETURN(const TensorBytes bytes, embed.bytes.Resolve());  // maps a deferred one; rows read only
  const size_t row = bytes.size() / static_cast<size_t>(embed.shape[0]);
  std::vector<uint8_t> out(tokens.size() * row);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= embed.shape[0])
      return absl::InternalError("make-model: calibration token out of range");
    std::memcpy(out.data() + i * row, bytes.data() + static_cast<size_t>(tokens[i]) * row, row);
  }
  return HostTensor{embed.dtype, {static_cast<int64_t>(tokens.size()), embed.shape[1]}, std::move(out)};
}

// ModelOpt-style calibration of an NVFP4 checkpoint's activation scales: runs
// a calibration prompt through the model (fp4 weights, bf16 activations: the
// w4a16 path, which never reads input_scale), takes the amax of every linear
// layer's input and returns input_scale = amax / (6 * 448) by tensor name
// ("<layer>.input_scale"), so that under w4a4 the calibrated amax maps to the
// largest e2m1 value times the largest e4m3 block scale. Layers that read
// the same activation (q/k/v, gate/up) get the same amax. Every expert is
// calibrated on every token (not only the ones routed to it), so no expert
// is left without a scale.
//
// The model is built over `tensors` without copying them (an in-memory
// checkpoint's buffers, or a written one's files, deferred) and without
// hashing them; `stream` holds one layer's weights at a time (layer
// streaming), so calibrating a written checkpoint needs about one layer of
// memory. Its embedding is only the prompt's rows (PromptEmbedding), and
// the tokens are renumbered to index them.
absl::StatusOr<std::map<std::string, float>> CalibrateInputScales(const ModelSpec& spec, const MakeModelOptions& opts,
                                                                  const TensorSet& tensors, bool stream) {
  const std::vector<int32_t> prompt = CalibrationTokens(spec, opts.seed);
  const int64_t n = static_cast<int64_t>(prompt.size());
  ModelSpec cal = spec;
  cal.vocab = n;
  cal.tie_embeddings = true;
  TensorSet cal_tensors;
  for (const auto& [name, t] : tensors) {
    if (name != "model.embed_tokens.weight" && name != "lm_head.weight") cal_tensors.emplace(name, Borrow(t));
  }
  auto embed = tensors.find("model.embed_tokens.weight");
  if (embed == tensors.end()) return absl::InternalError("make-model: no embedding to calibrate with");
  CR_ASSIGN_OR_RETURN(cal_tensors["model.embed_tokens.weight"], PromptEmbedding(embed->second, prompt));

  EngineConfig cfg;
  cfg.nvfp4_activation = Nvfp4Activation::kW4a16;
  CR_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                      BuildModel(cal, cal_tensors, cfg, {.stream = stream, .hash = false}));
  StepInput in;
  in.rows.resize(1);
  StepRow& row = in.rows[0];
  for (int32_t i = 0; i < n; ++i) row.tokens.push_back(i);
  const int64_t pages = (n + cfg.page_size - 1) / cfg.page_size;
  for (int64_t p = 0; p < pages; ++p) row.page_table.push_back(static_cast<int32_t>(p));
  CR_ASSIGN_OR_RETURN(std::unique_ptr<Executor> exec,
                      MakeExecutor("cpu", ExecMode::kKernelByKernel, MakeModelThreads(opts)));
  CR_ASSIGN_OR_RETURN(std::unique_ptr<DeviceModel> dm, stream ? DeviceModel::UploadStreaming(*model, exec.get())
                                                              : DeviceModel::Upload(*model, exec.get()));
  CR_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> kv, KvCache::Create(*model, cfg, pages, exec.get()));
  std::unique_ptr<StepProgram> program = StepProgram::Lower(*dm, cfg, kv.get(), in);
  if (stream) program->set_streaming(dm.get());
  StepProgram& prog = *program;
  const int64_t L = spec.layers, H = spec.hidden;
  std::vector<float> qkv(L, 0.0f), o(L, 0.0f), mlp_in(L, 0.0f), down(L, 0.0f), shared_down(L, 0.0f);
  std::vector<std::vector<float>> expert_down(L);
  const int64_t total = static_cast<int64_t>(prog.kernels().size());
  int64_t done = 0;
  for (const KernelCall& k : prog.kernels()) {
    if (opts.progress) opts.progress("calibrating input_scale (kernels)", done++, total, 0);
    if (prog.RunNext()) {
      return absl::InternalError(Cat("make-model calibration failed in ", k.Label(), ": ", prog.status().message()));
    }
    if (k.layer < 0) continue;
    const int64_t l = k.layer;
    // MLA's attention and the indexer stay bf16 in NVFP4 checkpoints (Generator::Quantized).
    if (k.name == "input_norm") qkv[l] = BufferAmax(prog.buffer("x"));
    if (k.name == "attention") o[l] = BufferAmax(prog.buffer("attn"));
    if (k.name == "silu_mul") down[l] = BufferAmax(prog.buffer("act"));
    if (k.name != "post_attention_norm") continue;
    const Buffer* x = prog.buffer("x");
    mlp_in[l] = BufferAmax(x);
    // The layer's weights are held now (the kernel just run is one of its own).
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
  std::map<std::string, float> scales;
  auto set = [&](const std::string& base, float amax) {
    if (!tensors.count(base + ".weight_scale_2")) return;  // not NVFP4 (excluded, or MLA's attention)
    scales[base + ".input_scale"] = std::max(amax, 1e-6f) / (kE2m1Max * kE4m3Max);
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
    if (static_cast<int64_t>(expert_down[l].size()) != spec.num_experts) {
      return absl::InternalError(Cat("make-model calibration: layer ", l, " calibrated ", expert_down[l].size(),
                                     " experts of ", spec.num_experts));
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
  return scales;
}

// The RoPE keys config.json carries (MakeModelOptions::rope_form).
void ApplyRopeForm(const std::string& form, ModelSpec* spec) {
  if (form != "legacy") spec->rope_parameters = spec->rope_legacy;
  if (form == "rope_parameters") spec->rope_legacy.reset();
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

namespace {

// The model `dir`'s config.json describes, as the engine reads it.
absl::StatusOr<ModelSpec> SpecLike(const std::string& dir) {
  CR_ASSIGN_OR_RETURN(const ModelConfig c, LoadHfConfig(dir + "/config.json"));
  CR_ASSIGN_OR_RETURN(ModelSpec s, ModelSpecFromHfConfig(c));
  // Which modules stay unquantized is the file's list (the engine reads it
  // from the config; the generator from the spec).
  s.quant_ignore = c.quant.ignore;
  if (s.mlp_bias) {
    return absl::InvalidArgumentError(
        Cat("make-model --like ", dir, ": the config has MLP biases, which make-model does not draw"));
  }
  return s;
}

// The dtype of the unquantized tensors: bf16, or what --like's config says
// (its torch_dtype / dtype).
absl::StatusOr<DType> FloatDTypeFor(const MakeModelOptions& o) {
  if (o.like.empty()) return DType::kBF16;
  CR_ASSIGN_OR_RETURN(const ModelConfig c, LoadHfConfig(o.like + "/config.json"));
  if (c.torch_dtype.empty() || c.torch_dtype == "bfloat16") return DType::kBF16;
  if (c.torch_dtype == "float16") return DType::kF16;
  if (c.torch_dtype == "float32") return DType::kF32;
  return absl::InvalidArgumentError(Cat("make-model --like ", o.like, ": config.json's dtype '", c.torch_dtype,
                                        "' is none of bfloat16, float16, float32"));
}

// The checkpoint's architecture from the options, checked.
absl::StatusOr<ModelSpec> SpecFor(const MakeModelOptions& o) {
  if (!o.like.empty()) return SpecLike(o.like);
  if (o.rope_form != "legacy" && o.rope_form != "rope_parameters" && o.rope_form != "both") {
    return absl::InvalidArgumentError(
        Cat("make-model: unknown rope form '", o.rope_form, "' (legacy, rope_parameters, both)"));
  }
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
      if (m.q_lora_rank <= 0)
        return absl::InvalidArgumentError(Cat("make-model: ", o.arch, " needs --q-lora-rank > 0"));
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
        return absl::InvalidArgumentError(
            Cat("make-model: --index-pattern has ", o.index_pattern.size(), " letters for ", s.layers, " layers"));
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
  } else if (o.arch == "gpt_oss") {
    // gpt-oss: q/k/v/o biases, attention sinks, sliding-window layers (every
    // other one from layer 0, window --sliding-window), experts of
    // --intermediate with biases, the clamped SwiGLU, top-k-then-softmax
    // routing with a bias, gpt-oss's YaRN (truncate false).
    s.model_type = "gpt_oss";
    s.rms_eps = 1e-5;
    s.attention_bias = s.attention_out_bias = true;
    s.attention_sinks = true;
    s.sliding_window = o.sliding_window;
    for (int64_t l = 0; l < o.layers; ++l) s.layer_window.push_back(l % 2 == 0 ? o.sliding_window : 0);
    s.num_experts = o.experts;
    s.experts_per_tok = o.experts_per_tok;
    s.moe_intermediate = o.intermediate;
    s.norm_topk_prob = true;
    s.softmax_after_topk = true;
    s.moe_bias = true;
    s.swiglu_alpha = 1.702;
    s.swiglu_limit = 7.0;
    rope.type = "yarn";
    rope.theta = 150000.0;
    rope.factor = 32.0;
    rope.beta_fast = 32.0;
    rope.beta_slow = 1.0;
    rope.truncate = false;
    rope.original_max_position = 128;  // small, so the scaled band reaches tiny head dims
    if (o.quant != "bf16") {
      return absl::InvalidArgumentError(Cat("make-model: gpt_oss is written in bf16 only (--quant ", o.quant,
                                            "); the engine reads OpenAI's MXFP4 experts, make-model does not "
                                            "write them"));
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
            "' (llama, qwen3, qwen3_moe, mixtral, glm4_moe, deepseek_v3, deepseek_v32, glm_moe_dsa, gpt_oss)"));
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
    return absl::InvalidArgumentError(
        Cat("make-model: --heads ", s.heads, " is not a multiple of --kv-heads ", s.kv_heads));
  }
  if (s.is_moe() && (s.num_experts % s.n_group != 0 || s.topk_group > s.n_group || s.experts_per_tok > kMaxTopK)) {
    return absl::InvalidArgumentError(
        "make-model: experts must split evenly into --n-group groups, topk-group <= n-group");
  }
  const int64_t bc = s.quant_block_cols;
  const int64_t attn_in = s.mla.enabled() ? bc : s.heads * s.head_dim;  // MLA attention stays bf16 in fp4
  for (int64_t in : {s.hidden, attn_in, s.intermediate, s.is_moe() ? s.moe_intermediate : bc}) {
    if (s.quant != QuantKind::kFp8Block && in % bc != 0) {
      return absl::InvalidArgumentError(
          Cat("make-model: input dimension ", in, " is not a multiple of the ", o.quant, " block of ", bc));
    }
  }
  return s;
}

// make-model --like: the config files of `from` written into `to` as they
// are (config.json and the other small JSON files a loader reads beside it;
// not a shard index, which describes other shards, nor tokenizer files).
absl::Status CopyConfigFiles(const std::string& from, const std::string& to) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(from, ec)) {
    const std::string name = e.path().filename().string();
    if (e.path().extension() != ".json" || name.find(".index.json") != std::string::npos ||
        name.rfind("tokenizer", 0) == 0) {
      continue;
    }
    std::ifstream in(e.path(), std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    if (!in.good() && !in.eof()) return absl::DataLossError(Cat(e.path().string(), ": cannot be read"));
    CR_RETURN_IF_ERROR(WriteFileAtomically(to + "/" + name, bytes.str()));
  }
  if (ec) return absl::NotFoundError(Cat(from, ": ", ec.message()));
  return absl::OkStatus();
}

std::vector<uint8_t> F32Bytes(float v) {
  std::vector<uint8_t> b(4);
  std::memcpy(b.data(), &v, 4);
  return b;
}

}  // namespace

absl::StatusOr<RandomCheckpoint> GenerateRandomCheckpoint(const MakeModelOptions& o) {
  CR_ASSIGN_OR_RETURN(const ModelSpec s, SpecFor(o));
  CR_ASSIGN_OR_RETURN(const DType fdt, FloatDTypeFor(o));
  MemorySink sink;
  {
    CpuPool pool(MakeModelThreads(o));
    Generator g(o, s, fdt, &pool, &sink);
    CR_RETURN_IF_ERROR(g.Build());
  }
  RandomCheckpoint ck{s, std::move(sink.tensors)};
  // gpt_oss's experts as the engine builds them (LoadCheckpointDir splits
  // the files' fused tensors the same way).
  CR_RETURN_IF_ERROR(SplitFusedExperts(s, "make-model", &ck.tensors));
  if (s.quant == QuantKind::kNvfp4) {
    CR_ASSIGN_OR_RETURN(const auto scales, CalibrateInputScales(s, o, ck.tensors, /*stream=*/false));
    for (const auto& [name, v] : scales) ck.tensors[name].bytes = F32Bytes(v);
  }
  if (o.like.empty()) ApplyRopeForm(o.rope_form, &ck.spec);
  return ck;
}

absl::StatusOr<WrittenCheckpoint> WriteRandomCheckpoint(const std::string& dir, const MakeModelOptions& o,
                                                        uint64_t max_shard_bytes) {
  CR_ASSIGN_OR_RETURN(const ModelSpec s, SpecFor(o));
  CR_ASSIGN_OR_RETURN(const DType fdt, FloatDTypeFor(o));
  CpuPool pool(MakeModelThreads(o));
  // Every tensor's name, dtype and shape, from the generator itself.
  PlanSink plan;
  CR_RETURN_IF_ERROR(Generator(o, s, fdt, &pool, &plan).Build());
  // The files at their final size, headers written: a bad directory or a
  // full disk fails here, before any drawing.
  CR_ASSIGN_OR_RETURN(std::unique_ptr<StreamedSafetensors> out,
                      StreamedSafetensors::Create(dir, plan.plan, max_shard_bytes, {{"format", "pt"}}));
  FileSink sink(out.get());
  CR_RETURN_IF_ERROR(Generator(o, s, fdt, &pool, &sink).Build());
  if (s.quant == QuantKind::kNvfp4) {
    // From the files, one layer at a time, then the placeholders patched.
    CR_ASSIGN_OR_RETURN(const auto scales, CalibrateInputScales(s, o, out->Tensors(), /*stream=*/true));
    for (const auto& [name, v] : scales) CR_RETURN_IF_ERROR(out->Write(name, 0, F32Bytes(v)));
  }
  if (o.progress) o.progress("flushing files", 0, 0, static_cast<int64_t>(out->data_bytes()));
  CR_RETURN_IF_ERROR(out->Commit());
  WrittenCheckpoint w{s, out->num_tensors(), out->data_bytes()};
  if (!o.like.empty()) {
    CR_RETURN_IF_ERROR(CopyConfigFiles(o.like, dir));
    return w;
  }
  ApplyRopeForm(o.rope_form, &w.spec);
  CR_RETURN_IF_ERROR(WriteFileAtomically(dir + "/config.json", HfConfigToJson(HfConfigFromModelSpec(w.spec))));
  return w;
}

}  // namespace crashreplay::replay
