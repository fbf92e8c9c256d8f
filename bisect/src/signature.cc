#include "crashreplay/bisect/signature.h"

#include <array>
#include <utility>

#include "absl/strings/str_cat.h"

namespace crashreplay::bisect {
namespace {

constexpr std::array<std::pair<FailureClass, std::string_view>, 13> kClassNames = {{
    {FailureClass::kNone, "none"},
    {FailureClass::kDeviceAssert, "device_assert"},
    {FailureClass::kOom, "oom"},
    {FailureClass::kNonFinite, "non_finite"},
    {FailureClass::kOutputMismatch, "output_mismatch"},
    {FailureClass::kTimeout, "timeout"},
    {FailureClass::kCrashSignal, "crash_signal"},
    {FailureClass::kOther, "other"},
    {FailureClass::kCudaError, "cuda_error"},
    {FailureClass::kNcclError, "nccl_error"},
    {FailureClass::kException, "exception"},
    {FailureClass::kUnsupportedArch, "unsupported_arch"},
    {FailureClass::kEngineDivergence, "engine_divergence"},
}};
constexpr std::array<std::pair<FailureStage, std::string_view>, 5> kStageNames = {{
    {FailureStage::kLoad, "load"},
    {FailureStage::kGraphCapture, "graph_capture"},
    {FailureStage::kPrefill, "prefill"},
    {FailureStage::kDecode, "decode"},
    {FailureStage::kUnknown, "unknown"},
}};

}  // namespace

std::string_view FailureClassName(FailureClass c) {
  for (const auto& [k, n] : kClassNames)
    if (k == c) return n;
  return "other";
}
std::optional<FailureClass> ParseFailureClass(std::string_view name) {
  for (const auto& [k, n] : kClassNames)
    if (n == name) return k;
  return std::nullopt;
}
std::string_view FailureStageName(FailureStage s) {
  for (const auto& [k, n] : kStageNames)
    if (k == s) return n;
  return "unknown";
}
std::optional<FailureStage> ParseFailureStage(std::string_view name) {
  for (const auto& [k, n] : kStageNames)
    if (n == name) return k;
  return std::nullopt;
}

bool SameBug(const FailureSignature& a, const FailureSignature& b) {
  return a.failure_class == b.failure_class && a.stage == b.stage && a.kernel == b.kernel && a.check == b.check;
}

std::string DescribeSignature(const FailureSignature& s) {
  if (!s.is_failure()) return "no failure";
  std::string out(FailureClassName(s.failure_class));
  if (s.stage != FailureStage::kUnknown) absl::StrAppend(&out, " during ", std::string(FailureStageName(s.stage)));
  if (!s.kernel.empty() || !s.check.empty()) {
    absl::StrAppend(&out, " at ", s.kernel.empty() ? "?" : s.kernel);
    if (!s.check.empty()) absl::StrAppend(&out, "/", s.check);
  }
  if (s.step) absl::StrAppend(&out, " (step ", *s.step, ")");
  if (!s.detail.empty()) absl::StrAppend(&out, ": ", s.detail);
  return out;
}

nlohmann::json SignatureToJson(const FailureSignature& s) {
  nlohmann::json j;
  j["class"] = std::string(FailureClassName(s.failure_class));
  j["stage"] = std::string(FailureStageName(s.stage));
  j["kernel"] = s.kernel;
  j["check"] = s.check;
  j["step"] = s.step ? nlohmann::json(*s.step) : nlohmann::json(nullptr);
  if (!s.detail.empty()) j["detail"] = s.detail;
  return j;
}

absl::StatusOr<FailureSignature> SignatureFromJson(const nlohmann::json& j) {
  if (!j.is_object()) return absl::InvalidArgumentError("signature: expected a JSON object");
  FailureSignature s;
  auto str = [&](const char* key, std::string* out) -> absl::Status {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return absl::OkStatus();
    if (!it->is_string()) return absl::InvalidArgumentError(absl::StrCat("signature: '", key, "' must be a string"));
    *out = it->get<std::string>();
    return absl::OkStatus();
  };
  if (j.find("class") == j.end()) return absl::InvalidArgumentError("signature: missing 'class'");
  std::string cls, stage;
  if (auto st = str("class", &cls); !st.ok()) return st;
  auto c = ParseFailureClass(cls);
  if (!c) {
    return absl::InvalidArgumentError(
        absl::StrCat("signature: unknown class '", cls,
                     "' (one of none, device_assert, oom, non_finite, output_mismatch, timeout, crash_signal, other, "
                     "cuda_error, nccl_error, exception)"));
  }
  s.failure_class = *c;
  if (auto st = str("stage", &stage); !st.ok()) return st;
  if (!stage.empty()) {
    auto g = ParseFailureStage(stage);
    if (!g) {
      return absl::InvalidArgumentError(absl::StrCat("signature: unknown stage '", stage,
                                                     "' (one of load, graph_capture, prefill, decode, unknown)"));
    }
    s.stage = *g;
  }
  if (auto st = str("kernel", &s.kernel); !st.ok()) return st;
  if (auto st = str("check", &s.check); !st.ok()) return st;
  if (auto st = str("detail", &s.detail); !st.ok()) return st;
  if (auto st_it = j.find("step"); st_it != j.end() && !st_it->is_null()) {
    if (!st_it->is_number_integer()) return absl::InvalidArgumentError("signature: 'step' must be an integer");
    s.step = st_it->get<int64_t>();
  }
  return s;
}

}  // namespace crashreplay::bisect
