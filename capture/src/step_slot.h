// StepSlot: one step of the step-log queue, packed flat (internal).
//
// The serving thread's whole cost per step is Pack(): a handful of memcpys
// into buffers this slot reuses (all integer lists into one int64 buffer,
// all request ids into one char buffer), so a steady batch size allocates
// nothing and touches few cache lines. The writer thread Unpack()s into a
// StepRecord (allocating there, off the hot path) and encodes it.
// Not thread-safe: a slot belongs to the producer until published, then to
// the writer until released (the queue's head/tail order them).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "crashreplay/capture/recorder.h"
#include "crashreplay/formats/capture_records.h"

namespace crashreplay::capture::internal {

class StepSlot {
 public:
  // Validates the view (page-table CSR) and copies it in.
  absl::Status Pack(const StepView& v, int64_t timestamp_nanos);
  void Unpack(uint32_t rank, StepRecord* out) const;

  uint64_t step() const { return step_; }
  ForwardMode mode() const { return mode_; }
  int64_t timestamp_nanos() const { return timestamp_nanos_; }

 private:
  enum Field { kTokens, kPositions, kSeqLens, kExtendLens, kPool, kPtOffsets, kPtSlots, kOutLoc, kOutputs, kFields };

  uint64_t step_ = 0;
  ForwardMode mode_ = ForwardMode::kUnknown;
  int64_t timestamp_nanos_ = 0;
  uint64_t rng_seed_ = 0, rng_offset_ = 0;
  std::vector<int64_t> ints_;                 // the kFields lists, concatenated
  std::array<size_t, kFields + 1> begin_{};   // field f is ints_[begin_[f], begin_[f+1])
  std::vector<char> id_chars_;
  std::vector<uint32_t> id_ends_;             // request id i ends at id_ends_[i]
  std::vector<SamplingParams> sampling_;
  std::vector<char> digest_chars_;
  std::vector<uint32_t> digest_ends_;
  std::vector<DigestView> digests_;           // names point nowhere; use digest_chars_
};

}  // namespace crashreplay::capture::internal
