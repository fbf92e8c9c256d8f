#include "crashreplay/bisect/judge.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace crashreplay::bisect {

Outcome Judge::Classify(const Config& config, const TrialResult& r, std::optional<int64_t> step) {
  switch (r.verdict) {
    case Verdict::kGood:
      return Outcome::kPass;
    case Verdict::kBad:
      if (SameBug(r.signature, target_)) return Outcome::kFail;
      {
        const bool known = std::any_of(findings_.begin(), findings_.end(), [&](const OtherFinding& f) {
          return f.config == config && f.step == step && SameBug(f.signature, r.signature);
        });
        if (!known) {
          const std::vector<Change> diff = Differences(good_, config);
          ChangeSet all;
          for (size_t i = 0; i < diff.size(); ++i) all.push_back(i);
          findings_.push_back({config, DescribeChanges(diff, all), r.signature, step});
        }
      }
      return Outcome::kUnresolved;
    default:
      return Outcome::kUnresolved;
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

void ConfigOracle::OnCandidates(const ChangeSet& pass, const ChangeSet& fail) {
  if (progress_ == nullptr) return;
  ChangeSet diff;
  std::set_difference(fail.begin(), fail.end(), pass.begin(), pass.end(), std::back_inserter(diff));
  std::string text = absl::StrCat(diff.size(), " of ", changes_.size(), " changes");
  if (diff.size() <= 8) absl::StrAppend(&text, " {", DescribeChanges(changes_, diff), "}");
  progress_->SetCandidates(text);
}

}  // namespace crashreplay::bisect
