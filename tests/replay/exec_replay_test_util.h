// Helpers shared by the step-program tests (CPU) and the GPU tests: record a
// run of the CPU engine (every step's inputs and kernel records), then replay
// those steps, lowered again, on any executor.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "crashreplay/replay/kernels/executor.h"
#include "crashreplay/replay/program/step.h"
#include "crashreplay/replay/session/backends.h"
#include "engine_test_util.h"

namespace crashreplay::replay::testing {

// A parameterised case: a random checkpoint of `arch`/`quant` run under `sets`.
struct ConfigCase {
  std::string name, arch, quant;
  std::vector<std::string> sets;
  float temperature = 0.0f;
};
inline void PrintTo(const ConfigCase& c, std::ostream* os) { *os << c.name; }

// The configurations a device executor is checked on, kernel by kernel
// against the CPU (tests/gpu/kernel_parity_test.cc) and on the CPU's
// guarded stand-in (tests/replay/guarded_device_test.cc).
inline std::vector<ConfigCase> DeviceParityCases() {
  using Case = ConfigCase;
  // clang-format off: a table, one case a line or two as written
  return {Case{"llama_bf16_reference", "llama", "bf16", {}, 0.0f},
          Case{"qwen3_fp8_flashdecode_fused", "qwen3", "fp8",
               {"attention_backend=flashdecode", "gemm_backend=fused_blockscaled"}, 0.8f},
          Case{"qwen3_nvfp4_tp2_dequant", "qwen3", "nvfp4", {"tp_size=2"}, 0.8f},
          Case{"llama_nvfp4_w4a4_fused", "llama", "nvfp4", {"gemm_backend=fused_blockscaled"}, 0.0f},
          Case{"llama_nvfp4_w4a16", "llama", "nvfp4", {"nvfp4_activation=w4a16"}, 0.0f},
          Case{"mixtral_nvfp4_paged64_fp8kv_threshold", "mixtral", "nvfp4",
               {"page_size=64", "attention_backend=paged64", "kv_cache_dtype=fp8_e4m3",
                "sampling_backend=threshold"},
               0.8f},
          Case{"glm4_moe_mxfp4_ue8m0_fused", "glm4_moe", "mxfp4",
               {"scale_format=ue8m0", "moe_backend=fused_blockscaled"}, 0.8f},
          Case{"glm4_moe_nvfp4_tp2_expert", "glm4_moe", "nvfp4", {"tp_size=2", "moe_parallel=expert"},
               0.8f},
          Case{"qwen3_moe_fp8_ue8m0_requant", "qwen3_moe", "fp8", {"scale_format=ue8m0_requant"}, 0.0f},
          Case{"deepseek_v3_fp8_absorbed_fp8kv", "deepseek_v3", "fp8",
               {"page_size=64", "mla_decode=absorbed", "kv_cache_dtype=fp8_e4m3"}, 0.8f},
          Case{"deepseek_v32_bf16_naive_reference", "deepseek_v32", "bf16", {}, 0.0f},
          Case{"glm_moe_dsa_nvfp4_tiled64_fp8_tp2", "glm_moe_dsa", "nvfp4",
               {"page_size=64", "dsa_decode=tiled64", "kv_cache_dtype=fp8_e4m3",
                "index_cache_dtype=fp8_e4m3", "tp_size=2"},
               0.8f},
          // gpt_oss: sinks and the sliding window in split-KV and paged64
          // attention, biased experts with the clamped SwiGLU in the stages.
          Case{"gpt_oss_bf16_flashdecode_tp2", "gpt_oss", "bf16", {"attention_backend=flashdecode", "tp_size=2"},
               0.8f},
          Case{"gpt_oss_bf16_paged64", "gpt_oss", "bf16", {"page_size=64", "attention_backend=paged64"}, 0.0f}};
  // clang-format on
}

struct RecordedRun {
  std::unique_ptr<Engine> engine;
  RunResult result;
  std::vector<StepInput> inputs;
  std::vector<std::vector<KernelRecord>> records;  // per step
};

class Recorder : public StepObserver {
 public:
  explicit Recorder(RecordedRun* run) : run_(run) {}
  void BeforeStep(const StepInput& input) override { run_->inputs.push_back(input); }
  void AfterStep(const StepProgram& program) override { run_->records.push_back(program.records()); }

 private:
  RecordedRun* run_;
};

inline RecordedRun RecordRun(const MakeModelOptions& opts, const std::vector<std::string>& sets, int64_t max_new,
                             float temperature) {
  RecordedRun run;
  run.engine = MakeEngine(opts, sets);
  if (!run.engine) return run;
  Recorder rec(&run);
  run.result = run.engine->Run(TwoRequests(max_new, temperature), &rec);
  return run;
}

// The engine's KV pool size (MakeEngine caps it at 4096 pages).
inline int64_t EnginePages(const Engine& e) { return std::min<int64_t>(e.plan().pool_pages, 4096); }

// Replays every recorded step on `exec` (a fresh device model and KV cache).
// `status` is the executor status of the first failing step (or OK), `fault`
// its fault; `kernel_digests` gets each step's per-kernel output digests
// (with the watcher on), `step_digests` the step digests.
struct ExecReplay {
  std::unique_ptr<DeviceModel> model;
  std::unique_ptr<KvCache> kv;
  std::vector<std::vector<Hash128>> kernel_digests;
  std::vector<Hash128> step_digests;
  absl::Status status;
  std::optional<Fault> fault;
  size_t failed_step = 0;
};

// The smallest KV pool the recorded steps fit in (the highest page any row's
// table names, plus one).
inline int64_t UsedPages(const RecordedRun& run) {
  int64_t pages = 1;
  for (const StepInput& in : run.inputs) {
    for (const StepRow& row : in.rows) {
      for (int32_t p : row.page_table) pages = std::max<int64_t>(pages, int64_t{p} + 1);
    }
  }
  return pages;
}

// pages: the KV pool's size (default: the engine's).
inline ExecReplay ReplayOnExecutor(const RecordedRun& run, Executor* exec, bool watch, int64_t pages = 0) {
  ExecReplay r;
  auto dm = DeviceModel::Upload(run.engine->model(), exec);
  if (!dm.ok()) {
    r.status = dm.status();
    return r;
  }
  r.model = std::move(*dm);
  auto kv =
      KvCache::Create(run.engine->model(), run.engine->config(), pages > 0 ? pages : EnginePages(*run.engine), exec);
  if (!kv.ok()) {
    r.status = kv.status();
    return r;
  }
  r.kv = std::move(*kv);
  for (size_t i = 0; i < run.inputs.size(); ++i) {
    auto step = StepProgram::Lower(*r.model, run.engine->config(), r.kv.get(), run.inputs[i]);
    step->set_watch(watch);
    r.fault = step->RunAll();
    std::vector<Hash128> digests;
    if (watch) {
      for (const KernelRecord& k : step->records()) digests.push_back(k.digest);
    }
    r.kernel_digests.push_back(digests);
    if (r.fault) {
      r.status = step->status();
      r.failed_step = i;
      return r;
    }
    r.step_digests.push_back(step->Digest());
  }
  return r;
}

// Every kernel `rep` replayed (with the watcher on) and every step has the
// bits `run` recorded.
inline void ExpectRecordedBits(const RecordedRun& run, const ExecReplay& rep) {
  ASSERT_EQ(rep.kernel_digests.size(), run.records.size());
  for (size_t s = 0; s < run.records.size(); ++s) {
    ASSERT_EQ(rep.kernel_digests[s].size(), run.records[s].size()) << "step " << s;
    for (size_t k = 0; k < run.records[s].size(); ++k) {
      EXPECT_EQ(rep.kernel_digests[s][k], run.records[s][k].digest)
          << "step " << s << " kernel " << run.records[s][k].label;
    }
    EXPECT_EQ(rep.step_digests[s], run.result.steps[s].digest) << "step " << s;
  }
}

}  // namespace crashreplay::replay::testing
