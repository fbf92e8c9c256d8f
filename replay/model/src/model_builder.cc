#include <algorithm>
#include <cmath>
#include <cstring>

#include "crashreplay/base/status.h"
#include "crashreplay/base/text.h"
#include "crashreplay/formats/numeric.h"
#include "crashreplay/formats/sharding.h"
#include "crashreplay/replay/model/model.h"
#include "model_builder_internal.h"

namespace crashreplay::replay {
namespace {

using text::Cat;

// The tensor `name` of `t`, its size checked against its shape. A deferred
// tensor (layer streaming) is read into `resolved`, which keeps it mapped
// until the caller clears it.
absl::StatusOr<const HostTensor*> Get(const TensorSet& t, std::map<std::string, HostTensor>* resolved,
                                      const std::string& name) {
  auto it = t.find(name);
  if (it == t.end()) return absl::NotFoundError(Cat("checkpoint has no tensor '", name, "'"));
  uint64_t n = 1;
  for (int64_t d : it->second.shape) n *= static_cast<uint64_t>(d);
  if (DTypeBytes(it->second.dtype, n) != it->second.bytes.size()) {
    return absl::DataLossError(Cat("tensor '", name, "' has ", it->second.bytes.size(), " bytes, its shape needs ",
                                   DTypeBytes(it->second.dtype, n)));
  }
  if (!it->second.bytes.deferred()) return &it->second;
  auto done = resolved->find(name);
  if (done != resolved->end()) return &done->second;
  HostTensor h = it->second;
  CR_ASSIGN_OR_RETURN(h.bytes, it->second.bytes.Resolve());
  return &resolved->emplace(name, std::move(h)).first->second;
}

float ScalarF32(const HostTensor& t) {
  float v = 0;
  std::memcpy(&v, t.bytes.data(), 4);
  return v;
}

}  // namespace

uint64_t RowStorageBytes(WFormat f, int64_t cols) {
  switch (f) {
    case WFormat::kF32: return static_cast<uint64_t>(cols) * 4;
    case WFormat::kBF16:
    case WFormat::kF16: return static_cast<uint64_t>(cols) * 2;
    case WFormat::kE4m3: return static_cast<uint64_t>(cols);
    case WFormat::kE2m1: return static_cast<uint64_t>(cols + 1) / 2;
  }
  return 0;
}

size_t LinearShard::data_bytes() const {
  if (data.empty() || !StridedRows(w)) return data.size();
  return static_cast<size_t>(w.rows) * RowStorageBytes(w.format, w.cols);
}

std::vector<uint8_t> DenseRows(const QWeight& w) {
  const uint64_t row = RowStorageBytes(w.format, w.cols), stride = RowStorageBytes(w.format, RowStride(w));
  std::vector<uint8_t> out(static_cast<size_t>(w.rows) * row);
  const uint8_t* src = static_cast<const uint8_t*>(w.data);
  for (int64_t r = 0; r < w.rows; ++r) std::memcpy(out.data() + r * row, src + r * stride, row);
  return out;
}

void CompactRows(LinearShard* s) {
  if (s->data.empty() || !StridedRows(s->w)) return;
  s->data = DenseRows(s->w);
  s->w.row_stride = 0;
  s->w.data = s->data.data();
}

namespace {

void SetViews(LinearShard* s) {
  s->w.data = s->data.data();
  s->w.scales = s->scales.empty() ? nullptr : s->scales.data();
}

// Rewrites the shard's scales for the configured scale format (see the
// scale_format toggle): fp32 and ue8m0 expand to fp32 with the global scale
// folded in; ue8m0_requant also rounds every scale up to a power of two and
// requantizes the block's values so value * scale is kept as closely as the
// element format allows.
void ConvertScales(LinearShard* s, ScaleFormat fmt) {
  if (s->w.scale_format == SFormat::kNone || fmt == ScaleFormat::kCheckpoint) return;
  // sglang's DEEPGEMM_SCALE_UE8M0: the FP8 block-scaled path requantizes its
  // scales to UE8M0 at load; nothing requantizes other formats' scales
  // (NVFP4's e4m3), which the UE8M0 kernels then read as they are.
  if (fmt == ScaleFormat::kDeepGemmUe8m0) {
    fmt = s->w.format == WFormat::kE4m3 ? ScaleFormat::kUe8m0Requant : ScaleFormat::kUe8m0;
  }
  QWeight& w = s->w;
  const int64_t sr = (w.rows + w.block_rows - 1) / w.block_rows;
  std::vector<float> f(sr * w.scale_cols);
  for (int64_t i = 0; i < sr; ++i)
    for (int64_t j = 0; j < w.scale_cols; ++j) f[i * w.scale_cols + j] = ScaleAt(w, i * w.block_rows, j * w.block_cols);
  if (fmt == ScaleFormat::kUe8m0Requant) {
    // The one transform that rewrites a weight: a view becomes a copy here.
    CompactRows(s);
    uint8_t* data = s->data.mutable_data();
    w.data = data;
    std::vector<float> pow2(f.size());
    for (size_t i = 0; i < f.size(); ++i) pow2[i] = f[i] == 0.0f ? 0.0f : E8m0ToFloat(FloatToUe8m0Ceil(f[i]));
    for (int64_t r = 0; r < w.rows; ++r) {
      for (int64_t c = 0; c < w.cols; ++c) {
        const int64_t si = ScaleIndex(w, r, c);
        if (pow2[si] == 0.0f || pow2[si] == f[si]) continue;
        const float v = RawAt(w, r, c) * f[si] / pow2[si];
        const int64_t i = r * w.cols + c;
        if (w.format == WFormat::kE4m3) {
          data[i] = FloatToE4m3(v);
        } else if (w.format == WFormat::kE2m1) {
          SetNibble(data, static_cast<uint64_t>(i), FloatToE2m1(v));
        }
      }
    }
    f = pow2;
  }
  s->scales = std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(f.data()),
                                   reinterpret_cast<const uint8_t*>(f.data() + f.size()));
  w.scale_format = SFormat::kF32;
  w.global_scale = 1.0f;
  SetViews(s);
}

class Builder : public WeightSource {
 public:
  Builder(const ModelSpec& spec, const TensorSet& t, const EngineConfig& cfg) : spec_(spec), t_(t), cfg_(cfg) {
    tp_ = cfg.tp_size;
    sharding_.num_kv_heads = spec.kv_heads;
    sharding_.num_experts = spec.num_experts;
    sharding_.expert_parallel = cfg.moe_parallel == MoeParallel::kExpert;
  }

  // The rank's shard of one tensor, cut by the shared sharding rules
  // (formats/sharding.h) and hashed as the capture side hashes it (its rows
  // packed). A shard that is one contiguous run of a mapped tensor (whole, or
  // whole rows) views the mapping. A column split of a mapped tensor views it
  // too when the caller can read strided rows (`row_stride_bytes` non-null:
  // set to the full row's bytes, 0 when the result is dense); otherwise it,
  // and a tensor made in memory, is copied.
  absl::StatusOr<TensorBytes> Shard(const std::string& name, const HostTensor& t, int rank,
                                    ShardSpec* spec_out = nullptr, ShardBlock* block_out = nullptr,
                                    uint64_t* row_stride_bytes = nullptr) {
    const ShardSpec spec = ShardingRuleFor(name, t.shape, tp_, rank, sharding_);
    CR_ASSIGN_OR_RETURN(ShardBlock b, ShardBlockFor(name, spec, t.shape, t.bytes.size()));
    if (spec.kind == ShardKind::kOwned) b.held = spec.owner == rank;  // whole tensor, one owner
    if (row_stride_bytes != nullptr) *row_stride_bytes = 0;
    TensorBytes out;
    if (b.held) {
      CR_ASSIGN_OR_RETURN(const TensorBytes bytes, t.bytes.Resolve());  // a deferred tensor is mapped here
      const uint64_t w = b.col_byte_end - b.col_byte_begin;
      const int64_t rows = b.row_end - b.row_begin;
      if (bytes.is_view() && w == b.row_bytes) {
        out = TensorBytes::View({bytes.data() + b.row_begin * b.row_bytes, b.bytes()}, bytes.owner());
      } else if (bytes.is_view() && row_stride_bytes != nullptr && rows > 0 && w > 0) {
        const uint64_t span = static_cast<uint64_t>(rows - 1) * b.row_bytes + w;
        out = TensorBytes::View({bytes.data() + b.row_begin * b.row_bytes + b.col_byte_begin, span}, bytes.owner());
        *row_stride_bytes = b.row_bytes;
      } else {
        std::vector<uint8_t> copy(b.bytes());
        for (int64_t r = b.row_begin; r < b.row_end; ++r) {
          std::memcpy(copy.data() + (r - b.row_begin) * w, bytes.data() + r * b.row_bytes + b.col_byte_begin, w);
        }
        out = std::move(copy);
      }
      if (hashes_ != nullptr) {
        Hash128 h;
        if (row_stride_bytes != nullptr && *row_stride_bytes != 0) {
          Hasher128 hasher;  // equals the hash of the packed rows
          for (int64_t r = 0; r < rows; ++r) hasher.Update(out.data() + r * b.row_bytes, w);
          h = hasher.Digest();
        } else {
          h = XXH128Of(out.data(), out.size());
        }
        (*hashes_)[rank][name] = ShardHash{h, b.bytes()};
      }
    }
    if (spec_out) *spec_out = spec;
    if (block_out) *block_out = b;
    return out;
  }

  // Loads rank `rank`'s shard of `base`.weight with its scales and bias.
  absl::StatusOr<LinearShard> Linear(const std::string& base, int rank) override {
    const std::string name = base + ".weight";
    CR_ASSIGN_OR_RETURN(const HostTensor* w, Get(t_, &resolved_, name));
    if (w->shape.size() != 2) return absl::InvalidArgumentError(Cat("tensor '", name, "' is not 2-D"));
    LinearShard out;
    QWeight& q = out.w;
    int bits = 16;
    bool per_tensor = false;  // one scale for the whole tensor (ModelOpt FP8)
    const HostTensor* scale = nullptr;
    std::string scale_name;
    switch (w->dtype) {
      case DType::kBF16: q.format = WFormat::kBF16; break;
      case DType::kF16: q.format = WFormat::kF16; break;
      case DType::kF32:
        q.format = WFormat::kF32;
        bits = 32;
        break;
      case DType::kF8E4M3: {
        q.format = WFormat::kE4m3;
        bits = 8;
        // DeepSeek-style block FP8 names its fp32 scales weight_scale_inv;
        // ModelOpt (FP8 per tensor, fp8_pb_wo blocks) names them weight_scale.
        scale_name = base + ".weight_scale_inv";
        if (t_.find(scale_name) == t_.end()) scale_name = base + ".weight_scale";
        CR_ASSIGN_OR_RETURN(scale, Get(t_, &resolved_, scale_name));
        q.scale_format = SFormat::kF32;
        q.block_rows = static_cast<int32_t>(spec_.quant_block_rows > 1 ? spec_.quant_block_rows : 128);
        q.block_cols = static_cast<int32_t>(spec_.quant_block_cols > 1 ? spec_.quant_block_cols : 128);
        per_tensor = spec_.quant == QuantKind::kFp8Tensor;
        if (per_tensor) {  // its input_scale is not applied (W8A16), but hashed as loaded
          auto in = t_.find(base + ".input_scale");
          if (in != t_.end()) CR_RETURN_IF_ERROR(Shard(in->first, in->second, rank).status());
        }
        break;
      }
      case DType::kU8: {
        q.format = WFormat::kE2m1;
        bits = 4;
        scale_name = base + ".weight_scale";
        CR_ASSIGN_OR_RETURN(scale, Get(t_, &resolved_, scale_name));
        if (scale->dtype == DType::kF8E4M3) {  // NVFP4 (ModelOpt)
          out.nvfp4 = true;
          q.scale_format = SFormat::kE4m3;
          q.block_cols = 16;
          CR_ASSIGN_OR_RETURN(const HostTensor* g, Get(t_, &resolved_, base + ".weight_scale_2"));
          q.global_scale = ScalarF32(*g);
          CR_RETURN_IF_ERROR(Shard(base + ".weight_scale_2", *g, rank).status());
          auto in = t_.find(base + ".input_scale");
          if (in != t_.end()) CR_RETURN_IF_ERROR(Shard(in->first, in->second, rank).status());
        } else {  // MXFP4: e8m0 bytes
          q.scale_format = SFormat::kE8m0;
          q.block_cols = 32;
        }
        break;
      }
      default:
        return absl::UnimplementedError(
            Cat("tensor '", name, "' has dtype ", DTypeName(w->dtype), ", which the engine does not load as a weight"));
    }
    ShardSpec spec;
    ShardBlock blk;
    uint64_t stride_bytes = 0;
    CR_ASSIGN_OR_RETURN(out.data, Shard(name, *w, rank, &spec, &blk, &stride_bytes));
    if (!blk.held) return absl::InternalError(Cat("rank ", rank, " does not hold '", name, "'"));
    q.rows = blk.row_end - blk.row_begin;
    q.cols = static_cast<int64_t>((blk.col_byte_end - blk.col_byte_begin) * 8 / bits);
    q.row_stride = static_cast<int64_t>(stride_bytes * 8 / bits);
    if (per_tensor) {  // the one scale block is the rank's whole shard
      q.block_rows = static_cast<int32_t>(q.rows);
      q.block_cols = static_cast<int32_t>(q.cols);
    }
    if (scale != nullptr) {
      ShardBlock sb;
      CR_ASSIGN_OR_RETURN(out.scales, Shard(scale_name, *scale, rank, nullptr, &sb));
      const int64_t sbytes = scale->dtype == DType::kF32 ? 4 : 1;
      q.scale_cols = static_cast<int64_t>((sb.col_byte_end - sb.col_byte_begin) / sbytes);
      // The rule cuts weight and scales into the same number of equal parts;
      // they stay aligned only when every part holds whole scale blocks.
      const int64_t want_rows = (q.rows + q.block_rows - 1) / q.block_rows;
      const int64_t want_cols = (q.cols + q.block_cols - 1) / q.block_cols;
      const bool aligned =
          spec.kind != ShardKind::kSplit || (spec.dim == 0 ? q.rows % q.block_rows == 0 || spec.parts == 1
                                                           : q.cols % q.block_cols == 0 || spec.parts == 1);
      if (!aligned || want_rows != sb.row_end - sb.row_begin || want_cols != q.scale_cols) {
        return absl::InvalidArgumentError(Cat("rank ", rank, "'s shard of '", name, "' (", q.rows, "x", q.cols,
                                              ") splits a ", q.block_rows, "x", q.block_cols,
                                              " scale block; use a tp_size that divides the blocks evenly"));
      }
    }
    auto bias_it = t_.find(base + ".bias");
    if (bias_it != t_.end()) {
      ShardSpec bspec;
      CR_ASSIGN_OR_RETURN(TensorBytes b, Shard(bias_it->first, bias_it->second, rank, &bspec));
      const bool f32 = bias_it->second.dtype == DType::kF32;
      for (size_t i = 0; i < b.size(); i += f32 ? 4 : 2) {
        float v;
        if (f32) {
          std::memcpy(&v, b.data() + i, 4);
        } else {
          uint16_t h;
          std::memcpy(&h, b.data() + i, 2);
          v = bias_it->second.dtype == DType::kF16 ? Fp16ToFloat(h) : Bf16ToFloat(h);
        }
        out.bias.push_back(v);
      }
      // A row-parallel layer's bias is replicated; it is added once, on rank 0.
      if (spec.kind == ShardKind::kSplit && spec.dim == 1 && rank != 0) out.bias.assign(out.bias.size(), 0.0f);
    }
    SetViews(&out);
    // Device bytes: UE8M0 scales live packed, one byte each (DeepGEMM's
    // layout), whatever the host copy holds.
    const size_t stored_scales = out.scales.size();
    ConvertScales(&out, cfg_.scale_format);
    const bool ue8m0 = cfg_.scale_format == ScaleFormat::kUe8m0 || cfg_.scale_format == ScaleFormat::kUe8m0Requant ||
                       cfg_.scale_format == ScaleFormat::kDeepGemmUe8m0;
    size_t scale_bytes = out.scales.size();
    if (ue8m0 && out.w.scale_format == SFormat::kF32 && stored_scales != 0) scale_bytes = out.scales.size() / 4;
    (*bytes_)[rank] += out.data_bytes() + scale_bytes + out.bias.size() * 4;
    return out;
  }

  absl::StatusOr<std::vector<float>> Vector(const std::string& name, int64_t n) override {
    CR_ASSIGN_OR_RETURN(const HostTensor* t, Get(t_, &resolved_, name));
    for (int r = 0; r < tp_; ++r) CR_RETURN_IF_ERROR(Shard(name, *t, r).status());
    std::vector<float> v(n);
    if (t->bytes.size() != DTypeBytes(t->dtype, n)) {
      return absl::InvalidArgumentError(Cat("tensor '", name, "' should have ", n, " elements"));
    }
    for (int64_t i = 0; i < n; ++i) {
      if (t->dtype == DType::kF32) {
        std::memcpy(&v[i], t->bytes.data() + 4 * i, 4);
      } else {
        uint16_t b;
        std::memcpy(&b, t->bytes.data() + 2 * i, 2);
        v[i] = t->dtype == DType::kF16 ? Fp16ToFloat(b) : Bf16ToFloat(b);
      }
    }
    return v;
  }

  // The input_scale that the NVFP4 layers `bases` quantize their (shared)
  // input with under w4a4: the max over them, NaN-propagating, as engines
  // take it for fused q/k/v and gate/up and for an MoE layer's experts.
  absl::StatusOr<float> GroupInputScale(const std::vector<std::string>& bases) override {
    float m = 0.0f;
    for (size_t i = 0; i < bases.size(); ++i) {
      const std::string name = bases[i] + ".input_scale";
      if (t_.find(name) == t_.end()) {
        return absl::NotFoundError(Cat("checkpoint has no tensor '", name, "', so NVFP4 layer '", bases[i],
                                       "' cannot quantize its input (nvfp4_activation=w4a4); a weight-only "
                                       "checkpoint runs with --set nvfp4_activation=w4a16"));
      }
      CR_ASSIGN_OR_RETURN(const HostTensor* t, Get(t_, &resolved_, name));
      if (t->dtype != DType::kF32 || t->bytes.size() != 4) {
        return absl::InvalidArgumentError(Cat("tensor '", name, "' should hold one fp32 value; it has dtype ",
                                              DTypeName(t->dtype), " and ", t->bytes.size(), " bytes"));
      }
      const float v = ScalarF32(*t);
      if (i == 0 || (m == m && (v != v || v > m))) m = v;
    }
    return m;
  }

  // Lets go of the deferred tensors read so far (the shards built from them
  // keep what they view alive).
  void ForgetResolved() { resolved_.clear(); }

  std::vector<std::map<std::string, ShardHash>>* hashes_ = nullptr;
  std::vector<uint64_t>* bytes_ = nullptr;

 private:
  std::map<std::string, HostTensor> resolved_;
  const ModelSpec& spec_;
  const TensorSet& t_;
  const EngineConfig& cfg_;
  int tp_ = 1;
  ShardingModel sharding_;
};

// w4a4: marks every NVFP4 linear of the layer as taking a quantized input and
// gives it the input_scale of its group (the layers that read the same
// activation: q/k/v, gate/up, an MoE layer's gate/up of every expert, its
// down of every expert, a shared expert's gate/up; o and dense down alone).
// Every rank gets the same scale, as every rank of a real deployment loads it.
}  // namespace

absl::Status SetGroupActivationScale(WeightSource& b, const std::vector<LinearShard*>& shards,
                                     const std::vector<std::string>& bases) {
  std::vector<std::string> quantized;
  for (size_t i = 0; i < bases.size(); ++i) {
    if (shards[i]->nvfp4) quantized.push_back(bases[i]);
  }
  if (quantized.empty()) return absl::OkStatus();
  CR_ASSIGN_OR_RETURN(const float scale, b.GroupInputScale(quantized));
  for (LinearShard* s : shards) {
    if (!s->nvfp4) continue;
    s->w.act_fp4 = true;
    s->w.act_scale = scale;
  }
  return absl::OkStatus();
}

namespace {

absl::Status SetActivationScales(Builder& b, const ModelSpec& spec, const LayerNames& n, Layer* layer) {
  auto strip = [](const std::string& s) { return s.substr(0, s.size() - 7); };  // ".weight"
  auto group = [&](const std::vector<LinearShard*>& shards, const std::vector<std::string>& bases) {
    return SetGroupActivationScale(b, shards, bases);
  };
  const std::string a = n.prefix + "self_attn.";
  for (RankLayer& rl : layer->ranks) {
    if (!spec.mla.enabled()) {  // MLA: LoadMlaAttention sets its own groups
      CR_RETURN_IF_ERROR(group({&rl.q, &rl.k, &rl.v}, {a + "q_proj", a + "k_proj", a + "v_proj"}));
      CR_RETURN_IF_ERROR(group({&rl.o}, {a + "o_proj"}));
    }
    if (!layer->moe) {
      CR_RETURN_IF_ERROR(group({&rl.gate, &rl.up}, {n.prefix + "mlp.gate_proj", n.prefix + "mlp.up_proj"}));
      CR_RETURN_IF_ERROR(group({&rl.down}, {n.prefix + "mlp.down_proj"}));
      continue;
    }
    // One scale per MoE layer and GEMM over all experts (not only this
    // rank's), as FlashInfer's and CUTLASS's fused MoE take the max, so the
    // input is quantized once before dispatch.
    std::vector<std::string> up_bases, down_bases;
    for (int64_t j = 0; j < spec.num_experts; ++j) {
      up_bases.push_back(strip(n.expert(j, "gate")));
      up_bases.push_back(strip(n.expert(j, "up")));
      down_bases.push_back(strip(n.expert(j, "down")));
    }
    std::vector<LinearShard*> ups, downs;
    for (ExpertShard& e : rl.experts) {
      ups.push_back(&e.gate);
      ups.push_back(&e.up);
      downs.push_back(&e.down);
    }
    if (!ups.empty() && ups[0]->nvfp4) {
      CR_ASSIGN_OR_RETURN(const float s13, b.GroupInputScale(up_bases));
      CR_ASSIGN_OR_RETURN(const float s2, b.GroupInputScale(down_bases));
      for (LinearShard* s : ups) {
        s->w.act_fp4 = s->nvfp4;
        s->w.act_scale = s13;
      }
      for (LinearShard* s : downs) {
        s->w.act_fp4 = s->nvfp4;
        s->w.act_scale = s2;
      }
    }
    if (rl.has_shared) {
      CR_RETURN_IF_ERROR(group({&rl.shared.gate, &rl.shared.up}, {strip(n.shared("gate")), strip(n.shared("up"))}));
      CR_RETURN_IF_ERROR(group({&rl.shared.down}, {strip(n.shared("down"))}));
    }
  }
  return absl::OkStatus();
}

absl::Status Divides(int64_t n, int tp, const char* what) {
  if (n % tp != 0) {
    return absl::InvalidArgumentError(Cat(what, " (", n, ") is not divisible by tp_size ", tp));
  }
  return absl::OkStatus();
}

// The shards layer streaming loads before a layer runs and releases after:
// every rank's attention, MLP and expert weights and MLA's replicated
// projections, in a fixed order. Norms, routers and biases stay resident.
template <typename F>
void ForEachStreamedShard(Layer& L, F f) {
  for (RankLayer& r : L.ranks) {
    for (LinearShard* s : {&r.q, &r.k, &r.v, &r.o, &r.kv_b, &r.gate, &r.up, &r.down}) f(*s);
    for (ExpertShard& e : r.experts) {
      f(e.gate);
      f(e.up);
      f(e.down);
    }
    if (r.has_shared) {
      f(r.shared.gate);
      f(r.shared.up);
      f(r.shared.down);
    }
  }
  for (LinearShard* s : {&L.mla.q_a, &L.mla.kv_a, &L.mla.index_wq_b, &L.mla.index_wk, &L.mla.index_weights}) f(*s);
}

// Drops a shard's bytes (its mapping or copy), keeping its shape, format,
// scales' layout and activation scale: what lowering reads.
void ReleaseShard(LinearShard* s) {
  s->data = TensorBytes();
  s->scales = TensorBytes();
  s->w.data = nullptr;
  s->w.scales = nullptr;
}

// Layer `l`: norms, router, every rank's attention and MLP/expert shards,
// hashed into `hashes` by the builder (and the replicated router copied to
// every rank's table).
absl::StatusOr<Layer> BuildLayer(Builder& b, const ModelSpec& spec, const EngineConfig& cfg, const TensorSet& tensors,
                                 int64_t l, std::vector<std::map<std::string, ShardHash>>* hashes) {
  const int tp = cfg.tp_size;
  const int64_t H = spec.hidden, hd = spec.head_dim;
  const LayerNames n = NamesFor(spec, l);
  Layer layer;
  CR_ASSIGN_OR_RETURN(layer.input_norm, b.Vector(n.prefix + "input_layernorm.weight", H));
  CR_ASSIGN_OR_RETURN(layer.post_norm, b.Vector(n.prefix + "post_attention_layernorm.weight", H));
  if (spec.qk_norm) {
    CR_ASSIGN_OR_RETURN(layer.q_norm, b.Vector(n.prefix + "self_attn.q_norm.weight", hd));
    CR_ASSIGN_OR_RETURN(layer.k_norm, b.Vector(n.prefix + "self_attn.k_norm.weight", hd));
  }
  if (spec.attention_sinks) {
    CR_ASSIGN_OR_RETURN(layer.sinks, b.Vector(n.sinks(), spec.heads));
  }
  layer.moe = spec.layer_is_moe(l);
  if (layer.moe) {
    const std::string router = n.router();
    const std::string router_bias = router.substr(0, router.size() - 7) + ".bias";
    CR_ASSIGN_OR_RETURN(layer.router, b.Linear(router.substr(0, router.size() - 7), 0));
    for (int r = 1; r < tp; ++r) {
      (*hashes)[r][router] = (*hashes)[0][router];
      if (!layer.router.bias.empty()) (*hashes)[r][router_bias] = (*hashes)[0][router_bias];
    }
    if (spec.scoring == "sigmoid" && tensors.count(n.bias())) {
      CR_ASSIGN_OR_RETURN(layer.correction_bias, b.Vector(n.bias(), spec.num_experts));
    }
  }
  const std::string a = n.prefix + "self_attn.";
  for (int r = 0; r < tp; ++r) {
    RankLayer rl;
    if (!spec.mla.enabled()) {  // MLA attention: LoadMlaAttention below
      CR_ASSIGN_OR_RETURN(rl.q, b.Linear(a + "q_proj", r));
      CR_ASSIGN_OR_RETURN(rl.k, b.Linear(a + "k_proj", r));
      CR_ASSIGN_OR_RETURN(rl.v, b.Linear(a + "v_proj", r));
      CR_ASSIGN_OR_RETURN(rl.o, b.Linear(a + "o_proj", r));
    }
    auto strip = [](const std::string& s) { return s.substr(0, s.size() - 7); };  // ".weight"
    if (!layer.moe) {
      CR_ASSIGN_OR_RETURN(rl.gate, b.Linear(n.prefix + "mlp.gate_proj", r));
      CR_ASSIGN_OR_RETURN(rl.up, b.Linear(n.prefix + "mlp.up_proj", r));
      CR_ASSIGN_OR_RETURN(rl.down, b.Linear(n.prefix + "mlp.down_proj", r));
    } else {
      const bool ep = cfg.moe_parallel == MoeParallel::kExpert;
      const int64_t e_per = ep ? spec.num_experts / tp : spec.num_experts;
      rl.expert_begin = ep ? r * e_per : 0;
      for (int64_t j = rl.expert_begin; j < rl.expert_begin + e_per; ++j) {
        ExpertShard e;
        CR_ASSIGN_OR_RETURN(e.gate, b.Linear(strip(n.expert(j, "gate")), r));
        CR_ASSIGN_OR_RETURN(e.up, b.Linear(strip(n.expert(j, "up")), r));
        CR_ASSIGN_OR_RETURN(e.down, b.Linear(strip(n.expert(j, "down")), r));
        rl.experts.push_back(std::move(e));
      }
      if (spec.n_shared_experts > 0) {
        const int64_t si = spec.moe_intermediate * spec.n_shared_experts;
        CR_RETURN_IF_ERROR(Divides(si, tp, "shared expert intermediate size"));
        rl.has_shared = true;
        CR_ASSIGN_OR_RETURN(rl.shared.gate, b.Linear(strip(n.shared("gate")), r));
        CR_ASSIGN_OR_RETURN(rl.shared.up, b.Linear(strip(n.shared("up")), r));
        CR_ASSIGN_OR_RETURN(rl.shared.down, b.Linear(strip(n.shared("down")), r));
      }
    }
    layer.ranks.push_back(std::move(rl));
  }
  if (spec.mla.enabled()) CR_RETURN_IF_ERROR(LoadMlaAttention(b, spec, cfg, l, &layer));
  // A weight-only checkpoint (W4A16_NVFP4) has no input_scale to quantize with.
  if (cfg.nvfp4_activation == Nvfp4Activation::kW4a4 && !spec.quant_weight_only) {
    CR_RETURN_IF_ERROR(SetActivationScales(b, spec, n, &layer));
  }
  return layer;
}

}  // namespace

// What a streaming model keeps to build its layers again: its own copies of
// the spec, configuration and tensor table (the tensors are deferred, so a
// copy is names, shapes and handles) and a builder over them.
struct LayerStream {
  LayerStream(const ModelSpec& s, const TensorSet& t, const EngineConfig& c)
      : spec(s), tensors(t), cfg(c), builder(spec, tensors, cfg) {}
  ModelSpec spec;
  TensorSet tensors;
  EngineConfig cfg;
  Builder builder;
  int64_t loaded = -1;
};

absl::Status LoadLayerWeights(Model& m, int64_t l) {
  if (!m.stream) return absl::OkStatus();
  LayerStream& st = *m.stream;
  if (st.loaded == l) return absl::OkStatus();
  if (st.loaded >= 0) ReleaseLayerWeights(m, st.loaded);
  if (l < 0) return absl::OkStatus();
  if (l >= static_cast<int64_t>(m.layers.size())) return absl::OutOfRangeError(Cat("no layer ", l));
  // Not hashed again: reading every byte of a layer (all its experts) to
  // hash it would cost a decode step many times the bytes it uses. The
  // files are checked instead (size and modification time, at every map:
  // formats' OpenFile), so bytes changed since the load are an error.
  std::vector<std::map<std::string, ShardHash>> replicated(m.tp);  // the router's copies, unused
  std::vector<uint64_t> bytes(m.tp, 0);
  st.builder.hashes_ = nullptr;
  st.builder.bytes_ = &bytes;
  absl::StatusOr<Layer> fresh = BuildLayer(st.builder, st.spec, st.cfg, st.tensors, l, &replicated);
  st.builder.ForgetResolved();
  if (!fresh.ok()) return fresh.status();
  std::vector<LinearShard*> into, from;
  ForEachStreamedShard(m.layers[l], [&](LinearShard& s) { into.push_back(&s); });
  ForEachStreamedShard(*fresh, [&](LinearShard& s) { from.push_back(&s); });
  if (into.size() != from.size()) return absl::InternalError(Cat("layer ", l, " was built with another structure"));
  for (size_t i = 0; i < into.size(); ++i) *into[i] = std::move(*from[i]);
  st.loaded = l;
  return absl::OkStatus();
}

void ReleaseLayerWeights(Model& m, int64_t l) {
  if (!m.stream || l < 0 || l >= static_cast<int64_t>(m.layers.size())) return;
  ForEachStreamedShard(m.layers[l], [](LinearShard& s) { ReleaseShard(&s); });
  if (m.stream->loaded == l) m.stream->loaded = -1;
}

absl::StatusOr<std::unique_ptr<Model>> BuildModel(const ModelSpec& spec, const TensorSet& tensors,
                                                  const EngineConfig& cfg, BuildOptions options) {
  auto m = std::make_unique<Model>();
  m->spec = spec;
  const int tp = cfg.tp_size;
  m->tp = tp;
  CR_RETURN_IF_ERROR(Divides(spec.heads, tp, "attention heads"));
  CR_RETURN_IF_ERROR(Divides(spec.vocab, tp, "vocabulary size"));
  if (spec.kv_heads >= tp) {
    CR_RETURN_IF_ERROR(Divides(spec.kv_heads, tp, "KV heads"));
  } else if (tp % spec.kv_heads != 0) {
    return absl::InvalidArgumentError(Cat("tp_size ", tp, " is not a multiple of the ", spec.kv_heads, " KV heads"));
  }
  m->heads_local = spec.heads / tp;
  m->kv_heads_local = spec.kv_heads >= tp ? spec.kv_heads / tp : 1;
  m->vocab_local = spec.vocab / tp;
  m->shard_hashes.resize(tp);
  m->rank_weight_bytes.assign(tp, 0);
  Builder b(spec, tensors, cfg);
  b.hashes_ = options.hash ? &m->shard_hashes : nullptr;
  b.bytes_ = &m->rank_weight_bytes;
  const int64_t H = spec.hidden, hd = spec.head_dim;

  // Streaming keeps the resident part (embedding, lm_head, routers) in
  // memory of its own rather than as views: it is a small part of the model,
  // and a checkpoint rewritten during the replay is then caught at the next
  // layer load (its hashes) instead of faulting on a page of the file.
  auto own = [&](LinearShard* s) {
    if (!options.stream) return;
    CompactRows(s);
    s->data.mutable_data();
    s->scales.mutable_data();
    SetViews(s);
    b.ForgetResolved();  // the copy is all that is left of the tensor
  };
  CR_ASSIGN_OR_RETURN(m->embed, b.Linear("model.embed_tokens", 0));
  own(&m->embed);
  for (int r = 1; r < tp; ++r) {  // replicated: every rank holds (and hashes) it
    m->rank_weight_bytes[r] += m->embed.bytes();
    if (options.hash) m->shard_hashes[r]["model.embed_tokens.weight"] = m->shard_hashes[0]["model.embed_tokens.weight"];
  }
  CR_ASSIGN_OR_RETURN(m->final_norm, b.Vector("model.norm.weight", H));
  const std::string head = tensors.count("lm_head.weight") ? "lm_head" : "model.embed_tokens";
  for (int r = 0; r < tp; ++r) {
    CR_ASSIGN_OR_RETURN(LinearShard s, b.Linear(head, r));
    own(&s);
    m->lm_head.push_back(std::move(s));
  }
  if (!spec.is_moe() || spec.first_k_dense > 0) CR_RETURN_IF_ERROR(Divides(spec.intermediate, tp, "intermediate size"));
  m->intermediate_local = spec.intermediate / tp;
  if (spec.is_moe()) {
    if (cfg.moe_parallel == MoeParallel::kTensor) {
      CR_RETURN_IF_ERROR(Divides(spec.moe_intermediate, tp, "moe_intermediate_size"));
      m->moe_intermediate_local = spec.moe_intermediate / tp;
    } else {
      CR_RETURN_IF_ERROR(Divides(spec.num_experts, tp, "experts (moe_parallel=expert)"));
      m->moe_intermediate_local = spec.moe_intermediate;
    }
  }

  if (options.stream) {
    m->stream = std::make_shared<LayerStream>(spec, tensors, cfg);
    m->stream->builder.hashes_ = options.hash ? &m->shard_hashes : nullptr;
    m->stream->builder.bytes_ = &m->rank_weight_bytes;
  }
  Builder& lb = m->stream ? m->stream->builder : b;
  for (int64_t l = 0; l < spec.layers; ++l) {
    CR_ASSIGN_OR_RETURN(Layer layer, BuildLayer(lb, spec, cfg, tensors, l, &m->shard_hashes));
    if (m->stream) {
      // Read and hashed; what the step needs of it is loaded again when it runs.
      ForEachStreamedShard(layer, [](LinearShard& s) { ReleaseShard(&s); });
      own(&layer.router);
      lb.ForgetResolved();
    }
    m->layers.push_back(std::move(layer));
  }

  if (!options.hash) m->shard_hashes.assign(tp, {});  // no entries (the router's replicated copies)

  // RoPE: the file as transformers 5 reads it, or one form only (rope_config);
  // ChooseRope says when that ignores keys the file has.
  RopeChoice rope = ChooseRope(spec, cfg.rope_config);
  m->rope = ComputeRope(rope.rope, hd, spec.partial_rotary_factor);
  m->rope.from_default = rope.from_default;
  if (!rope.note.empty()) m->notes.push_back(std::move(rope.note));

  const bool ue8m0 = cfg.scale_format == ScaleFormat::kUe8m0 || cfg.scale_format == ScaleFormat::kDeepGemmUe8m0;
  m->dense_dot = ue8m0                                                ? DotKind::kUe8m0
                 : cfg.gemm_backend == GemmBackend::kFusedBlockScaled ? DotKind::kFused
                                                                      : DotKind::kDequant;
  m->moe_dot = ue8m0                                               ? DotKind::kUe8m0
               : cfg.moe_backend == GemmBackend::kFusedBlockScaled ? DotKind::kFused
                                                                   : DotKind::kDequant;
  return m;
}

absl::Status VerifyShardHashes(const Model& m, const std::vector<std::map<std::string, Hash128>>& recorded) {
  if (recorded.size() != m.shard_hashes.size()) {
    return absl::FailedPreconditionError(Cat("the recording has ", recorded.size(), " ranks, this replay shards for ",
                                             m.shard_hashes.size(), "; replay with --set tp_size=", recorded.size()));
  }
  for (size_t r = 0; r < recorded.size(); ++r) {
    for (const auto& [name, hash] : recorded[r]) {
      auto it = m.shard_hashes[r].find(name);
      if (it == m.shard_hashes[r].end()) {
        return absl::NotFoundError(
            Cat("rank ", r, ": the recording hashed tensor '", name, "', the checkpoint has no such shard"));
      }
      if (it->second.hash != hash) {
        return absl::DataLossError(Cat("rank ", r, " tensor '", name, "': shard hash ", it->second.hash.Hex(),
                                       " but the recording has ", hash.Hex(), "; is this the recorded checkpoint?"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace crashreplay::replay
