// The MLA / DSA attention of one layer (DeepSeek-V3, DeepSeek-V3.2, GLM-5),
// the lowering's counterpart of LowerGqaAttention. Kernels, in order:
//
//   q_a_proj, q_a_norm, q_b_proj     (or q_proj without q_lora); q per rank
//   kv_a_proj, kv_a_norm             the latent [c | k_rot], once for all ranks
//   rope                             q's rope part and k_rot
//   kv_write                         the latent into every rank's cache
//   DSA layers with their own indexer:
//     indexer_q_proj, indexer_k_proj, indexer_k_norm, indexer_weights_proj,
//     indexer_rope, index_k_write, indexer (top-k per token and rank);
//     a "shared" layer reuses the last indexer's top-k
//   expanded form (prefill; decode with mla_decode=naive):
//     latent_gather, kv_b_proj, attention (MlaAttentionOp; over the top-k
//     in DSA models)
//   absorbed form (decode with mla_decode=absorbed; every DSA decode):
//     q_absorb, attention (LatentAttentionOp: paged64, sparse reference or
//     tiled64), v_up
//   o_proj                           row-parallel into the rank partials
#include <cmath>

#include "crashreplay/base/status.h"
#include "crashreplay/base/text.h"
#include "crashreplay/replay/program/step.h"
#include "step_lower_internal.h"

namespace crashreplay::replay {
namespace {

using text::Cat;

double YarnGetMscale(double scale, double mscale) { return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

// transformers' DeepseekV3Attention.scaling: qk_head_dim^-1/2, times
// yarn_get_mscale(factor, mscale_all_dim)^2 when the RoPE is scaled and
// mscale_all_dim is set (DeepSeek's softmax_scale * mscale * mscale).
float MlaSoftmaxScale(const Model& m) {
  double scale = 1.0 / std::sqrt(static_cast<double>(m.spec.mla.qk_head_dim()));
  const RopeSpec& r = m.rope.used;
  if (r.type != "default" && r.mscale_all_dim != 0.0) {
    const double ms = YarnGetMscale(r.factor, r.mscale_all_dim);
    scale = scale * ms * ms;
  }
  return static_cast<float>(scale);
}

}  // namespace

absl::Status StepProgram::LowerMlaAttention(const Lowering& c, int64_t l) {
  const Model& m = c.dm.model();
  const ModelSpec& s = m.spec;
  const MlaSpec& ms = s.mla;
  const DeviceModel::LayerViews& L = c.dm.layers()[l];
  const MlaLayer& ml = m.layers[l].mla;
  const RankLayer& host = m.layers[l].ranks[0];
  const int li = static_cast<int>(l);
  const int N = c.ranks;
  const int64_t T = c.tokens, H = s.hidden, heads = m.heads_local;
  const int64_t nope = ms.qk_nope_head_dim, rope = ms.qk_rope_head_dim, vd = ms.v_head_dim;
  const int64_t lora = ms.kv_lora_rank, qlora = ms.q_lora_rank, qk = nope + rope, kva = lora + rope;
  const int64_t qd = heads * qk, od = heads * vd;
  const DotKind dot = m.dense_dot;
  CR_RETURN_IF_ERROR(Ensure("q", {N, T, qd}));
  CR_RETURN_IF_ERROR(Ensure("kv_a", {T, kva}));
  CR_RETURN_IF_ERROR(Ensure("attn", {N, T, od}));

  // The q and latent projections (x is shared: one quantization under w4a4).
  const LinearShard* x_first = ml.kv_a.w.act_fp4 ? &ml.kv_a : qlora > 0 ? &ml.q_a : &host.q;
  CR_ASSIGN_OR_RETURN(const std::string x_fp4, ActQuant("qkv_a_act_quant", li, x_first, "x", T, H, 0, "x_fp4"));
  if (qlora > 0) {
    CR_RETURN_IF_ERROR(Ensure("q_a", {T, qlora}));
    Add("q_a_proj", li, {"q_a"}, T, {MakeLinear(c, L.q_a, dot, "x", false, "q_a", T, qlora, H, x_fp4, 1)});
    RmsNormOp qn = MakeNorm(c, "q_a", L.q_a_norm, "q_a", T, qlora);
    qn.eps = static_cast<float>(kMlaNormEps);
    Add("q_a_norm", li, {"q_a"}, 0, {qn});
    CR_RETURN_IF_ERROR(AddProjection(c, li, "q_b_proj", &host.q, L.q, dot, "q_a", false, "q", T, qd, qlora, "q_a_fp4"));
  } else {
    Add("q_proj", li, {"q"}, T, {MakeLinear(c, L.q, dot, "x", false, "q", T, qd, H, x_fp4)});
  }
  Add("kv_a_proj", li, {"kv_a"}, T, {MakeLinear(c, L.kv_a, dot, "x", false, "kv_a", T, kva, H, x_fp4, 1)});
  RmsNormOp kn = MakeNorm(c, "kv_a", L.kv_a_norm, "kv_a", T, lora);
  kn.stride = kva;
  kn.eps = static_cast<float>(kMlaNormEps);
  Add("kv_a_norm", li, {"kv_a"}, 0, {kn});
  auto rope_op = [&](const std::string& x, int64_t rows, int64_t nheads, int64_t head_dim, int64_t offset,
                     bool interleaved) {
    RopeOp op;
    op.x = F(x);
    op.positions = I("positions");
    op.inv_freq = c.dm.inv_freq();
    op.rows = rows;
    op.tokens = T;
    op.heads = nheads;
    op.head_dim = head_dim;
    op.rot_offset = offset;
    op.rotary_dim = rope;
    op.mscale = m.rope.mscale;
    op.interleaved = interleaved;
    return op;
  };
  Add("rope", li, {"q", "kv_a"}, 0,
      {rope_op("q", N * T, heads, qk, nope, ms.rope_interleave), rope_op("kv_a", T, 1, kva, lora, ms.rope_interleave)});
  LatentWriteOp lw;
  lw.views = c.kv->latent_views(l);
  lw.kv_a = F("kv_a");
  lw.batch = c.batch;
  lw.ranks = N;
  Add("kv_write", li, {}, T, {lw});

  // The lightning indexer: this layer's own, or the last one's top-k.
  const bool sparse = ms.dsa();
  const int64_t topk = ms.index_topk;
  if (ml.has_indexer) {
    const int64_t nh = ms.index_n_heads, idim = ms.index_head_dim;
    CR_RETURN_IF_ERROR(Ensure("index_q", {T, nh * idim}));
    CR_RETURN_IF_ERROR(Ensure("index_k", {T, idim}));
    CR_RETURN_IF_ERROR(Ensure("index_w", {T, nh}));
    CR_RETURN_IF_ERROR(Ensure("index_topk", {N, T, topk}, true));
    CR_RETURN_IF_ERROR(AddProjection(c, li, "indexer_q_proj", &ml.index_wq_b, L.index_wq_b, dot, "q_a", false,
                                     "index_q", T, nh * idim, qlora, "q_a_fp4", 1));
    CR_RETURN_IF_ERROR(AddProjection(c, li, "indexer_k_proj", &ml.index_wk, L.index_wk, dot, "x", false, "index_k", T,
                                     idim, H, "x_fp4", 1));
    RmsNormOp ln = MakeNorm(c, "index_k", L.index_k_norm, "index_k", T, idim);
    ln.bias = L.index_k_norm_bias;
    ln.eps = static_cast<float>(kMlaNormEps);
    Add("indexer_k_norm", li, {"index_k"}, 0, {ln});
    CR_RETURN_IF_ERROR(AddProjection(c, li, "indexer_weights_proj", &ml.index_weights, L.index_weights, dot, "x", false,
                                     "index_w", T, nh, H, "x_fp4", 1));
    Add("indexer_rope", li, {"index_q", "index_k"}, 0,
        {rope_op("index_q", T, nh, idim, 0, ms.index_rope_interleave),
         rope_op("index_k", T, 1, idim, 0, ms.index_rope_interleave)});
    IndexKWriteOp kw;
    kw.views = c.kv->index_views(l);
    kw.k = F("index_k");
    kw.batch = c.batch;
    kw.ranks = N;
    kw.dim = idim;
    kw.fp8 = c.cfg.index_cache_dtype == KvCacheDType::kFp8E4m3;
    Add("index_k_write", li, {}, T, {kw});
    IndexerOp ix;
    ix.views = c.kv->index_views(l);
    ix.q = F("index_q");
    ix.w = F("index_w");
    ix.ids = I("index_topk");
    ix.batch = c.batch;
    ix.ranks = N;
    ix.heads = nh;
    ix.dim = idim;
    ix.topk = topk;
    ix.max_len = c.max_len;
    ix.fp8 = kw.fp8;
    Add("indexer", li, {"index_topk"}, T, {ix});
  } else if (sparse && bufs_.find("index_topk") == bufs_.end()) {
    return absl::InvalidArgumentError(Cat("layer ", l, " reuses an earlier indexer's top-k, but none ran before it"));
  }
  const int32_t* ids = sparse ? I("index_topk") : nullptr;
  const float scale = MlaSoftmaxScale(m);

  const bool expanded = !c.decode || (!sparse && c.cfg.mla_decode == MlaDecode::kNaive);
  if (expanded) {
    // Every row's positions [0, start + tokens), gathered once per step.
    if (bufs_.find("gather_row") == bufs_.end()) {
      std::vector<int32_t> grow, gpos, begin;
      for (size_t r = 0; r < c.input->rows.size(); ++r) {
        const StepRow& row = c.input->rows[r];
        begin.push_back(static_cast<int32_t>(grow.size()));
        const int64_t end = row.start_pos + static_cast<int64_t>(row.tokens.size());
        for (int64_t p = 0; p < end; ++p) {
          grow.push_back(static_cast<int32_t>(r));
          gpos.push_back(static_cast<int32_t>(p));
        }
      }
      const int64_t n = static_cast<int64_t>(grow.size()), R = static_cast<int64_t>(begin.size());
      CR_RETURN_IF_ERROR(Alloc("gather_row", {n}, true).status());
      CR_RETURN_IF_ERROR(Alloc("gather_pos", {n}, true).status());
      CR_RETURN_IF_ERROR(Alloc("gather_row_begin", {R}, true).status());
      CR_RETURN_IF_ERROR(Upload("gather_row", grow.data(), grow.size() * 4));
      CR_RETURN_IF_ERROR(Upload("gather_pos", gpos.data(), gpos.size() * 4));
      CR_RETURN_IF_ERROR(Upload("gather_row_begin", begin.data(), begin.size() * 4));
    }
    const int64_t n = bufs_.at("gather_row").count;
    CR_RETURN_IF_ERROR(Ensure("latent_c", {N, n, lora}));
    CR_RETURN_IF_ERROR(Ensure("latent_rot", {N, n, rope}));
    CR_RETURN_IF_ERROR(Ensure("kv_expanded", {N, n, heads * (nope + vd)}));
    LatentGatherOp g;
    g.views = c.kv->latent_views(l);
    g.batch = c.batch;
    g.row = I("gather_row");
    g.pos = I("gather_pos");
    g.c = F("latent_c");
    g.rot = F("latent_rot");
    g.ranks = N;
    g.n = n;
    g.kv_lora = lora;
    g.rope = rope;
    Add("latent_gather", li, {"latent_c", "latent_rot"}, n, {g});
    CR_RETURN_IF_ERROR(AddProjection(c, li, "kv_b_proj", &host.kv_b, L.kv_b, dot, "latent_c", true, "kv_expanded", n,
                                     heads * (nope + vd), lora, "latent_fp4"));
    MlaAttentionOp at;
    at.q = F("q");
    at.kv = F("kv_expanded");
    at.rot = F("latent_rot");
    at.row_begin = I("gather_row_begin");
    at.topk = ids;
    at.out = F("attn");
    at.batch = c.batch;
    at.ranks = N;
    at.n = n;
    at.heads = heads;
    at.nope = nope;
    at.rope = rope;
    at.v_dim = vd;
    at.topk_width = sparse ? topk : 0;
    at.max_len = c.max_len;
    at.scale = scale;
    Add("attention", li, {"attn"}, T, {at});
  } else {
    CR_RETURN_IF_ERROR(Ensure("q_latent", {N, T, heads, kva}));
    CR_RETURN_IF_ERROR(Ensure("attn_latent", {N, T, heads, lora}));
    MlaQAbsorbOp qa;
    qa.kv_b = L.kv_b;
    qa.q = F("q");
    qa.q576 = F("q_latent");
    qa.ranks = N;
    qa.tokens = T;
    qa.heads = heads;
    qa.nope = nope;
    qa.rope = rope;
    qa.v_dim = vd;
    qa.kv_lora = lora;
    Add("q_absorb", li, {"q_latent"}, T, {qa});
    LatentAttentionOp at;
    at.views = c.kv->latent_views(l);
    at.q576 = F("q_latent");
    at.topk = ids;
    at.out = F("attn_latent");
    at.batch = c.batch;
    at.variant = static_cast<int32_t>(!sparse                                   ? LatentAttention::kPaged64
                                      : c.cfg.dsa_decode == DsaDecode::kTiled64 ? LatentAttention::kSparseTiled64
                                                                                : LatentAttention::kSparseReference);
    at.ranks = N;
    at.heads = heads;
    at.kv_lora = lora;
    at.rope = rope;
    at.topk_width = sparse ? topk : 0;
    at.max_len = c.max_len;
    at.scale = scale;
    Add("attention", li, {"attn_latent"}, T, {at});
    MlaVUpOp vu;
    vu.kv_b = L.kv_b;
    vu.o_lat = F("attn_latent");
    vu.out = F("attn");
    vu.dot = dot;
    vu.ranks = N;
    vu.tokens = T;
    vu.heads = heads;
    vu.nope = nope;
    vu.v_dim = vd;
    vu.kv_lora = lora;
    Add("v_up", li, {"attn"}, T, {vu});
  }
  CR_RETURN_IF_ERROR(AddProjection(c, li, "o_proj", &host.o, L.o, dot, "attn", true, "partial", T, H, od, "attn_fp4"));
  return absl::OkStatus();
}

}  // namespace crashreplay::replay
