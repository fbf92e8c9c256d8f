#include "crashreplay/replay/config/fault.h"

#include <cmath>

namespace crashreplay::replay {

namespace {

// The engine's fault classes in the signature vocabulary every JSON consumer
// reads (bisect's FailureClass names, docs/bisect.md): a failed kernel check
// is what a GPU reports as a device-side assert.
std::string SignatureClassName(const std::string& klass) {
  if (klass == "assert") return "device_assert";
  if (klass == "nonfinite") return "non_finite";
  if (klass == "oom") return "oom";
  if (klass == "unsupported_arch") return "unsupported_arch";
  return "other";
}

}  // namespace

nlohmann::json Fault::ToJson() const {
  nlohmann::json j;
  j["signature"] = {{"class", SignatureClassName(klass)}, {"stage", stage}, {"kernel", kernel}, {"check", check}};
  j["layer"] = layer;
  j["step"] = step;
  j["rank"] = rank;
  j["item"] = item;
  j["index"] = index;
  if (std::isfinite(value)) {
    j["value"] = value;
  } else {
    j["value"] = std::isnan(value) ? "nan" : (value > 0 ? "inf" : "-inf");
  }
  j["message"] = message;
  return j;
}

}  // namespace crashreplay::replay
