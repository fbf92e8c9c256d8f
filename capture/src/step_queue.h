// StepQueue: the step log's queue between the serving thread and the writer
// thread (internal). docs/capture.md ("The step queue") has the design and
// the measurements behind it.
//
// Each accepted step is packed flat into one contiguous record: a header,
// the integer lists, the sampling parameters, the digests, the request-id
// end offsets and the id/digest characters, copied straight from the
// caller's spans (no std::vector resize, so nothing is zero-filled first;
// no allocation in the steady state). The request ids are gathered first
// in buffers of the producer's own; then the record is written in whole
// cache lines with streaming stores (LineStream, stream_copy.h). Records
// live in one arena allocated and pre-faulted when the recorder begins,
// one after the other round it (a record never wraps; one that would cross
// the end starts at the beginning). The position is
// not rewound to the start when the queue empties: rewriting the lines the
// writer has just read measured slower and far less steady (docs/capture.md,
// "The step queue"). A record that finds no room gets a buffer of its own
// (a "spilled" step: an allocation on the serving thread, never a wait and
// never a lost step). A record larger than the whole arena grows the arena,
// which happens only while the queue is empty.
//
// The queue holds at most `slots` steps (head - tail <= slots); Full() tells
// the producer to wait (the recorder's policy: a bounded wait, then
// ResourceExhausted).
//
// Threads: one producer at a time (Recorder serialises callers with a
// mutex) calls Full/Push; one consumer (the writer thread) calls
// Unpack/Release in order. head() and tail() may be read from anywhere,
// including a signal handler (lock-free atomics). head_ and tail_ are on
// cache lines of their own, apart from each side's private state.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "crashreplay/capture/recorder.h"
#include "crashreplay/formats/capture_records.h"

namespace crashreplay::capture::internal {

class alignas(64) StepQueue {
 public:
  // `arena_bytes` is rounded up to whole pages (at least 64 KiB).
  StepQueue(uint32_t slots, uint64_t arena_bytes);
  ~StepQueue();
  StepQueue(const StepQueue&) = delete;
  StepQueue& operator=(const StepQueue&) = delete;

  // The checks a view must pass before it is accepted (page-table CSR).
  static absl::Status Validate(const StepView& v);

  // Producer. Full(): `slots` steps are queued, Push would overwrite one the
  // writer has not released. Push() requires !Full() and a view that
  // passed Validate().
  bool Full() {
    const uint64_t h = head_.load(std::memory_order_relaxed);
    if (h - tail_seen_ < entries_.size()) return false;
    tail_seen_ = tail_.load(std::memory_order_acquire);
    return h - tail_seen_ >= entries_.size();
  }
  void Push(const StepView& v, int64_t timestamp_nanos);

  // Consumer, in sequence order: Unpack(seq) for seq < head(), then
  // Release(seq) hands its space back (tail = seq + 1).
  void Unpack(uint64_t seq, uint32_t rank, StepRecord* out) const;
  void Release(uint64_t seq);

  uint64_t head() const { return head_.load(std::memory_order_acquire); }
  uint64_t tail() const { return tail_.load(std::memory_order_acquire); }
  uint32_t slots() const { return static_cast<uint32_t>(entries_.size()); }
  uint64_t arena_bytes() const { return arena_size_.load(std::memory_order_relaxed); }
  // False when the arena could not be mapped at construction.
  bool ok() const { return arena_ != nullptr; }
  uint64_t spilled() const { return spilled_.load(std::memory_order_relaxed); }

  // The record size of a view (header and padding included).
  static size_t PackedBytes(const StepView& v);

 private:
  struct Entry {
    uint64_t mark = 0;        // arena position (virtual) when the entry was made
    const std::byte* data = nullptr;
    std::unique_ptr<std::byte[]> spill;  // set when the record is not in the arena
  };
  std::byte* Allocate(size_t bytes, Entry* e);
  std::byte* Place(size_t bytes, Entry* e);
  void GrowIdChars(size_t need, size_t keep);

  std::vector<Entry> entries_;
  // Producer side.
  std::byte* arena_ = nullptr;  // mmap'ed, arena_size_ bytes
  std::atomic<uint64_t> arena_size_{0};
  uint64_t write_pos_ = 0;  // virtual: physical = write_pos_ % arena_size_
  // The tail as the producer last read it (<= tail_): a step reads the
  // writer's cache line only when this copy says the queue or the arena is
  // full, not on every push.
  uint64_t tail_seen_ = 0;
  // The request ids of the step being pushed, gathered here (end offsets
  // and characters, in this core's cache) and then streamed out whole;
  // each grows only with a step larger than any before.
  std::unique_ptr<uint32_t[]> id_ends_;
  size_t id_ends_capacity_ = 0;
  std::unique_ptr<char[]> id_chars_;
  size_t id_chars_capacity_ = 0;
  std::atomic<uint64_t> spilled_{0};

  alignas(64) std::atomic<uint64_t> head_{0};  // steps pushed
  alignas(64) std::atomic<uint64_t> tail_{0};  // steps released by the writer
  alignas(64) char pad_[1] = {};
};

}  // namespace crashreplay::capture::internal
