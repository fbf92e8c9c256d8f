#include "crashreplay/replay/session/step_state.h"

#include <algorithm>
#include <cstring>

#include "crashreplay/base/text.h"

namespace crashreplay::replay {

using text::Cat;

namespace {

std::string ShapeText(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += Cat(i ? ", " : "", s[i]);
  return out + "]";
}

// Whether every group of a replicated pool's planes holds the same bytes in
// `bytes` (CopyPages' layout). They do unless the engine diverged between
// ranks; then every plane is kept, so the snapshot shows it.
bool ReplicasAgree(const KvCache::Pool& p, const std::vector<uint8_t>& bytes) {
  const size_t planes = p.planes.size(), n = static_cast<size_t>(p.replicas);
  if (n <= 1 || planes % n != 0 || bytes.empty()) return false;
  const size_t plane_bytes = bytes.size() / planes;
  for (size_t g = 0; g < planes / n; ++g) {
    const uint8_t* first = bytes.data() + g * n * plane_bytes;
    for (size_t r = 1; r < n; ++r) {
      if (std::memcmp(first, first + r * plane_bytes, plane_bytes) != 0) return false;
    }
  }
  return true;
}

}  // namespace

std::vector<int32_t> StatePages(const StepInput& in, int page_size) {
  std::vector<int32_t> pages;
  for (const StepRow& row : in.rows) {
    const int64_t n =
        std::min<int64_t>((row.start_pos + page_size - 1) / page_size, static_cast<int64_t>(row.page_table.size()));
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
    sp.bytes = std::move(bytes[i]);
    const int64_t planes = static_cast<int64_t>(p.planes.size());
    const int64_t kept = ReplicasAgree(p, sp.bytes) ? planes / p.replicas : planes;
    if (kept < planes) {  // one plane of each group: the first rank's
      const size_t plane_bytes = sp.bytes.size() / static_cast<size_t>(planes);
      for (int64_t g = 0; g < kept; ++g) {
        std::memmove(sp.bytes.data() + g * plane_bytes, sp.bytes.data() + g * p.replicas * plane_bytes, plane_bytes);
      }
      sp.bytes.resize(static_cast<size_t>(kept) * plane_bytes);
      sp.bytes.shrink_to_fit();
    }
    sp.shape = {kept, static_cast<int64_t>(s.pages.size())};
    sp.shape.insert(sp.shape.end(), p.page_shape.begin(), p.page_shape.end());
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
    // Every plane, or one of each group of replicas (CaptureState).
    const int64_t planes = static_cast<int64_t>(p.planes.size());
    const bool grouped = p.replicas > 1 && !sp.shape.empty() && sp.shape[0] * p.replicas == planes;
    const int64_t kept = grouped ? planes / p.replicas : planes;
    std::vector<int64_t> shape = {kept, static_cast<int64_t>(need.size())};
    shape.insert(shape.end(), p.page_shape.begin(), p.page_shape.end());
    if (sp.dtype != p.dtype || sp.shape != shape) {
      return absl::InvalidArgumentError(Cat(where, ": KV tensor 'kv.", sp.name, "' is ", DTypeName(sp.dtype), " ",
                                            ShapeText(sp.shape), ", this engine's cache needs ", DTypeName(p.dtype),
                                            " ", ShapeText(shape)));
    }
    const size_t plane_bytes = p.page_bytes * need.size();
    const size_t want_bytes = plane_bytes * static_cast<size_t>(kept);
    if (sp.bytes.size() != want_bytes) {
      return absl::InvalidArgumentError(
          Cat(where, ": KV tensor 'kv.", sp.name, "' holds ", sp.bytes.size(), " bytes, the shape needs ", want_bytes));
    }
    if (!grouped) {
      bytes.push_back(sp.bytes);
      continue;
    }
    std::vector<uint8_t>& all = bytes.emplace_back(plane_bytes * static_cast<size_t>(planes));
    for (int64_t plane = 0; plane < planes; ++plane) {
      std::memcpy(all.data() + plane * plane_bytes, sp.bytes.data() + plane / p.replicas * plane_bytes, plane_bytes);
    }
  }
  return kv->WritePages(need, bytes);
}

}  // namespace crashreplay::replay
