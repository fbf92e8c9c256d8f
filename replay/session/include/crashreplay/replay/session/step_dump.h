// Dumping a replayed step's kernel outputs as safetensors
// (`crashreplay replay CAPTURE --dump DIR [--dump-kernels PATTERNS]`), so the
// tensors of the step under study open in numpy or torch.
//
// Kernel names are the step's kernel labels (step.h, KernelCall::Label):
// "L<layer>.<kernel>" for a kernel of a layer ("L0.q_proj",
// "L11.attention"), the bare kernel name outside the layers ("embedding",
// "final_norm", "lm_head", "logits_all_gather", "logits_processor",
// "sampler"); a label is unique within a step. PATTERNS is one or more shell
// globs over labels (fnmatch(3): `*`, `?`, `[...]`) separated by commas:
// "L*.attention", "L0.*,lm_head", "logits_*". A kernel is dumped when any
// pattern matches its label; no pattern (or "*") dumps every kernel.
//
// Tensors: "<label>.<buffer>" for each output buffer of a dumped kernel
// ("L0.q_proj.q", "logits_all_gather.logits", "sampler.next_tokens"), copied
// right after that kernel ran (the step reuses one buffer per role across
// layers), in the dtype and shape the step holds it: F32 activations, I32
// token and expert ids; per-rank buffers keep their leading tensor-parallel
// rank dimension ([tp, tokens, dim]), because one process emulates every
// rank. kv_write writes the paged KV cache, which is not an activation
// buffer: it adds no tensor (its inputs are the L<i>.rope and L<i>.v_proj
// outputs). File: one per (step, rank), DumpFileName().
//
// `__metadata__` (string values; JSON text where structured):
//   format         "crashreplay.step_dump/1"
//   capture        the capture path; step, rank, mode ("prefill"/"decode")
//   request_ids    JSON array, the batch rows in order (row r of "logits")
//   config         JSON object of every toggle as replayed
//   start          how the step's state was rebuilt (see replay_session.h)
//   outcome        reproduced | diverged | failed; detail: the report's line
//   complete       "true" when the step ran to its last kernel
//   kernel_order   JSON array: every kernel of the step that ran, in order
//   kernels        JSON array: the dumped kernels, in order
//   digests        JSON object: dumped kernel -> XXH3-128 of its output
//                  bytes (the replay report's digest; hex)
//   fault, fault_kernel, fault_message  when a check fired: the signature,
//                  the label of the kernel whose check fired (its outputs
//                  are dumped as they were when it stopped), the message
// When the step faults, the file holds the kernels that ran up to and
// including the faulting one; when an earlier step failed while rebuilding
// the state, or the memory plan failed, no kernel of the step ran and the
// file holds no tensor, only the metadata saying why.
//
// Deterministic: the same replay gives the same bytes (no timings or thread
// counts in the file). Not thread-safe; one StepDump per replay.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "crashreplay/formats/safetensors_writer.h"
#include "crashreplay/replay/session/replay_session.h"

namespace crashreplay::replay {

class KernelPatterns {
 public:
  // Comma-separated globs; "" selects every kernel. InvalidArgument for an
  // empty pattern between commas.
  static absl::StatusOr<KernelPatterns> Parse(std::string_view text);
  bool Matches(std::string_view label) const;
  // InvalidArgument naming every pattern that matches none of `labels`, with
  // the naming rule and some of the labels, for a usage error.
  absl::Status CheckAgainst(const std::vector<std::string>& labels) const;
  const std::vector<std::string>& patterns() const { return patterns_; }

 private:
  std::vector<std::string> patterns_;  // empty: everything
};

// "step<N>.rank<R>.safetensors".
std::string DumpFileName(int64_t step, int rank);

struct DumpContext {
  std::string capture;
  int64_t step = -1;
  int rank = 0;
  std::vector<std::pair<std::string, std::string>> config;
  std::string start;  // "re-executed", "snapshot of step N", ...
};

class StepDump : public KernelObserver {
 public:
  explicit StepDump(KernelPatterns patterns) : patterns_(std::move(patterns)) {}
  void AfterKernel(const StepProgram& program, size_t index) override;

  size_t num_tensors() const { return writer_.num_tensors(); }
  const std::vector<std::string>& dumped_kernels() const { return dumped_; }

  // Sets the metadata from the replay's context and report, then writes the
  // file atomically. An error names the path.
  absl::Status Write(const std::string& path, const DumpContext& ctx, const ReplayReport& report);

 private:
  KernelPatterns patterns_;
  SafetensorsWriter writer_;
  absl::Status status_;
  std::vector<std::string> ran_;     // every kernel seen, in order
  std::vector<std::string> dumped_;  // the selected ones
  std::vector<std::pair<std::string, std::string>> digests_;
  std::vector<int64_t> request_ids_;
  std::string mode_;
  std::string fault_kernel_;
  bool complete_ = false;
};

}  // namespace crashreplay::replay
