// `crashreplay shrink`: the smallest capture whose replay still fails the
// same way, with nothing of the user's prompts in it (issue 48).
//
// Starting from a capture whose replay fails (or diverges), Shrink runs
// delta debugging (bisect/dd.h: 1-minimal) over the capture itself, stage by
// stage, each candidate written as a capture of its own and judged by a
// replay in its own process (`crashreplay replay CANDIDATE --json`, with
// the user's --config/--set/--engine words): a candidate is kept when it
// fails with the target signature (class, stage, kernel, check: bisect's
// SameBug). The stages, in order:
//   requests   the requests of the failing step, and of the earlier steps
//              only those the kept requests are (steps left empty are
//              dropped, the rest renumbered from 0);
//   history    the earlier steps the kept requests ran in: none at all
//              first, else delta debugging over them (a dropped step's KV
//              writes are absent: the exact engine reads zeros there);
//   prompt     each kept request's prompt cut from its start (positions,
//              lengths and its row of token slots moved down with it), to
//              the shortest that still fails: the whole cut but one token
//              first, then by halves; rows of pages or blocks are not cut
//              (part of a page cannot go);
//   layers     when the failure names layer k (a kernel or boundary
//              L<k>.*), a checkpoint slice of layers 0..k written under
//              OUT/model (config.json's num_hidden_layers and its per-layer
//              lists cut to k + 1), kept when the failure survives it;
//   weights    the same tensors (names, dtypes, shapes, the quantization's
//              scales as its quantizer makes them) with values drawn from
//              the seed by make-model --like the checkpoint or its slice,
//              kept when the failure survives them: OUT then holds no
//              model, only model-config/ (its config files) and the
//              make-model command that draws it again (same bytes on any
//              host); else shrink.json `needs.weights` says the failure
//              needs the checkpoint's values (before/after: the tensors
//              whose values the repro needs);
//   token_ids  every token id replaced by one drawn from a fixed seed over
//              the vocabulary, the original kept only at the occurrences
//              the failure needs (dd over the occurrences; listed in
//              shrink.json).
//
// What leaves the user's capture (anonymize, on by default): the shrunk
// capture holds no request id (renamed r0, r1, ...; the failure record's
// message too), no sampled output, no fingerprint or digest (of the batch
// the user ran), no snapshot, no session id, host name or backtrace, no
// path of the original (the checkpoint path is "model", OUT's own, or, when
// the failure needs the real weights, the original's, listed in shrink.json
// `needs`), and no engine setting the replay does not read whose value
// looks like a path; token ids as above.
//
// A target that is a departure from the recording (the exact engine's
// fingerprints or tokens against the recorded ones, no --engine) keeps the
// recorded fingerprints and tokens (`needs.recording`), a slice's only up
// to its last layer, and skips the history and token_ids stages: without
// them a step departs from the recording under any configuration.
//
// Errors: FailedPrecondition when the capture's replay does not fail
// ("nothing to shrink"); the replay's own errors (usage, data) as its
// message. A trial budget hit returns the smallest failing capture found so
// far, marked not minimal; so does the time budget. Trials run through
// bisect's scheduler (ShrinkOptions::jobs at once, repeats, confirmations,
// memory limits); Shrink itself is driven by one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "crashreplay/bisect/signature.h"

namespace crashreplay::tools {

struct ShrinkOptions {
  std::string capture;                   // capture file or session directory
  std::string out_dir;                   // created; its capture/, model/, README.md, shrink.json
  std::string self;                      // the crashreplay executable the trials run
  std::vector<std::string> replay_args;  // --config F, --set k=v, --engine ... for every replay
  std::string model_dir;                 // --model: the checkpoint (default: the recorded path)
  int max_trials = 400;
  std::optional<double> time_budget_s;  // no trial starts after it (the smallest failing capture is kept)
  std::optional<double> trial_timeout_s;
  std::optional<uint64_t> memory_limit_bytes;  // address-space limit per trial
  // bisect's scheduler: trials at once (dd's batches: subsets, complements),
  // runs per trial (disagreement: flaky, counted as unresolved), extra runs
  // of the shrunk capture at the end, GPU pool (one CUDA_VISIBLE_DEVICES
  // value per worker).
  int jobs = 1;
  int repeat = 1;
  int confirm = 6;
  std::vector<std::string> gpus;
  bool anonymize = true;
  uint64_t seed = 0x5eed;  // the replacement token ids' draw
  std::function<void(const std::string&)> progress;  // one line per trial and stage
};

struct ShrinkStage {
  std::string stage;  // requests | history | prompt | layers | weights | token_ids
  int64_t before = 0, after = 0;
  int trials = 0;
  std::string note;
};

struct ShrinkResult {
  bisect::FailureSignature target;
  std::vector<ShrinkStage> stages;
  int trials = 0;
  bool minimal = true;  // every stage ran to its end within the budget
  // The shrunk capture replayed repeat + confirm times: how many failed the
  // same way (all of them, or the README says it is flaky).
  int confirm_runs = 0, confirm_failed = 0;
  uint64_t bytes_before = 0, bytes_after = 0;
  std::string capture_dir;     // OUT/capture
  std::string model_dir;       // OUT/model (a slice or the drawn model), or "" for the original checkpoint
  // Random weights: OUT/model-config (the config files) and the make-model
  // command that draws OUT/model from them and the seed, run from OUT. The
  // drawn model is left in OUT/model for the caller (export-kernel) to read;
  // `crashreplay shrink` removes it: OUT ships the recipe, not the model.
  std::string model_config_dir;
  std::string regenerate_command;
  std::string replay_command;  // the one command that fails, run from OUT
  nlohmann::json needs;        // what of the original the failure needed
  nlohmann::json ToJson() const;
};

absl::StatusOr<ShrinkResult> Shrink(const ShrinkOptions& options);

}  // namespace crashreplay::tools
