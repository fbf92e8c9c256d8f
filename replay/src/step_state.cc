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
  if (s.pages.empty()) return s;
  std::vector<std::vector<uint8_t>> bytes;
  absl::Status st = kv.CopyPages(s.pages, &bytes);
  if (!st.ok()) return st;
  for (size_t i = 0; i < kv.pools().size(); ++i) {
    const KvCache::Pool& p = kv.pools()[i];
    StatePool sp;
    sp.name = p.name;
    sp.dtype = p.dtype;
    sp.shape = {static_cast<int64_t>(p.planes.size()), static_cast<int64_t>(s.pages.size())};
    sp.shape.insert(sp.shape.end(), p.page_shape.begin(), p.page_shape.end());
    sp.bytes = std::move(bytes[i]);
    s.pools.push_back(std::move(sp));
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
  std::string have, want;
  for (const StatePool& p : s.pools) have += Cat(have.empty() ? "" : ", ", "kv.", p.name);
  for (const KvCache::Pool& p : kv->pools()) want += Cat(want.empty() ? "" : ", ", "kv.", p.name);
  if (have != want) {
    return absl::InvalidArgumentError(
        Cat(where, ": holds the cache tensors {", have, "}, this engine's cache has {", want, "}"));
  }
  std::vector<std::vector<uint8_t>> bytes;
  for (size_t i = 0; i < s.pools.size(); ++i) {
    const StatePool& sp = s.pools[i];
    const KvCache::Pool& p = kv->pools()[i];
    std::vector<int64_t> shape = {static_cast<int64_t>(p.planes.size()), static_cast<int64_t>(need.size())};
    shape.insert(shape.end(), p.page_shape.begin(), p.page_shape.end());
    if (sp.dtype != p.dtype || sp.shape != shape) {
      return absl::InvalidArgumentError(Cat(where, ": KV tensor 'kv.", sp.name, "' is ", DTypeName(sp.dtype), " ",
                                            ShapeText(sp.shape), ", this engine's cache needs ", DTypeName(p.dtype),
                                            " ", ShapeText(shape)));
    }
    const size_t want_bytes = p.page_bytes * need.size() * p.planes.size();
    if (sp.bytes.size() != want_bytes) {
      return absl::InvalidArgumentError(Cat(where, ": KV tensor 'kv.", sp.name, "' holds ", sp.bytes.size(),
                                            " bytes, the shape needs ", want_bytes));
    }
    bytes.push_back(sp.bytes);
  }
  return kv->WritePages(need, bytes);
}

}  // namespace crashreplay::replay
