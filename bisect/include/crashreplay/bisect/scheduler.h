// The trial scheduler: cache, parallel workers, GPU pool, repeats.
//
// RunBatch judges a list of configurations: each one not already in the
// cache (keyed by the runner's subject, i.e. the capture or command, plus the
// canonical configuration text and step) runs `repeat` times, at most `jobs`
// processes at once, and the runs are combined (CombineRepeats: disagreement
// is flaky). No configuration is judged twice: duplicates inside a batch and
// across batches are served from the cache. Confirm is the one exception, on
// purpose: it runs a cached configuration again until it has `repeat +
// confirm` runs and combines them all, so a search can check the results it
// rests on (a configuration that fails with probability p passes all of N
// runs with probability (1-p)^N). With a GPU pool, worker w owns
// gpus[w] for its whole life and exports it as CUDA_VISIBLE_DEVICES, and the
// number of workers is at most the pool's size.
//
// An abort verdict or the interrupt flag stops launching: runs not yet
// started come back as abort, running ones are killed (process.h). Results
// are returned in request order, so a search's decisions do not depend on
// which worker finished first.
//
// Thread safety: one thread drives a Scheduler; it runs its own workers.
#pragma once

#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "crashreplay/bisect/progress.h"
#include "crashreplay/bisect/trial.h"

namespace crashreplay::bisect {

// Runs added by Confirm to each configuration a claim rests on. A
// configuration that fails half the time passes (or fails) all 1 + 6 runs
// with probability 1/128; measured over the flaky oracles of
// tests/bisect/flaky_test.cc (3000 searches at --repeat 1) no wrong culprit
// was claimed at 6, one at 5, 15 at 3.
inline constexpr int kDefaultConfirmRuns = 6;

struct SchedulerOptions {
  int jobs = 1;
  int repeat = 1;
  int confirm = kDefaultConfirmRuns;             // extra runs per confirmed configuration
  std::vector<std::string> gpus;                 // CUDA_VISIBLE_DEVICES values, one per worker
  const std::atomic<bool>* interrupt = nullptr;  // set by a SIGINT handler
};

// Parses "0,1,2" (or "0,1;2,3" for two GPUs per worker) into pool entries.
std::vector<std::string> ParseGpuList(const std::string& list);

struct HistoryEntry {
  int id = 0;                        // evaluation number, in decision order
  std::string phase;                 // "check", "isolate", "threshold", ...
  Config config;
  std::optional<int64_t> step;
  TrialResult result;
};

class TrialCache {
 public:
  struct Entry {
    std::vector<TrialResult> runs;  // every run (output kept for the first only)
    TrialResult combined;
    size_t history = 0;             // index of its HistoryEntry
  };
  static std::string Key(const std::string& subject, const Config& config, std::optional<int64_t> step);
  std::optional<TrialResult> Find(const std::string& key) const;
  Entry* Get(const std::string& key);
  void Insert(const std::string& key, Entry entry);
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, Entry> entries_;
};

class Scheduler {
 public:
  Scheduler(TrialRunner& runner, SchedulerOptions options, Progress* progress = nullptr);

  std::vector<TrialResult> RunBatch(const std::vector<Config>& configs, std::optional<int64_t> step = {});
  // Like RunBatch with one step per configuration (steps.size() == configs.size()).
  std::vector<TrialResult> RunRequests(const std::vector<Config>& configs,
                                       const std::vector<std::optional<int64_t>>& steps);
  TrialResult RunOne(const Config& config, std::optional<int64_t> step = {});
  // Runs each configuration (judged or not) until it has repeat + confirm
  // runs, and returns the results combined over all of them.
  std::vector<TrialResult> Confirm(const std::vector<Config>& configs, std::optional<int64_t> step = {});

  void set_phase(const std::string& phase);
  // A short description of configurations for progress lines (differences
  // from this base); optional.
  void set_describe_base(const Config& base) { describe_base_ = base; }

  int parallelism() const;
  int repeat() const { return options_.repeat; }
  int confirm() const { return options_.confirm; }
  int evaluations() const { return static_cast<int>(history_.size()); }  // distinct configs judged
  int launches() const { return launches_.load(); }                      // processes started
  const std::vector<HistoryEntry>& history() const { return history_; }
  bool interrupted() const { return options_.interrupt != nullptr && options_.interrupt->load(); }
  bool aborted() const { return aborted_; }
  const std::string& abort_reason() const { return abort_reason_; }
  bool stopped() const { return interrupted() || aborted(); }
  TrialRunner& runner() { return runner_; }
  std::string Describe(const Config& config) const;

 private:
  struct Job {
    size_t request;   // index into the caller's configs
    int runs;         // runs to start
  };
  // Starts `jobs`' runs (at most parallelism() at once) and returns each
  // request's new runs, in request order. Empty for a request not run.
  std::vector<std::vector<TrialResult>> Execute(const std::vector<Config>& configs,
                                                const std::vector<std::optional<int64_t>>& steps,
                                                const std::vector<Job>& jobs, const std::string& tag);

  TrialRunner& runner_;
  SchedulerOptions options_;
  Progress* progress_;
  TrialCache cache_;
  std::vector<HistoryEntry> history_;
  std::atomic<int> launches_{0};
  std::atomic<int> next_index_{1};
  std::string phase_ = "search";
  std::optional<Config> describe_base_;
  bool aborted_ = false;
  std::string abort_reason_;
};

}  // namespace crashreplay::bisect
