#include "manifest_from_python.h"

#include <nanobind/stl/string.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <map>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "crashreplay/base/status.h"

namespace nb = nanobind;

namespace crashreplay::python {
namespace {

// Reads the keys of a dict through a table of typed setters; an unknown key
// or a value of the wrong type is InvalidArgument naming `where.key`.
class DictReader {
 public:
  explicit DictReader(std::string where) : where_(std::move(where)) {}

  template <typename T>
  void Field(const char* key, T* out) {
    setters_[key] = [this, key, out](nb::handle v) -> absl::Status {
      if (!nb::try_cast<T>(v, *out)) return TypeError(key, v);
      return absl::OkStatus();
    };
  }
  void Custom(const char* key, std::function<absl::Status(nb::handle)> fn) { setters_[key] = std::move(fn); }

  absl::Status Read(const nb::dict& d) {
    for (auto [k, v] : d) {
      std::string key;
      if (!nb::try_cast<std::string>(k, key)) {
        return absl::InvalidArgumentError(absl::StrCat(where_, ": keys must be strings"));
      }
      auto it = setters_.find(key);
      if (it == setters_.end()) {
        return absl::InvalidArgumentError(absl::StrCat(where_, ": unknown key '", key, "'"));
      }
      if (v.is_none()) continue;  // None leaves the default
      absl::Status s = it->second(v);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::Status TypeError(const char* key, nb::handle v) const {
    return absl::InvalidArgumentError(
        absl::StrCat(where_, ".", key, ": unexpected value of type ", nb::type_name(v.type()).c_str()));
  }

 private:
  std::string where_;
  std::map<std::string, std::function<absl::Status(nb::handle)>> setters_;
};

// Integers arrive as Python ints; narrow with a range check.
template <typename T>
absl::Status ReadUnsigned(nb::handle v, T* out, const std::string& where) {
  uint64_t x = 0;
  if (!nb::try_cast<uint64_t>(v, x) || x > static_cast<uint64_t>(std::numeric_limits<T>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": expected a non-negative integer that fits ", 8 * sizeof(T), " bits"));
  }
  *out = static_cast<T>(x);
  return absl::OkStatus();
}

absl::StatusOr<ToggleValue> ToggleFromPython(nb::handle v, const std::string& name) {
  if (v.is_none()) return ToggleValue{};
  // bool first: a Python bool is also an int.
  if (nb::isinstance<nb::bool_>(v)) return ToggleValue{nb::cast<bool>(v)};
  if (nb::isinstance<nb::int_>(v)) {
    int64_t x = 0;
    if (!nb::try_cast<int64_t>(v, x)) {
      return absl::InvalidArgumentError(absl::StrCat("toggle '", name, "': integer out of int64 range"));
    }
    return ToggleValue{x};
  }
  if (nb::isinstance<nb::float_>(v)) return ToggleValue{nb::cast<double>(v)};
  if (nb::isinstance<nb::str>(v)) return ToggleValue{nb::cast<std::string>(v)};
  return absl::InvalidArgumentError(absl::StrCat("toggle '", name, "': value of type ", nb::type_name(v.type()).c_str(),
                                                 " (toggles are None, bool, int, float or str)"));
}

}  // namespace

absl::StatusOr<SessionManifest> ManifestFromPython(const nb::dict& d) {
  SessionManifest m;
  DictReader top("manifest");
  top.Field("session_id", &m.session_id);
  top.Field("engine", &m.engine);
  top.Field("engine_version", &m.engine_version);
  top.Field("recorder_version", &m.recorder_version);
  top.Field("hostname", &m.hostname);
  top.Custom("weight_check_period_steps", [&](nb::handle v) {
    return ReadUnsigned(v, &m.weight_check_period_steps, "manifest.weight_check_period_steps");
  });
  top.Custom("features", [&](nb::handle v) -> absl::Status {
    for (nb::handle item : nb::iter(v)) {
      std::string s;
      if (!nb::try_cast<std::string>(item, s)) return top.TypeError("features", item);
      m.features.push_back(std::move(s));
    }
    return absl::OkStatus();
  });
  top.Custom("toggles", [&](nb::handle v) -> absl::Status {
    for (nb::handle item : nb::iter(v)) {
      nb::tuple pair;
      if (!nb::try_cast<nb::tuple>(item, pair) || pair.size() != 2) {
        return absl::InvalidArgumentError("manifest.toggles: expected (name, value) pairs");
      }
      Toggle t;
      if (!nb::try_cast<std::string>(pair[0], t.name)) return top.TypeError("toggles", pair[0]);
      absl::StatusOr<ToggleValue> value = ToggleFromPython(pair[1], t.name);
      if (!value.ok()) return value.status();
      t.value = *std::move(value);
      m.toggles.push_back(std::move(t));
    }
    return absl::OkStatus();
  });
  top.Custom("model", [&](nb::handle v) -> absl::Status {
    DictReader r("manifest.model");
    ModelConfigInfo& mc = m.model;
    r.Field("config_json", &mc.config_json);
    r.Field("model_type", &mc.model_type);
    r.Field("architecture", &mc.architecture);
    r.Field("quantization", &mc.quantization);
    r.Field("dtype", &mc.dtype);
    r.Field("checkpoint_path", &mc.checkpoint_path);
    const std::pair<const char*, uint32_t*> ints[] = {{"num_layers", &mc.num_layers},
                                                      {"hidden_size", &mc.hidden_size},
                                                      {"vocab_size", &mc.vocab_size},
                                                      {"num_heads", &mc.num_heads},
                                                      {"num_kv_heads", &mc.num_kv_heads},
                                                      {"head_dim", &mc.head_dim},
                                                      {"intermediate_size", &mc.intermediate_size},
                                                      {"num_experts", &mc.num_experts}};
    for (auto [key, ptr] : ints) {
      r.Custom(key, [key, ptr](nb::handle x) { return ReadUnsigned(x, ptr, absl::StrCat("manifest.model.", key)); });
    }
    nb::dict sub;
    if (!nb::try_cast<nb::dict>(v, sub)) return top.TypeError("model", v);
    return r.Read(sub);
  });
  top.Custom("device", [&](nb::handle v) -> absl::Status {
    DictReader r("manifest.device");
    DeviceInfo& dev = m.device;
    r.Field("name", &dev.name);
    r.Field("driver_version", &dev.driver_version);
    r.Field("runtime_version", &dev.runtime_version);
    r.Custom("sm_arch", [&](nb::handle x) { return ReadUnsigned(x, &dev.sm_arch, "manifest.device.sm_arch"); });
    r.Custom("index", [&](nb::handle x) { return ReadUnsigned(x, &dev.index, "manifest.device.index"); });
    r.Custom("memory_capacity_bytes", [&](nb::handle x) {
      return ReadUnsigned(x, &dev.memory_capacity_bytes, "manifest.device.memory_capacity_bytes");
    });
    nb::dict sub;
    if (!nb::try_cast<nb::dict>(v, sub)) return top.TypeError("device", v);
    return r.Read(sub);
  });
  top.Custom("parallel", [&](nb::handle v) -> absl::Status {
    DictReader r("manifest.parallel");
    ParallelLayout& p = m.parallel;
    const std::pair<const char*, uint32_t*> ints[] = {
        {"tp_size", &p.tp_size}, {"tp_rank", &p.tp_rank}, {"world_size", &p.world_size}, {"rank", &p.rank},
        {"pp_size", &p.pp_size}, {"ep_size", &p.ep_size}, {"dp_size", &p.dp_size}};
    for (auto [key, ptr] : ints) {
      r.Custom(key, [key, ptr](nb::handle x) { return ReadUnsigned(x, ptr, absl::StrCat("manifest.parallel.", key)); });
    }
    nb::dict sub;
    if (!nb::try_cast<nb::dict>(v, sub)) return top.TypeError("parallel", v);
    return r.Read(sub);
  });
  CR_RETURN_IF_ERROR(top.Read(d));
  return m;
}

absl::StatusOr<capture::RecorderOptions> OptionsFromPython(const nb::dict& d) {
  capture::RecorderOptions o;
  DictReader r("options");
  r.Field("session_dir", &o.session_dir);
  r.Field("path", &o.path);
  r.Field("overwrite", &o.overwrite);
  r.Field("write_snapshots_on_close", &o.write_snapshots_on_close);
  r.Field("install_signal_handlers", &o.install_signal_handlers);
  r.Field("page_table_deltas", &o.page_table_deltas);
  r.Field("step_list_deltas", &o.step_list_deltas);
  r.Field("arm_coredumps", &o.arm_coredumps);
  r.Field("coredump_driver_library", &o.coredump_driver_library);
  r.Field("coredump_wait_s", &o.coredump_wait_s);
  r.Custom("coredump_method", [&](nb::handle x) -> absl::Status {
    std::string m;
    if (!nb::try_cast<std::string>(x, m)) return r.TypeError("coredump_method", x);
    if (m == "auto") {
      o.coredump_method = capture::CoredumpArmMethod::kAuto;
    } else if (m == "env") {
      o.coredump_method = capture::CoredumpArmMethod::kEnvironment;
    } else if (m == "driver_api") {
      o.coredump_method = capture::CoredumpArmMethod::kDriverApi;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("options.coredump_method: \"", m, "\" is not one of auto, env, driver_api"));
    }
    return absl::OkStatus();
  });
  r.Field("step_queue_wait_s", &o.step_queue_wait_s);
  r.Field("disk_retry_interval_s", &o.disk_retry_interval_s);
  r.Field("signal_drain_timeout_s", &o.signal_drain_timeout_s);
  r.Field("weight_check_budget", &o.weight_check_budget);
  r.Custom("snapshot_ring_bytes",
           [&](nb::handle x) { return ReadUnsigned(x, &o.snapshot_ring_bytes, "options.snapshot_ring_bytes"); });
  r.Custom("max_snapshots", [&](nb::handle x) { return ReadUnsigned(x, &o.max_snapshots, "options.max_snapshots"); });
  r.Custom("step_queue_slots",
           [&](nb::handle x) { return ReadUnsigned(x, &o.step_queue_slots, "options.step_queue_slots"); });
  r.Custom("step_queue_bytes",
           [&](nb::handle x) { return ReadUnsigned(x, &o.step_queue_bytes, "options.step_queue_bytes"); });
  r.Custom("held_steps", [&](nb::handle x) { return ReadUnsigned(x, &o.held_steps, "options.held_steps"); });
  r.Custom("held_bytes", [&](nb::handle x) { return ReadUnsigned(x, &o.held_bytes, "options.held_bytes"); });
  r.Custom("weight_check_bytes_per_step", [&](nb::handle x) {
    return ReadUnsigned(x, &o.weight_check_bytes_per_step, "options.weight_check_bytes_per_step");
  });
  r.Custom("weight_chunk_bytes",
           [&](nb::handle x) { return ReadUnsigned(x, &o.weight_chunk_bytes, "options.weight_chunk_bytes"); });
  r.Custom("zstd_level", [&](nb::handle x) -> absl::Status {
    if (!nb::try_cast<int>(x, o.blob.zstd_level)) return r.TypeError("zstd_level", x);
    return absl::OkStatus();
  });
  CR_RETURN_IF_ERROR(r.Read(d));
  return o;
}

absl::StatusOr<FailureClass> ParseFailureClass(const std::string& name) {
  for (int i = 0; i <= static_cast<int>(FailureClass::kException); ++i) {
    const FailureClass c = static_cast<FailureClass>(i);
    if (name == FailureClassName(c)) return c;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown failure class '", name,
      "'; one of unknown, device-assert, out-of-memory, non-finite, output-mismatch, timeout, crash, exception"));
}

absl::StatusOr<ForwardMode> ParseForwardMode(const std::string& name) {
  for (int i = 0; i <= static_cast<int>(ForwardMode::kIdle); ++i) {
    const ForwardMode m = static_cast<ForwardMode>(i);
    if (name == ForwardModeName(m)) return m;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown forward mode '", name, "'; one of unknown, prefill, decode, extend, mixed, idle"));
}

}  // namespace crashreplay::python
