// LaunchIndexerFast (cpu_kernels.h): DSA's lightning indexer once for all
// ranks whose index keys are rank 0's.
//
// Every rank holds the whole index-key cache (the indexer is not split over
// ranks), written by the same kernel from the same keys, and every rank's
// item reads the same queries, weights, positions and page tables. So a
// rank whose pages hold rank 0's bytes computes rank 0's top-k: the launcher
// runs rank 0's items, compares each other rank's pages with rank 0's (the
// pages the step reads), copies the ids where they agree and runs the items
// of a rank that differs. At tp 8 that is an eighth of the work items' work,
// with their bits: the items that run are the work items.
#include <cstring>
#include <vector>

#include "crashreplay/replay/cpu/cpu_kernels.h"

namespace crashreplay::replay {
namespace {

float* IndexerScratch(int64_t n) {
  thread_local std::vector<float> s;
  if (static_cast<int64_t>(s.size()) < n) s.resize(static_cast<size_t>(n));
  return s.data();
}

// Runs the items of rank r, each on one thread's scratch.
void RunRank(const IndexerOp& o, int64_t r, CpuPool& pool) {
  const int64_t T = o.batch.tokens, scratch = ScratchFloats(o);
  pool.Launch(T,
              [&o, r, T, scratch](int64_t t, KernelStatus* st) { RunItem(o, r * T + t, IndexerScratch(scratch), st); });
}

}  // namespace

bool LaunchIndexerFast(const IndexerOp& o, CpuPool& pool, CpuIsa isa, KernelStatus* status) {
  *status = KernelStatus{};
  const int64_t T = o.batch.tokens;
  if (isa == CpuIsa::kReference || o.ranks <= 1 || T <= 0 || o.topk <= 0) return false;
  // The items' checks (head dim, every page a query reads), looked at first:
  // where one would fire, the work items run and report it.
  const IndexPoolView& v0 = o.views[0];
  for (int64_t r = 0; r < o.ranks; ++r) {
    const IndexPoolView& v = o.views[r];
    if (!IndexDimSupported(v) || v.fp8 != v0.fp8 || v.dim != v0.dim || v.page_size != v0.page_size ||
        v.pages != v0.pages || v.page_size < 1) {
      return false;
    }
  }
  std::vector<char> read(static_cast<size_t>(v0.pages), 0);
  for (int64_t t = 0; t < T; ++t) {
    const PageTableRow row = RowTable(o.batch, t);
    const int64_t last = static_cast<int64_t>(o.batch.positions[t]) / v0.page_size;
    for (int64_t logical = 0; logical <= last; ++logical) {
      KernelStatus probe;
      const int64_t page = ResolvePoolPage(v0.pages, row, logical, 0, &probe);
      if (page < 0) return false;
      read[page] = 1;
    }
  }
  RunRank(o, 0, pool);
  const size_t page_bytes = static_cast<size_t>(IndexPageBytes(v0.fp8, v0.page_size, v0.dim));
  const size_t ids_bytes = static_cast<size_t>(T * o.topk) * sizeof(int32_t);
  for (int64_t r = 1; r < o.ranks; ++r) {
    bool same = true;
    for (int64_t p = 0; p < v0.pages && same; ++p) {
      if (read[p]) same = std::memcmp(o.views[r].data + p * page_bytes, v0.data + p * page_bytes, page_bytes) == 0;
    }
    if (same) {
      std::memcpy(o.ids + r * T * o.topk, o.ids, ids_bytes);
    } else {
      RunRank(o, r, pool);
    }
  }
  return true;
}

}  // namespace crashreplay::replay
