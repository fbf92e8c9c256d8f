// The per-step context StepProgram's lowering passes to its pieces
// (step_lower.cc, step_lower_mla.cc). Private to replay/src.
#pragma once

#include <cstdint>

#include "crashreplay/replay/program/step.h"

namespace crashreplay::replay {

struct StepProgram::Lowering {
  const DeviceModel& dm;
  const EngineConfig& cfg;
  KvCache* kv = nullptr;
  BatchView batch;
  int ranks = 1;          // tensor-parallel ranks (emulated)
  int64_t tokens = 0;     // T: tokens of the step, all rows
  int64_t rows = 0;       // R: requests of the step
  int64_t max_len = 1;    // longest attended length (position + 1)
  bool decode = false;
  float eps = 1e-6f;      // the model's rms_norm_eps
  // Per row r: its token count, first position and page table (host copies,
  // for the lowering's own index arithmetic).
  const StepInput* input = nullptr;
};

}  // namespace crashreplay::replay
