#include "crashreplay/replay/op_step.h"

#include <algorithm>
#include <cmath>

#include "crashreplay/base/status.h"
#include "text_util.h"

namespace crashreplay::replay {

using text::Cat;

ExecMemory::~ExecMemory() {
  for (void* p : owned_) exec_->Free(p);
}

absl::StatusOr<void*> ExecMemory::Alloc(size_t bytes) {
  auto p = exec_->Allocate(bytes);
  if (!p.ok()) return p.status();
  owned_.push_back(*p);
  return *p;
}

absl::StatusOr<void*> ExecMemory::Copy(const void* host, size_t bytes) {
  CR_ASSIGN_OR_RETURN(void* p, Alloc(bytes));
  if (bytes > 0) CR_RETURN_IF_ERROR(exec_->CopyToDevice(p, host, bytes));
  return p;
}

// ---- DeviceModel -------------------------------------------------------------

absl::StatusOr<QWeight> DeviceModel::Weight(const QWeight& w, size_t data_bytes, size_t scale_bytes) {
  QWeight d = w;
  CR_ASSIGN_OR_RETURN(void* data, mem_.Copy(w.data, data_bytes));
  d.data = data;
  if (w.scales != nullptr && scale_bytes > 0) {
    CR_ASSIGN_OR_RETURN(void* scales, mem_.Copy(w.scales, scale_bytes));
    d.scales = scales;
  }
  bytes_ += data_bytes + scale_bytes;
  return d;
}

absl::StatusOr<LinearShardView> DeviceModel::Shard(const LinearShard& s) {
  LinearShardView v;
  CR_ASSIGN_OR_RETURN(v.w, Weight(s.w, s.data.size(), s.scales.size()));
  if (!s.bias.empty()) {
    CR_ASSIGN_OR_RETURN(float* b, mem_.Copy(s.bias));
    v.bias = b;
  }
  return v;
}

absl::StatusOr<const LinearShardView*> DeviceModel::Ranks(const std::vector<LinearShardView>& v) {
  CR_ASSIGN_OR_RETURN(LinearShardView * p, mem_.Copy(v));
  return p;
}

absl::StatusOr<std::unique_ptr<DeviceModel>> DeviceModel::Upload(const Model& m, Executor* exec) {
  std::unique_ptr<DeviceModel> dm(new DeviceModel(exec));
  dm->model_ = &m;
  CR_ASSIGN_OR_RETURN(LinearShardView embed, dm->Shard(m.embed));
  dm->embed_ = embed.w;
  CR_ASSIGN_OR_RETURN(float* fnorm, dm->mem_.Copy(m.final_norm));
  dm->final_norm_ = fnorm;
  CR_ASSIGN_OR_RETURN(float* inv, dm->mem_.Copy(m.rope.inv_freq));
  dm->inv_freq_ = inv;
  std::vector<LinearShardView> heads;
  for (const LinearShard& s : m.lm_head) {
    CR_ASSIGN_OR_RETURN(LinearShardView v, dm->Shard(s));
    heads.push_back(v);
  }
  CR_ASSIGN_OR_RETURN(dm->lm_head_, dm->Ranks(heads));
  for (const Layer& L : m.layers) {
    LayerViews lv;
    auto norm = [&](const std::vector<float>& v) -> absl::StatusOr<const float*> {
      if (v.empty()) return static_cast<const float*>(nullptr);
      CR_ASSIGN_OR_RETURN(float* p, dm->mem_.Copy(v));
      return static_cast<const float*>(p);
    };
    CR_ASSIGN_OR_RETURN(lv.input_norm, norm(L.input_norm));
    CR_ASSIGN_OR_RETURN(lv.post_norm, norm(L.post_norm));
    CR_ASSIGN_OR_RETURN(lv.q_norm, norm(L.q_norm));
    CR_ASSIGN_OR_RETURN(lv.k_norm, norm(L.k_norm));
    CR_ASSIGN_OR_RETURN(lv.correction_bias, norm(L.correction_bias));
    auto ranks = [&](LinearShard RankLayer::*member) -> absl::StatusOr<const LinearShardView*> {
      std::vector<LinearShardView> v;
      for (const RankLayer& rl : L.ranks) {
        if ((rl.*member).data.empty()) return static_cast<const LinearShardView*>(nullptr);
        CR_ASSIGN_OR_RETURN(LinearShardView s, dm->Shard(rl.*member));
        v.push_back(s);
      }
      return dm->Ranks(v);
    };
    CR_ASSIGN_OR_RETURN(lv.q, ranks(&RankLayer::q));
    CR_ASSIGN_OR_RETURN(lv.k, ranks(&RankLayer::k));
    CR_ASSIGN_OR_RETURN(lv.v, ranks(&RankLayer::v));
    CR_ASSIGN_OR_RETURN(lv.o, ranks(&RankLayer::o));
    lv.moe = L.moe;
    if (!L.moe) {
      CR_ASSIGN_OR_RETURN(lv.gate, ranks(&RankLayer::gate));
      CR_ASSIGN_OR_RETURN(lv.up, ranks(&RankLayer::up));
      CR_ASSIGN_OR_RETURN(lv.down, ranks(&RankLayer::down));
    } else {
      CR_ASSIGN_OR_RETURN(LinearShardView router, dm->Shard(L.router));
      lv.router = router.w;
      int64_t stride = 1;
      for (const RankLayer& rl : L.ranks) stride = std::max<int64_t>(stride, static_cast<int64_t>(rl.experts.size()));
      std::vector<ExpertView> experts(L.ranks.size() * stride);
      std::vector<int32_t> count;
      std::vector<int64_t> begin;
      std::vector<ExpertView> shared;
      auto expert = [&](const ExpertShard& e) -> absl::StatusOr<ExpertView> {
        ExpertView v;
        CR_ASSIGN_OR_RETURN(v.gate, dm->Weight(e.gate.w, e.gate.data.size(), e.gate.scales.size()));
        CR_ASSIGN_OR_RETURN(v.up, dm->Weight(e.up.w, e.up.data.size(), e.up.scales.size()));
        CR_ASSIGN_OR_RETURN(v.down, dm->Weight(e.down.w, e.down.data.size(), e.down.scales.size()));
        return v;
      };
      for (size_t r = 0; r < L.ranks.size(); ++r) {
        const RankLayer& rl = L.ranks[r];
        for (size_t j = 0; j < rl.experts.size(); ++j) {
          CR_ASSIGN_OR_RETURN(experts[r * stride + j], expert(rl.experts[j]));
        }
        count.push_back(static_cast<int32_t>(rl.experts.size()));
        begin.push_back(rl.expert_begin);
        if (rl.has_shared) {
          CR_ASSIGN_OR_RETURN(ExpertView sv, expert(rl.shared));
          shared.push_back(sv);
          lv.shared_inter = std::max<int64_t>(lv.shared_inter, rl.shared.gate.w.rows);
        }
      }
      CR_ASSIGN_OR_RETURN(ExpertView * ev, dm->mem_.Copy(experts));
      CR_ASSIGN_OR_RETURN(int32_t * cp, dm->mem_.Copy(count));
      CR_ASSIGN_OR_RETURN(int64_t * bp, dm->mem_.Copy(begin));
      lv.experts = ev;
      lv.local_count = cp;
      lv.expert_begin = bp;
      lv.expert_stride = stride;
      lv.has_shared = shared.size() == L.ranks.size() && !shared.empty();
      if (lv.has_shared) {
        CR_ASSIGN_OR_RETURN(ExpertView * sp, dm->mem_.Copy(shared));
        lv.shared = sp;
      }
    }
    dm->layers_.push_back(lv);
  }
  return dm;
}

// ---- DeviceKv ----------------------------------------------------------------

absl::StatusOr<std::unique_ptr<DeviceKv>> DeviceKv::Create(const Model& m, const EngineConfig& c, int64_t pages,
                                                           Executor* exec) {
  std::unique_ptr<DeviceKv> kv(new DeviceKv(exec));
  kv->pages_ = pages;
  const bool fp8 = c.kv_cache_dtype == KvCacheDType::kFp8E4m3;
  const size_t bytes = static_cast<size_t>(pages) * c.page_size * m.kv_heads_local * m.spec.head_dim * (fp8 ? 1 : 2);
  for (int64_t l = 0; l < m.spec.layers; ++l) {
    std::vector<KvPoolView> views;
    for (int r = 0; r < m.tp; ++r) {
      CR_ASSIGN_OR_RETURN(void* k, kv->mem_.Alloc(bytes));
      CR_ASSIGN_OR_RETURN(void* v, kv->mem_.Alloc(bytes));
      CR_RETURN_IF_ERROR(exec->Fill(k, 0, bytes));
      CR_RETURN_IF_ERROR(exec->Fill(v, 0, bytes));
      views.push_back(KvPoolView{k, v, fp8, pages, static_cast<int32_t>(c.page_size),
                                 static_cast<int32_t>(m.kv_heads_local), static_cast<int32_t>(m.spec.head_dim)});
    }
    CR_ASSIGN_OR_RETURN(KvPoolView * p, kv->mem_.Copy(views));
    kv->views_.push_back(p);
  }
  return kv;
}

// ---- OpStep --------------------------------------------------------------------

absl::StatusOr<OpStep::Buf*> OpStep::Alloc(const std::string& name, int64_t count, bool is_int, bool is_bytes) {
  Buf& b = bufs_[name];
  b.count = count;
  b.is_int = is_int;
  b.is_bytes = is_bytes;
  CR_ASSIGN_OR_RETURN(b.p, mem_.Alloc(b.size()));
  CR_RETURN_IF_ERROR(exec_->Fill(b.p, 0, b.size()));
  return &b;
}

absl::StatusOr<std::unique_ptr<OpStep>> OpStep::Build(const DeviceModel& model, const EngineConfig& config,
                                                      DeviceKv* kv, Executor* exec, const StepInput& input) {
  std::unique_ptr<OpStep> step(new OpStep(exec));
  CR_RETURN_IF_ERROR(step->Lower(model, config, kv, input));
  return step;
}

absl::Status OpStep::Lower(const DeviceModel& dm, const EngineConfig& cfg, DeviceKv* kv, const StepInput& in) {
  const Model& m = dm.model();
  const ModelSpec& s = m.spec;
  const int N = m.tp;
  const int64_t R = static_cast<int64_t>(in.rows.size());
  const int64_t H = s.hidden, hd = s.head_dim;
  const int64_t qd = m.heads_local * hd, kvd = m.kv_heads_local * hd;
  const float eps = static_cast<float>(s.rms_eps);

  // The batch layout, as StepProgram derives it.
  std::vector<int32_t> ids, pos, token_row, tables, row_last;
  std::vector<int64_t> offsets{0}, request_ids;
  std::vector<uint64_t> sample_offsets;
  std::vector<SamplingParams> params;
  int64_t max_len = 1;
  for (int64_t r = 0; r < R; ++r) {
    const StepRow& row = in.rows[r];
    for (size_t j = 0; j < row.tokens.size(); ++j) {
      ids.push_back(row.tokens[j]);
      pos.push_back(static_cast<int32_t>(row.start_pos + static_cast<int64_t>(j)));
      token_row.push_back(static_cast<int32_t>(r));
      max_len = std::max<int64_t>(max_len, pos.back() + 1);
    }
    row_last.push_back(static_cast<int32_t>(ids.size()) - 1);
    tables.insert(tables.end(), row.page_table.begin(), row.page_table.end());
    offsets.push_back(static_cast<int64_t>(tables.size()));
    request_ids.push_back(row.request_id);
    sample_offsets.push_back(row.sample_offset);
    params.push_back(row.sampling);
  }
  const int64_t T = static_cast<int64_t>(ids.size());
  CR_ASSIGN_OR_RETURN(Buf * ids_buf, Alloc("input_ids", T, true));
  if (T > 0) CR_RETURN_IF_ERROR(exec_->CopyToDevice(ids_buf->p, ids.data(), ids.size() * 4));
  CR_ASSIGN_OR_RETURN(Buf * pos_buf, Alloc("positions", T, true));
  if (T > 0) CR_RETURN_IF_ERROR(exec_->CopyToDevice(pos_buf->p, pos.data(), pos.size() * 4));
  BatchView batch;
  batch.tokens = T;
  batch.positions = static_cast<const int32_t*>(pos_buf->p);
  CR_ASSIGN_OR_RETURN(batch.token_row, mem_.Copy(token_row));
  CR_ASSIGN_OR_RETURN(batch.page_tables, mem_.Copy(tables));
  CR_ASSIGN_OR_RETURN(batch.table_offset, mem_.Copy(offsets));
  CR_ASSIGN_OR_RETURN(const int32_t* row_last_d, mem_.Copy(row_last));
  CR_ASSIGN_OR_RETURN(const SamplingParams* params_d, mem_.Copy(params));
  CR_ASSIGN_OR_RETURN(const int64_t* request_d, mem_.Copy(request_ids));
  CR_ASSIGN_OR_RETURN(const uint64_t* offset_d, mem_.Copy(sample_offsets));

  const int64_t il = std::max<int64_t>(m.intermediate_local, 1);
  const std::vector<std::pair<std::string, int64_t>> floats = {
      {"hidden", T * H}, {"x", T * H}, {"q", N * T * qd}, {"k", N * T * kvd}, {"v", N * T * kvd},
      {"attn", N * T * qd}, {"partial", N * T * H}, {"gate", N * T * il}, {"up", N * T * il}, {"act", N * T * il},
      {"last_hidden", R * H}, {"logits_local", N * R * m.vocab_local}, {"logits", R * s.vocab},
      {"probs", R * s.vocab}};
  for (const auto& [name, n] : floats) CR_RETURN_IF_ERROR(Alloc(name, n).status());
  if (s.is_moe()) {
    CR_RETURN_IF_ERROR(Alloc("router_logits", T * s.num_experts).status());
    CR_RETURN_IF_ERROR(Alloc("topk_ids", T * s.experts_per_tok, true).status());
    CR_RETURN_IF_ERROR(Alloc("topk_weights", T * s.experts_per_tok).status());
  }
  CR_RETURN_IF_ERROR(Alloc("next_tokens", R, true).status());

  auto add = [this](std::string name, int layer, std::vector<std::string> outs, std::vector<Op> ops) {
    kernels_.push_back(OpKernel{std::move(name), layer, std::move(outs), std::move(ops)});
  };
  auto linear = [&](const LinearShardView* shards, DotKind dot, const std::string& x, bool per_rank,
                    const std::string& y, int64_t tokens, int64_t rows, int64_t cols, const std::string& fp4 = "") {
    LinearOp op;
    op.shards = shards;
    op.dot = dot;
    op.x = F(x);
    if (!fp4.empty()) {
      op.xq = U8(fp4);
      op.xq_scales = U8(fp4 + "_scale");
    }
    op.x_per_rank = per_rank;
    op.y = F(y);
    op.ranks = N;
    op.tokens = tokens;
    op.rows = rows;
    op.cols = cols;
    return op;
  };
  auto norm = [&](const std::string& x, const float* w, const std::string& out, int64_t rows, int64_t n) {
    RmsNormOp op;
    op.x = F(x);
    op.w = w;
    op.out = F(out);
    op.rows = rows;
    op.n = n;
    op.eps = eps;
    return op;
  };
  // w4a4: a kernel quantizing `x` ([rows, cols]) into `out` and `out`_scale
  // with the input_scale of `first`'s group, as StepProgram::AddActQuant;
  // "" when the group's input is not quantized.
  auto act_quant = [&](const std::string& name, int layer, const LinearShard* first, const std::string& x,
                       int64_t rows, int64_t cols, const std::string& out) -> absl::StatusOr<std::string> {
    if (first == nullptr || !first->w.act_fp4) return std::string();
    const std::string scales = out + "_scale";
    if (bufs_.find(out) == bufs_.end()) {
      CR_RETURN_IF_ERROR(Alloc(out, rows * Nvfp4ActValueBytes(cols), false, true).status());
      CR_RETURN_IF_ERROR(Alloc(scales, rows * Nvfp4ActScaleBytes(cols), false, true).status());
    }
    ActQuantOp op;
    op.x = F(x);
    op.values = U8(out);
    op.scales = U8(scales);
    op.rows = rows;
    op.cols = cols;
    op.input_scale = first->w.act_scale;
    add(name, layer, {out, scales}, {op});
    return out;
  };
  auto reduce = [&] {
    ReduceOp op;
    op.hidden = F("hidden");
    op.partial = F("partial");
    op.ranks = N;
    op.n = T * H;
    return op;
  };

  EmbeddingOp emb;
  emb.table = dm.embed();
  emb.tokens = I("input_ids");
  emb.out = F("hidden");
  emb.n_tokens = T;
  add("embedding", -1, {"hidden"}, {emb});
  const bool decode = in.mode == ForwardMode::kDecode;
  for (int64_t l = 0; l < s.layers; ++l) {
    const DeviceModel::LayerViews& L = dm.layers()[l];
    const RankLayer& host = m.layers[l].ranks[0];
    const int li = static_cast<int>(l);
    add("input_norm", li, {"x"}, {norm("hidden", L.input_norm, "x", T, H)});
    CR_ASSIGN_OR_RETURN(const std::string qkv_fp4, act_quant("qkv_act_quant", li, &host.q, "x", T, H, "x_fp4"));
    add("q_proj", li, {"q"}, {linear(L.q, m.dense_dot, "x", false, "q", T, qd, H, qkv_fp4)});
    add("k_proj", li, {"k"}, {linear(L.k, m.dense_dot, "x", false, "k", T, kvd, H, qkv_fp4)});
    add("v_proj", li, {"v"}, {linear(L.v, m.dense_dot, "x", false, "v", T, kvd, H, qkv_fp4)});
    if (s.qk_norm) {
      add("qk_norm", li, {"q", "k"},
          {norm("q", L.q_norm, "q", N * T * m.heads_local, hd), norm("k", L.k_norm, "k", N * T * m.kv_heads_local, hd)});
    }
    auto rope = [&](const std::string& x, int64_t heads) {
      RopeOp op;
      op.x = F(x);
      op.positions = I("positions");
      op.inv_freq = dm.inv_freq();
      op.rows = N * T;
      op.tokens = T;
      op.heads = heads;
      op.head_dim = hd;
      op.rotary_dim = m.rope.rotary_dim;
      op.mscale = m.rope.mscale;
      return op;
    };
    add("rope", li, {"q", "k"}, {rope("q", m.heads_local), rope("k", m.kv_heads_local)});
    KvWriteOp kw;
    kw.views = kv->views(l);
    kw.k = F("k");
    kw.v = F("v");
    kw.batch = batch;
    kw.ranks = N;
    kw.kvd = kvd;
    add("kv_write", li, {}, {kw});
    AttentionOp at;
    at.views = kv->views(l);
    at.q = F("q");
    at.out = F("attn");
    at.batch = batch;
    at.backend = static_cast<int32_t>(decode ? cfg.attention_backend : AttentionBackend::kReference);
    at.ranks = N;
    at.heads = m.heads_local;
    at.group = m.heads_local / m.kv_heads_local;
    at.head_dim = hd;
    at.max_len = max_len;
    at.scale = 1.0f / std::sqrt(static_cast<float>(hd));
    add("attention", li, {"attn"}, {at});
    CR_ASSIGN_OR_RETURN(const std::string o_fp4, act_quant("o_act_quant", li, &host.o, "attn", N * T, qd, "attn_fp4"));
    add("o_proj", li, {"partial"}, {linear(L.o, m.dense_dot, "attn", true, "partial", T, H, qd, o_fp4)});
    add("attn_all_reduce", li, {"hidden"}, {reduce()});
    add("post_attention_norm", li, {"x"}, {norm("hidden", L.post_norm, "x", T, H)});
    if (!L.moe) {
      const int64_t inter = m.intermediate_local;
      CR_ASSIGN_OR_RETURN(const std::string gu_fp4,
                          act_quant("gate_up_act_quant", li, &host.gate, "x", T, H, "x_fp4"));
      add("gate_proj", li, {"gate"}, {linear(L.gate, m.dense_dot, "x", false, "gate", T, inter, H, gu_fp4)});
      add("up_proj", li, {"up"}, {linear(L.up, m.dense_dot, "x", false, "up", T, inter, H, gu_fp4)});
      SiluMulOp sm;
      sm.gate = F("gate");
      sm.up = F("up");
      sm.out = F("act");
      sm.rows = N * T;
      sm.n = inter;
      add("silu_mul", li, {"act"}, {sm});
      CR_ASSIGN_OR_RETURN(const std::string d_fp4,
                          act_quant("down_act_quant", li, &host.down, "act", N * T, inter, "act_fp4"));
      add("down_proj", li, {"partial"}, {linear(L.down, m.dense_dot, "act", true, "partial", T, H, inter, d_fp4)});
      add("mlp_all_reduce", li, {"hidden"}, {reduce()});
      continue;
    }
    RouterOp ro;
    ro.router = L.router;
    ro.x = F("x");
    ro.logits = F("router_logits");
    ro.tokens = T;
    add("router", li, {"router_logits"}, {ro});
    TopKOp tk;
    tk.logits = F("router_logits");
    tk.bias = L.correction_bias;
    tk.ids = I("topk_ids");
    tk.weights = F("topk_weights");
    tk.tokens = T;
    tk.experts = static_cast<int32_t>(s.num_experts);
    tk.k = static_cast<int32_t>(s.experts_per_tok);
    tk.n_group = static_cast<int32_t>(s.n_group);
    tk.topk_group = static_cast<int32_t>(s.topk_group);
    tk.sigmoid = s.scoring == "sigmoid";
    tk.renormalize = s.norm_topk_prob;
    tk.scaling = static_cast<float>(s.routed_scaling_factor);
    add("topk", li, {"topk_ids", "topk_weights"}, {tk});
    CR_ASSIGN_OR_RETURN(const std::string ex_fp4,
                        act_quant("experts_act_quant", li, host.experts.empty() ? nullptr : &host.experts[0].gate,
                                  "x", T, H, "x_fp4"));
    ExpertsOp ex;
    if (!ex_fp4.empty()) {
      ex.xq = U8(ex_fp4);
      ex.xq_scales = U8(ex_fp4 + "_scale");
    }
    ex.experts = L.experts;
    ex.local_count = L.local_count;
    ex.expert_begin = L.expert_begin;
    ex.x = F("x");
    ex.ids = I("topk_ids");
    ex.weights = F("topk_weights");
    ex.partial = F("partial");
    ex.ranks = N;
    ex.tokens = T;
    ex.hidden = H;
    ex.k = s.experts_per_tok;
    ex.stride = L.expert_stride;
    ex.inter = m.moe_intermediate_local;
    ex.dot = m.moe_dot;
    add("experts", li, {"partial"}, {ex});
    if (s.n_shared_experts > 0 && L.has_shared) {
      CR_ASSIGN_OR_RETURN(const std::string sh_fp4,
                          act_quant("shared_expert_act_quant", li, &host.shared.gate, "x", T, H, "x_fp4"));
      SharedExpertOp se;
      if (!sh_fp4.empty()) {
        se.xq = U8(sh_fp4);
        se.xq_scales = U8(sh_fp4 + "_scale");
      }
      se.shared = L.shared;
      se.x = F("x");
      se.partial = F("partial");
      se.ranks = N;
      se.tokens = T;
      se.hidden = H;
      se.inter = L.shared_inter;
      se.dot = m.moe_dot;
      add("shared_expert", li, {"partial"}, {se});
    }
    add("moe_all_reduce", li, {"hidden"}, {reduce()});
  }
  RmsNormOp fn = norm("hidden", dm.final_norm(), "last_hidden", R, H);
  fn.gather = row_last_d;
  add("final_norm", -1, {"last_hidden"}, {fn});
  add("lm_head", -1, {"logits_local"},
      {linear(dm.lm_head(), m.dense_dot, "last_hidden", false, "logits_local", R, m.vocab_local, H)});
  GatherLogitsOp g;
  g.local = F("logits_local");
  g.logits = F("logits");
  g.ranks = N;
  g.rows = R;
  g.vocab_local = m.vocab_local;
  add("logits_all_gather", -1, {"logits"}, {g});
  ProcessLogitsOp pl;
  pl.logits = F("logits");
  pl.probs = F("probs");
  pl.params = params_d;
  pl.rows = R;
  pl.vocab = static_cast<int32_t>(s.vocab);
  pl.sorted = cfg.sampling_backend == SamplingBackend::kSorted;
  add("logits_processor", -1, {"probs"}, {pl});
  SampleOp sa;
  sa.logits = F("logits");
  sa.probs = F("probs");
  sa.params = params_d;
  sa.request_id = request_d;
  sa.sample_offset = offset_d;
  sa.next = I("next_tokens");
  sa.rows = R;
  sa.vocab = static_cast<int32_t>(s.vocab);
  add("sampler", -1, {"next_tokens"}, {sa});
  return absl::OkStatus();
}

absl::Status OpStep::RunNext() {
  if (done()) return absl::OkStatus();
  const OpKernel& k = kernels_[next_];
  next_ += 1;
  for (const Op& op : k.ops) CR_RETURN_IF_ERROR(exec_->Launch(op, LaunchTag{k.name, k.layer}));
  if (watch_) {
    Hasher128 h;
    for (const std::string& name : k.outputs) {
      const Buf& b = bufs_.at(name);
      std::vector<uint8_t> host(b.size());
      CR_RETURN_IF_ERROR(exec_->CopyToHost(host.data(), b.p, host.size()));
      h.Update(host.data(), host.size());
    }
    digests_.push_back(h.Digest());
  }
  return absl::OkStatus();
}

absl::Status OpStep::RunAll() {
  while (!done()) CR_RETURN_IF_ERROR(RunNext());
  return exec_->Synchronize();
}

absl::StatusOr<std::vector<float>> OpStep::ReadFloats(const std::string& name) const {
  auto it = bufs_.find(name);
  if (it == bufs_.end() || it->second.is_int || it->second.is_bytes) {
    return absl::NotFoundError(Cat("no float buffer '", name, "'"));
  }
  std::vector<float> v(static_cast<size_t>(it->second.count));
  CR_RETURN_IF_ERROR(exec_->CopyToHost(v.data(), it->second.p, v.size() * 4));
  return v;
}

absl::StatusOr<std::vector<int32_t>> OpStep::ReadInts(const std::string& name) const {
  auto it = bufs_.find(name);
  if (it == bufs_.end() || !it->second.is_int) return absl::NotFoundError(Cat("no int buffer '", name, "'"));
  std::vector<int32_t> v(static_cast<size_t>(it->second.count));
  CR_RETURN_IF_ERROR(exec_->CopyToHost(v.data(), it->second.p, v.size() * 4));
  return v;
}

bool OpStep::IsIntBuffer(const std::string& name) const {
  auto it = bufs_.find(name);
  return it != bufs_.end() && it->second.is_int;
}

bool OpStep::IsBytesBuffer(const std::string& name) const {
  auto it = bufs_.find(name);
  return it != bufs_.end() && it->second.is_bytes;
}

absl::StatusOr<std::vector<uint8_t>> OpStep::ReadBytes(const std::string& name) const {
  auto it = bufs_.find(name);
  if (it == bufs_.end() || !it->second.is_bytes) return absl::NotFoundError(Cat("no byte buffer '", name, "'"));
  std::vector<uint8_t> v(it->second.size());
  CR_RETURN_IF_ERROR(exec_->CopyToHost(v.data(), it->second.p, v.size()));
  return v;
}

absl::Status OpStep::WriteBytes(const std::string& name, const std::vector<uint8_t>& v) {
  auto it = bufs_.find(name);
  if (it == bufs_.end() || !it->second.is_bytes || it->second.size() != v.size()) {
    return absl::InvalidArgumentError(Cat("no byte buffer '", name, "' of ", v.size(), " bytes"));
  }
  return exec_->CopyToDevice(it->second.p, v.data(), v.size());
}

absl::Status OpStep::WriteFloats(const std::string& name, const std::vector<float>& v) {
  auto it = bufs_.find(name);
  if (it == bufs_.end() || it->second.is_int || it->second.is_bytes || it->second.count != static_cast<int64_t>(v.size())) {
    return absl::InvalidArgumentError(Cat("no float buffer '", name, "' of ", v.size(), " elements"));
  }
  return exec_->CopyToDevice(it->second.p, v.data(), v.size() * 4);
}

absl::Status OpStep::WriteInts(const std::string& name, const std::vector<int32_t>& v) {
  auto it = bufs_.find(name);
  if (it == bufs_.end() || !it->second.is_int || it->second.count != static_cast<int64_t>(v.size())) {
    return absl::InvalidArgumentError(Cat("no int buffer '", name, "' of ", v.size(), " elements"));
  }
  return exec_->CopyToDevice(it->second.p, v.data(), v.size() * 4);
}

absl::StatusOr<Hash128> OpStep::BufferDigest(const std::string& name) const {
  auto it = bufs_.find(name);
  if (it == bufs_.end()) return absl::NotFoundError(Cat("no buffer '", name, "'"));
  std::vector<uint8_t> host(it->second.size());
  CR_RETURN_IF_ERROR(exec_->CopyToHost(host.data(), it->second.p, host.size()));
  Hasher128 h;
  h.Update(host.data(), host.size());
  return h.Digest();
}

absl::StatusOr<Hash128> OpStep::Digest() const {
  CR_ASSIGN_OR_RETURN(std::vector<float> logits, ReadFloats("logits"));
  CR_ASSIGN_OR_RETURN(std::vector<int32_t> next, ReadInts("next_tokens"));
  Hasher128 h;
  h.Update(logits.data(), logits.size() * 4);
  h.Update(next.data(), next.size() * 4);
  return h.Digest();
}

}  // namespace crashreplay::replay
