#include "crashreplay/bisect/kernel_table.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace crashreplay::bisect {

std::string_view KernelFindingReasonName(KernelFinding::Reason r) {
  switch (r) {
    case KernelFinding::Reason::kNonFinite: return "non_finite";
    case KernelFinding::Reason::kOutOfTolerance: return "out_of_tolerance";
    case KernelFinding::Reason::kMissing: return "missing";
    case KernelFinding::Reason::kStructure: return "structure";
  }
  return "unknown";
}

std::optional<KernelFinding> FirstBadKernel(const std::vector<KernelRow>& reference, const std::vector<KernelRow>& test,
                                            const Tolerance& tol) {
  std::optional<size_t> first_digest_mismatch;
  const size_t common = std::min(reference.size(), test.size());
  for (size_t i = 0; i < common; ++i) {
    const KernelRow& ref = reference[i];
    const KernelRow& t = test[i];
    KernelFinding f;
    f.index = i;
    f.reference = ref;
    f.test = t;
    if (ref.name != t.name || ref.layer != t.layer) {
      f.reason = KernelFinding::Reason::kStructure;
      f.first_digest_mismatch = first_digest_mismatch.value_or(i);
      return f;
    }
    const bool same_bits = !ref.digest.empty() && ref.digest == t.digest;
    if (!same_bits && !first_digest_mismatch) first_digest_mismatch = i;
    f.first_digest_mismatch = first_digest_mismatch.value_or(i);
    if (same_bits) continue;
    // Non-finite where the reference is finite. A non-finite reference is
    // skipped deliberately: the reference defines right, and it is not.
    const int64_t ref_bad = ref.nan_count + ref.inf_count;
    const int64_t test_bad = t.nan_count + t.inf_count;
    if (test_bad > 0 && ref_bad == 0) {
      f.reason = KernelFinding::Reason::kNonFinite;
      f.error = INFINITY;
      return f;
    }
    if (ref_bad > 0) continue;
    const double atol = t.atol.value_or(ref.atol.value_or(tol.atol));
    const double rtol = t.rtol.value_or(ref.rtol.value_or(tol.rtol));
    const double error = t.max_err ? *t.max_err : std::fabs(t.max_abs - ref.max_abs);
    const double bound = atol + std::fabs(ref.max_abs) * rtol;
    if (!(error <= bound)) {  // written so a NaN error counts as out of tolerance
      f.reason = KernelFinding::Reason::kOutOfTolerance;
      f.error = error;
      f.bound = bound;
      return f;
    }
  }
  if (test.size() < reference.size()) {
    KernelFinding f;
    f.reason = KernelFinding::Reason::kMissing;
    f.index = test.size();
    f.reference = reference[test.size()];
    if (!test.empty()) f.test = test.back();
    f.first_digest_mismatch = first_digest_mismatch.value_or(test.size());
    return f;
  }
  return std::nullopt;
}

nlohmann::json KernelRowToJson(const KernelRow& r) {
  nlohmann::json j = {{"name", r.name},           {"layer", r.layer},         {"numel", r.numel},
                      {"nan_count", r.nan_count}, {"inf_count", r.inf_count}, {"digest", r.digest},
                      {"max_abs", r.max_abs}};
  if (r.max_err) j["max_err"] = *r.max_err;
  if (r.atol) j["atol"] = *r.atol;
  if (r.rtol) j["rtol"] = *r.rtol;
  return j;
}

absl::StatusOr<KernelRow> KernelRowFromJson(const nlohmann::json& j) {
  if (!j.is_object()) return absl::InvalidArgumentError("kernel row: expected a JSON object");
  KernelRow r;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string()) return absl::InvalidArgumentError("kernel row: missing string 'name'");
  r.name = name->get<std::string>();
  auto get_int = [&](const char* key, int64_t* out) -> absl::Status {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return absl::OkStatus();
    if (!it->is_number_integer()) {
      return absl::InvalidArgumentError(absl::StrCat("kernel row '", r.name, "': '", key, "' must be an integer"));
    }
    *out = it->get<int64_t>();
    return absl::OkStatus();
  };
  auto get_num = [&](const char* key) -> absl::StatusOr<std::optional<double>> {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return std::optional<double>();
    if (it->is_number()) return std::optional<double>(it->get<double>());
    // JSON has no NaN/Inf; engines write them as strings.
    if (it->is_string()) {
      const std::string s = it->get<std::string>();
      if (s == "nan" || s == "NaN") return std::optional<double>(NAN);
      if (s == "inf" || s == "Infinity") return std::optional<double>(INFINITY);
      if (s == "-inf" || s == "-Infinity") return std::optional<double>(-INFINITY);
    }
    return absl::InvalidArgumentError(absl::StrCat("kernel row '", r.name, "': '", key, "' must be a number"));
  };
  if (auto st = get_int("layer", &r.layer); !st.ok()) return st;
  if (auto st = get_int("numel", &r.numel); !st.ok()) return st;
  if (auto st = get_int("nan_count", &r.nan_count); !st.ok()) return st;
  if (auto st = get_int("inf_count", &r.inf_count); !st.ok()) return st;
  if (auto it = j.find("digest"); it != j.end() && it->is_string()) r.digest = it->get<std::string>();
  auto max_abs = get_num("max_abs");
  if (!max_abs.ok()) return max_abs.status();
  r.max_abs = max_abs->value_or(0.0);
  auto max_err = get_num("max_err");
  if (!max_err.ok()) return max_err.status();
  r.max_err = *max_err;
  auto atol = get_num("atol");
  if (!atol.ok()) return atol.status();
  r.atol = *atol;
  auto rtol = get_num("rtol");
  if (!rtol.ok()) return rtol.status();
  r.rtol = *rtol;
  return r;
}

absl::StatusOr<std::vector<KernelRow>> KernelRowsFromJson(const nlohmann::json& j) {
  if (!j.is_array()) return absl::InvalidArgumentError("kernels: expected a JSON array of rows");
  std::vector<KernelRow> rows;
  for (size_t i = 0; i < j.size(); ++i) {
    auto row = KernelRowFromJson(j[i]);
    if (!row.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("kernels[", i, "]: ", row.status().message()));
    }
    rows.push_back(*std::move(row));
  }
  return rows;
}

nlohmann::json KernelFindingToJson(const KernelFinding& f) {
  nlohmann::json j = {{"reason", std::string(KernelFindingReasonName(f.reason))},
                      {"index", f.index},
                      {"kernel", f.reason == KernelFinding::Reason::kMissing ? f.reference.name : f.test.name},
                      {"layer", f.reason == KernelFinding::Reason::kMissing ? f.reference.layer : f.test.layer},
                      {"reference", KernelRowToJson(f.reference)},
                      {"test", KernelRowToJson(f.test)},
                      {"first_digest_mismatch", f.first_digest_mismatch}};
  if (f.reason == KernelFinding::Reason::kOutOfTolerance) {
    j["error"] = f.error;
    j["bound"] = f.bound;
  }
  return j;
}

std::string DescribeKernelFinding(const KernelFinding& f) {
  const KernelRow& row = f.reason == KernelFinding::Reason::kMissing ? f.reference : f.test;
  std::string where = absl::StrCat("kernel #", f.index, " ", row.name);
  if (row.layer >= 0) absl::StrAppend(&where, " (layer ", row.layer, ")");
  switch (f.reason) {
    case KernelFinding::Reason::kNonFinite:
      return absl::StrFormat("%s goes non-finite: %d NaN, %d Inf in %d values (reference: none)", where,
                             f.test.nan_count, f.test.inf_count, f.test.numel);
    case KernelFinding::Reason::kOutOfTolerance:
      return absl::StrFormat("%s leaves the tolerance: error %.6g > bound %.6g (max|x| %.6g vs reference %.6g)", where,
                             f.error, f.bound, f.test.max_abs, f.reference.max_abs);
    case KernelFinding::Reason::kMissing:
      return absl::StrCat(where, " never ran: the failing run stopped before it (it faulted at or before it)");
    case KernelFinding::Reason::kStructure:
      return absl::StrCat(where, ": the kernel sequence differs from the reference's (", f.reference.name, ")");
  }
  return where;
}

}  // namespace crashreplay::bisect
