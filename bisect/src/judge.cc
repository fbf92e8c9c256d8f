#include "crashreplay/bisect/judge.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace crashreplay::bisect {

std::string_view FindingStatusName(FindingStatus s) {
  switch (s) {
    case FindingStatus::kListed: return "listed";
    case FindingStatus::kNarrowed: return "narrowed";
    case FindingStatus::kFlaky: return "flaky";
    case FindingStatus::kInconclusive: return "inconclusive";
    case FindingStatus::kBudget: return "budget_exhausted";
    case FindingStatus::kStopped: return "stopped";
  }
  return "unknown";
}

Outcome Judge::Classify(const Config& config, const TrialResult& r, std::optional<int64_t> step) {
  switch (r.verdict) {
    case Verdict::kGood: return Outcome::kPass;
    case Verdict::kBad: {
      if (SameBug(r.signature, target_)) return Outcome::kFail;
      const size_t count = Differences(good_, config).size();
      auto it = std::find_if(findings_.begin(), findings_.end(), [&](const OtherFinding& f) {
        return SameBug(f.signature, r.signature) && f.step == step;
      });
      if (it == findings_.end()) {
        OtherFinding f;
        f.signature = r.signature;
        f.config = config;
        f.changes = SummarizeConfig(good_, config, 400);
        f.change_count = count;
        f.configurations = 1;
        f.step = step;
        findings_.push_back(std::move(f));
      } else if (!(it->config == config)) {
        ++it->configurations;
        if (count < it->change_count) {  // keep the smallest: its own search starts there
          it->config = config;
          it->changes = SummarizeConfig(good_, config, 400);
          it->change_count = count;
          it->signature = r.signature;
        }
      }
      return Outcome::kOther;
    }
    case Verdict::kFlaky: {
      if (r.bad_runs > 0 && SameBug(r.signature, target_)) target_flaky_ = true;
      auto it = std::find_if(flaky_.begin(), flaky_.end(),
                             [&](const FlakyConfig& f) { return f.config == config && f.step == step; });
      if (it == flaky_.end())
        flaky_.push_back(FlakyConfig{config, SummarizeConfig(good_, config, 400), step, r});
      else
        it->result = r;
      return Outcome::kUnresolved;
    }
    default: return Outcome::kUnresolved;
  }
}

std::vector<Outcome> ConfigOracle::Test(const std::vector<ChangeSet>& sets) {
  std::vector<Config> configs;
  for (const ChangeSet& s : sets) configs.push_back(ApplyChanges(good_, changes_, s));
  const std::vector<TrialResult> results = scheduler_.RunBatch(configs);
  std::vector<Outcome> out;
  for (size_t i = 0; i < sets.size(); ++i) out.push_back(judge_.Classify(configs[i], results[i]));
  return out;
}

std::vector<Outcome> ConfigOracle::Confirm(const std::vector<ChangeSet>& sets) {
  std::vector<Config> configs;
  for (const ChangeSet& s : sets) configs.push_back(ApplyChanges(good_, changes_, s));
  const std::vector<TrialResult> results = scheduler_.Confirm(configs);
  std::vector<Outcome> out;
  for (size_t i = 0; i < sets.size(); ++i) out.push_back(judge_.Classify(configs[i], results[i]));
  return out;
}

void ConfigOracle::OnCandidates(const ChangeSet& needed, const ChangeSet& searching) {
  last_needed_ = needed;
  last_searching_ = searching;
  if (progress_ == nullptr) return;
  std::string text;
  if (!needed.empty()) absl::StrAppend(&text, "needed {", SummarizeChanges(changes_, needed, 60), "}");
  if (!searching.empty()) {
    absl::StrAppend(&text, text.empty() ? "" : ", ", "searching ", searching.size(), " of ", changes_.size());
  }
  progress_->SetCandidates(text);
}

}  // namespace crashreplay::bisect
