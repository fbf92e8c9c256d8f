#include "crashreplay/bisect/scheduler.h"

#include <algorithm>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "crashreplay/bisect/delta.h"

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
  return it->second.combined;
}

TrialCache::Entry* TrialCache::Get(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  return it == entries_.end() ? nullptr : &it->second;
}

void TrialCache::Insert(const std::string& key, Entry entry) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_[key] = std::move(entry);
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
  // Bounded: a 10,000-change configuration is one short line.
  if (!describe_base_) return SummarizeConfig(Config{}, config, 100);
  const std::string d = SummarizeConfig(*describe_base_, config, 100);
  return d == "(good configuration)" ? "{base}" : absl::StrCat("{", d, "}");
}

TrialResult Scheduler::RunOne(const Config& config, std::optional<int64_t> step) {
  return RunBatch({config}, step).front();
}

std::vector<TrialResult> Scheduler::RunBatch(const std::vector<Config>& configs, std::optional<int64_t> step) {
  std::vector<std::optional<int64_t>> steps(configs.size(), step);
  return RunRequests(configs, steps);
}

std::vector<std::vector<TrialResult>> Scheduler::Execute(const std::vector<Config>& configs,
                                                         const std::vector<std::optional<int64_t>>& steps,
                                                         const std::vector<Job>& jobs, const std::string& tag) {
  struct Run {
    size_t request;
    TrialResult result;
    bool done = false;
  };
  std::vector<Run> runs;
  for (const Job& j : jobs)
    for (int k = 0; k < j.runs; ++k) runs.push_back({j.request, {}, false});

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
      req.config = configs[runs[r].request];
      req.step = steps[runs[r].request];
      req.gpus = gpus;
      req.index = next_index_.fetch_add(1);
      const std::string what = tag.empty() ? Describe(req.config) : absl::StrCat(Describe(req.config), " ", tag);
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
  std::vector<std::vector<TrialResult>> out(configs.size());
  std::vector<bool> complete(configs.size(), true);
  for (Run& r : runs) {
    if (!r.done)
      complete[r.request] = false;
    else
      out[r.request].push_back(std::move(r.result));
  }
  for (size_t i = 0; i < out.size(); ++i) {
    if (!complete[i]) {
      TrialResult a;
      a.verdict = Verdict::kAbort;
      a.note = interrupted() ? "interrupted" : "not run: the search was aborted";
      out[i] = {a};
    }
  }
  return out;
}

namespace {

// Keeps the first run's output; later runs only need their verdicts.
void Slim(TrialResult& r) {
  r.stderr_tail.clear();
  r.stderr_tail.shrink_to_fit();
}

}  // namespace

std::vector<TrialResult> Scheduler::RunRequests(const std::vector<Config>& configs,
                                                const std::vector<std::optional<int64_t>>& steps) {
  const std::string subject = runner_.SubjectId();
  std::vector<std::string> keys;
  std::vector<std::optional<TrialResult>> results(configs.size());
  // Unique uncached configurations, in first-request order.
  std::vector<Job> jobs;
  std::map<std::string, size_t> first_of_key;
  for (size_t i = 0; i < configs.size(); ++i) {
    keys.push_back(TrialCache::Key(subject, configs[i], steps[i]));
    if (auto hit = cache_.Find(keys[i])) {
      results[i] = *hit;
      continue;
    }
    if (first_of_key.emplace(keys[i], i).second) jobs.push_back({i, options_.repeat});
  }
  std::vector<std::vector<TrialResult>> done = Execute(configs, steps, jobs, "");

  // Combine repeats, cache complete verdicts, record history in request order.
  for (const Job& j : jobs) {
    const size_t i = j.request;
    std::vector<TrialResult>& mine = done[i];
    const TrialResult combined = CombineRepeats(mine);
    results[i] = combined;
    HistoryEntry h;
    h.id = static_cast<int>(history_.size()) + 1;
    h.phase = phase_;
    h.config = configs[i];
    h.step = steps[i];
    h.result = combined;
    if (combined.verdict != Verdict::kAbort) {
      for (size_t k = 1; k < mine.size(); ++k) Slim(mine[k]);
      cache_.Insert(keys[i], TrialCache::Entry{std::move(mine), combined, history_.size()});
    }
    history_.push_back(std::move(h));
  }
  std::vector<TrialResult> out;
  for (size_t i = 0; i < configs.size(); ++i) {
    if (!results[i]) results[i] = *results[first_of_key.at(keys[i])];
    out.push_back(*results[i]);
  }
  return out;
}

std::vector<TrialResult> Scheduler::Confirm(const std::vector<Config>& configs, std::optional<int64_t> step) {
  // First judge any configuration never run.
  std::vector<TrialResult> out = RunBatch(configs, step);
  if (stopped()) return out;
  const std::string subject = runner_.SubjectId();
  const int want = options_.repeat + options_.confirm;
  std::vector<std::optional<int64_t>> steps(configs.size(), step);
  std::vector<std::string> keys;
  std::vector<Job> jobs;
  std::set<std::string> seen;
  for (size_t i = 0; i < configs.size(); ++i) {
    keys.push_back(TrialCache::Key(subject, configs[i], step));
    TrialCache::Entry* e = cache_.Get(keys[i]);
    if (e == nullptr || !seen.insert(keys[i]).second) continue;
    const int have = static_cast<int>(e->runs.size());
    if (have < want) jobs.push_back({i, want - have});
  }
  if (jobs.empty()) return out;
  std::vector<std::vector<TrialResult>> done = Execute(configs, steps, jobs, "(confirming)");
  for (const Job& j : jobs) {
    std::vector<TrialResult>& more = done[j.request];
    if (more.size() == 1 && more[0].verdict == Verdict::kAbort) continue;  // stopped: keep what was known
    TrialCache::Entry* e = cache_.Get(keys[j.request]);
    for (TrialResult& r : more) {
      Slim(r);
      e->runs.push_back(std::move(r));
    }
    TrialResult combined = CombineRepeats(e->runs);
    e->combined = combined;
    history_[e->history].result = combined;
  }
  for (size_t i = 0; i < configs.size(); ++i) {
    if (auto hit = cache_.Find(keys[i])) out[i] = *hit;
  }
  return out;
}

}  // namespace crashreplay::bisect
