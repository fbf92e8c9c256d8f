// Fingerprints of device tensors that survive the sticky CUDA error
// (docs/capture.md, "Fingerprints on the device").
//
// A DeviceFingerprints table owns one slot per boundary ("L41.attention"),
// in pinned host memory mapped into the device. Enqueue() launches our
// summary kernel (device_fingerprints.cu) on the engine's stream right after
// the kernel that produced the tensor; the kernel writes the slot's record
// straight into the mapped memory and stamps it with the step's generation,
// which BeginStep()'s one-thread kernel advances in stream order. Every
// address is fixed when the slot is first used, so the launches may be
// captured into a CUDA graph and replayed step after step.
//
// After the step, or after a fault that poisoned the context (a device-side
// assert, 710; an illegal address), Collect() reads the slots on the host
// (no CUDA call: the memory is the host's) and returns the boundaries the
// step completed, in slot order, as a FingerprintRecord with source
// "device" for Recorder::RecordFingerprints; after a fault the record is
// incomplete and its last entry is the last boundary that ran.
//
// The sums run in a fixed order (each block's grid-stride share, a fixed
// tree in the block, the blocks in order), so a table gives the same bits
// for the same tensor every time; the order is not the host's
// SummarizeTensor's, so the fp64 sums may differ in the last bits from a
// host summary of the same tensor (counts, min, max, max |x| do not).
//
// Thread-compatible: one thread (the engine's scheduler) drives a table.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "crashreplay/capture/recorder.h"
#include "crashreplay/formats/capture_records.h"

namespace crashreplay::capture {

namespace internal {
struct DeviceFingerprintSlot;
struct DeviceFingerprintHeader;
}  // namespace internal

class DeviceFingerprints {
 public:
  // A table of `max_boundaries` slots. Unimplemented in a build without
  // CUDA; FailedPrecondition without a device; the CUDA error otherwise.
  static absl::StatusOr<std::unique_ptr<DeviceFingerprints>> Create(uint32_t max_boundaries);
  ~DeviceFingerprints();
  DeviceFingerprints(const DeviceFingerprints&) = delete;
  DeviceFingerprints& operator=(const DeviceFingerprints&) = delete;

  // Starts step `step` on `stream` (a cudaStream_t; null for the legacy
  // default stream): enqueues the generation kernel and notes which step
  // the new generation is. In a captured graph, enqueue it once inside the
  // graph and call NoteGraphStep(step) before each launch instead.
  absl::Status BeginStep(uint64_t step, void* stream);
  void NoteGraphStep(uint64_t step);

  // Enqueues the summary of `tensor` (device memory, dense) at boundary
  // `tensor.name` on `stream`. The boundary's slot is fixed by its first
  // Enqueue (the order of first use is the slot order); a later Enqueue of
  // the same name must have the same dtype and element count (a CUDA graph
  // replays the same launch), else InvalidArgument. ResourceExhausted past
  // max_boundaries; InvalidArgument for a dtype the kernel does not decode
  // (fp4, e8m0) or a malformed view.
  absl::Status Enqueue(const TensorView& tensor, void* stream);

  // The boundaries the step now running (the last BeginStep/NoteGraphStep)
  // has completed, in slot order; `complete` false marks a step that did
  // not finish (the failure path). Reads host memory only: safe after the
  // context is lost. The caller synchronises first on the normal path.
  FingerprintRecord Collect(bool complete) const;

  // Names of the boundaries in slot order.
  std::vector<std::string> boundaries() const;

 private:
  DeviceFingerprints() = default;
  struct SlotInfo {
    std::string name;
    DType dtype = DType::kF32;
    uint64_t numel = 0;
    uint64_t columns = 1;
    int kind = 0;
  };
  uint32_t capacity_ = 0;
  internal::DeviceFingerprintHeader* host_header_ = nullptr;
  internal::DeviceFingerprintSlot* host_slots_ = nullptr;
  void* device_header_ = nullptr;
  void* device_slots_ = nullptr;
  void* scratch_ = nullptr;
  std::vector<SlotInfo> slots_;
  absl::flat_hash_map<std::string, uint32_t> slot_of_;
  uint64_t generation_ = 0;  // the host's count of BeginStep/NoteGraphStep
  absl::flat_hash_map<uint64_t, uint64_t> step_of_generation_;
};

namespace internal {
// The record of one slot as the Fingerprint the capture holds (pure; the
// host side of Collect, tested without a device).
Fingerprint FingerprintFromSlot(const DeviceFingerprintSlot& slot, std::string_view name, DType dtype,
                                uint64_t columns);
}  // namespace internal

}  // namespace crashreplay::capture
