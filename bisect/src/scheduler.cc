#include "crashreplay/bisect/scheduler.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace crashreplay::bisect {

std::vector<std::string> ParseGpuList(const std::string& list) {
  std::vector<std::string> out;
  for (absl::string_view part : absl::StrSplit(list, ';', absl::SkipWhitespace())) {
    std::string p(absl::StripAsciiWhitespace(part));
    // "0,1,2" means three workers with one GPU each; "0,1;2,3" two workers with two.
    if (list.find(';') == std::string::npos) {
      for (absl::string_view g : absl::StrSplit(p, ',', absl::SkipWhitespace())) {
        out.emplace_back(absl::StripAsciiWhitespace(g));
      }
    } else {
      out.push_back(p);
    }
  }
  return out;
}

std::string TrialCache::Key(const std::string& subject, const Config& config, std::optional<int64_t> step) {
  return absl::StrCat(subject, "\n", step ? absl::StrCat("step ", *step) : std::string("step -"), "\n",
                      FormatConfig(config));
}

std::optional<TrialResult> TrialCache::Find(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

void TrialCache::Insert(const std::string& key, const TrialResult& result) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_[key] = result;
}

size_t TrialCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

Scheduler::Scheduler(TrialRunner& runner, SchedulerOptions options, Progress* progress)
    : runner_(runner), options_(std::move(options)), progress_(progress) {
  options_.jobs = std::max(1, options_.jobs);
  options_.repeat = std::max(1, options_.repeat);
}

int Scheduler::parallelism() const {
  if (options_.gpus.empty()) return options_.jobs;
  return std::min<int>(options_.jobs, static_cast<int>(options_.gpus.size()));
}

void Scheduler::set_phase(const std::string& phase) {
  phase_ = phase;
  if (progress_ != nullptr) progress_->SetPhase(phase);
}

std::string Scheduler::Describe(const Config& config) const {
  if (!describe_base_) return FormatConfig(config);
  std::vector<std::string> parts;
  for (const auto& [k, v] : config) {
    auto it = describe_base_->find(k);
    if (it == describe_base_->end() || !(it->second == v)) parts.push_back(absl::StrCat(k, "=", v.ToDisplay()));
  }
  for (const auto& [k, v] : *describe_base_) {
    if (config.find(k) == config.end()) parts.push_back(absl::StrCat("-", k));
  }
  if (parts.empty()) return "{base}";
  return absl::StrCat("{", absl::StrJoin(parts, ", "), "}");
}

TrialResult Scheduler::RunOne(const Config& config, std::optional<int64_t> step) {
  return RunBatch({config}, step).front();
}

std::vector<TrialResult> Scheduler::RunBatch(const std::vector<Config>& configs, std::optional<int64_t> step) {
  std::vector<std::optional<int64_t>> steps(configs.size(), step);
  return RunRequests(configs, steps);
}

std::vector<TrialResult> Scheduler::RunRequests(const std::vector<Config>& configs,
                                                const std::vector<std::optional<int64_t>>& steps) {
  const std::string subject = runner_.SubjectId();
  std::vector<std::string> keys;
  std::vector<std::optional<TrialResult>> results(configs.size());
  // Unique uncached configurations, in first-request order.
  std::vector<size_t> todo;
  std::map<std::string, size_t> first_of_key;
  for (size_t i = 0; i < configs.size(); ++i) {
    keys.push_back(TrialCache::Key(subject, configs[i], steps[i]));
    if (auto hit = cache_.Find(keys[i])) {
      results[i] = *hit;
      continue;
    }
    if (first_of_key.emplace(keys[i], i).second) todo.push_back(i);
  }
  struct Run {
    size_t config;
    TrialResult result;
    bool done = false;
  };
  std::vector<Run> runs;
  for (size_t i : todo)
    for (int k = 0; k < options_.repeat; ++k) runs.push_back({i, {}, false});

  std::atomic<size_t> next{0};
  std::mutex mu;
  auto worker = [&](int w) {
    const std::string gpus = options_.gpus.empty() ? "" : options_.gpus[static_cast<size_t>(w)];
    while (true) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (aborted_ || interrupted()) return;
      }
      const size_t r = next.fetch_add(1);
      if (r >= runs.size()) return;
      TrialRequest req;
      req.config = configs[runs[r].config];
      req.step = steps[runs[r].config];
      req.gpus = gpus;
      req.index = next_index_.fetch_add(1);
      const std::string what = Describe(req.config);
      if (progress_ != nullptr) progress_->TrialStarted(req.index, what);
      launches_.fetch_add(1);
      TrialResult res = runner_.Run(req, options_.interrupt);
      if (progress_ != nullptr) {
        std::string verdict(VerdictName(res.verdict));
        if (res.verdict == Verdict::kBad) verdict += " [" + DescribeSignature(res.signature) + "]";
        if (res.verdict == Verdict::kAbort && !res.note.empty()) verdict += " (" + res.note + ")";
        progress_->TrialFinished(req.index, what, verdict);
      }
      std::lock_guard<std::mutex> lock(mu);
      if (res.verdict == Verdict::kAbort && !aborted_ && !interrupted()) {
        aborted_ = true;
        abort_reason_ = absl::StrCat("trial ", req.index, " (", what, "): ", res.note.empty() ? "aborted" : res.note);
      }
      runs[r].result = std::move(res);
      runs[r].done = true;
    }
  };
  const int workers = std::min<int>(parallelism(), static_cast<int>(runs.size()));
  if (workers == 1) {
    worker(0);
  } else if (workers > 1) {
    std::vector<std::thread> threads;
    for (int w = 0; w < workers; ++w) threads.emplace_back(worker, w);
    for (auto& t : threads) t.join();
  }

  // Combine repeats, cache complete verdicts, record history in request order.
  for (size_t i : todo) {
    std::vector<TrialResult> mine;
    bool complete = true;
    for (const Run& r : runs) {
      if (r.config != i) continue;
      if (!r.done) complete = false;
      else mine.push_back(r.result);
    }
    TrialResult combined;
    if (!complete || mine.empty()) {
      combined.verdict = Verdict::kAbort;
      combined.note = interrupted() ? "interrupted" : "not run: the search was aborted";
    } else {
      combined = CombineRepeats(mine);
    }
    if (combined.verdict != Verdict::kAbort) cache_.Insert(keys[i], combined);
    results[i] = combined;
    HistoryEntry h;
    h.id = static_cast<int>(history_.size()) + 1;
    h.phase = phase_;
    h.config = configs[i];
    h.step = steps[i];
    h.result = combined;
    history_.push_back(std::move(h));
  }
  std::vector<TrialResult> out;
  for (size_t i = 0; i < configs.size(); ++i) {
    if (!results[i]) results[i] = *results[first_of_key.at(keys[i])];
    out.push_back(*results[i]);
  }
  return out;
}

}  // namespace crashreplay::bisect
