#include "crashreplay/replay/captures/engine_weights.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <map>

#include "capture_steps.h"
#include "crashreplay/base/status.h"
#include "crashreplay/base/text.h"
#include "crashreplay/formats/hash.h"

namespace crashreplay::replay {

using text::Cat;

namespace {

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::optional<int64_t> RecordedInt(const SessionManifest& m, std::string_view name) {
  const Toggle* t = internal::FindRecordedToggle(m, name);
  if (t == nullptr) return std::nullopt;
  if (const auto* i = std::get_if<int64_t>(&t->value)) return *i;
  return std::nullopt;
}

std::string RecordedText(const SessionManifest& m, std::string_view name) {
  const Toggle* t = internal::FindRecordedToggle(m, name);
  if (t == nullptr) return "";
  if (const auto* s = std::get_if<std::string>(&t->value)) return *s;
  if (const auto* b = std::get_if<bool>(&t->value)) return *b ? "true" : "false";
  return "";
}

// The bytes of a parameter, built piece by piece from checkpoint tensors.
class Builder {
 public:
  Builder(const TensorSet& tensors, std::vector<std::string>* sources) : tensors_(tensors), sources_(sources) {}

  absl::StatusOr<const HostTensor*> Get(const std::string& name) {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) return absl::NotFoundError(Cat("the checkpoint has no tensor '", name, "'"));
    const HostTensor& t = it->second;
    if (t.dtype != DType::kBF16 && t.dtype != DType::kF16 && t.dtype != DType::kF32) {
      return absl::UnimplementedError(Cat("'", name, "' is ", DTypeName(t.dtype),
                                          ": quantized tensors are repacked by ",
                                          "the engine's quantization method after loading and are not mapped"));
    }
    if (sources_ != nullptr) sources_->push_back(name);
    if (!t.bytes.deferred()) return &t;
    // A deferred checkpoint (layer streaming): mapped while this builder lives.
    auto done = resolved_.find(name);
    if (done != resolved_.end()) return &done->second;
    HostTensor h = t;
    CR_ASSIGN_OR_RETURN(h.bytes, t.bytes.Resolve());
    return &resolved_.emplace(name, std::move(h)).first->second;
  }

  // Part `part` of `parts` equal parts along dim 0 (a 1-D or 0-D tensor
  // counts as rows of one element).
  absl::Status Rows(const std::string& name, int64_t parts, int64_t part) {
    CR_ASSIGN_OR_RETURN(const HostTensor* t, Get(name));
    const int64_t rows = t->shape.empty() ? 1 : t->shape[0];
    if (parts <= 0 || rows % parts != 0) {
      return absl::UnimplementedError(Cat("'", name, "' has ", rows, " rows, not divisible into ", parts, " parts"));
    }
    const uint64_t row_bytes = rows == 0 ? 0 : t->bytes.size() / static_cast<uint64_t>(rows);
    const uint64_t per = static_cast<uint64_t>(rows / parts) * row_bytes;
    Append(t->bytes.data() + static_cast<uint64_t>(part) * per, per);
    return absl::OkStatus();
  }

  // Part `part` of `parts` equal parts along dim 1 of a 2-D tensor.
  absl::Status Columns(const std::string& name, int64_t parts, int64_t part) {
    CR_ASSIGN_OR_RETURN(const HostTensor* t, Get(name));
    if (t->shape.size() != 2 || parts <= 0 || t->shape[1] % parts != 0) {
      return absl::UnimplementedError(Cat("'", name, "' cannot be split into ", parts, " column parts"));
    }
    const uint64_t elem = DTypeBytes(t->dtype, 1);
    const uint64_t row_bytes = static_cast<uint64_t>(t->shape[1]) * elem;
    const uint64_t per = row_bytes / static_cast<uint64_t>(parts);
    for (int64_t r = 0; r < t->shape[0]; ++r) Append(t->bytes.data() + r * row_bytes + part * per, per);
    return absl::OkStatus();
  }

  // Rows [begin, end) of a 2-D tensor, zero rows where it has none.
  absl::Status PaddedRows(const std::string& name, int64_t begin, int64_t end) {
    CR_ASSIGN_OR_RETURN(const HostTensor* t, Get(name));
    if (t->shape.size() != 2) return absl::UnimplementedError(Cat("'", name, "' is not 2-D"));
    const uint64_t row_bytes = static_cast<uint64_t>(t->shape[1]) * DTypeBytes(t->dtype, 1);
    const int64_t have = std::clamp<int64_t>(t->shape[0], begin, end);
    Append(t->bytes.data() + begin * row_bytes, static_cast<uint64_t>(have - begin) * row_bytes);
    out_.resize(out_.size() + static_cast<uint64_t>(end - have) * row_bytes, 0);
    return absl::OkStatus();
  }

  // Part `part` of `parts` equal column parts of a 2-D tensor, each row
  // followed by `pad_columns` zero columns.
  absl::Status PaddedColumns(const std::string& name, int64_t parts, int64_t part, int64_t pad_columns) {
    CR_ASSIGN_OR_RETURN(const HostTensor* t, Get(name));
    if (t->shape.size() != 2 || parts <= 0 || t->shape[1] % parts != 0 || pad_columns < 0) {
      return absl::UnimplementedError(Cat("'", name, "' cannot be split into ", parts, " column parts"));
    }
    const uint64_t elem = DTypeBytes(t->dtype, 1);
    const uint64_t row_bytes = static_cast<uint64_t>(t->shape[1]) * elem;
    const uint64_t per = row_bytes / static_cast<uint64_t>(parts);
    for (int64_t r = 0; r < t->shape[0]; ++r) {
      Append(t->bytes.data() + r * row_bytes + part * per, per);
      out_.resize(out_.size() + static_cast<uint64_t>(pad_columns) * elem, 0);
    }
    return absl::OkStatus();
  }

  // `rows` zero rows of `name`'s row size.
  absl::Status ZeroRows(const std::string& name, int64_t rows) {
    CR_ASSIGN_OR_RETURN(const HostTensor* t, Get(name));
    const int64_t n = t->shape.empty() ? 1 : t->shape[0];
    const uint64_t row_bytes = n == 0 ? 0 : t->bytes.size() / static_cast<uint64_t>(n);
    out_.resize(out_.size() + static_cast<uint64_t>(std::max<int64_t>(rows, 0)) * row_bytes, 0);
    return absl::OkStatus();
  }

  void Value(const void* p, size_t n) { Append(static_cast<const uint8_t*>(p), n); }
  std::vector<uint8_t> Take() { return std::move(out_); }

 private:
  void Append(const uint8_t* p, uint64_t n) { out_.insert(out_.end(), p, p + n); }
  const TensorSet& tensors_;
  std::vector<std::string>* sources_;
  std::vector<uint8_t> out_;
  std::map<std::string, HostTensor> resolved_;
};

// K/V heads: split over tp, or replicated when there are fewer than ranks
// (rank r holds head r / (tp / kv_heads)).
std::pair<int64_t, int64_t> KvPart(int64_t kv_heads, int64_t tp, int64_t rank) {
  if (kv_heads >= tp) return {tp, rank};
  return {kv_heads, rank * kv_heads / tp};
}

std::optional<int64_t> LayerOf(std::string_view name) {
  const size_t at = name.find("layers.");
  if (at == std::string_view::npos) return std::nullopt;
  int64_t v = 0;
  const char* b = name.data() + at + 7;
  auto [p, ec] = std::from_chars(b, name.data() + name.size(), v);
  if (ec != std::errc() || p == b) return std::nullopt;
  return v;
}

}  // namespace

EngineLayout EngineLayoutFor(const SessionManifest& m, const ParallelLayout& p) {
  EngineLayout l;
  l.engine = m.engine;
  l.tp_size = std::max<int64_t>(p.tp_size, 1);
  l.tp_rank = p.tp_rank;
  int64_t ep = 1;
  if (m.engine == "sglang") {
    ep = RecordedInt(m, "ep_size").value_or(std::max<int64_t>(p.ep_size, 1));
    const std::string backend = RecordedText(m, "moe_runner_backend");
    if (!backend.empty() && backend != "auto" && backend != "triton") {
      l.experts_unmapped = Cat("moe_runner_backend=", backend, " lays the experts out its own way");
    }
  } else if (m.engine == "vllm") {
    const bool expert_parallel = RecordedText(m, "parallel_config.enable_expert_parallel") == "true";
    ep = expert_parallel ? l.tp_size : 1;
    for (const Toggle& t : m.toggles) {
      const bool on = (std::holds_alternative<bool>(t.value) && std::get<bool>(t.value)) ||
                      (std::holds_alternative<std::string>(t.value) && std::get<std::string>(t.value) == "1");
      if (on && t.name.rfind("env.VLLM_USE_FLASHINFER_MOE", 0) == 0) {
        l.experts_unmapped = Cat(t.name.substr(4), " repacks the experts after loading");
      }
    }
  }
  ep = std::clamp<int64_t>(ep, 1, l.tp_size);
  l.moe_ep_size = ep;
  l.moe_tp_size = l.tp_size / ep;
  l.moe_ep_rank = l.tp_rank / l.moe_tp_size;
  l.moe_tp_rank = l.tp_rank % l.moe_tp_size;
  return l;
}

absl::StatusOr<std::vector<uint8_t>> EngineParameterBytes(const EngineLayout& l, std::string_view name_view,
                                                          const ModelSpec& spec, const TensorSet& tensors,
                                                          std::vector<std::string>* sources) {
  const std::string name(name_view);
  Builder b(tensors, sources);
  const int64_t tp = l.tp_size, r = l.tp_rank;
  // transformers holds every parameter whole under its checkpoint name (one
  // process, no tensor parallelism); a tied lm_head is the embedding.
  if (l.engine == "transformers") {
    const bool tied = name == "lm_head.weight" && tensors.count(name) == 0;
    CR_RETURN_IF_ERROR(b.Rows(tied ? std::string("model.embed_tokens.weight") : name, 1, 0));
    return b.Take();
  }
  for (std::string_view q :
       {"weight_scale", "input_scale", "weight_scale_inv", "weight_scale_2", "k_scale", "v_scale"}) {
    if (EndsWith(name, Cat(".", q)) || EndsWith(name, Cat("_", q))) {
      if (l.engine == "vllm" && name.find(".attn._") != std::string::npos) break;
      return absl::UnimplementedError("a quantization scale: laid out by the engine's quantization method");
    }
  }
  auto kind_of = [&](std::string_view stem) -> std::optional<std::string> {
    for (std::string_view k : {".weight", ".bias"}) {
      if (EndsWith(name, Cat(stem, k)))
        return name.substr(0, name.size() - stem.size() - k.size()) + "|" + std::string(k);
    }
    return std::nullopt;
  };
  auto split = [](const std::string& s) {
    const size_t bar = s.find('|');
    return std::pair<std::string, std::string>{s.substr(0, bar), s.substr(bar + 1)};
  };
  const auto [kv_parts, kv_part] = KvPart(spec.kv_heads, tp, r);
  if (auto k = kind_of("qkv_proj")) {
    const auto [pre, kind] = split(*k);
    CR_RETURN_IF_ERROR(b.Rows(pre + "q_proj" + kind, tp, r));
    CR_RETURN_IF_ERROR(b.Rows(pre + "k_proj" + kind, kv_parts, kv_part));
    CR_RETURN_IF_ERROR(b.Rows(pre + "v_proj" + kind, kv_parts, kv_part));
    return b.Take();
  }
  if (auto k = kind_of("gate_up_proj")) {
    const auto [pre, kind] = split(*k);
    if (kind == ".bias") return absl::UnimplementedError("a gate_up_proj bias is not mapped");
    CR_RETURN_IF_ERROR(b.Rows(pre + "gate_proj" + kind, tp, r));
    CR_RETURN_IF_ERROR(b.Rows(pre + "up_proj" + kind, tp, r));
    return b.Take();
  }
  for (std::string_view proj : {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"}) {
    if (kind_of(Cat(".", proj))) {
      const bool kv = proj == "k_proj" || proj == "v_proj";
      CR_RETURN_IF_ERROR(b.Rows(name, kv ? kv_parts : tp, kv ? kv_part : r));
      return b.Take();
    }
  }
  for (std::string_view proj : {".o_proj", ".down_proj"}) {
    if (EndsWith(name, Cat(proj, ".weight"))) {
      CR_RETURN_IF_ERROR(b.Columns(name, tp, r));
      return b.Take();
    }
    if (EndsWith(name, Cat(proj, ".bias"))) {
      CR_RETURN_IF_ERROR(b.Rows(name, 1, 0));
      return b.Take();
    }
  }
  const bool embed = EndsWith(name, "embed_tokens.weight");
  if (embed || name == "lm_head.weight") {
    std::string src = name;
    if (!embed && tensors.count(src) == 0 && spec.tie_embeddings) src = "model.embed_tokens.weight";
    const int64_t padded = (spec.vocab + l.vocab_padding - 1) / l.vocab_padding * l.vocab_padding;
    if (padded % tp != 0)
      return absl::UnimplementedError(Cat("the padded vocabulary ", padded, " does not split over ", tp));
    const int64_t per = padded / tp;
    CR_RETURN_IF_ERROR(b.PaddedRows(src, r * per, (r + 1) * per));
    return b.Take();
  }
  if (EndsWith(name, "experts.w13_weight") || EndsWith(name, "experts.w2_weight")) {
    if (!l.experts_unmapped.empty()) return absl::UnimplementedError(l.experts_unmapped);
    const std::optional<int64_t> layer = LayerOf(name);
    if (!layer || spec.num_experts <= 0) return absl::NotFoundError("not a layer of routed experts in this checkpoint");
    if (spec.num_experts % l.moe_ep_size != 0) {
      return absl::UnimplementedError(Cat(spec.num_experts, " experts do not split over ", l.moe_ep_size, " ranks"));
    }
    const LayerNames names = NamesFor(spec, *layer);
    const int64_t local = spec.num_experts / l.moe_ep_size;
    const bool w13 = EndsWith(name, "w13_weight");
    const int64_t per_rank = spec.moe_intermediate / std::max<int64_t>(l.moe_tp_size, 1);
    const int64_t pad = l.expert_intermediate_padded > per_rank ? l.expert_intermediate_padded - per_rank : 0;
    for (int64_t e = l.moe_ep_rank * local; e < (l.moe_ep_rank + 1) * local; ++e) {
      if (w13) {
        for (const char* half : {"gate", "up"}) {
          CR_RETURN_IF_ERROR(b.Rows(names.expert(e, half), l.moe_tp_size, l.moe_tp_rank));
          if (pad > 0) CR_RETURN_IF_ERROR(b.ZeroRows(names.expert(e, half), pad));
        }
      } else {
        CR_RETURN_IF_ERROR(b.PaddedColumns(names.expert(e, "down"), l.moe_tp_size, l.moe_tp_rank, pad));
      }
    }
    return b.Take();
  }
  if (l.engine == "vllm") {
    for (std::string_view s : {"._k_scale", "._v_scale", "._q_scale", "._prob_scale"}) {
      if (!EndsWith(name, s)) continue;
      // vLLM's Attention registers these as fp32 1.0 and overwrites them
      // only from a checkpoint's kv-cache scales.
      const std::string stem = name.substr(0, name.rfind(".attn."));
      const std::string scale(s.substr(2));
      if (tensors.count(Cat(stem, ".", scale)) || tensors.count(Cat(stem, ".k_proj.", scale)) ||
          tensors.count(Cat(stem, ".v_proj.", scale))) {
        return absl::UnimplementedError("a kv-cache scale loaded from the checkpoint");
      }
      const float one = 1.0f;
      b.Value(&one, sizeof one);
      return b.Take();
    }
  }
  // Replicated tensors, held whole under their HF names.
  if (EndsWith(name, "norm.weight") || EndsWith(name, "norm.bias") || EndsWith(name, ".gate.weight") ||
      EndsWith(name, "e_score_correction_bias")) {
    CR_RETURN_IF_ERROR(b.Rows(name, 1, 0));
    return b.Take();
  }
  return absl::UnimplementedError(Cat("no ", l.engine, " layout known for this parameter"));
}

absl::StatusOr<WeightVerification> VerifyEngineWeights(const LoadedCapture& cap, const ModelSpec& spec,
                                                       const TensorSet& tensors) {
  WeightVerification v;
  const std::string& engine = cap.manifest.engine;
  for (const LoadedCapture::RankWeights& rw : cap.rank_weights) {
    ++v.ranks;
    const EngineLayout layout = EngineLayoutFor(cap.manifest, rw.parallel);
    for (const TensorHash& t : rw.tensors) {
      std::vector<std::string> sources;
      absl::StatusOr<std::vector<uint8_t>> bytes = EngineParameterBytes(layout, t.name, spec, tensors, &sources);
      const bool experts = EndsWith(t.name, "experts.w13_weight") || EndsWith(t.name, "experts.w2_weight");
      if (bytes.ok() && experts && bytes->size() < t.byte_size && bytes->size() > 0 && spec.moe_intermediate > 0) {
        // A larger recorded tensor that zero padding of the per-rank
        // intermediate explains (sglang pads it for its MoE kernels): that
        // layout, checked by the hash like any other.
        const int64_t per_rank = spec.moe_intermediate / std::max<int64_t>(layout.moe_tp_size, 1);
        if (per_rank > 0 && (t.byte_size * static_cast<uint64_t>(per_rank)) % bytes->size() == 0) {
          const uint64_t padded = t.byte_size * static_cast<uint64_t>(per_rank) / bytes->size();
          EngineLayout wide = layout;
          wide.expert_intermediate_padded = static_cast<int64_t>(padded);
          sources.clear();
          bytes = EngineParameterBytes(wide, t.name, spec, tensors, &sources);
        }
      }
      if (!bytes.ok()) {
        v.unmapped.push_back(Cat("rank ", rw.rank, " '", t.name, "': ", bytes.status().message()));
        continue;
      }
      if (bytes->size() != t.byte_size) {
        v.unmapped.push_back(Cat("rank ", rw.rank, " '", t.name, "': the ", engine, " layout gives ", bytes->size(),
                                 " bytes, the recording holds ", t.byte_size, " (a layout not modelled)"));
        continue;
      }
      const Hash128 h = XXH128Of(bytes->data(), bytes->size());
      if (h != t.hash) {
        std::string from;
        for (const std::string& s : sources) from += (from.empty() ? "" : ", ") + s;
        return absl::DataLossError(Cat("rank ", rw.rank, " tensor '", t.name, "' (", engine, " layout of ", from,
                                       "): the recording has ", t.hash.Hex(), ", the checkpoint gives ", h.Hex(), " (",
                                       rw.file, "); is this the recorded checkpoint?"));
      }
      ++v.verified;
    }
  }
  if (v.ranks == 0) {
    v.summary = Cat("not verified (the ", engine, " capture records no weight hashes)");
    return v;
  }
  v.summary = Cat("verified ", v.verified, " tensors of ", v.ranks, v.ranks == 1 ? " rank" : " ranks", " (", engine,
                  " layout)");
  if (!cap.ranks_without_file.empty()) {
    std::string missing;
    for (uint32_t r : cap.ranks_without_file) missing += Cat(missing.empty() ? "" : ", ", r);
    const bool one = cap.ranks_without_file.size() == 1;
    v.summary +=
        Cat(one ? "; rank " : "; ranks ", missing, one ? " has" : " have", " no capture file here, not verified");
  }
  if (!v.unmapped.empty()) {
    v.summary += Cat("; ", v.unmapped.size(), " not mapped: ");
    for (size_t i = 0; i < v.unmapped.size(); ++i) v.summary += Cat(i ? "; " : "", v.unmapped[i]);
  }
  return v;
}

absl::StatusOr<std::string> VerifyCaptureWeights(const LoadedCapture& cap, const LoadedCheckpoint& ckpt,
                                                 const Model& model, const EngineConfig& config) {
  if (cap.manifest.engine != "crashreplay") {
    CR_ASSIGN_OR_RETURN(WeightVerification v, VerifyEngineWeights(cap, ckpt.spec, ckpt.tensors));
    return v.summary;
  }
  if (static_cast<size_t>(config.tp_size) != cap.weights.size()) {
    return std::string("not verified (tp_size differs from the recording)");
  }
  CR_RETURN_IF_ERROR(VerifyShardHashes(model, cap.weights));
  return std::string("verified");
}

}  // namespace crashreplay::replay
