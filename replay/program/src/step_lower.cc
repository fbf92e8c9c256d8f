// The one lowering of an engine step: a StepInput becomes the kernel list
// (step.h) of ops (ops.h) over buffers in the executor's memory. The CPU and
// CUDA executors run exactly this list.
#include <algorithm>
#include <cmath>

#include "crashreplay/base/status.h"
#include "crashreplay/replay/program/step.h"
#include "step_lower_internal.h"

namespace crashreplay::replay {

absl::Status StepProgram::Build(const DeviceModel& dm, const EngineConfig& cfg, KvCache* kv) {
  const Model& m = dm.model();
  const ModelSpec& s = m.spec;
  const StepInput& in = input_;
  const int N = m.tp;
  const int64_t R = static_cast<int64_t>(in.rows.size());
  const int64_t H = s.hidden;
  const float eps = static_cast<float>(s.rms_eps);

  // The batch layout: tokens in row order, each row's page table.
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
  CR_RETURN_IF_ERROR(Alloc("input_ids", {T}, true).status());
  CR_RETURN_IF_ERROR(Upload("input_ids", ids.data(), ids.size() * 4));
  CR_ASSIGN_OR_RETURN(Buf * pos_buf, Alloc("positions", {T}, true));
  CR_RETURN_IF_ERROR(Upload("positions", pos.data(), pos.size() * 4));
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
  const std::vector<std::pair<std::string, std::vector<int64_t>>> floats = {
      {"hidden", {T, H}},       {"x", {T, H}},
      {"partial", {N, T, H}},   {"gate", {N, T, il}},
      {"up", {N, T, il}},       {"act", {N, T, il}},
      {"last_hidden", {R, H}},  {"logits_local", {N, R, m.vocab_local}},
      {"logits", {R, s.vocab}}, {"probs", {R, s.vocab}}};
  for (const auto& [name, shape] : floats) CR_RETURN_IF_ERROR(Alloc(name, shape).status());
  if (s.is_moe()) {
    CR_RETURN_IF_ERROR(Alloc("router_logits", {T, s.num_experts}).status());
    CR_RETURN_IF_ERROR(Alloc("topk_ids", {T, s.experts_per_tok}, true).status());
    CR_RETURN_IF_ERROR(Alloc("topk_weights", {T, s.experts_per_tok}).status());
  }
  CR_RETURN_IF_ERROR(Alloc("next_tokens", {R}, true).status());

  const Lowering c{dm, cfg, kv, batch, N, T, R, max_len, in.mode == ForwardMode::kDecode, eps, &input_};
  auto linear = [&](const LinearShardView* shards, DotKind dot, const std::string& x, bool per_rank,
                    const std::string& y, int64_t tokens, int64_t rows, int64_t cols, const std::string& fp4 = "") {
    return MakeLinear(c, shards, dot, x, per_rank, y, tokens, rows, cols, fp4);
  };
  auto norm = [&](const std::string& x, const float* w, const std::string& out, int64_t rows, int64_t n) {
    return MakeNorm(c, x, w, out, rows, n);
  };
  auto act_quant = [&](const std::string& name, int layer, const LinearShard* first, const std::string& x, int64_t rows,
                       int64_t cols, int64_t tpr,
                       const std::string& out) { return ActQuant(name, layer, first, x, rows, cols, tpr, out); };
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
  Add("embedding", -1, {"hidden"}, 0, {emb});
  for (int64_t l = 0; l < s.layers; ++l) {
    const DeviceModel::LayerViews& L = dm.layers()[l];
    const RankLayer& host = m.layers[l].ranks[0];
    const int li = static_cast<int>(l);
    Add("input_norm", li, {"x"}, 0, {norm("hidden", L.input_norm, "x", T, H)});
    CR_RETURN_IF_ERROR(s.mla.enabled() ? LowerMlaAttention(c, l) : LowerGqaAttention(c, l));
    Add("attn_all_reduce", li, {"hidden"}, 0, {reduce()});
    Add("post_attention_norm", li, {"x"}, 0, {norm("hidden", L.post_norm, "x", T, H)});
    if (!L.moe) {
      const int64_t inter = m.intermediate_local;
      CR_ASSIGN_OR_RETURN(const std::string gu_fp4,
                          act_quant("gate_up_act_quant", li, &host.gate, "x", T, H, 0, "x_fp4"));
      Add("gate_proj", li, {"gate"}, T, {linear(L.gate, m.dense_dot, "x", false, "gate", T, inter, H, gu_fp4)});
      Add("up_proj", li, {"up"}, T, {linear(L.up, m.dense_dot, "x", false, "up", T, inter, H, gu_fp4)});
      SiluMulOp sm;
      sm.gate = F("gate");
      sm.up = F("up");
      sm.out = F("act");
      sm.rows = N * T;
      sm.n = inter;
      Add("silu_mul", li, {"act"}, T, {sm});
      CR_RETURN_IF_ERROR(AddProjection(c, li, "down_proj", &host.down, L.down, m.dense_dot, "act", true, "partial", T,
                                       H, inter, "act_fp4"));
      Add("mlp_all_reduce", li, {"hidden"}, 0, {reduce()});
      continue;
    }
    RouterOp ro;
    ro.router = L.router;
    ro.bias = L.router_bias;
    ro.x = F("x");
    ro.logits = F("router_logits");
    ro.tokens = T;
    Add("router", li, {"router_logits"}, 0, {ro});
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
    tk.softmax_after_topk = s.softmax_after_topk;
    tk.scaling = static_cast<float>(s.routed_scaling_factor);
    Add("topk", li, {"topk_ids", "topk_weights"}, 0, {tk});
    // The routed experts of every token on every rank: gate/up GEMVs, SiLU*up,
    // down GEMV, weighted by the router in top-k order into the rank's
    // partial. Under w4a4 the layer's input is quantized once, with the max
    // input_scale of every expert's gate/up, before the routed experts read it.
    CR_ASSIGN_OR_RETURN(const std::string ex_fp4,
                        act_quant("experts_act_quant", li, host.experts.empty() ? nullptr : &host.experts[0].gate, "x",
                                  T, H, 0, "x_fp4"));
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
    Add("experts", li, {"partial"}, T, {ex});
    if (s.n_shared_experts > 0 && L.has_shared) {
      CR_ASSIGN_OR_RETURN(const std::string sh_fp4,
                          act_quant("shared_expert_act_quant", li, &host.shared.gate, "x", T, H, 0, "x_fp4"));
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
      Add("shared_expert", li, {"partial"}, T, {se});
    }
    Add("moe_all_reduce", li, {"hidden"}, 0, {reduce()});
  }
  RmsNormOp fn = norm("hidden", dm.final_norm(), "last_hidden", R, H);
  fn.gather = row_last_d;
  Add("final_norm", -1, {"last_hidden"}, 0, {fn});
  Add("lm_head", -1, {"logits_local"}, R,
      {linear(dm.lm_head(), m.dense_dot, "last_hidden", false, "logits_local", R, m.vocab_local, H)});
  GatherLogitsOp g;
  g.local = F("logits_local");
  g.logits = F("logits");
  g.ranks = N;
  g.rows = R;
  g.vocab_local = m.vocab_local;
  Add("logits_all_gather", -1, {"logits"}, 0, {g});
  ProcessLogitsOp pl;
  pl.logits = F("logits");
  pl.probs = F("probs");
  pl.params = params_d;
  pl.rows = R;
  pl.vocab = static_cast<int32_t>(s.vocab);
  pl.sorted = cfg.sampling_backend == SamplingBackend::kSorted;
  Add("logits_processor", -1, {"probs"}, 0, {pl});
  SampleOp sa;
  sa.logits = F("logits");
  sa.probs = F("probs");
  sa.params = params_d;
  sa.request_id = request_d;
  sa.sample_offset = offset_d;
  sa.next = I("next_tokens");
  sa.rows = R;
  sa.vocab = static_cast<int32_t>(s.vocab);
  Add("sampler", -1, {"next_tokens"}, 0, {sa});
  return absl::OkStatus();
}

absl::Status StepProgram::Ensure(const std::string& name, std::vector<int64_t> shape, bool is_int) {
  if (bufs_.count(name)) return absl::OkStatus();
  return Alloc(name, std::move(shape), is_int).status();
}

LinearOp StepProgram::MakeLinear(const Lowering& c, const LinearShardView* shards, DotKind dot, const std::string& x,
                                 bool per_rank, const std::string& y, int64_t tokens, int64_t rows, int64_t cols,
                                 const std::string& fp4, int ranks) {
  LinearOp op;
  op.shards = shards;
  op.weight_format = c.dm.FormatOf(shards);
  op.dot = dot;
  op.x = F(x);
  if (!fp4.empty()) {
    op.xq = U8(fp4);
    op.xq_scales = U8(fp4 + "_scale");
  }
  op.x_per_rank = per_rank;
  op.y = F(y);
  op.ranks = ranks > 0 ? ranks : c.ranks;
  op.tokens = tokens;
  op.rows = rows;
  op.cols = cols;
  return op;
}

RmsNormOp StepProgram::MakeNorm(const Lowering& c, const std::string& x, const float* w, const std::string& out,
                                int64_t rows, int64_t n) {
  RmsNormOp op;
  op.x = F(x);
  op.w = w;
  op.out = F(out);
  op.rows = rows;
  op.n = n;
  op.eps = c.eps;
  return op;
}

// w4a4: a kernel quantizing `x` ([rows, cols], rows = ranks * tpr when
// tpr > 0) into `out` and `out`_scale with the input_scale of `first`'s
// group (the layers reading the same input share it); "" when the group's
// input is not quantized.
absl::StatusOr<std::string> StepProgram::ActQuant(const std::string& name, int layer, const LinearShard* first,
                                                  const std::string& x, int64_t rows, int64_t cols, int64_t tpr,
                                                  const std::string& out) {
  if (first == nullptr || !first->w.act_fp4) return std::string();
  const std::string scales = out + "_scale";
  if (bufs_.find(out) == bufs_.end()) {
    std::vector<int64_t> lead{rows};
    if (tpr > 0) lead = {rows / tpr, tpr};
    std::vector<int64_t> vshape = lead, sshape = lead;
    vshape.push_back(Nvfp4ActValueBytes(cols));
    sshape.push_back(Nvfp4ActScaleBytes(cols));
    CR_RETURN_IF_ERROR(Alloc(out, vshape, false, true).status());
    CR_RETURN_IF_ERROR(Alloc(scales, sshape, false, true).status());
  }
  ActQuantOp op;
  op.x = F(x);
  op.values = U8(out);
  op.scales = U8(scales);
  op.rows = rows;
  op.cols = cols;
  op.input_scale = first->w.act_scale;
  Add(name, layer, {out, scales}, tpr, {op});
  return out;
}

// A projection as both lowerings launch it: under w4a4 (`first`'s group has
// an input scale) the kernel NAME_act_quant (NAME less its "_proj") quantizes
// x into `xq` (ActQuant: [ranks * tokens, cols] per rank when per_rank, else
// [tokens, cols]), then kernel `name` is the linear x -> y (MakeLinear's
// arguments). A group sharing one quantization (q/k/v, gate/up) calls
// ActQuant once and MakeLinear for each.
absl::Status StepProgram::AddProjection(const Lowering& c, int layer, const std::string& name, const LinearShard* first,
                                        const LinearShardView* shards, DotKind dot, const std::string& x, bool per_rank,
                                        const std::string& y, int64_t tokens, int64_t rows, int64_t cols,
                                        const std::string& xq, int ranks) {
  const std::string base = name.ends_with("_proj") ? name.substr(0, name.size() - 5) : name;
  CR_ASSIGN_OR_RETURN(const std::string fp4,
                      ActQuant(base + "_act_quant", layer, first, x, per_rank ? c.ranks * tokens : tokens, cols,
                               per_rank ? tokens : 0, xq));
  Add(name, layer, {y}, tokens, {MakeLinear(c, shards, dot, x, per_rank, y, tokens, rows, cols, fp4, ranks)});
  return absl::OkStatus();
}

// GQA attention of one layer: q/k/v projections (+ bias), qk-norm, RoPE, the
// K/V write into the paged cache, attention, o_proj into the rank partials.
absl::Status StepProgram::LowerGqaAttention(const Lowering& c, int64_t l) {
  const Model& m = c.dm.model();
  const ModelSpec& s = m.spec;
  const DeviceModel::LayerViews& L = c.dm.layers()[l];
  const RankLayer& host = m.layers[l].ranks[0];
  const int li = static_cast<int>(l);
  const int N = c.ranks;
  const int64_t T = c.tokens, H = s.hidden, hd = s.head_dim;
  const int64_t qd = m.heads_local * hd, kvd = m.kv_heads_local * hd;
  CR_RETURN_IF_ERROR(Ensure("q", {N, T, qd}));
  CR_RETURN_IF_ERROR(Ensure("k", {N, T, kvd}));
  CR_RETURN_IF_ERROR(Ensure("v", {N, T, kvd}));
  CR_RETURN_IF_ERROR(Ensure("attn", {N, T, qd}));
  CR_ASSIGN_OR_RETURN(const std::string qkv_fp4, ActQuant("qkv_act_quant", li, &host.q, "x", T, H, 0, "x_fp4"));
  Add("q_proj", li, {"q"}, T, {MakeLinear(c, L.q, m.dense_dot, "x", false, "q", T, qd, H, qkv_fp4)});
  Add("k_proj", li, {"k"}, T, {MakeLinear(c, L.k, m.dense_dot, "x", false, "k", T, kvd, H, qkv_fp4)});
  Add("v_proj", li, {"v"}, T, {MakeLinear(c, L.v, m.dense_dot, "x", false, "v", T, kvd, H, qkv_fp4)});
  if (s.qk_norm) {
    Add("qk_norm", li, {"q", "k"}, T,
        {MakeNorm(c, "q", L.q_norm, "q", N * T * m.heads_local, hd),
         MakeNorm(c, "k", L.k_norm, "k", N * T * m.kv_heads_local, hd)});
  }
  auto rope = [&](const std::string& x, int64_t heads) {
    RopeOp op;
    op.x = F(x);
    op.positions = I("positions");
    op.inv_freq = c.dm.inv_freq();
    op.rows = N * T;
    op.tokens = T;
    op.heads = heads;
    op.head_dim = hd;
    op.rotary_dim = m.rope.rotary_dim;
    op.mscale = m.rope.mscale;
    return op;
  };
  Add("rope", li, {"q", "k"}, T, {rope("q", m.heads_local), rope("k", m.kv_heads_local)});
  KvWriteOp kw;
  kw.views = c.kv->views(l);
  kw.k = F("k");
  kw.v = F("v");
  kw.batch = c.batch;
  kw.ranks = N;
  kw.kvd = kvd;
  Add("kv_write", li, {}, T, {kw});
  AttentionOp at;
  at.views = c.kv->views(l);
  at.q = F("q");
  at.out = F("attn");
  at.batch = c.batch;
  at.backend = static_cast<int32_t>(c.decode ? c.cfg.attention_backend : AttentionBackend::kReference);
  at.ranks = N;
  at.heads = m.heads_local;
  at.group = m.heads_local / m.kv_heads_local;
  at.head_dim = hd;
  at.max_len = c.max_len;
  at.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  at.window = s.window_of(l);
  at.sinks = L.sinks;
  Add("attention", li, {"attn"}, T, {at});
  CR_RETURN_IF_ERROR(
      AddProjection(c, li, "o_proj", &host.o, L.o, m.dense_dot, "attn", true, "partial", T, H, qd, "attn_fp4"));
  return absl::OkStatus();
}

}  // namespace crashreplay::replay
