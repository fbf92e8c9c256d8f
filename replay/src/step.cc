#include "crashreplay/replay/step.h"

#include <chrono>
#include <cmath>
#include <cstring>

#include "crashreplay/replay/kernels/act_quant.h"
#include "crashreplay/replay/kernels/elementwise.h"
#include "crashreplay/replay/kernels/expert.h"
#include "crashreplay/replay/kernels/router.h"
#include "text_util.h"

namespace crashreplay::replay {

using text::Cat;

const char* ForwardModeName(ForwardMode m) { return m == ForwardMode::kPrefill ? "prefill" : "decode"; }

KvCache::KvCache(const Model& m, const EngineConfig& c, int64_t pages)
    : pages_(pages),
      page_size_(c.page_size),
      fp8_(c.kv_cache_dtype == KvCacheDType::kFp8E4m3),
      kv_heads_(m.kv_heads_local),
      head_dim_(m.spec.head_dim),
      tp_(m.tp) {
  const size_t bytes = static_cast<size_t>(pages) * page_size_ * kv_heads_ * head_dim_ * (fp8_ ? 1 : 2);
  k_.assign(m.spec.layers * tp_, std::vector<uint8_t>(bytes, 0));
  v_.assign(m.spec.layers * tp_, std::vector<uint8_t>(bytes, 0));
}

KvPoolView KvCache::View(int64_t layer, int rank) {
  const size_t i = layer * tp_ + rank;
  return KvPoolView{k_[i].data(), v_[i].data(), fp8_, pages_, page_size_, static_cast<int32_t>(kv_heads_),
                    static_cast<int32_t>(head_dim_)};
}

size_t KvCache::page_bytes() const {
  return static_cast<size_t>(page_size_) * kv_heads_ * head_dim_ * (fp8_ ? 1 : 2);
}

void KvCache::CopyPages(const std::vector<int32_t>& pages, std::vector<uint8_t>* k, std::vector<uint8_t>* v) const {
  const size_t pb = page_bytes();
  k->resize(k_.size() * pages.size() * pb);
  v->resize(v_.size() * pages.size() * pb);
  for (size_t plane = 0; plane < k_.size(); ++plane) {
    for (size_t i = 0; i < pages.size(); ++i) {
      const size_t dst = (plane * pages.size() + i) * pb, src = static_cast<size_t>(pages[i]) * pb;
      std::memcpy(k->data() + dst, k_[plane].data() + src, pb);
      std::memcpy(v->data() + dst, v_[plane].data() + src, pb);
    }
  }
}

void KvCache::WritePages(const std::vector<int32_t>& pages, const std::vector<uint8_t>& k,
                         const std::vector<uint8_t>& v) {
  const size_t pb = page_bytes();
  for (size_t plane = 0; plane < k_.size(); ++plane) {
    for (size_t i = 0; i < pages.size(); ++i) {
      const size_t src = (plane * pages.size() + i) * pb, dst = static_cast<size_t>(pages[i]) * pb;
      std::memcpy(k_[plane].data() + dst, k.data() + src, pb);
      std::memcpy(v_[plane].data() + dst, v.data() + src, pb);
    }
  }
}

namespace {
constexpr int64_t kRowChunk = 32;

// A linear's input buffers: the float activation, or its NVFP4 values and scales.
std::vector<std::string> Fp4Inputs(const std::string& plain, const std::string& fp4) {
  if (fp4.empty()) return {plain};
  return {fp4, fp4 + "_scale"};
}

// Scratch for one work item of a host launch (thread-local, reused).
float* Scratch(size_t n) {
  thread_local std::vector<float> s;
  if (s.size() < n) s.resize(n);
  return s.data();
}
}  // namespace

StepProgram::StepProgram(const Model& model, const EngineConfig& config, KvCache* kv, CpuPool* pool, StepInput input)
    : m_(model), cfg_(config), kv_(kv), pool_(pool), input_(std::move(input)) {
  for (size_t r = 0; r < input_.rows.size(); ++r) {
    const StepRow& row = input_.rows[r];
    for (size_t j = 0; j < row.tokens.size(); ++j) {
      token_row_.push_back(static_cast<int64_t>(r));
      token_pos_.push_back(row.start_pos + static_cast<int64_t>(j));
    }
    row_last_.push_back(static_cast<int64_t>(token_row_.size()) - 1);
  }
  T_ = static_cast<int64_t>(token_row_.size());
  R_ = static_cast<int64_t>(input_.rows.size());
  Build();
}

Buffer& StepProgram::Alloc(const std::string& name, std::vector<int64_t> shape, bool is_int) {
  Buffer& b = buffers_[name];
  b.is_int = is_int;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  b.shape = std::move(shape);
  if (is_int) {
    b.i.assign(n, 0);
  } else {
    b.f.assign(n, 0.0f);
  }
  return b;
}

void StepProgram::Add(std::string name, int layer, std::vector<std::string> in, std::vector<std::string> out,
                      int64_t tokens_per_rank, std::function<KernelStatus()> launch) {
  kernels_.push_back(KernelCall{std::move(name), layer, std::move(in), std::move(out), tokens_per_rank,
                                std::move(launch)});
}

Buffer& StepProgram::AllocBytes(const std::string& name, std::vector<int64_t> shape) {
  Buffer& b = buffers_[name];
  b.is_bytes = true;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  b.shape = std::move(shape);
  b.u8.assign(n, 0);
  return b;
}

const Buffer* StepProgram::buffer(const std::string& name) const {
  auto it = buffers_.find(name);
  return it == buffers_.end() ? nullptr : &it->second;
}

KernelStatus StepProgram::LaunchLinear(const std::vector<const LinearShard*>& shards, DotKind dot,
                                       const std::string& in, bool in_per_rank, const std::string& out,
                                       int64_t tokens, const std::string& in_fp4) {
  const int64_t rows = shards[0]->w.rows, cols = shards[0]->w.cols;
  const int64_t chunks = (rows + kRowChunk - 1) / kRowChunk;
  const float* x = F(in);
  float* y = F(out);
  const uint8_t* qv = in_fp4.empty() ? nullptr : U8(in_fp4);
  const uint8_t* qs = in_fp4.empty() ? nullptr : U8(in_fp4 + "_scale");
  const int64_t vb = Nvfp4ActValueBytes(cols), sb = Nvfp4ActScaleBytes(cols);
  const int64_t ranks = static_cast<int64_t>(shards.size());
  return pool_->Launch(ranks * tokens * chunks, [=](int64_t item, KernelStatus* st) {
    const int64_t rt = item / chunks, chunk = item % chunks;
    const int64_t r = rt / tokens, t = rt % tokens;
    const LinearShard& s = *shards[r];
    const int64_t xr = in_per_rank ? rt : t;
    const float* xi = x + xr * cols;
    const bool quantized = qv != nullptr && s.w.act_fp4;
    const QWeight xq = quantized ? Nvfp4ActRow(qv + xr * vb, qs + xr * sb, cols, s.w.act_scale) : QWeight{};
    float* yo = y + rt * rows;
    const int64_t r1 = std::min(rows, (chunk + 1) * kRowChunk);
    for (int64_t row = chunk * kRowChunk; row < r1; ++row) {
      float v = quantized ? LinearElementQ(dot, s.w, xq, row, rt, st) : LinearElement(dot, s.w, xi, row, rt, st);
      if (!s.bias.empty()) v += s.bias[row];
      yo[row] = v;
    }
  });
}

std::string StepProgram::AddActQuant(const std::string& name, int layer, const std::vector<const LinearShard*>& shards,
                                     const std::string& in, int64_t rows, int64_t cols, int64_t tokens_per_rank,
                                     const std::string& out) {
  if (shards.empty() || !shards[0]->w.act_fp4) return "";
  const std::string scales = out + "_scale";
  if (buffers_.find(out) == buffers_.end()) {
    std::vector<int64_t> lead{rows};
    if (tokens_per_rank > 0) lead = {rows / tokens_per_rank, tokens_per_rank};
    std::vector<int64_t> vshape = lead, sshape = lead;
    vshape.push_back(Nvfp4ActValueBytes(cols));
    sshape.push_back(Nvfp4ActScaleBytes(cols));
    AllocBytes(out, vshape);
    AllocBytes(scales, sshape);
  }
  const float scale = shards[0]->w.act_scale;
  Add(name, layer, {in}, {out, scales}, tokens_per_rank, [this, in, out, scales, rows, cols, scale] {
    const float* x = F(in);
    uint8_t* v = U8(out);
    uint8_t* sc = U8(scales);
    const int64_t vb = Nvfp4ActValueBytes(cols), sb = Nvfp4ActScaleBytes(cols);
    return pool_->Launch(rows, [=](int64_t r, KernelStatus* st) {
      QuantizeNvfp4ActRow(x + r * cols, cols, scale, v + r * vb, sc + r * sb, r, st);
    });
  });
  return out;
}

void StepProgram::Build() {
  const ModelSpec& s = m_.spec;
  const int N = m_.tp;
  const int64_t T = T_, R = R_, H = s.hidden, hd = s.head_dim;
  const int64_t qd = m_.heads_local * hd, kvd = m_.kv_heads_local * hd;
  const float eps = static_cast<float>(s.rms_eps);
  const bool decode = input_.mode == ForwardMode::kDecode;

  Buffer& ids = Alloc("input_ids", {T}, true);
  Buffer& pos = Alloc("positions", {T}, true);
  for (int64_t t = 0, k = 0; t < R; ++t)
    for (int32_t tok : input_.rows[t].tokens) ids.i[k++] = tok;
  for (int64_t t = 0; t < T; ++t) pos.i[t] = static_cast<int32_t>(token_pos_[t]);
  Alloc("hidden", {T, H});
  Alloc("x", {T, H});
  Alloc("q", {N, T, qd});
  Alloc("k", {N, T, kvd});
  Alloc("v", {N, T, kvd});
  Alloc("attn", {N, T, qd});
  Alloc("partial", {N, T, H});
  Alloc("gate", {N, T, std::max<int64_t>(m_.intermediate_local, 1)});
  Alloc("up", {N, T, std::max<int64_t>(m_.intermediate_local, 1)});
  Alloc("act", {N, T, std::max<int64_t>(m_.intermediate_local, 1)});
  if (s.is_moe()) {
    Alloc("router_logits", {T, s.num_experts});
    Alloc("topk_ids", {T, s.experts_per_tok}, true);
    Alloc("topk_weights", {T, s.experts_per_tok});
  }
  Alloc("last_hidden", {R, H});
  Alloc("logits_local", {N, R, m_.vocab_local});
  Alloc("logits", {R, s.vocab});
  Alloc("probs", {R, s.vocab});
  Alloc("next_tokens", {R}, true);

  auto rank_shards = [&](auto member, int64_t l) {
    std::vector<const LinearShard*> v;
    for (int r = 0; r < N; ++r) v.push_back(&(m_.layers[l].ranks[r].*member));
    return v;
  };
  // hidden += sum over ranks of partial (all-gather, then a fixed-order sum).
  auto reduce = [this, N, T, H]() {
    float* h = F("hidden");
    const float* p = F("partial");
    const int64_t n = T * H;
    return pool_->Launch((n + 255) / 256, [=](int64_t item, KernelStatus*) {
      for (int64_t i = item * 256; i < std::min(n, item * 256 + 256); ++i) h[i] = h[i] + FixedOrderSum(p, N, n, i);
    });
  };

  Add("embedding", -1, {"input_ids"}, {"hidden"}, 0, [this, T, H] {
    const int32_t* tok = I("input_ids");
    float* h = F("hidden");
    return pool_->Launch(T, [=, this](int64_t t, KernelStatus* st) { EmbeddingRow(m_.embed.w, tok[t], h + t * H, t, st); });
  });

  for (int64_t l = 0; l < s.layers; ++l) {
    const Layer& L = m_.layers[l];
    Add("input_norm", l, {"hidden"}, {"x"}, 0, [this, &L, T, H, eps] {
      const float* h = F("hidden");
      float* x = F("x");
      return pool_->Launch(T, [=, &L](int64_t t, KernelStatus*) { RmsNormRow(h + t * H, L.input_norm.data(), H, eps, x + t * H); });
    });
    const std::string qkv_fp4 = AddActQuant("qkv_act_quant", l, rank_shards(&RankLayer::q, l), "x", T, H, 0, "x_fp4");
    for (const char* p : {"q", "k", "v"}) {
      auto member = p[0] == 'q' ? &RankLayer::q : p[0] == 'k' ? &RankLayer::k : &RankLayer::v;
      auto shards = rank_shards(member, l);
      const std::string out = p;
      Add(Cat(p, "_proj"), l, Fp4Inputs("x", qkv_fp4), {out}, T, [this, shards, out, T, qkv_fp4] {
        return LaunchLinear(shards, m_.dense_dot, "x", false, out, T, qkv_fp4);
      });
    }
    if (s.qk_norm) {
      Add("qk_norm", l, {"q", "k"}, {"q", "k"}, T, [this, &L, N, T, qd, kvd, hd, eps] {
        float* q = F("q");
        float* k = F("k");
        return pool_->Launch(N * T, [=, &L](int64_t rt, KernelStatus*) {
          for (int64_t h = 0; h < qd / hd; ++h) RmsNormRow(q + rt * qd + h * hd, L.q_norm.data(), hd, eps, q + rt * qd + h * hd);
          for (int64_t h = 0; h < kvd / hd; ++h) RmsNormRow(k + rt * kvd + h * hd, L.k_norm.data(), hd, eps, k + rt * kvd + h * hd);
        });
      });
    }
    Add("rope", l, {"q", "k", "positions"}, {"q", "k"}, T, [this, N, T, qd, kvd, hd] {
      float* q = F("q");
      float* k = F("k");
      const int32_t* p = I("positions");
      return pool_->Launch(N * T, [=, this](int64_t rt, KernelStatus*) {
        const RopeTable& rope = m_.rope;
        const int64_t t = rt % T;
        for (int64_t h = 0; h < qd / hd; ++h) RopeHead(q + rt * qd + h * hd, rope.rotary_dim, p[t], rope.inv_freq.data(), rope.mscale);
        for (int64_t h = 0; h < kvd / hd; ++h) RopeHead(k + rt * kvd + h * hd, rope.rotary_dim, p[t], rope.inv_freq.data(), rope.mscale);
      });
    });
    Add("kv_write", l, {"k", "v", "positions"}, {"kv_cache"}, T, [this, l, N, T, kvd] {
      const float* k = F("k");
      const float* v = F("v");
      std::vector<KvPoolView> views;
      for (int r = 0; r < N; ++r) views.push_back(kv_->View(l, r));
      return pool_->Launch(N * T, [=, this](int64_t rt, KernelStatus* st) {
        const int64_t r = rt / T, t = rt % T;
        const StepRow& row = input_.rows[token_row_[t]];
        KvWriteToken(views[r], PageTableRow{row.page_table.data(), static_cast<int64_t>(row.page_table.size())},
                     token_pos_[t], k + rt * kvd, v + rt * kvd, rt, st);
      });
    });
    const AttentionBackend backend = decode ? cfg_.attention_backend : AttentionBackend::kReference;
    Add("attention", l, {"q", "kv_cache"}, {"attn"}, T, [this, l, N, T, qd, hd, backend] {
      const float* q = F("q");
      float* o = F("attn");
      std::vector<KvPoolView> views;
      for (int r = 0; r < N; ++r) views.push_back(kv_->View(l, r));
      const int64_t hl = m_.heads_local, group = m_.heads_local / m_.kv_heads_local;
      const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
      return pool_->Launch(N * T * hl, [=, this](int64_t item, KernelStatus* st) {
        const int64_t rt = item / hl, h = item % hl, r = rt / T, t = rt % T;
        const StepRow& row = input_.rows[token_row_[t]];
        const PageTableRow pt{row.page_table.data(), static_cast<int64_t>(row.page_table.size())};
        const int64_t len = token_pos_[t] + 1;
        float* scratch = Scratch(FlashScratchFloats(len, hd) + len + kPaged64Tile);
        const float* qh = q + rt * qd + h * hd;
        float* out = o + rt * qd + h * hd;
        switch (backend) {
          case AttentionBackend::kReference:
            AttendReference(views[r], pt, qh, h / group, len, scale, out, scratch, rt, st);
            break;
          case AttentionBackend::kFlashDecode:
            AttendFlashDecode(views[r], pt, qh, h / group, len, scale, out, scratch, rt, st);
            break;
          case AttentionBackend::kPaged64:
            AttendPaged64(views[r], pt, qh, h / group, len, scale, out, scratch, rt, st);
            break;
        }
      });
    });
    {
      auto shards = rank_shards(&RankLayer::o, l);
      const std::string o_fp4 = AddActQuant("o_act_quant", l, shards, "attn", N * T, qd, T, "attn_fp4");
      Add("o_proj", l, Fp4Inputs("attn", o_fp4), {"partial"}, T, [this, shards, T, o_fp4] {
        return LaunchLinear(shards, m_.dense_dot, "attn", true, "partial", T, o_fp4);
      });
    }
    Add("attn_all_reduce", l, {"partial", "hidden"}, {"hidden"}, 0, reduce);
    Add("post_attention_norm", l, {"hidden"}, {"x"}, 0, [this, &L, T, H, eps] {
      const float* h = F("hidden");
      float* x = F("x");
      return pool_->Launch(T, [=, &L](int64_t t, KernelStatus*) { RmsNormRow(h + t * H, L.post_norm.data(), H, eps, x + t * H); });
    });
    if (!L.moe) {
      auto g = rank_shards(&RankLayer::gate, l), u = rank_shards(&RankLayer::up, l), d = rank_shards(&RankLayer::down, l);
      const std::string gu_fp4 = AddActQuant("gate_up_act_quant", l, g, "x", T, H, 0, "x_fp4");
      const std::vector<std::string> gu_in = Fp4Inputs("x", gu_fp4);
      Add("gate_proj", l, gu_in, {"gate"}, T, [this, g, T, gu_fp4] {
        return LaunchLinear(g, m_.dense_dot, "x", false, "gate", T, gu_fp4);
      });
      Add("up_proj", l, gu_in, {"up"}, T, [this, u, T, gu_fp4] {
        return LaunchLinear(u, m_.dense_dot, "x", false, "up", T, gu_fp4);
      });
      Add("silu_mul", l, {"gate", "up"}, {"act"}, T, [this, N, T] {
        const float* g = F("gate");
        const float* u = F("up");
        float* a = F("act");
        const int64_t il = m_.intermediate_local;
        return pool_->Launch(N * T, [=](int64_t rt, KernelStatus*) { SiluMulRow(g + rt * il, u + rt * il, il, a + rt * il); });
      });
      const std::string d_fp4 = AddActQuant("down_act_quant", l, d, "act", N * T, m_.intermediate_local, T, "act_fp4");
      Add("down_proj", l, Fp4Inputs("act", d_fp4), {"partial"}, T, [this, d, T, d_fp4] {
        return LaunchLinear(d, m_.dense_dot, "act", true, "partial", T, d_fp4);
      });
      Add("mlp_all_reduce", l, {"partial", "hidden"}, {"hidden"}, 0, reduce);
      continue;
    }
    const int64_t E = s.num_experts, K = s.experts_per_tok;
    Add("router", l, {"x"}, {"router_logits"}, 0, [this, &L, T, E, H] {
      const float* x = F("x");
      float* y = F("router_logits");
      return pool_->Launch(T, [=, &L](int64_t t, KernelStatus*) {
        for (int64_t e = 0; e < E; ++e) y[t * E + e] = DotRaw(L.router.w, x + t * H, e, 0, H);
      });
    });
    Add("topk", l, {"router_logits"}, {"topk_ids", "topk_weights"}, 0, [this, &L, T, E, K] {
      const float* y = F("router_logits");
      int32_t* ids = I("topk_ids");
      float* w = F("topk_weights");
      const ModelSpec& sp = m_.spec;
      return pool_->Launch(T, [=, &L, &sp](int64_t t, KernelStatus* st) {
        float* scratch = Scratch(2 * E + E / 4 + 1);
        if (sp.scoring == "sigmoid") {
          uint8_t* mask = reinterpret_cast<uint8_t*>(scratch + 2 * E);
          RouteSigmoidGrouped(y + t * E, L.correction_bias.empty() ? nullptr : L.correction_bias.data(),
                              static_cast<int32_t>(E), static_cast<int32_t>(K), static_cast<int32_t>(sp.n_group),
                              static_cast<int32_t>(sp.topk_group), sp.norm_topk_prob,
                              static_cast<float>(sp.routed_scaling_factor), ids + t * K, w + t * K, scratch, mask, t, st);
        } else {
          RouteSoftmaxTopK(y + t * E, static_cast<int32_t>(E), static_cast<int32_t>(K), sp.norm_topk_prob, ids + t * K,
                           w + t * K, scratch, t, st);
        }
      });
    });
    // The routed experts of every token on every rank: gate/up GEMVs, SiLU*up,
    // down GEMV, weighted by the router in top-k order into the rank's partial.
    // Under w4a4 the layer's input is quantized once, with the max input_scale
    // of every expert's gate/up, before the routed experts read it.
    std::vector<const LinearShard*> first_gate;
    if (!L.ranks[0].experts.empty()) first_gate.push_back(&L.ranks[0].experts[0].gate);
    const std::string ex_fp4 = AddActQuant("experts_act_quant", l, first_gate, "x", T, H, 0, "x_fp4");
    std::vector<std::string> ex_in{"x", "topk_ids", "topk_weights"};
    if (!ex_fp4.empty()) ex_in = {"x", ex_fp4, ex_fp4 + "_scale", "topk_ids", "topk_weights"};
    Add("experts", l, ex_in, {"partial"}, T, [this, &L, N, T, H, K, ex_fp4] {
      const float* x = F("x");
      const uint8_t* qv = ex_fp4.empty() ? nullptr : U8(ex_fp4);
      const uint8_t* qs = ex_fp4.empty() ? nullptr : U8(ex_fp4 + "_scale");
      const int32_t* ids = I("topk_ids");
      const float* w = F("topk_weights");
      float* part = F("partial");
      const int64_t mi = m_.moe_intermediate_local;
      const DotKind dot = m_.moe_dot;
      return pool_->Launch(N * T, [=, &L](int64_t rt, KernelStatus* st) {
        const int64_t r = rt / T, t = rt % T;
        const RankLayer& rl = L.ranks[r];
        float* scratch = Scratch(ExpertScratchFloats(mi));
        float* out = part + rt * H;
        for (int64_t i = 0; i < H; ++i) out[i] = 0.0f;
        for (int64_t k = 0; k < K; ++k) {
          const int64_t j = ids[t * K + k] - rl.expert_begin;
          if (j < 0 || j >= static_cast<int64_t>(rl.experts.size())) continue;  // another rank's expert
          const ExpertShard& e = rl.experts[j];
          const QWeight xq = qv != nullptr ? Nvfp4ActRow(qv + t * Nvfp4ActValueBytes(H), qs + t * Nvfp4ActScaleBytes(H), H,
                                                         e.gate.w.act_scale)
                                           : QWeight{};
          ExpertMlp(dot, e.gate.w, e.up.w, e.down.w, x + t * H, qv != nullptr ? &xq : nullptr, w[t * K + k], H, scratch,
                    out, rt, st);
        }
      });
    });
    if (s.n_shared_experts > 0) {
      const std::string sh_fp4 =
          AddActQuant("shared_expert_act_quant", l, {&L.ranks[0].shared.gate}, "x", T, H, 0, "x_fp4");
      std::vector<std::string> sh_in{"x", "partial"};
      if (!sh_fp4.empty()) sh_in = {"x", sh_fp4, sh_fp4 + "_scale", "partial"};
      Add("shared_expert", l, sh_in, {"partial"}, T, [this, &L, N, T, H, sh_fp4] {
        const float* x = F("x");
        const uint8_t* qv = sh_fp4.empty() ? nullptr : U8(sh_fp4);
        const uint8_t* qs = sh_fp4.empty() ? nullptr : U8(sh_fp4 + "_scale");
        float* part = F("partial");
        const DotKind dot = m_.moe_dot;
        return pool_->Launch(N * T, [=, &L](int64_t rt, KernelStatus* st) {
          const int64_t r = rt / T, t = rt % T;
          const ExpertShard& e = L.ranks[r].shared;
          float* scratch = Scratch(ExpertScratchFloats(e.gate.w.rows));
          const QWeight xq = qv != nullptr ? Nvfp4ActRow(qv + t * Nvfp4ActValueBytes(H), qs + t * Nvfp4ActScaleBytes(H), H,
                                                         e.gate.w.act_scale)
                                           : QWeight{};
          ExpertMlp(dot, e.gate.w, e.up.w, e.down.w, x + t * H, qv != nullptr ? &xq : nullptr, 1.0f, H, scratch,
                    part + rt * H, rt, st);
        });
      });
    }
    Add("moe_all_reduce", l, {"partial", "hidden"}, {"hidden"}, 0, reduce);
  }

  Add("final_norm", -1, {"hidden"}, {"last_hidden"}, 0, [this, R, H, eps] {
    const float* h = F("hidden");
    float* o = F("last_hidden");
    return pool_->Launch(R, [=, this](int64_t r, KernelStatus*) {
      RmsNormRow(h + row_last_[r] * H, m_.final_norm.data(), H, eps, o + r * H);
    });
  });
  {
    std::vector<const LinearShard*> shards;
    for (int r = 0; r < N; ++r) shards.push_back(&m_.lm_head[r]);
    Add("lm_head", -1, {"last_hidden"}, {"logits_local"}, R, [this, shards, R] {
      return LaunchLinear(shards, m_.dense_dot, "last_hidden", false, "logits_local", R);
    });
  }
  Add("logits_all_gather", -1, {"logits_local"}, {"logits"}, 0, [this, N, R] {
    const float* in = F("logits_local");
    float* out = F("logits");
    const int64_t vl = m_.vocab_local;
    return pool_->Launch(R, [=](int64_t row, KernelStatus*) {
      for (int r = 0; r < N; ++r) std::memcpy(out + row * vl * N + r * vl, in + (r * R + row) * vl, vl * 4);
    });
  });
  Add("logits_processor", -1, {"logits"}, {"probs"}, 0, [this, R] {
    const float* lg = F("logits");
    float* p = F("probs");
    const int32_t V = static_cast<int32_t>(m_.spec.vocab);
    const bool sorted = cfg_.sampling_backend == SamplingBackend::kSorted;
    return pool_->Launch(R, [=, this](int64_t r, KernelStatus*) {
      const SamplingParams& sp = input_.rows[r].sampling;
      if (sp.temperature <= 0.0f) return;  // greedy rows take the argmax of the logits
      int32_t* ids = reinterpret_cast<int32_t*>(Scratch(V));
      ProcessLogits(lg + r * V, V, sp, sorted, p + r * V, ids);
    });
  });
  Add("sampler", -1, {"logits", "probs"}, {"next_tokens"}, 0, [this, R] {
    const float* lg = F("logits");
    const float* p = F("probs");
    int32_t* next = I("next_tokens");
    const int32_t V = static_cast<int32_t>(m_.spec.vocab);
    return pool_->Launch(R, [=, this](int64_t r, KernelStatus* st) {
      const StepRow& row = input_.rows[r];
      if (row.sampling.temperature <= 0.0f) {
        next[r] = ArgMaxRow(lg + r * V, V, r, st);
      } else {
        const float u = CounterUniform(row.sampling.seed, static_cast<uint64_t>(row.request_id), row.sample_offset);
        next[r] = SampleRow(p + r * V, V, u, r, st);
      }
    });
  });
}

std::optional<Fault> StepProgram::RunNext() {
  if (done()) return fault_;
  const KernelCall& k = kernels_[next_];
  const auto t0 = std::chrono::steady_clock::now();
  const KernelStatus st = k.launch();
  const auto t1 = std::chrono::steady_clock::now();
  KernelRecord rec;
  rec.label = k.Label();
  rec.name = k.name;
  rec.layer = k.layer;
  rec.micros = std::chrono::duration<double, std::micro>(t1 - t0).count();
  Hasher128 hasher;
  double sum_abs = 0;
  int64_t count = 0;
  bool first = true;
  for (const std::string& name : k.outputs) {
    const Buffer* b = buffer(name);
    if (b == nullptr) continue;  // the KV cache is not an activation buffer
    hasher.Update(b->data(), b->bytes());
    if (b->is_bytes) {  // quantized activations: hashed and counted, no value statistics
      rec.numel += static_cast<int64_t>(b->u8.size());
      continue;
    }
    const size_t n = b->is_int ? b->i.size() : b->f.size();
    rec.numel += static_cast<int64_t>(n);
    for (size_t i = 0; i < n; ++i) {
      const double v = b->is_int ? b->i[i] : b->f[i];
      if (std::isnan(v)) {
        rec.nan += 1;
        continue;
      }
      if (std::isinf(v)) {
        rec.inf += 1;
        continue;
      }
      rec.min = first ? v : std::min(rec.min, v);
      rec.max = first ? v : std::max(rec.max, v);
      first = false;
      sum_abs += std::abs(v);
      rec.max_abs = std::max(rec.max_abs, std::abs(v));
      count += 1;
    }
  }
  rec.mean_abs = count ? sum_abs / count : 0.0;
  rec.digest = hasher.Digest();
  if ((rec.nan || rec.inf) && first_nonfinite_.empty()) first_nonfinite_ = rec.label;
  if (st.fired) {
    rec.failed = true;
    Fault f;
    f.klass = "assert";
    f.stage = ForwardModeName(input_.mode);
    f.kernel = k.name;
    f.check = CheckName(st.check);
    f.layer = k.layer;
    f.step = input_.step;
    f.rank = k.tokens_per_rank > 0 ? static_cast<int>(st.item / k.tokens_per_rank) : -1;
    f.item = k.tokens_per_rank > 0 ? st.item % k.tokens_per_rank : st.item;
    f.index = st.index;
    f.value = st.value;
    f.message = Cat("step ", input_.step, " (", f.stage, "): kernel ", rec.label, " check ", f.check, " failed",
                    f.rank >= 0 ? Cat(" on rank ", f.rank) : std::string(), " at item ", f.item, ": index ", f.index,
                    ", value ", f.value);
    fault_ = f;
  }
  records_.push_back(std::move(rec));
  next_ += 1;
  return fault_;
}

std::optional<Fault> StepProgram::RunAll() {
  while (!done()) RunNext();
  return fault_;
}

// Field names follow bisect's kernel table (bisect/kernel_table.h): name
// (the label, unique in a step), layer, numel, nan_count, inf_count, digest,
// max_abs; the rest are extra.
nlohmann::json KernelRecordToJson(const KernelRecord& r) {
  return nlohmann::json{{"name", r.label},      {"kernel", r.name},         {"layer", r.layer},
                        {"numel", r.numel},     {"nan_count", r.nan},       {"inf_count", r.inf},
                        {"digest", r.digest.Hex()}, {"max_abs", r.max_abs}, {"min", r.min},
                        {"max", r.max},         {"mean_abs", r.mean_abs},   {"micros", r.micros},
                        {"failed", r.failed}};
}

std::vector<int32_t> StepProgram::SampledTokens() const {
  const Buffer* b = buffer("next_tokens");
  return b ? b->i : std::vector<int32_t>{};
}

Hash128 StepProgram::Digest() const {
  Hasher128 h;
  const Buffer* lg = buffer("logits");
  const Buffer* nt = buffer("next_tokens");
  h.Update(lg->data(), lg->bytes());
  h.Update(nt->data(), nt->bytes());
  return h.Digest();
}

}  // namespace crashreplay::replay
