#include "crashreplay/replay/program/device_model.h"

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
  bytes_ += bytes;
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

absl::StatusOr<QWeight> DeviceModel::Weight(ExecMemory& mem, const QWeight& w, size_t data_bytes, size_t scale_bytes) {
  QWeight d = w;
  if (StridedRows(w) && !mem.exec()->host_visible() && w.data != nullptr) {
    // A column split read in place on the host: uploaded as packed rows.
    const std::vector<uint8_t> packed = DenseRows(w);
    CR_ASSIGN_OR_RETURN(void* p, mem.Copy(packed.data(), packed.size()));
    d.data = p;
    d.row_stride = 0;
  } else {
    CR_ASSIGN_OR_RETURN(d.data, mem.Share(w.data, data_bytes));
  }
  if (w.scales != nullptr && scale_bytes > 0) {
    CR_ASSIGN_OR_RETURN(d.scales, mem.Share(w.scales, scale_bytes));
  }
  return d;
}

absl::StatusOr<LinearShardView> DeviceModel::Shard(ExecMemory& mem, const LinearShard& s) {
  LinearShardView v;
  CR_ASSIGN_OR_RETURN(v.w, Weight(mem, s.w, s.data.size(), s.scales.size()));
  if (!s.bias.empty()) {
    CR_ASSIGN_OR_RETURN(v.bias, mem.Share(s.bias));
  }
  return v;
}

absl::StatusOr<const float*> DeviceModel::Floats(const std::vector<float>& v) {
  if (v.empty()) return static_cast<const float*>(nullptr);
  return mem_.Share(v);
}

namespace {

// A shard the layer has (a released, streamed shard keeps its shape).
bool Present(const LinearShard& s) { return s.w.rows > 0; }

uint64_t ShardBytes(const LinearShard& s) { return s.bytes(); }

}  // namespace

struct DeviceModel::LayerArrays {
  // Per rank (empty: the layer has no such shard).
  std::vector<LinearShardView> q, k, v, o, kv_b, gate, up, down;
  // MLA's replicated projections: one element or none.
  std::vector<LinearShardView> q_a, kv_a, index_wq_b, index_wk, index_weights;
  std::vector<ExpertView> experts;  // [ranks * stride]
  std::vector<ExpertView> shared;   // [ranks] or none
  uint64_t bytes = 0;               // weight bytes behind the views

  // The arrays in a fixed order, as (bytes, size); the order slots_ follows.
  std::vector<std::pair<const void*, size_t>> Parts() const {
    std::vector<std::pair<const void*, size_t>> out;
    for (const auto* a :
         {&q, &k, &v, &o, &kv_b, &gate, &up, &down, &q_a, &kv_a, &index_wq_b, &index_wk, &index_weights}) {
      out.emplace_back(a->data(), a->size() * sizeof(LinearShardView));
    }
    out.emplace_back(experts.data(), experts.size() * sizeof(ExpertView));
    out.emplace_back(shared.data(), shared.size() * sizeof(ExpertView));
    return out;
  }
};

absl::StatusOr<DeviceModel::LayerArrays> DeviceModel::Arrays(const Layer& L, ExecMemory& mem, int64_t stride,
                                                             bool fill) {
  LayerArrays a;
  auto view = [&](const LinearShard& s) -> absl::StatusOr<LinearShardView> {
    if (!fill) return LinearShardView{};
    a.bytes += ShardBytes(s);
    return Shard(mem, s);
  };
  auto ranks = [&](LinearShard RankLayer::* member, std::vector<LinearShardView>* out) -> absl::Status {
    for (const RankLayer& rl : L.ranks) {
      if (!Present(rl.*member)) {
        out->clear();
        return absl::OkStatus();
      }
      CR_ASSIGN_OR_RETURN(LinearShardView s, view(rl.*member));
      out->push_back(s);
    }
    return absl::OkStatus();
  };
  auto one = [&](const LinearShard& s, std::vector<LinearShardView>* out) -> absl::Status {
    if (!Present(s)) return absl::OkStatus();
    CR_ASSIGN_OR_RETURN(LinearShardView v, view(s));
    out->push_back(v);
    return absl::OkStatus();
  };
  CR_RETURN_IF_ERROR(ranks(&RankLayer::q, &a.q));
  CR_RETURN_IF_ERROR(ranks(&RankLayer::k, &a.k));
  CR_RETURN_IF_ERROR(ranks(&RankLayer::v, &a.v));
  CR_RETURN_IF_ERROR(ranks(&RankLayer::o, &a.o));
  CR_RETURN_IF_ERROR(ranks(&RankLayer::kv_b, &a.kv_b));
  CR_RETURN_IF_ERROR(one(L.mla.q_a, &a.q_a));
  CR_RETURN_IF_ERROR(one(L.mla.kv_a, &a.kv_a));
  CR_RETURN_IF_ERROR(one(L.mla.index_wq_b, &a.index_wq_b));
  CR_RETURN_IF_ERROR(one(L.mla.index_wk, &a.index_wk));
  CR_RETURN_IF_ERROR(one(L.mla.index_weights, &a.index_weights));
  if (!L.moe) {
    CR_RETURN_IF_ERROR(ranks(&RankLayer::gate, &a.gate));
    CR_RETURN_IF_ERROR(ranks(&RankLayer::up, &a.up));
    CR_RETURN_IF_ERROR(ranks(&RankLayer::down, &a.down));
    return a;
  }
  auto expert = [&](const ExpertShard& e) -> absl::StatusOr<ExpertView> {
    ExpertView v;
    if (!fill) return v;
    a.bytes += ShardBytes(e.gate) + ShardBytes(e.up) + ShardBytes(e.down);
    CR_ASSIGN_OR_RETURN(v.gate, Weight(mem, e.gate.w, e.gate.data.size(), e.gate.scales.size()));
    CR_ASSIGN_OR_RETURN(v.up, Weight(mem, e.up.w, e.up.data.size(), e.up.scales.size()));
    CR_ASSIGN_OR_RETURN(v.down, Weight(mem, e.down.w, e.down.data.size(), e.down.scales.size()));
    auto bias = [&](const LinearShard& s, const float** out) -> absl::Status {
      if (s.bias.empty()) return absl::OkStatus();
      CR_ASSIGN_OR_RETURN(*out, mem.Share(s.bias));
      return absl::OkStatus();
    };
    CR_RETURN_IF_ERROR(bias(e.gate, &v.gate_bias));
    CR_RETURN_IF_ERROR(bias(e.up, &v.up_bias));
    CR_RETURN_IF_ERROR(bias(e.down, &v.down_bias));
    v.glu_alpha = static_cast<float>(model_->spec.swiglu_alpha);
    v.glu_limit = static_cast<float>(model_->spec.swiglu_limit);
    return v;
  };
  a.experts.resize(L.ranks.size() * stride);
  std::vector<ExpertView> shared;
  for (size_t r = 0; r < L.ranks.size(); ++r) {
    const RankLayer& rl = L.ranks[r];
    for (size_t j = 0; j < rl.experts.size(); ++j) {
      CR_ASSIGN_OR_RETURN(a.experts[r * stride + j], expert(rl.experts[j]));
    }
    if (rl.has_shared) {
      CR_ASSIGN_OR_RETURN(ExpertView sv, expert(rl.shared));
      shared.push_back(sv);
    }
  }
  if (shared.size() == L.ranks.size()) a.shared = std::move(shared);
  return a;
}

absl::StatusOr<std::unique_ptr<DeviceModel>> DeviceModel::Upload(const Model& m, Executor* exec) {
  return Make(m, exec, false);
}

absl::StatusOr<std::unique_ptr<DeviceModel>> DeviceModel::UploadStreaming(Model& m, Executor* exec) {
  CR_ASSIGN_OR_RETURN(std::unique_ptr<DeviceModel> dm, Make(m, exec, true));
  dm->host_ = &m;
  return dm;
}

absl::StatusOr<std::unique_ptr<DeviceModel>> DeviceModel::Make(const Model& m, Executor* exec, bool stream) {
  std::unique_ptr<DeviceModel> dm(new DeviceModel(exec));
  dm->model_ = &m;
  dm->streaming_ = stream;
  auto resident = [&](const LinearShard& s) -> absl::StatusOr<LinearShardView> {
    if (!exec->host_visible()) dm->uploaded_ += ShardBytes(s);
    return dm->Shard(dm->mem_, s);
  };
  CR_ASSIGN_OR_RETURN(LinearShardView embed, resident(m.embed));
  dm->embed_ = embed.w;
  CR_ASSIGN_OR_RETURN(dm->final_norm_, dm->Floats(m.final_norm));
  CR_ASSIGN_OR_RETURN(dm->inv_freq_, dm->Floats(m.rope.inv_freq));
  std::vector<LinearShardView> heads;
  for (const LinearShard& s : m.lm_head) {
    CR_ASSIGN_OR_RETURN(LinearShardView v, resident(s));
    heads.push_back(v);
  }
  CR_ASSIGN_OR_RETURN(dm->lm_head_, dm->mem_.Copy(heads));
  if (!m.lm_head.empty()) dm->formats_[dm->lm_head_] = m.lm_head.front().w.format;
  for (const Layer& L : m.layers) {
    LayerViews lv;
    CR_ASSIGN_OR_RETURN(lv.input_norm, dm->Floats(L.input_norm));
    CR_ASSIGN_OR_RETURN(lv.post_norm, dm->Floats(L.post_norm));
    CR_ASSIGN_OR_RETURN(lv.q_norm, dm->Floats(L.q_norm));
    CR_ASSIGN_OR_RETURN(lv.k_norm, dm->Floats(L.k_norm));
    CR_ASSIGN_OR_RETURN(lv.correction_bias, dm->Floats(L.correction_bias));
    CR_ASSIGN_OR_RETURN(lv.sinks, dm->Floats(L.sinks));
    CR_ASSIGN_OR_RETURN(lv.q_a_norm, dm->Floats(L.mla.q_a_norm));
    CR_ASSIGN_OR_RETURN(lv.kv_a_norm, dm->Floats(L.mla.kv_a_norm));
    CR_ASSIGN_OR_RETURN(lv.index_k_norm, dm->Floats(L.mla.index_k_norm));
    CR_ASSIGN_OR_RETURN(lv.index_k_norm_bias, dm->Floats(L.mla.index_k_norm_bias));
    lv.moe = L.moe;
    int64_t stride = 1;
    for (const RankLayer& rl : L.ranks) stride = std::max<int64_t>(stride, static_cast<int64_t>(rl.experts.size()));
    if (L.moe) {
      CR_ASSIGN_OR_RETURN(LinearShardView router, resident(L.router));
      lv.router = router.w;
      lv.router_bias = router.bias;
      std::vector<int32_t> count;
      std::vector<int64_t> begin;
      for (const RankLayer& rl : L.ranks) {
        count.push_back(static_cast<int32_t>(rl.experts.size()));
        begin.push_back(rl.expert_begin);
        if (rl.has_shared) lv.shared_inter = std::max<int64_t>(lv.shared_inter, rl.shared.gate.w.rows);
      }
      CR_ASSIGN_OR_RETURN(lv.local_count, dm->mem_.Copy(count));
      CR_ASSIGN_OR_RETURN(lv.expert_begin, dm->mem_.Copy(begin));
      lv.expert_stride = stride;
    }
    CR_ASSIGN_OR_RETURN(LayerArrays a, dm->Arrays(L, dm->mem_, stride, !stream));
    if (!stream && !exec->host_visible()) dm->uploaded_ += a.bytes;
    // Every array at an address of its own for the run; a streamed layer's
    // are rewritten in place by Hold.
    std::vector<void*> slots;
    for (const auto& [bytes, size] : a.Parts()) {
      void* p = nullptr;
      if (size > 0) {
        CR_ASSIGN_OR_RETURN(p, dm->mem_.Copy(bytes, size));
      }
      slots.push_back(p);
    }
    auto at = [&](size_t i) { return static_cast<const LinearShardView*>(slots[i]); };
    lv.q = at(0), lv.k = at(1), lv.v = at(2), lv.o = at(3), lv.kv_b = at(4);
    lv.gate = at(5), lv.up = at(6), lv.down = at(7);
    lv.q_a = at(8), lv.kv_a = at(9), lv.index_wq_b = at(10), lv.index_wk = at(11), lv.index_weights = at(12);
    // Formats by array, from the host shards (a streamed layer's released
    // shards keep theirs).
    if (!L.ranks.empty()) {
      const RankLayer& r0 = L.ranks.front();
      const LinearShard* host[] = {&r0.q,
                                   &r0.k,
                                   &r0.v,
                                   &r0.o,
                                   &r0.kv_b,
                                   &r0.gate,
                                   &r0.up,
                                   &r0.down,
                                   &L.mla.q_a,
                                   &L.mla.kv_a,
                                   &L.mla.index_wq_b,
                                   &L.mla.index_wk,
                                   &L.mla.index_weights};
      for (size_t i = 0; i < 13; ++i) {
        if (slots[i] != nullptr) dm->formats_[slots[i]] = host[i]->w.format;
      }
    }
    lv.experts = static_cast<const ExpertView*>(slots[13]);
    lv.shared = static_cast<const ExpertView*>(slots[14]);
    lv.has_shared = lv.shared != nullptr;
    dm->layers_.push_back(lv);
    dm->strides_.push_back(stride);
    if (stream) dm->slots_.push_back(std::move(slots));
  }
  return dm;
}

absl::Status DeviceModel::Hold(int64_t l) {
  if (!streaming_ || l == held_) return absl::OkStatus();
  Executor* exec = mem_.exec();
  if (held_ >= 0) {
    // Empty views first, so nothing points at freed memory.
    CR_ASSIGN_OR_RETURN(LayerArrays empty, Arrays(host_->layers[held_], mem_, strides_[held_], false));
    const auto parts = empty.Parts();
    for (size_t i = 0; i < parts.size(); ++i) {
      if (slots_[held_][i] != nullptr)
        CR_RETURN_IF_ERROR(exec->CopyToDevice(slots_[held_][i], parts[i].first, parts[i].second));
    }
    layer_mem_.reset();
    ReleaseLayerWeights(*host_, held_);
    held_ = -1;
  }
  if (l < 0) return absl::OkStatus();
  CR_RETURN_IF_ERROR(LoadLayerWeights(*host_, l));
  layer_mem_ = std::make_unique<ExecMemory>(exec);
  CR_ASSIGN_OR_RETURN(LayerArrays a, Arrays(host_->layers[l], *layer_mem_, strides_[l], true));
  if (!exec->host_visible()) layer_peak_ = std::max(layer_peak_, a.bytes);
  const auto parts = a.Parts();
  for (size_t i = 0; i < parts.size(); ++i) {
    if (slots_[l][i] != nullptr) CR_RETURN_IF_ERROR(exec->CopyToDevice(slots_[l][i], parts[i].first, parts[i].second));
  }
  held_ = l;
  return absl::OkStatus();
}

WFormat DeviceModel::FormatOf(const LinearShardView* views) const {
  auto it = formats_.find(views);
  return it == formats_.end() ? WFormat::kF32 : it->second;
}

}  // namespace crashreplay::replay
