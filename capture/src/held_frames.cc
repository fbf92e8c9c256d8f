#include "held_frames.h"

#include <utility>

#include "crashreplay/formats/capture_format.h"

namespace crashreplay::capture::internal {
namespace {

bool IsStep(const EncodedFrame& f) { return f.type == static_cast<uint16_t>(RecordType::kStep); }

}  // namespace

void HeldFrames::Push(EncodedFrame frame) {
  const bool step = IsStep(frame);
  bytes_.fetch_add(frame.bytes.size(), std::memory_order_relaxed);
  if (step) steps_.fetch_add(1, std::memory_order_relaxed);
  frames_.push_back(std::move(frame));
  while (!frames_.empty() && (steps() > max_steps_ || bytes() > max_bytes_)) DropFront();
}

void HeldFrames::PopFront() {
  const EncodedFrame& f = frames_.front();
  bytes_.fetch_sub(f.bytes.size(), std::memory_order_relaxed);
  if (IsStep(f)) steps_.fetch_sub(1, std::memory_order_relaxed);
  frames_.pop_front();
}

void HeldFrames::DropFront() {
  const bool step = IsStep(frames_.front());
  PopFront();
  (step ? steps_dropped_ : records_dropped_).fetch_add(1, std::memory_order_relaxed);
}

uint64_t HeldFrames::first_step() const {
  for (const EncodedFrame& f : frames_) {
    if (IsStep(f)) return f.step;
  }
  return 0;
}

uint64_t HeldFrames::last_step() const {
  for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
    if (IsStep(*it)) return it->step;
  }
  return 0;
}

}  // namespace crashreplay::capture::internal
