// Typed, checked reads of fields from a JSON object in a config file.
// Private to formats/.
//
// A JSON null counts as absent (HF configs write `"sliding_window": null`).
// Each getter leaves `*out` untouched when the field is absent and not
// required, so callers preset defaults. Errors are InvalidArgument and read
// "config '<file>': field '<prefix><key>' <problem>".
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"

namespace crashreplay {

class JsonFields {
 public:
  JsonFields(const nlohmann::json& object, std::string source, std::string prefix = "")
      : object_(object), source_(std::move(source)), prefix_(std::move(prefix)) {}

  // nullptr when absent or null.
  const nlohmann::json* Get(const char* key) const;
  bool Has(const char* key) const { return Get(key) != nullptr; }
  // The key is present with the value null (transformers distinguishes
  // `"q_lora_rank": null` from an absent key, which takes the class default).
  bool IsNull(const char* key) const;

  absl::Status Int(const char* key, int64_t* out, bool required = false) const;
  absl::Status Double(const char* key, double* out, bool required = false) const;
  absl::Status Bool(const char* key, bool* out, bool required = false) const;
  absl::Status String(const char* key, std::string* out, bool required = false) const;
  absl::Status IntList(const char* key, std::vector<int64_t>* out, bool required = false) const;
  absl::Status DoubleList(const char* key, std::vector<double>* out, bool required = false) const;
  absl::Status StringList(const char* key, std::vector<std::string>* out, bool required = false) const;
  // An integer or a list of integers (bos/eos token ids).
  absl::Status IntOrIntList(const char* key, std::vector<int64_t>* out) const;
  // One integer that the file may spell under any of `keys` (the aliases of
  // a config class's attribute_map): the one present is read; two present
  // with different values are an error naming both.
  absl::Status IntAlias(std::initializer_list<const char*> keys, int64_t* out) const;

  // "config '<file>': field '<prefix><key>' <what>" as InvalidArgument.
  absl::Status Invalid(const char* key, const std::string& what) const;
  const std::string& source() const { return source_; }
  const std::string& prefix() const { return prefix_; }

 private:
  absl::Status Missing(const char* key) const;
  absl::Status WrongType(const char* key, const nlohmann::json& v, const char* want) const;

  const nlohmann::json& object_;
  std::string source_;
  std::string prefix_;
};

}  // namespace crashreplay
