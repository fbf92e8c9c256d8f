// The built-in inference engine: continuous batching over a paged KV cache,
// one StepProgram per scheduler step, on the executor the `device` toggle
// names (the CPU reference backend, or the CUDA backend running the same
// kernel list on the GPU).
//
// Scheduling follows sglang's default loop: when requests are waiting, the
// next step prefills as many of them as fit (max_running_requests, free KV
// pages); otherwise it decodes one token for every running request. Pages are
// handed out lowest id first and returned when a request finishes. The first
// failure (a planner OOM, a KV pool exhausted, a kernel check) stops the run
// and is returned with its step's kernel records.
//
// Steps are also the unit of replay: Prepare builds a given StepInput (as
// recorded) against the engine's KV cache, so replaying step N is re-running
// the recorded inputs of steps 0..N-1, or restoring step N's state snapshot
// (RestoreState, step_state.h), and then step N kernel by kernel.
// Thread safety: one thread drives an Engine.
// Errors: Engine::Create fails (InvalidArgument, "no CUDA device ...") when
// the configuration asks for a device this build or machine does not have;
// it never falls back to another device.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "crashreplay/replay/config/fault.h"
#include "crashreplay/replay/config/toggles.h"
#include "crashreplay/replay/kernels/executor.h"
#include "crashreplay/replay/model/model.h"
#include "crashreplay/replay/model/planner.h"
#include "crashreplay/replay/program/device_model.h"
#include "crashreplay/replay/program/step.h"
#include "crashreplay/replay/session/step_state.h"

namespace crashreplay::replay {

struct Request {
  int64_t id = 0;
  std::vector<int32_t> prompt;
  int64_t max_new_tokens = 8;
  SamplingParams sampling;
};

struct StepSummary {
  int64_t step = 0;
  ForwardMode mode = ForwardMode::kPrefill;
  int64_t rows = 0;
  int64_t tokens = 0;
  Hash128 digest;
  std::vector<int32_t> sampled;
  uint64_t activation_bytes = 0;  // StepProgram::activation_bytes
};

// Hooks for a recorder: called around every step with the exact inputs.
// StateBeforeStep comes first and sees the KV cache as the step will read it
// (CaptureRecorder snapshots it: step_state.h).
class StepObserver {
 public:
  virtual ~StepObserver() = default;
  virtual void StateBeforeStep(const StepInput& /*input*/, const KvCache& /*kv*/) {}
  virtual void BeforeStep(const StepInput& input) = 0;
  virtual void AfterStep(const StepProgram& program) = 0;
};

struct RunResult {
  MemoryPlan plan;
  std::vector<StepSummary> steps;
  std::map<int64_t, std::vector<int32_t>> outputs;  // request id -> generated tokens
  std::optional<Fault> fault;
  std::string first_nonfinite;                // kernel label in the failing (or last) step
  std::vector<KernelRecord> last_step_kernels;  // the failing step's (or last step's) kernels
};

class Engine {
 public:
  // Plans memory for `model` under `config` and sets it up on the executor
  // `config.device` names (threads: CPU worker threads, <= 0 for
  // CRASHREPLAY_THREADS). The KV pool is the planner's page count, capped at
  // `max_pool_pages` (what the workload can use) to keep memory small; the
  // cap never changes which page ids are valid for a workload that fits. A
  // plan that fails (or a device that cannot hold the weights or the pool) is
  // not an error here: plan().fault holds it, and Run reports it.
  // Layer streaming (device_model.h): when the model streams, or
  // config.weights is stream, or it is auto and the weights do not fit the
  // executor's memory (an upload that runs out of it is retried streaming;
  // notes() says so).
  static absl::StatusOr<std::unique_ptr<Engine>> Create(std::unique_ptr<Model> model, const EngineConfig& config,
                                                        int threads, int64_t max_pool_pages);
  // The same on a given executor instead of the one config.device names
  // (tests run the device path on a CPU stand-in this way).
  static absl::StatusOr<std::unique_ptr<Engine>> Create(std::unique_ptr<Model> model, const EngineConfig& config,
                                                        std::unique_ptr<Executor> executor, int64_t max_pool_pages);

  const MemoryPlan& plan() const { return plan_; }
  const Model& model() const { return *model_; }
  const EngineConfig& config() const { return config_; }
  Executor& executor() { return *exec_; }
  // Whether one layer's weights at a time are resident (see Create).
  bool streaming() const { return device_model_ && device_model_->streaming(); }
  const DeviceModel* device_model() const { return device_model_.get(); }
  // What Create decided that the user should know.
  const std::vector<std::string>& notes() const { return notes_; }

  RunResult Run(const std::vector<Request>& requests, StepObserver* observer = nullptr);

  // Lowers one recorded step against this engine's KV cache; the caller runs
  // it (whole, or kernel by kernel).
  std::unique_ptr<StepProgram> Prepare(const StepInput& input);

  // Writes a recorded step's state (step_state.h) into the KV cache, so that
  // Prepare(input) runs that step without re-executing its history. The
  // cache must be fresh. InvalidArgument when the state does not fit `input`
  // or this engine (naming the step); FailedPrecondition when the memory plan
  // failed (there is no cache).
  absl::Status RestoreState(const StepState& state, const StepInput& input);

 private:
  Engine(std::unique_ptr<Model> model, const EngineConfig& config) : model_(std::move(model)), config_(config) {}
  std::unique_ptr<Model> model_;
  EngineConfig config_;
  std::unique_ptr<Executor> exec_;
  std::unique_ptr<DeviceModel> device_model_;
  MemoryPlan plan_;
  std::unique_ptr<KvCache> kv_;
  std::vector<std::string> notes_;
};

// Pages a workload needs: the sum over requests of ceil((prompt + max_new) / page_size).
int64_t PagesNeeded(const std::vector<Request>& requests, int page_size);

}  // namespace crashreplay::replay
