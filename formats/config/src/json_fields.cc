#include "json_fields.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "json_util.h"

namespace crashreplay {
namespace {

bool AsInt(const nlohmann::json& v, int64_t* out) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (v.is_number_integer()) {
    *out = v.get<int64_t>();
    return true;
  }
  return false;
}

bool AsDouble(const nlohmann::json& v, double* out) {
  if (!v.is_number()) return false;
  *out = v.get<double>();
  return std::isfinite(*out);
}

}  // namespace

const nlohmann::json* JsonFields::Get(const char* key) const {
  if (!object_.is_object()) return nullptr;
  auto it = object_.find(key);
  if (it == object_.end() || it->is_null()) return nullptr;
  return &*it;
}

bool JsonFields::IsNull(const char* key) const {
  if (!object_.is_object()) return false;
  auto it = object_.find(key);
  return it != object_.end() && it->is_null();
}

absl::Status JsonFields::IntAlias(std::initializer_list<const char*> keys, int64_t* out) const {
  const char* first = nullptr;
  int64_t value = 0;
  for (const char* key : keys) {
    if (!Has(key)) continue;
    int64_t v = 0;
    if (absl::Status s = Int(key, &v); !s.ok()) return s;
    if (first != nullptr && v != value) {
      return Invalid(key, absl::StrCat("(", v, ") disagrees with '", prefix_, first, "' (", value,
                                       "); they name the same setting"));
    }
    if (first == nullptr) {
      first = key;
      value = v;
    }
  }
  if (first != nullptr) *out = value;
  return absl::OkStatus();
}

absl::Status JsonFields::Invalid(const char* key, const std::string& what) const {
  return absl::InvalidArgumentError(absl::StrCat("config '", source_, "': field '", prefix_, key, "' ", what));
}

absl::Status JsonFields::Missing(const char* key) const { return Invalid(key, "is required but missing"); }

absl::Status JsonFields::WrongType(const char* key, const nlohmann::json& v, const char* want) const {
  return Invalid(key, absl::StrCat("is a JSON ", json_util::TypeName(v), " (",
                                   v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).substr(0, 60),
                                   "), expected ", want));
}

absl::Status JsonFields::Int(const char* key, int64_t* out, bool required) const {
  const nlohmann::json* v = Get(key);
  if (v == nullptr) return required ? Missing(key) : absl::OkStatus();
  if (!AsInt(*v, out)) return WrongType(key, *v, "an integer");
  return absl::OkStatus();
}

absl::Status JsonFields::Double(const char* key, double* out, bool required) const {
  const nlohmann::json* v = Get(key);
  if (v == nullptr) return required ? Missing(key) : absl::OkStatus();
  if (!AsDouble(*v, out)) return WrongType(key, *v, "a finite number");
  return absl::OkStatus();
}

absl::Status JsonFields::Bool(const char* key, bool* out, bool required) const {
  const nlohmann::json* v = Get(key);
  if (v == nullptr) return required ? Missing(key) : absl::OkStatus();
  if (!v->is_boolean()) return WrongType(key, *v, "true or false");
  *out = v->get<bool>();
  return absl::OkStatus();
}

absl::Status JsonFields::String(const char* key, std::string* out, bool required) const {
  const nlohmann::json* v = Get(key);
  if (v == nullptr) return required ? Missing(key) : absl::OkStatus();
  if (!v->is_string()) return WrongType(key, *v, "a string");
  *out = v->get<std::string>();
  return absl::OkStatus();
}

absl::Status JsonFields::IntList(const char* key, std::vector<int64_t>* out, bool required) const {
  const nlohmann::json* v = Get(key);
  if (v == nullptr) return required ? Missing(key) : absl::OkStatus();
  if (!v->is_array()) return WrongType(key, *v, "a list of integers");
  std::vector<int64_t> values;
  for (const nlohmann::json& e : *v) {
    int64_t x;
    if (!AsInt(e, &x)) return WrongType(key, *v, "a list of integers");
    values.push_back(x);
  }
  *out = std::move(values);
  return absl::OkStatus();
}

absl::Status JsonFields::DoubleList(const char* key, std::vector<double>* out, bool required) const {
  const nlohmann::json* v = Get(key);
  if (v == nullptr) return required ? Missing(key) : absl::OkStatus();
  if (!v->is_array()) return WrongType(key, *v, "a list of numbers");
  std::vector<double> values;
  for (const nlohmann::json& e : *v) {
    double x;
    if (!AsDouble(e, &x)) return WrongType(key, *v, "a list of numbers");
    values.push_back(x);
  }
  *out = std::move(values);
  return absl::OkStatus();
}

absl::Status JsonFields::StringList(const char* key, std::vector<std::string>* out, bool required) const {
  const nlohmann::json* v = Get(key);
  if (v == nullptr) return required ? Missing(key) : absl::OkStatus();
  if (!v->is_array()) return WrongType(key, *v, "a list of strings");
  std::vector<std::string> values;
  for (const nlohmann::json& e : *v) {
    if (!e.is_string()) return WrongType(key, *v, "a list of strings");
    values.push_back(e.get<std::string>());
  }
  *out = std::move(values);
  return absl::OkStatus();
}

absl::Status JsonFields::IntOrIntList(const char* key, std::vector<int64_t>* out) const {
  const nlohmann::json* v = Get(key);
  if (v == nullptr) return absl::OkStatus();
  int64_t x;
  if (AsInt(*v, &x)) {
    *out = {x};
    return absl::OkStatus();
  }
  if (!v->is_array()) return WrongType(key, *v, "an integer or a list of integers");
  return IntList(key, out);
}

}  // namespace crashreplay
