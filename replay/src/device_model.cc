#include "crashreplay/replay/device_model.h"

#include <algorithm>

#include "crashreplay/base/status.h"

namespace crashreplay::replay {

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

absl::StatusOr<const void*> ExecMemory::Share(const void* host, size_t bytes) {
  if (exec_->host_visible() && host != nullptr) return host;
  CR_ASSIGN_OR_RETURN(void* p, Copy(host, bytes));
  return static_cast<const void*>(p);
}

absl::StatusOr<QWeight> DeviceModel::Weight(const QWeight& w, size_t data_bytes, size_t scale_bytes) {
  QWeight d = w;
  CR_ASSIGN_OR_RETURN(d.data, mem_.Share(w.data, data_bytes));
  if (w.scales != nullptr && scale_bytes > 0) {
    CR_ASSIGN_OR_RETURN(d.scales, mem_.Share(w.scales, scale_bytes));
  }
  if (!exec()->host_visible()) uploaded_ += data_bytes + scale_bytes;
  return d;
}

absl::StatusOr<LinearShardView> DeviceModel::Shard(const LinearShard& s) {
  LinearShardView v;
  CR_ASSIGN_OR_RETURN(v.w, Weight(s.w, s.data.size(), s.scales.size()));
  if (!s.bias.empty()) {
    CR_ASSIGN_OR_RETURN(v.bias, mem_.Share(s.bias));
  }
  return v;
}

absl::StatusOr<const LinearShardView*> DeviceModel::Ranks(const std::vector<LinearShardView>& v) {
  CR_ASSIGN_OR_RETURN(LinearShardView * p, mem_.Copy(v));
  return p;
}

absl::StatusOr<const float*> DeviceModel::Floats(const std::vector<float>& v) {
  if (v.empty()) return static_cast<const float*>(nullptr);
  return mem_.Share(v);
}

absl::StatusOr<std::unique_ptr<DeviceModel>> DeviceModel::Upload(const Model& m, Executor* exec) {
  std::unique_ptr<DeviceModel> dm(new DeviceModel(exec));
  dm->model_ = &m;
  CR_ASSIGN_OR_RETURN(LinearShardView embed, dm->Shard(m.embed));
  dm->embed_ = embed.w;
  CR_ASSIGN_OR_RETURN(dm->final_norm_, dm->Floats(m.final_norm));
  CR_ASSIGN_OR_RETURN(dm->inv_freq_, dm->Floats(m.rope.inv_freq));
  std::vector<LinearShardView> heads;
  for (const LinearShard& s : m.lm_head) {
    CR_ASSIGN_OR_RETURN(LinearShardView v, dm->Shard(s));
    heads.push_back(v);
  }
  CR_ASSIGN_OR_RETURN(dm->lm_head_, dm->Ranks(heads));
  for (const Layer& L : m.layers) {
    LayerViews lv;
    CR_ASSIGN_OR_RETURN(lv.input_norm, dm->Floats(L.input_norm));
    CR_ASSIGN_OR_RETURN(lv.post_norm, dm->Floats(L.post_norm));
    CR_ASSIGN_OR_RETURN(lv.q_norm, dm->Floats(L.q_norm));
    CR_ASSIGN_OR_RETURN(lv.k_norm, dm->Floats(L.k_norm));
    CR_ASSIGN_OR_RETURN(lv.correction_bias, dm->Floats(L.correction_bias));
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
    CR_ASSIGN_OR_RETURN(lv.kv_b, ranks(&RankLayer::kv_b));
    auto one = [&](const LinearShard& s) -> absl::StatusOr<const LinearShardView*> {
      if (s.data.empty()) return static_cast<const LinearShardView*>(nullptr);
      CR_ASSIGN_OR_RETURN(LinearShardView v, dm->Shard(s));
      return dm->Ranks({v});
    };
    const MlaLayer& ml = L.mla;
    CR_ASSIGN_OR_RETURN(lv.q_a, one(ml.q_a));
    CR_ASSIGN_OR_RETURN(lv.kv_a, one(ml.kv_a));
    CR_ASSIGN_OR_RETURN(lv.q_a_norm, dm->Floats(ml.q_a_norm));
    CR_ASSIGN_OR_RETURN(lv.kv_a_norm, dm->Floats(ml.kv_a_norm));
    CR_ASSIGN_OR_RETURN(lv.index_wq_b, one(ml.index_wq_b));
    CR_ASSIGN_OR_RETURN(lv.index_wk, one(ml.index_wk));
    CR_ASSIGN_OR_RETURN(lv.index_weights, one(ml.index_weights));
    CR_ASSIGN_OR_RETURN(lv.index_k_norm, dm->Floats(ml.index_k_norm));
    CR_ASSIGN_OR_RETURN(lv.index_k_norm_bias, dm->Floats(ml.index_k_norm_bias));
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

}  // namespace crashreplay::replay
