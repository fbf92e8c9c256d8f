// The MoE launchers of cpu_kernels.h. ExpertMlp runs per (rank, token) item:
// for each of the token's experts, gate and up GEMVs, silu * up (quantized
// to NVFP4 under w4a4), the down GEMV, out += weight * y in top-k order.
// Here the same steps run as phases over all items at once, so that each
// expert's weights are read once for all the tokens routed to it:
//   1. inputs: every (rank, token, k) routed to a local expert is a slot;
//      its input row is prepared (w4a4: decoded with the expert's
//      input_scale, as ExpertMlp's LinearElementQ reads it);
//   2. gate and up rows of each expert over its slots (cpu_dot);
//   3. per slot: the gate/up biases (gpt_oss), silu * up (gpt_oss: the
//      clamped SwiGLU), quantized and decoded when down reads fp4;
//   4. down rows of each expert over its slots, plus down's bias;
//   5. per (rank, token): out = 0 (routed experts) then out + weight * y in
//      k order; the shared expert adds 1 * y to what is there.
// Each element goes through the same operations in the same order as in
// ExpertMlp, so the bits are those of the work items.
#include <algorithm>
#include <vector>

#include "cpu_dot.h"
#include "crashreplay/replay/cpu/cpu_kernels.h"
#include "crashreplay/replay/kernels/act_quant.h"
#include "crashreplay/replay/kernels/elementwise.h"

namespace crashreplay::replay {
namespace {

using cpu::DotJob;
using cpu::PaddedCols;

// Rows per work item: a multiple of every tile height (cpu_kernels.cc).
constexpr int64_t kRowBlock = 48;

// One expert of one rank and the slots routed to it.
struct Group {
  const ExpertView* e = nullptr;
  bool q_in = false;  // gate/up read the quantized input (ExpertMlp's q_in)
  std::vector<int64_t> slots;
};

struct Slot {
  int64_t rt = 0;   // rank * tokens + token
  int64_t t = 0;
  float weight = 1.0f;
};

// The phases over a set of groups, in slot rows the caller owns (none for
// a run that only checks coverage).
class MoeRun {
 public:
  MoeRun(const float* x, const uint8_t* xq, const uint8_t* xq_scales, int64_t hidden, DotKind dot, CpuIsa isa,
         std::vector<float>* buf = nullptr)
      : x_(x), xq_(xq), xq_scales_(xq_scales), H_(hidden), dot_(dot), isa_(isa), buf_(buf) {}

  std::vector<Group> groups;
  std::vector<Slot> slots;

  // Whether every group is covered by the dot engine and no check can fire.
  bool Covered() {
    for (const Group& g : groups) {
      const ExpertView& e = *g.e;
      const int64_t mi = e.gate.rows;
      if (e.gate.cols != H_ || e.up.cols != H_ || e.up.rows != mi || e.down.cols != mi || e.down.rows != H_) {
        return false;
      }
      if (!Ok(e.gate, g.q_in) || !Ok(e.up, g.q_in) || !Ok(e.down, e.down.act_fp4)) return false;
      if (e.down.act_fp4 && (mi % 2 != 0 || !Nvfp4InputScaleValid(e.down.act_scale))) return false;
    }
    return true;
  }

  // Phases 1-4: y rows of every slot.
  void Run(CpuPool& pool) {
    const int64_t S = static_cast<int64_t>(slots.size());
    if (S == 0) return;
    mi_max_ = 0;
    for (const Group& g : groups) mi_max_ = std::max(mi_max_, g.e->gate.rows);
    const int64_t ph = PaddedCols(H_), pm = PaddedCols(mi_max_);
    nbh_ = (H_ + kActBlock - 1) / kActBlock;
    nbm_ = (pm + kActBlock - 1) / kActBlock;
    qbytes_ = (Nvfp4ActValueBytes(pm) + Nvfp4ActScaleBytes(pm) + 3) / 4;
    per_slot_ = ph + nbh_ + 2 * mi_max_ + pm + nbm_ + qbytes_ + H_;
    buf_->assign(static_cast<size_t>(S * per_slot_), 0.0f);

    // 1. inputs.
    std::vector<cpu::ValueRange> slot_range(S);  // what each slot's row holds (cpu_dot.h)
    std::vector<char> slot_q(S, 0);
    std::vector<const ExpertView*> slot_e(S);
    for (const Group& g : groups) {
      for (int64_t s : g.slots) {
        slot_q[s] = g.q_in;
        slot_e[s] = g.e;
      }
    }
    pool.Launch(S, [&](int64_t s, KernelStatus*) {
      const int64_t t = slots[s].t;
      if (slot_q[s]) {
        const QWeight xq = Fp4Row(xq_, xq_scales_, t, H_, slot_e[s]->gate.act_scale);
        cpu::PrepareQRow(xq, dot_, X(s), XS(s));
      } else {
        cpu::PadRow(x_ + t * H_, H_, X(s));
      }
      if (CpuFusedMulAdd()) slot_range[s] = cpu::ScanRange(X(s), H_, isa_);
    });
    GroupRanges(slot_range, &x_range_);

    // 2. gate and up.
    std::vector<Item> items;
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      for (int which = 0; which < 2; ++which)
        AddItems(static_cast<int64_t>(gi), which, groups[gi].e->gate.rows, &items);
    }
    Pointers p = Gather();
    RunItems(pool, items, p);

    // 3. the gate and up biases (gpt_oss), silu * up or the clamped
    // SwiGLU, quantized when down reads fp4.
    pool.Launch(S, [&](int64_t s, KernelStatus* st) {
      const ExpertView& e = *slot_e[s];
      const int64_t mi = e.gate.rows;
      float* a = A(s);
      float *g = G(s), *u = U(s);
      if (e.gate_bias != nullptr) {
        for (int64_t i = 0; i < mi; ++i) g[i] = g[i] + e.gate_bias[i];
      }
      if (e.up_bias != nullptr) {
        for (int64_t i = 0; i < mi; ++i) u[i] = u[i] + e.up_bias[i];
      }
      GatedActRow(g, u, mi, e.glu_alpha, e.glu_limit, a);
      if (e.down.act_fp4) {
        uint8_t* values = reinterpret_cast<uint8_t*>(Q(s));
        uint8_t* scales = values + Nvfp4ActValueBytes(mi);
        // Checked valid before the launch (Covered), so this cannot fire.
        QuantizeNvfp4ActRow(a, mi, e.down.act_scale, values, scales, slots[s].rt, st);
        cpu::PrepareQRow(Nvfp4ActRow(values, scales, mi, e.down.act_scale), dot_, a, AS(s));
      }
      if (CpuFusedMulAdd()) slot_range[s] = cpu::ScanRange(a, mi, isa_);
    });
    GroupRanges(slot_range, &a_range_);

    // 4. down, plus its bias (gpt_oss).
    items.clear();
    for (size_t gi = 0; gi < groups.size(); ++gi) AddItems(static_cast<int64_t>(gi), 2, H_, &items);
    RunItems(pool, items, p);
    pool.Launch(S, [&](int64_t s, KernelStatus*) {
      const float* b = slot_e[s]->down_bias;
      if (b == nullptr) return;
      float* y = Y(s);
      for (int64_t i = 0; i < H_; ++i) y[i] = y[i] + b[i];
    });
  }

  float* Y(int64_t s) { return Base(s) + per_slot_ - H_; }

 private:
  struct Item {
    int64_t group;
    int which;  // 0 gate, 1 up, 2 down
    int64_t r0, r1;
  };
  // Per-slot row pointers, gathered per group (slots of a group contiguous).
  struct Pointers {
    std::vector<const float*> x, xs, a, as;
    std::vector<float*> g, u, y;
    std::vector<int64_t> begin;  // [group] first index
  };

  // out[group] = the union of its slots' ranges.
  void GroupRanges(const std::vector<cpu::ValueRange>& slot, std::vector<cpu::ValueRange>* out) const {
    out->assign(groups.size(), cpu::ValueRange{});
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      bool first = true;
      for (int64_t s : groups[gi].slots) {
        (*out)[gi] = first ? slot[s] : cpu::Merge((*out)[gi], slot[s]);
        first = false;
      }
    }
  }

  bool Ok(const QWeight& w, bool q) const { return cpu::DotCovered(w, dot_, q) && !cpu::DotMayFail(w, dot_, q); }

  float* Base(int64_t s) { return buf_->data() + s * per_slot_; }
  float* X(int64_t s) { return Base(s); }
  float* XS(int64_t s) { return X(s) + PaddedCols(H_); }
  float* G(int64_t s) { return XS(s) + nbh_; }
  float* U(int64_t s) { return G(s) + mi_max_; }
  float* A(int64_t s) { return U(s) + mi_max_; }
  float* AS(int64_t s) { return A(s) + PaddedCols(mi_max_); }
  float* Q(int64_t s) { return AS(s) + nbm_; }

  void AddItems(int64_t group, int which, int64_t rows, std::vector<Item>* items) const {
    for (int64_t r0 = 0; r0 < rows; r0 += kRowBlock)
      items->push_back(Item{group, which, r0, std::min(rows, r0 + kRowBlock)});
  }

  Pointers Gather() {
    Pointers p;
    for (const Group& g : groups) {
      p.begin.push_back(static_cast<int64_t>(p.x.size()));
      for (int64_t s : g.slots) {
        p.x.push_back(X(s));
        p.xs.push_back(XS(s));
        p.a.push_back(A(s));
        p.as.push_back(AS(s));
        p.g.push_back(G(s));
        p.u.push_back(U(s));
        p.y.push_back(Y(s));
      }
    }
    return p;
  }

  // Experts get different numbers of tokens, so threads take row blocks as
  // they finish them (a static split left one thread with most of a
  // prefill's work); each block's outputs are the same whoever runs it.
  void RunItems(CpuPool& pool, const std::vector<Item>& items, const Pointers& p) {
    pool.LaunchDynamic(static_cast<int64_t>(items.size()), [&](int64_t i, KernelStatus*) {
      const Item& it = items[i];
      const Group& g = groups[it.group];
      const int64_t b = p.begin[it.group];
      DotJob j;
      j.kind = dot_;
      j.tokens = static_cast<int64_t>(g.slots.size());
      if (it.which < 2) {
        j.w = it.which == 0 ? &g.e->gate : &g.e->up;
        j.q = g.q_in;
        j.x = p.x.data() + b;
        j.xs = p.xs.data() + b;
        j.x_global = g.e->gate.act_scale;
        j.x_range = x_range_[it.group];
        j.y = (it.which == 0 ? p.g.data() : p.u.data()) + b;
      } else {
        j.w = &g.e->down;
        j.q = g.e->down.act_fp4;
        j.x = p.a.data() + b;
        j.xs = p.as.data() + b;
        j.x_global = g.e->down.act_scale;
        j.x_range = a_range_[it.group];
        j.y = p.y.data() + b;
      }
      cpu::RunRows(j, it.r0, it.r1, isa_);
    });
  }

  const float* x_;
  const uint8_t* xq_;
  const uint8_t* xq_scales_;
  int64_t H_;
  DotKind dot_;
  CpuIsa isa_;
  int64_t mi_max_ = 0, nbh_ = 0, nbm_ = 0, qbytes_ = 0, per_slot_ = 0;
  std::vector<cpu::ValueRange> x_range_, a_range_;  // [group] of its slots' x and a rows
  std::vector<float>* buf_;  // the slot rows (the launcher's, reused by its chunks)
};

// Slot floats of a run whose widest expert has `mi_max` rows (MoeRun::Run's
// layout), for sizing token chunks before the run exists.
int64_t SlotFloats(int64_t hidden, int64_t mi_max) {
  const int64_t ph = PaddedCols(hidden), pm = PaddedCols(mi_max);
  const int64_t nbh = (hidden + kActBlock - 1) / kActBlock, nbm = (pm + kActBlock - 1) / kActBlock;
  const int64_t qbytes = (Nvfp4ActValueBytes(pm) + Nvfp4ActScaleBytes(pm) + 3) / 4;
  return ph + nbh + 2 * mi_max + pm + nbm + qbytes + hidden;
}

}  // namespace

// The slot buffers hold a padded input row and an output row of `hidden`
// floats for every (rank, token, k) routed to a local expert: at GLM-5's
// dimensions and tp 8, 3.3 MB a token. So a long prefill runs in chunks of
// tokens whose slots fit CpuScratchBytes(); each slot's rows are computed
// alone, so the chunking changes how often a weight is read, not the bits.

bool LaunchExpertsFast(const ExpertsOp& o, CpuPool& pool, CpuIsa isa, KernelStatus* status) {
  *status = KernelStatus{};
  if (isa == CpuIsa::kReference || o.ranks <= 0 || o.tokens <= 0 || o.hidden <= 0) return false;
  const int64_t R = o.ranks, T = o.tokens, K = o.k, H = o.hidden;
  // Every expert the step routes to must be covered before anything runs.
  int64_t mi_max = 0;
  {
    MoeRun all(o.x, o.xq, o.xq_scales, H, o.dot, isa);
    std::vector<char> seen(R * o.stride, 0);
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t i = 0; i < T * K; ++i) {
        const int64_t j = o.ids[i] - o.expert_begin[r];
        if (j < 0 || j >= o.local_count[r] || seen[r * o.stride + j]) continue;
        seen[r * o.stride + j] = 1;
        Group g;
        g.e = &o.experts[r * o.stride + j];
        g.q_in = o.xq != nullptr && g.e->gate.act_fp4;
        mi_max = std::max(mi_max, g.e->gate.rows);
        all.groups.push_back(std::move(g));
      }
    }
    if (!all.Covered()) return false;
  }
  const int64_t per_token = std::max<int64_t>(1, R * K * SlotFloats(H, mi_max) * 4);
  const int64_t chunk = std::clamp<int64_t>(static_cast<int64_t>(CpuScratchBytes()) / per_token, 1, T);
  std::vector<int64_t> slot_of;
  std::vector<int64_t> group_of(R * o.stride);
  std::vector<float> rows;
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t t1 = std::min(T, t0 + chunk), C = t1 - t0;
    MoeRun run(o.x, o.xq, o.xq_scales, H, o.dot, isa, &rows);
    // Slots in (rank, token, k) order; groups in (rank, expert) order.
    slot_of.assign(R * C * K, -1);
    std::fill(group_of.begin(), group_of.end(), -1);
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t t = t0; t < t1; ++t) {
        for (int64_t k = 0; k < K; ++k) {
          const int64_t j = o.ids[t * K + k] - o.expert_begin[r];
          if (j < 0 || j >= o.local_count[r]) continue;  // another rank's expert
          int64_t& gi = group_of[r * o.stride + j];
          if (gi < 0) {
            gi = static_cast<int64_t>(run.groups.size());
            Group g;
            g.e = &o.experts[r * o.stride + j];
            g.q_in = o.xq != nullptr && g.e->gate.act_fp4;
            run.groups.push_back(std::move(g));
          }
          const int64_t s = static_cast<int64_t>(run.slots.size());
          run.slots.push_back(Slot{r * T + t, t, o.weights[t * K + k]});
          run.groups[gi].slots.push_back(s);
          slot_of[(r * C + t - t0) * K + k] = s;
        }
      }
    }
    run.Run(pool);
    pool.Launch(R * C, [&](int64_t rc, KernelStatus*) {
      const int64_t r = rc / C, t = t0 + rc % C;
      float* out = o.partial + (r * T + t) * H;
      for (int64_t i = 0; i < H; ++i) out[i] = 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t s = slot_of[rc * K + k];
        if (s < 0) continue;
        const float w = run.slots[s].weight;
        const float* y = run.Y(s);
        for (int64_t i = 0; i < H; ++i) out[i] = MulAdd(out[i], w, y[i]);
      }
    });
  }
  return true;
}

bool LaunchSharedExpertFast(const SharedExpertOp& o, CpuPool& pool, CpuIsa isa, KernelStatus* status) {
  *status = KernelStatus{};
  if (isa == CpuIsa::kReference || o.ranks <= 0 || o.tokens <= 0 || o.hidden <= 0) return false;
  const int64_t R = o.ranks, T = o.tokens, H = o.hidden;
  int64_t mi_max = 0;
  {
    MoeRun all(o.x, o.xq, o.xq_scales, H, o.dot, isa);
    for (int64_t r = 0; r < R; ++r) {
      Group g;
      g.e = &o.shared[r];
      g.q_in = o.xq != nullptr && g.e->gate.act_fp4;
      mi_max = std::max(mi_max, g.e->gate.rows);
      all.groups.push_back(std::move(g));
    }
    if (!all.Covered()) return false;
  }
  // In token chunks, as LaunchExpertsFast.
  const int64_t per_token = std::max<int64_t>(1, R * SlotFloats(H, mi_max) * 4);
  const int64_t chunk = std::clamp<int64_t>(static_cast<int64_t>(CpuScratchBytes()) / per_token, 1, T);
  std::vector<float> rows;
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t t1 = std::min(T, t0 + chunk), C = t1 - t0;
    MoeRun run(o.x, o.xq, o.xq_scales, H, o.dot, isa, &rows);
    for (int64_t r = 0; r < R; ++r) {
      Group g;
      g.e = &o.shared[r];
      g.q_in = o.xq != nullptr && g.e->gate.act_fp4;
      for (int64_t t = t0; t < t1; ++t) {
        g.slots.push_back(static_cast<int64_t>(run.slots.size()));
        run.slots.push_back(Slot{r * T + t, t, 1.0f});
      }
      run.groups.push_back(std::move(g));
    }
    run.Run(pool);
    pool.Launch(R * C, [&](int64_t rc, KernelStatus*) {
      const int64_t r = rc / C, t = t0 + rc % C;
      float* out = o.partial + (r * T + t) * H;
      const float* y = run.Y(rc);
      for (int64_t i = 0; i < H; ++i) out[i] = MulAdd(out[i], 1.0f, y[i]);
    });
  }
  return true;
}

}  // namespace crashreplay::replay
