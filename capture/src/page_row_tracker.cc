#include "page_row_tracker.h"

#include <algorithm>

namespace crashreplay::capture::internal {

PageRowTracker::Row& PageRowTracker::Find(int64_t pool) {
  if (pool < kDense) {
    const size_t i = static_cast<size_t>(pool);
    if (i >= dense_.size()) dense_.resize(std::max<size_t>(i + 1, 2 * dense_.size()));
    return dense_[i];
  }
  return sparse_[pool];
}

PageRowTracker::Out PageRowTracker::Apply(int64_t pool, int64_t start, bool from_previous,
                                          std::span<const int64_t> slots, bool minimize) {
  if (pool < 0 || start < 0) return Out{start, from_previous && start > 0, slots};
  Row& row = Find(pool);
  held_slots_ -= row.held();
  const int64_t held_end = row.start + static_cast<int64_t>(row.held());
  Out delta;
  bool have_delta = false;
  if (from_previous && start > 0) {
    if (row.known && row.start <= start && start <= held_end) {
      if (start == held_end && slots.size() <= kTail) {
        // The common case: appended at the end, into the tail.
        if (row.tail_n + slots.size() > kTail) row.Flush();
        std::copy(slots.begin(), slots.end(), row.tail.begin() + row.tail_n);
        row.tail_n += static_cast<uint32_t>(slots.size());
      } else {
        row.Flush();
        row.slots.resize(static_cast<size_t>(start - row.start));
        row.slots.insert(row.slots.end(), slots.begin(), slots.end());
      }
      delta = Out{start, true, slots};
      have_delta = true;
    } else {
      ++incomplete_;  // the columns before `start` were never given (or were replaced)
      row.start = start;
      row.tail_n = 0;
      row.slots.assign(slots.begin(), slots.end());
    }
  } else if (minimize && row.known && row.start == start) {
    // Given whole: pass on from the first column that differs (nothing for
    // an unchanged row; a shorter row is passed on as its new end).
    row.Flush();
    const size_t n = std::min(row.slots.size(), slots.size());
    const size_t same = static_cast<size_t>(
        std::mismatch(row.slots.begin(), row.slots.begin() + static_cast<std::ptrdiff_t>(n), slots.begin()).first -
        row.slots.begin());
    row.slots.resize(same);
    row.slots.insert(row.slots.end(), slots.begin() + static_cast<std::ptrdiff_t>(same), slots.end());
    delta = Out{start + static_cast<int64_t>(same), same > 0 || start > 0, slots.subspan(same)};
    have_delta = same > 0;
  } else {
    row.start = start;
    row.tail_n = 0;
    row.slots.assign(slots.begin(), slots.end());
  }
  row.known = true;
  held_slots_ += row.held();
  if (have_delta && row.epoch == epoch_) return delta;
  row.epoch = epoch_;
  row.Flush();  // passed on whole
  return Out{row.start, false, row.slots};
}

}  // namespace crashreplay::capture::internal
