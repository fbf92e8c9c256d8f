#include "crashreplay/replay/step_state.h"

#include <algorithm>
#include <cstring>

#include "text_util.h"

namespace crashreplay::replay {

using text::Cat;

namespace {

std::string ShapeText(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += Cat(i ? ", " : "", s[i]);
  return out + "]";
}

}  // namespace

std::vector<int32_t> StatePages(const StepInput& in, int page_size) {
  std::vector<int32_t> pages;
  for (const StepRow& row : in.rows) {
    const int64_t n = std::min<int64_t>((row.start_pos + page_size - 1) / page_size,
                                        static_cast<int64_t>(row.page_table.size()));
    for (int64_t i = 0; i < n; ++i) pages.push_back(row.page_table[i]);
  }
  std::sort(pages.begin(), pages.end());
  pages.erase(std::unique(pages.begin(), pages.end()), pages.end());
  return pages;
}

absl::StatusOr<StepState> CaptureState(const StepInput& in, const KvCache& kv) {
  StepState s;
  s.step = in.step;
  for (const StepRow& row : in.rows) {
    s.rows.push_back(row.request_id);
    s.rows.push_back(row.start_pos);
  }
  s.pages = StatePages(in, kv.page_size());
  s.kv_dtype = kv.fp8() ? DType::kF8E4M3 : DType::kBF16;
  if (!s.pages.empty()) {
    s.kv_shape = {kv.planes(), static_cast<int64_t>(s.pages.size()), kv.page_size(), kv.kv_heads(), kv.head_dim()};
    absl::Status st = kv.CopyPages(s.pages, &s.k, &s.v);
    if (!st.ok()) return st;
  }
  return s;
}

absl::Status RestoreState(const StepState& s, const StepInput& in, KvCache* kv) {
  const std::string where = Cat("snapshot of step ", s.step);
  if (s.step != in.step) return absl::InvalidArgumentError(Cat(where, ": replay asked for step ", in.step));
  std::vector<int64_t> rows;
  for (const StepRow& row : in.rows) {
    rows.push_back(row.request_id);
    rows.push_back(row.start_pos);
  }
  if (rows != s.rows) {
    return absl::InvalidArgumentError(
        Cat(where, ": its batch (request id, start position per row) is not the step log's"));
  }
  const std::vector<int32_t> need = StatePages(in, kv->page_size());
  if (need != s.pages) {
    return absl::InvalidArgumentError(Cat(where, ": holds ", s.pages.size(), " KV pages, the step reads ", need.size(),
                                          need.size() == s.pages.size() ? " other ones" : ""));
  }
  if (need.empty()) return absl::OkStatus();
  for (int32_t p : need) {
    if (p < 0 || p >= kv->pages()) {
      return absl::InvalidArgumentError(Cat(where, ": page ", p, " is outside the KV pool of ", kv->pages(), " pages"));
    }
  }
  const DType want = kv->fp8() ? DType::kF8E4M3 : DType::kBF16;
  const std::vector<int64_t> shape = {kv->planes(), static_cast<int64_t>(need.size()), kv->page_size(), kv->kv_heads(),
                                      kv->head_dim()};
  if (s.kv_dtype != want || s.kv_shape != shape) {
    return absl::InvalidArgumentError(Cat(where, ": KV tensors are ", DTypeName(s.kv_dtype), " ", ShapeText(s.kv_shape),
                                          ", this engine's cache needs ", DTypeName(want), " ", ShapeText(shape)));
  }
  const size_t bytes = kv->page_bytes() * need.size() * static_cast<size_t>(kv->planes());
  if (s.k.size() != bytes || s.v.size() != bytes) {
    return absl::InvalidArgumentError(Cat(where, ": KV tensors hold ", s.k.size(), " and ", s.v.size(),
                                          " bytes, the shape needs ", bytes));
  }
  return kv->WritePages(need, s.k, s.v);
}

}  // namespace crashreplay::replay
