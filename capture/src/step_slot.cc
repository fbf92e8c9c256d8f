#include "step_slot.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace crashreplay::capture::internal {
namespace {

template <typename T>
void AppendSpan(std::vector<T>* out, std::span<const T> in) {
  const size_t at = out->size();
  out->resize(at + in.size());  // capacity is reused: no allocation when warm
  if (!in.empty()) std::memcpy(out->data() + at, in.data(), in.size() * sizeof(T));
}

}  // namespace

absl::Status StepSlot::Pack(const StepView& v, int64_t timestamp_nanos) {
  if (!v.page_table_offsets.empty()) {
    int64_t prev = 0;
    for (int64_t o : v.page_table_offsets) {
      if (o < prev || static_cast<uint64_t>(o) > v.page_table_slots.size()) {
        return absl::InvalidArgumentError(absl::StrCat("step ", v.step,
                                                       ": page_table_offsets must be non-decreasing offsets into the ",
                                                       v.page_table_slots.size(), " page-table slots"));
      }
      prev = o;
    }
  } else if (!v.page_table_slots.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("step ", v.step, ": page_table_slots without page_table_offsets"));
  }
  step_ = v.step;
  mode_ = v.mode;
  timestamp_nanos_ = timestamp_nanos;
  rng_seed_ = v.rng_seed;
  rng_offset_ = v.rng_offset;
  const std::span<const int64_t> fields[kFields] = {v.token_ids,          v.positions,        v.seq_lens,
                                                    v.extend_lens,        v.req_pool_indices, v.page_table_offsets,
                                                    v.page_table_slots,   v.out_cache_loc,    v.output_token_ids};
  ints_.clear();
  for (int f = 0; f < kFields; ++f) {
    begin_[f] = ints_.size();
    AppendSpan(&ints_, fields[f]);
  }
  begin_[kFields] = ints_.size();
  id_chars_.clear();
  id_ends_.clear();
  for (std::string_view id : v.request_ids) {
    AppendSpan(&id_chars_, std::span<const char>(id.data(), id.size()));
    id_ends_.push_back(static_cast<uint32_t>(id_chars_.size()));
  }
  sampling_.clear();
  AppendSpan(&sampling_, v.sampling);
  digest_chars_.clear();
  digest_ends_.clear();
  digests_.clear();
  for (const DigestView& d : v.digests) {
    AppendSpan(&digest_chars_, std::span<const char>(d.name.data(), d.name.size()));
    digest_ends_.push_back(static_cast<uint32_t>(digest_chars_.size()));
    digests_.push_back(DigestView{{}, d.is_128, d.value64, d.value128});
  }
  return absl::OkStatus();
}

void StepSlot::Unpack(uint32_t rank, StepRecord* r) const {
  auto field = [&](Field f) {
    return std::vector<int64_t>(ints_.begin() + static_cast<ptrdiff_t>(begin_[f]),
                                ints_.begin() + static_cast<ptrdiff_t>(begin_[f + 1]));
  };
  r->step = step_;
  r->rank = rank;
  r->mode = mode_;
  r->timestamp_nanos = timestamp_nanos_;
  r->request_ids.clear();
  uint32_t at = 0;
  for (uint32_t end : id_ends_) {
    r->request_ids.emplace_back(id_chars_.data() + at, end - at);
    at = end;
  }
  r->token_ids = field(kTokens);
  r->positions = field(kPositions);
  r->seq_lens = field(kSeqLens);
  r->extend_lens = field(kExtendLens);
  r->req_pool_indices = field(kPool);
  r->page_table.clear();
  const size_t pt0 = begin_[kPtOffsets], rows = begin_[kPtOffsets + 1] - pt0;
  for (size_t i = 0; i + 1 < rows; ++i) {
    PageTableRow row;
    row.req_pool_index = begin_[kPool] + i < begin_[kPool + 1] ? ints_[begin_[kPool] + i] : -1;
    const size_t s0 = begin_[kPtSlots] + static_cast<size_t>(ints_[pt0 + i]);
    const size_t s1 = begin_[kPtSlots] + static_cast<size_t>(ints_[pt0 + i + 1]);
    row.token_slots.assign(ints_.begin() + static_cast<ptrdiff_t>(s0), ints_.begin() + static_cast<ptrdiff_t>(s1));
    r->page_table.push_back(std::move(row));
  }
  r->out_cache_loc = field(kOutLoc);
  r->sampling = sampling_;
  r->rng_seed = rng_seed_;
  r->rng_offset = rng_offset_;
  r->output_token_ids = field(kOutputs);
  r->digests.clear();
  at = 0;
  for (size_t i = 0; i < digests_.size(); ++i) {
    Digest d;
    d.name.assign(digest_chars_.data() + at, digest_ends_[i] - at);
    at = digest_ends_[i];
    if (digests_[i].is_128) {
      d.value = digests_[i].value128;
    } else {
      d.value = digests_[i].value64;
    }
    r->digests.push_back(std::move(d));
  }
  r->tensors.clear();
}

}  // namespace crashreplay::capture::internal
