// The bisection driver: from a good and a bad configuration to the culprit
// change, the first bad kernel and the command that reproduces them.
//
// RunBisect:
//  1. judges the good and the bad configuration (in parallel); the bad one's
//     failure becomes the TARGET signature. A bad configuration that passes
//     or a good one that fails is run again (Scheduler::Confirm) before the
//     verdict: runs that disagree end the search as kFlaky; else
//     kNotReproducible (the bad one does not fail) or kGoodFails.
//  2. isolates a 1-minimal culprit among their differences (dd.h), keeping
//     the target fixed, and confirms the facts it rests on with more runs.
//     The culprit is claimed (kCulpritFound) only when the search met no
//     configuration whose runs disagree; otherwise it is kFlaky with the
//     flaky configurations listed and the culprit as a suspect, or
//     kInconclusive when decisive trials could not be judged.
//  3. narrows each other finding (a failure with another signature) to its
//     own 1-minimal culprit with a search of its own, within a trial budget.
//  4. optionally: threshold search on a numeric toggle, first failing step.
//  5. compares the culprit's kernel table with the reference's (the good
//     configuration, or options.reference), when the trials produced them,
//     for the first bad kernel.
//  6. writes <workdir>/culprit.toml (good + culprit) and the reproduce command.
// It never assumes what the trials run: everything goes through the
// Scheduler's TrialRunner. Interruption and aborts return what is known.
// Not thread-safe; one call drives one search.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "crashreplay/bisect/first_step.h"
#include "crashreplay/bisect/judge.h"
#include "crashreplay/bisect/kernel_table.h"
#include "crashreplay/bisect/threshold.h"

namespace crashreplay::bisect {

struct BisectOptions {
  Config good;
  Config bad;
  std::string good_label = "good";  // file names, for messages
  std::string bad_label = "bad";
  std::optional<std::string> threshold_toggle;
  double threshold_precision = 0;   // 0: 1/1000 of the range
  std::optional<std::pair<int64_t, int64_t>> step_range;  // first failing step search
  StepSearchMode step_mode = StepSearchMode::kBinary;
  std::string workdir;              // culprit.toml goes here
  // Configuration whose kernel table is the reference for the first bad
  // kernel (e.g. the reference backend); default: the good configuration.
  std::optional<Config> reference;
  Tolerance tolerance;
  bool narrow_others = true;        // give each other finding its own search
  int max_others = 4;               // how many other findings get one
  int other_budget = 0;             // trials per other finding; 0: 4*ceil(log2(m+1)) + 8
};

enum class BisectStatus {
  kCulpritFound,
  kNotReproducible,  // the bad configuration does not fail (exit 4)
  kGoodFails,        // the good configuration fails too (exit 5)
  kFlaky,            // runs of one configuration disagreed: no culprit claimed (exit 6)
  kInconclusive,     // decisive trials could not be judged (skipped): no culprit claimed (exit 6)
  kInterrupted,      // SIGINT (exit 130)
  kAborted,          // a trial aborted the search (exit 1)
};
std::string_view BisectStatusName(BisectStatus s);

struct BisectReport {
  BisectStatus status = BisectStatus::kAborted;
  std::string message;                    // one line: what happened / what to do next
  std::string subject;                    // capture or command
  Config good, bad;
  TrialResult good_result, bad_result;
  FailureSignature target_signature;
  std::vector<Change> changes;            // all differences, in name order
  ChangeSet culprit;                      // indices into changes (set only for kCulpritFound)
  bool culprit_minimal = false;
  ChangeSet suspect;                      // kFlaky/kInconclusive: what the search isolated, unclaimed
  std::string candidates;                 // last candidate set (when stopped early)
  std::vector<OtherFinding> other_findings;
  std::vector<FlakyConfig> flaky;         // configurations whose runs disagreed
  int confirm = 0;                        // extra runs per confirmed configuration
  std::optional<ThresholdResult> threshold;
  std::optional<StepSearchResult> first_step;
  std::optional<KernelFinding> first_bad_kernel;
  std::vector<KernelRow> reference_kernels;  // good (or --reference) configuration's table
  std::vector<KernelRow> culprit_kernels;    // culprit configuration's table
  Tolerance tolerance;
  std::string culprit_config_path;        // <workdir>/culprit.toml
  std::string reproduce;                  // the one command
  int trials = 0;                         // configurations judged
  int runs = 0;                           // processes started (repeats included)
  int jobs = 1;
  int repeat = 1;
  double seconds = 0;
  std::vector<HistoryEntry> history;
};

BisectReport RunBisect(Scheduler& scheduler, const BisectOptions& options, Progress* progress);

}  // namespace crashreplay::bisect
