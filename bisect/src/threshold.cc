#include "crashreplay/bisect/threshold.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace crashreplay::bisect {
namespace {

// 37 for an integer toggle (never 37.0 or 1e+06), else the shortest form.
std::string Num(double v, bool integer) {
  return integer ? absl::StrCat(static_cast<int64_t>(std::llround(v))) : absl::StrFormat("%.10g", v);
}

ConfigValue ValueOf(double v, bool integer) {
  return integer ? ConfigValue::Int(static_cast<int64_t>(std::llround(v))) : ConfigValue::Float(v);
}

}  // namespace

absl::StatusOr<ThresholdResult> ThresholdSearch(Scheduler& scheduler, const Config& base, const ThresholdOptions& o) {
  ThresholdResult r;
  r.toggle = o.toggle;
  r.integer = o.integer;
  if (o.pass_value == o.fail_value) {
    return absl::InvalidArgumentError(
        absl::StrCat("threshold on '", o.toggle, "': the good and bad values are equal; nothing to search"));
  }
  double precision = o.precision > 0 ? o.precision : std::fabs(o.fail_value - o.pass_value) / 1000.0;
  if (o.integer) precision = std::max(1.0, std::floor(precision));
  auto with = [&](double v) {
    Config c = base;
    c[o.toggle] = ValueOf(v, o.integer);
    return c;
  };
  double pass = o.pass_value, fail = o.fail_value;
  {
    const std::vector<TrialResult> ends = scheduler.RunBatch({with(pass), with(fail)});
    r.probes += 2;
    if (scheduler.stopped()) return absl::CancelledError("threshold search stopped");
    if (ends[0].verdict != Verdict::kGood || ends[1].verdict != Verdict::kBad) {
      r.last_pass = pass;
      r.first_fail = fail;
      r.note = absl::StrFormat("no bracket: %s=%s is %s and %s=%s is %s", o.toggle, Num(pass, o.integer),
                               std::string(VerdictName(ends[0].verdict)), o.toggle, Num(fail, o.integer),
                               std::string(VerdictName(ends[1].verdict)));
      return r;
    }
    r.bracketed = true;
    r.fail_signature = ends[1].signature;
  }
  const int p = std::max(1, scheduler.parallelism());
  while (std::fabs(fail - pass) > precision) {
    std::vector<double> points;
    for (int i = 1; i <= p; ++i) {
      double v = pass + (fail - pass) * i / (p + 1);
      if (o.integer) v = std::round(v);
      if (v != pass && v != fail && (points.empty() || v != points.back())) points.push_back(v);
    }
    if (points.empty()) break;
    std::vector<Config> configs;
    for (double v : points) configs.push_back(with(v));
    const std::vector<TrialResult> res = scheduler.RunBatch(configs);
    r.probes += static_cast<int>(points.size());
    if (scheduler.stopped()) return absl::CancelledError("threshold search stopped");
    // Walk from the passing side: the boundary lies before the first failure.
    double new_pass = pass, new_fail = fail;
    bool unresolved = false;
    for (size_t i = 0; i < points.size(); ++i) {
      if (res[i].verdict == Verdict::kGood) {
        new_pass = points[i];
      } else if (res[i].verdict == Verdict::kBad) {
        new_fail = points[i];
        r.fail_signature = res[i].signature;
        break;
      } else {
        unresolved = true;
        r.note = absl::StrFormat("stopped at %s=%s: the trial was %s", o.toggle, Num(points[i], o.integer),
                                 std::string(VerdictName(res[i].verdict)));
        new_fail = fail;
        break;
      }
    }
    pass = new_pass;
    fail = new_fail;
    if (unresolved) break;
  }
  r.last_pass = pass;
  r.first_fail = fail;
  return r;
}

nlohmann::json ThresholdResultToJson(const ThresholdResult& r) {
  // An integer toggle's boundary is written as an integer (37, not 37.0).
  auto value = [&](double v) {
    return r.integer ? nlohmann::json(static_cast<int64_t>(std::llround(v))) : nlohmann::json(v);
  };
  nlohmann::json j = {{"toggle", r.toggle},
                      {"bracketed", r.bracketed},
                      {"last_pass", value(r.last_pass)},
                      {"first_fail", value(r.first_fail)},
                      {"probes", r.probes},
                      {"fail_signature", SignatureToJson(r.fail_signature)}};
  if (!r.note.empty()) j["note"] = r.note;
  return j;
}

std::string DescribeThreshold(const ThresholdResult& r) {
  if (!r.bracketed) return absl::StrCat("threshold on ", r.toggle, ": ", r.note);
  std::string s = absl::StrFormat("%s passes up to %s and fails from %s (%s)", r.toggle, Num(r.last_pass, r.integer),
                                  Num(r.first_fail, r.integer), DescribeSignature(r.fail_signature));
  if (!r.note.empty()) absl::StrAppend(&s, "; ", r.note);
  return s;
}

}  // namespace crashreplay::bisect
