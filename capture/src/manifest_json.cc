#include "manifest_json.h"

#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace crashreplay::capture::internal {
namespace {

using Json = nlohmann::json;

absl::Status CheckKeys(const Json& obj, const std::string& where, const std::set<std::string>& allowed) {
  if (!obj.is_object()) return absl::InvalidArgumentError(absl::StrCat("manifest JSON: ", where, " must be an object"));
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (!allowed.contains(it.key())) {
      return absl::InvalidArgumentError(absl::StrCat("manifest JSON: unknown key '", it.key(), "' in ", where,
                                                     "; allowed: ", absl::StrJoin(allowed, ", ")));
    }
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status Get(const Json& obj, const char* key, const std::string& where, T* out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return absl::OkStatus();
  if constexpr (std::is_same_v<T, std::string>) {
    if (!it->is_string())
      return absl::InvalidArgumentError(absl::StrCat("manifest JSON: ", where, ".", key, " must be a string"));
    *out = it->get<std::string>();
  } else {
    if (!it->is_number_integer() || it->get<int64_t>() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("manifest JSON: ", where, ".", key, " must be a non-negative integer"));
    }
    *out = static_cast<T>(it->get<uint64_t>());
  }
  return absl::OkStatus();
}

#define CR_GET(obj, key, where, out) \
  if (absl::Status s_ = Get(obj, key, where, out); !s_.ok()) return s_

}  // namespace

absl::StatusOr<SessionManifest> ManifestFromJson(std::string_view text) {
  Json j = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("manifest JSON does not parse");
  if (absl::Status s = CheckKeys(
          j, "the manifest",
          {"session_id", "engine", "engine_version", "hostname", "model", "toggles", "device", "parallel", "features"});
      !s.ok()) {
    return s;
  }
  SessionManifest m;
  CR_GET(j, "session_id", "manifest", &m.session_id);
  CR_GET(j, "engine", "manifest", &m.engine);
  CR_GET(j, "engine_version", "manifest", &m.engine_version);
  CR_GET(j, "hostname", "manifest", &m.hostname);
  if (auto it = j.find("model"); it != j.end()) {
    const Json& o = *it;
    if (absl::Status s = CheckKeys(o, "model",
                                   {"config_json", "model_type", "architecture", "num_layers", "hidden_size",
                                    "vocab_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
                                    "num_experts", "quantization", "dtype", "checkpoint_path"});
        !s.ok()) {
      return s;
    }
    ModelConfigInfo& x = m.model;
    CR_GET(o, "config_json", "model", &x.config_json);
    CR_GET(o, "model_type", "model", &x.model_type);
    CR_GET(o, "architecture", "model", &x.architecture);
    CR_GET(o, "num_layers", "model", &x.num_layers);
    CR_GET(o, "hidden_size", "model", &x.hidden_size);
    CR_GET(o, "vocab_size", "model", &x.vocab_size);
    CR_GET(o, "num_heads", "model", &x.num_heads);
    CR_GET(o, "num_kv_heads", "model", &x.num_kv_heads);
    CR_GET(o, "head_dim", "model", &x.head_dim);
    CR_GET(o, "intermediate_size", "model", &x.intermediate_size);
    CR_GET(o, "num_experts", "model", &x.num_experts);
    CR_GET(o, "quantization", "model", &x.quantization);
    CR_GET(o, "dtype", "model", &x.dtype);
    CR_GET(o, "checkpoint_path", "model", &x.checkpoint_path);
  }
  if (auto it = j.find("device"); it != j.end()) {
    const Json& o = *it;
    if (absl::Status s = CheckKeys(
            o, "device", {"name", "sm_arch", "memory_capacity_bytes", "driver_version", "runtime_version", "index"});
        !s.ok()) {
      return s;
    }
    CR_GET(o, "name", "device", &m.device.name);
    CR_GET(o, "sm_arch", "device", &m.device.sm_arch);
    CR_GET(o, "memory_capacity_bytes", "device", &m.device.memory_capacity_bytes);
    CR_GET(o, "driver_version", "device", &m.device.driver_version);
    CR_GET(o, "runtime_version", "device", &m.device.runtime_version);
    CR_GET(o, "index", "device", &m.device.index);
  }
  if (auto it = j.find("parallel"); it != j.end()) {
    const Json& o = *it;
    if (absl::Status s =
            CheckKeys(o, "parallel", {"tp_size", "tp_rank", "world_size", "rank", "pp_size", "ep_size", "dp_size"});
        !s.ok()) {
      return s;
    }
    ParallelLayout& p = m.parallel;
    CR_GET(o, "tp_size", "parallel", &p.tp_size);
    CR_GET(o, "tp_rank", "parallel", &p.tp_rank);
    CR_GET(o, "world_size", "parallel", &p.world_size);
    CR_GET(o, "rank", "parallel", &p.rank);
    CR_GET(o, "pp_size", "parallel", &p.pp_size);
    CR_GET(o, "ep_size", "parallel", &p.ep_size);
    CR_GET(o, "dp_size", "parallel", &p.dp_size);
  }
  if (auto it = j.find("toggles"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return absl::InvalidArgumentError("manifest JSON: toggles must be an object");
    for (auto t = it->begin(); t != it->end(); ++t) {  // nlohmann objects iterate in key order
      Toggle tg;
      tg.name = t.key();
      const Json& v = t.value();
      if (v.is_null()) {
        tg.value = std::monostate{};
      } else if (v.is_boolean()) {
        tg.value = v.get<bool>();
      } else if (v.is_number_integer()) {
        tg.value = v.get<int64_t>();
      } else if (v.is_number()) {
        tg.value = v.get<double>();
      } else if (v.is_string()) {
        tg.value = v.get<std::string>();
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("manifest JSON: toggle '", tg.name, "' must be null, a boolean, a number or a string"));
      }
      m.toggles.push_back(std::move(tg));
    }
  }
  if (auto it = j.find("features"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) return absl::InvalidArgumentError("manifest JSON: features must be a list of strings");
    for (const Json& f : *it) {
      if (!f.is_string()) return absl::InvalidArgumentError("manifest JSON: features must be a list of strings");
      m.features.push_back(f.get<std::string>());
    }
  }
  return m;
}

}  // namespace crashreplay::capture::internal
