// PageRowTracker (internal): page-table rows as deltas (docs/capture.md,
// "Page-table deltas"). A decode step changes each request's row by one
// slot; recording the whole row every step makes the recorder's cost and
// the file grow with context length. The tracker keeps the row of every
// req_pool_index as far as it has been given, and turns each new row into
// what has to be passed on: the columns that changed, when the receiver
// has the row's earlier columns from this epoch, else the whole row.
//
// The recorder uses two: one on the caller's side of the step queue (an
// epoch ends when a step is dropped there: the writer never saw it) and
// one on the writer's side (an epoch ends when the step stream restarts
// after a disk error, and once the deltas written since the last whole
// rows outweigh the rows several times: Recorder::Impl::DeltaPageRows).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace crashreplay::capture::internal {

class PageRowTracker {
 public:
  // What to pass on for one row: its columns from `start` on; with
  // from_previous the columns before are those passed on before, in this
  // epoch; without, columns before `start` are unknown (start > 0: the
  // row is incomplete) or there are none. `slots` views the given row or
  // the tracker's copy, valid until the next call.
  struct Out {
    int64_t start = 0;
    bool from_previous = false;
    std::span<const int64_t> slots;
  };

  // Applies one row of req_pool_index `pool`: `slots` are its columns from
  // `start` on; with from_previous the columns before `start` are as last
  // given (if the tracker does not hold them, the row is kept as
  // incomplete and counted), without they are unknown (start > 0) or
  // there are none (start 0). With `minimize`, a row given whole is
  // compared with the one held and only the columns from the first that
  // differs are passed on. pool < 0: not tracked, passed on as given.
  Out Apply(int64_t pool, int64_t start, bool from_previous, std::span<const int64_t> slots, bool minimize);

  // Ends the epoch: every row is next passed on whole.
  void NewEpoch() { ++epoch_; }

  // Rows that continued columns the tracker did not hold.
  uint64_t incomplete() const { return incomplete_; }
  // The slots of every row held (what a new epoch passes on, at most).
  uint64_t held_slots() const { return held_slots_; }

 private:
  // A decode step appends a slot or two to each row. The end of a long row
  // is a line nobody touched since the last step (256 rows of 16k slots
  // are 32 MiB), so appending there cost a cache miss a row a step and made
  // the caller's cost grow with context (docs/capture.md, "Page-table
  // deltas"). Appends go to a short tail inside the Row instead, moved into
  // `slots` kTail at a time or before anything reads the row whole.
  static constexpr size_t kTail = 6;
  struct Row {
    int64_t start = 0;
    std::vector<int64_t> slots;  // columns [start, start + slots.size()), then the tail's
    std::array<int64_t, kTail> tail{};
    uint32_t tail_n = 0;
    uint64_t epoch = 0;  // the epoch it was last passed on in; 0: never
    bool known = false;  // given at least once
    size_t held() const { return slots.size() + tail_n; }
    void Flush() {
      slots.insert(slots.end(), tail.begin(), tail.begin() + tail_n);
      tail_n = 0;
    }
  };
  Row& Find(int64_t pool);

  // Pool indices are small (a pool of requests); a vector indexed by them
  // costs the hot path no hashing. Larger ones go to the map.
  static constexpr int64_t kDense = 1 << 16;
  std::vector<Row> dense_;
  absl::flat_hash_map<int64_t, Row> sparse_;
  uint64_t epoch_ = 1;
  uint64_t incomplete_ = 0;
  uint64_t held_slots_ = 0;
};

}  // namespace crashreplay::capture::internal
