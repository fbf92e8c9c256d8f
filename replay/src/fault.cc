#include "crashreplay/replay/fault.h"

#include <cmath>

namespace crashreplay::replay {

nlohmann::json Fault::ToJson() const {
  nlohmann::json j;
  j["signature"] = {{"class", klass}, {"stage", stage}, {"kernel", kernel}, {"check", check}};
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
