// The backend seam: an Executor runs ops (ops.h) in its own memory. Two real
// implementations: the CPU executor (CpuPool threads, host memory) and the
// CUDA executor (one stream, device memory, checks that trap on the device).
//
// Modes:
//   kKernelByKernel  every Launch waits for its kernel and reports a fired
//                    check right there (CUDA_LAUNCH_BLOCKING-like);
//   kAsync           Launch only enqueues; a device-side assert surfaces at a
//                    later call (the next Launch that touches the dead
//                    context, a copy, Synchronize), as in a serving engine.
// Either way the fault names both where it happened (the launch whose check
// fired, read from the fault record) and where it surfaced (the call that
// returned the error). The CPU executor always runs kernel by kernel.
//
// Errors: Aborted when a kernel check fired (fault() holds the record);
// ResourceExhausted for out of memory; InvalidArgument for an unknown or
// unavailable device ("no CUDA device"); Internal for other CUDA errors.
// After a device-side assert the executor is dead: every later call returns
// the same error, as the CUDA context is.
// Thread safety: one thread drives an Executor.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "crashreplay/replay/kernels/check.h"
#include "crashreplay/replay/kernels/ops.h"

namespace crashreplay::replay {

using Op = std::variant<EmbeddingOp, RmsNormOp, LinearOp, RopeOp, KvWriteOp, AttentionOp, SiluMulOp, ReduceOp, RouterOp,
                        TopKOp, ExpertsOp, SharedExpertOp, GatherLogitsOp, ProcessLogitsOp, SampleOp, ActQuantOp,
                        LatentWriteOp, LatentGatherOp, MlaAttentionOp, MlaQAbsorbOp, LatentAttentionOp, MlaVUpOp,
                        IndexKWriteOp, IndexerOp, StoreOp>;

OpKind KindOf(const Op& op);

enum class ExecMode { kAsync, kKernelByKernel };
const char* ExecModeName(ExecMode m);

// What the caller calls the launch (the step's kernel label parts).
struct LaunchTag {
  std::string kernel;  // "attention"
  int layer = -1;
};

struct ExecFault {
  // Where it happened.
  uint32_t launch = 0;  // sequence number of the launch (0-based, per executor)
  LaunchTag tag;
  OpKind op = OpKind::kCount;
  KernelStatus status;
  // Where it surfaced: the call that returned the error, and how many
  // launches had been enqueued by then.
  std::string surfaced_in;  // "Launch", "Synchronize", "CopyToHost", ...
  uint32_t surfaced_after_launch = 0;
  std::string device_error;  // "cudaErrorAssert (710): ..."; empty on the CPU

  std::string Describe() const;
};

class Executor {
 public:
  virtual ~Executor() = default;

  virtual std::string_view name() const = 0;
  virtual ExecMode mode() const = 0;
  // Whether the executor's memory is ordinary host memory (the CPU executor):
  // ops may then read host buffers in place, so weights are never copied.
  virtual bool host_visible() const { return false; }

  // Memory in the executor's address space (device memory for CUDA; never
  // managed memory). Free(nullptr) is a no-op.
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  virtual void Free(void* p) = 0;
  virtual absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) = 0;
  virtual absl::Status CopyToHost(void* dst, const void* src, size_t bytes) = 0;
  virtual absl::Status Fill(void* dst, int byte, size_t bytes) = 0;

  virtual absl::Status Launch(const Op& op, const LaunchTag& tag) = 0;
  virtual absl::Status Synchronize() = 0;

  // The fault of the last Aborted status, if any.
  virtual const std::optional<ExecFault>& fault() const = 0;
  // Launches so far.
  virtual uint32_t launches() const = 0;
};

// Copies a host vector into a new allocation of `exec`.
template <typename T>
absl::StatusOr<T*> Upload(Executor& exec, const std::vector<T>& v) {
  auto p = exec.Allocate(v.size() * sizeof(T) + (v.empty() ? 1 : 0));
  if (!p.ok()) return p.status();
  if (!v.empty()) {
    absl::Status s = exec.CopyToDevice(*p, v.data(), v.size() * sizeof(T));
    if (!s.ok()) return s;
  }
  return static_cast<T*>(*p);
}

}  // namespace crashreplay::replay
