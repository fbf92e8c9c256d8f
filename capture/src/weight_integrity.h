// WeightIntegrity: the per-step check of registered weights (internal).
//
// At registration every weight buffer is cut into chunks of chunk_bytes
// (the last chunk of a tensor is shorter) and each chunk's XXH3-128 is kept
// as its load-time value. Each CheckNext() re-hashes the next `n` chunks in
// a fixed rotation over all tensors and reports each as a WeightSlice
// (tensor, byte range, hash now, load-time hash, corrupt). All weights are
// covered every K = ceil(chunks / n) checks; K is recorded with every check.
//
// n comes from options: a fixed byte count per step, or the budget: the
// fraction of the step interval the caller measured, times the hashing
// speed measured while hashing the load-time values.
//
// Thread safety: Register and CheckNext from one thread at a time (the
// recorder calls Register under its lock and CheckNext from its writer).
#pragma once

#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "crashreplay/capture/recorder.h"
#include "crashreplay/formats/capture_records.h"

namespace crashreplay::capture::internal {

class WeightIntegrity {
 public:
  WeightIntegrity(uint64_t chunk_bytes, uint64_t fixed_bytes_per_step, double budget);

  // `device`: the buffers are device memory; their slices are hashed with
  // the chunked device hash (chunked_hash.h) instead of XXH3-128.
  absl::Status Register(std::span<const TensorView> weights, bool device = false);

  bool empty() const;
  uint64_t total_bytes() const;
  // Chunks per check for a step interval of `step_nanos` (0: unknown).
  uint64_t ChunksPerCheck(double step_nanos) const;
  uint32_t PeriodSteps(double step_nanos) const;

  // Hashes the next slice; `record` gets step, period and slices.
  void CheckNext(uint64_t step, double step_nanos, WeightCheckRecord* record);

 private:
  struct Chunk {
    uint32_t tensor = 0;
    uint64_t begin = 0, end = 0;
    Hash128 expected;
  };
  struct Tensor {
    std::string name;
    const unsigned char* data = nullptr;
    uint64_t size = 0;
    bool device = false;
  };
  static Hash128 HashSlice(const Tensor& t, uint64_t begin, uint64_t end);

  const uint64_t chunk_bytes_;
  const uint64_t fixed_bytes_per_step_;
  const double budget_;
  mutable std::mutex mu_;
  std::vector<Tensor> tensors_;
  std::vector<Chunk> chunks_;
  uint64_t total_bytes_ = 0;
  double hash_bytes_per_ns_ = 0;  // measured at Register
  uint64_t cursor_ = 0;
};

}  // namespace crashreplay::capture::internal
