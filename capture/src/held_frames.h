// HeldFrames: the records a recorder could not write because the disk
// refused them (internal). docs/capture.md, "Disk full and slow disks".
//
// After a write error (ENOSPC, EDQUOT, EFBIG, EIO) the recorder keeps
// recording: each later record is encoded as usual and held here, oldest
// first, until the disk takes writes again; then they are appended in
// order after the file's intact prefix. The hold is bounded by a number of
// step records and a number of bytes: past either bound the oldest frames
// are dropped (whatever their type) and counted, so a disk that never
// comes back costs a fixed amount of memory and the newest steps, the ones
// nearest a failure, are the ones kept.
//
// Thread safety: Push/front/PopFront/frames under the owner's lock; the
// counters are atomics that stats() may read from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>

#include "crashreplay/formats/capture_encoder.h"

namespace crashreplay::capture::internal {

class HeldFrames {
 public:
  HeldFrames(uint64_t max_steps, uint64_t max_bytes) : max_steps_(max_steps), max_bytes_(max_bytes) {}

  // Holds `frame`; drops the oldest frames while a bound is exceeded (a
  // frame larger than max_bytes on its own is dropped at once).
  void Push(EncodedFrame frame);
  bool empty() const { return frames_.empty(); }
  const EncodedFrame& front() const { return frames_.front(); }
  void PopFront();  // the front frame is in the file now

  // Steps held now, and the range of their numbers (valid when steps() > 0).
  uint64_t steps() const { return steps_.load(std::memory_order_relaxed); }
  uint64_t first_step() const;
  uint64_t last_step() const;
  uint64_t records() const { return frames_.size(); }  // every held frame
  uint64_t bytes() const { return bytes_.load(std::memory_order_relaxed); }
  // Dropped past a bound, cumulative: step records, and other records.
  uint64_t steps_dropped() const { return steps_dropped_.load(std::memory_order_relaxed); }
  uint64_t records_dropped() const { return records_dropped_.load(std::memory_order_relaxed); }

 private:
  void DropFront();

  const uint64_t max_steps_, max_bytes_;
  std::deque<EncodedFrame> frames_;
  std::atomic<uint64_t> steps_{0}, bytes_{0}, steps_dropped_{0}, records_dropped_{0};
};

}  // namespace crashreplay::capture::internal
