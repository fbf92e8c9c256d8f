#include "weight_integrity.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "crashreplay/capture/chunked_hash.h"
#include "crashreplay/formats/hash.h"

namespace crashreplay::capture::internal {

WeightIntegrity::WeightIntegrity(uint64_t chunk_bytes, uint64_t fixed_bytes_per_step, double budget)
    : chunk_bytes_(std::max<uint64_t>(chunk_bytes, 64)), fixed_bytes_per_step_(fixed_bytes_per_step), budget_(budget) {}

Hash128 WeightIntegrity::HashSlice(const Tensor& t, uint64_t begin, uint64_t end) {
  if (!t.device) return XXH128Of(t.data + begin, end - begin);
  absl::StatusOr<Hash128> h = ChunkedHashDevice(t.data + begin, end - begin);
  // A device error after registration (a sticky CUDA error): report the
  // slice as unverifiable by a hash that cannot match.
  return h.ok() ? *h : Hash128{~0ull, ~0ull};
}

absl::Status WeightIntegrity::Register(std::span<const TensorView> weights, bool device) {
  for (const TensorView& w : weights) {
    if (w.data == nullptr && w.byte_size > 0) {
      return absl::InvalidArgumentError(absl::StrCat("weight '", std::string(w.name), "' has no data"));
    }
  }
  if (device && !weights.empty()) {
    // Refuse early (Unimplemented without CUDA, FailedPrecondition for host memory).
    absl::StatusOr<Hash128> probe = ChunkedHashDevice(weights[0].data, std::min<uint64_t>(weights[0].byte_size, 1));
    if (!probe.ok()) return probe.status();
  }
  std::lock_guard<std::mutex> lock(mu_);
  const auto start = std::chrono::steady_clock::now();
  uint64_t hashed = 0;
  for (const TensorView& w : weights) {
    const uint32_t index = static_cast<uint32_t>(tensors_.size());
    tensors_.push_back(Tensor{std::string(w.name), static_cast<const unsigned char*>(w.data), w.byte_size, device});
    for (uint64_t b = 0; b < w.byte_size; b += chunk_bytes_) {
      const uint64_t e = std::min(w.byte_size, b + chunk_bytes_);
      chunks_.push_back(Chunk{index, b, e, HashSlice(tensors_.back(), b, e)});
    }
    total_bytes_ += w.byte_size;
    hashed += w.byte_size;
  }
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
  if (hashed >= (1u << 20) && ns > 0) hash_bytes_per_ns_ = static_cast<double>(hashed) / ns;
  return absl::OkStatus();
}

bool WeightIntegrity::empty() const {
  std::lock_guard<std::mutex> lock(mu_);
  return chunks_.empty();
}

uint64_t WeightIntegrity::total_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_bytes_;
}

uint64_t WeightIntegrity::ChunksPerCheck(double step_nanos) const {
  uint64_t bytes = fixed_bytes_per_step_;
  if (bytes == 0) {
    // Budget: a fraction of the step interval at the measured hashing speed
    // (XXH3 runs at several GB/s; 10 GB/s is assumed until measured).
    const double speed = hash_bytes_per_ns_ > 0 ? hash_bytes_per_ns_ : 10.0;
    bytes = step_nanos > 0 ? static_cast<uint64_t>(budget_ * step_nanos * speed) : chunk_bytes_;
  }
  return std::max<uint64_t>(1, bytes / chunk_bytes_);
}

uint32_t WeightIntegrity::PeriodSteps(double step_nanos) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (chunks_.empty()) return 0;
  const uint64_t n = ChunksPerCheck(step_nanos);
  return static_cast<uint32_t>(std::min<uint64_t>((chunks_.size() + n - 1) / n, UINT32_MAX));
}

void WeightIntegrity::CheckNext(uint64_t step, double step_nanos, WeightCheckRecord* record) {
  std::lock_guard<std::mutex> lock(mu_);
  record->step = step;
  record->slices.clear();
  if (chunks_.empty()) return;
  const uint64_t n = std::min<uint64_t>(ChunksPerCheck(step_nanos), chunks_.size());
  record->period_steps = static_cast<uint32_t>(std::min<uint64_t>((chunks_.size() + n - 1) / n, UINT32_MAX));
  for (uint64_t i = 0; i < n; ++i) {
    const Chunk& c = chunks_[cursor_];
    cursor_ = (cursor_ + 1) % chunks_.size();
    const Tensor& t = tensors_[c.tensor];
    WeightSlice s;
    s.tensor = t.name;
    s.byte_begin = c.begin;
    s.byte_end = c.end;
    s.hash = HashSlice(t, c.begin, c.end);
    s.expected = c.expected;
    s.corrupt = s.hash != s.expected;
    record->slices.push_back(std::move(s));
  }
}

}  // namespace crashreplay::capture::internal
