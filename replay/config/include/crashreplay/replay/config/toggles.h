// The one table of configuration toggles, and configurations built from it.
//
// Every consumer of configuration (config files, `--set k=v`, `crashreplay
// toggles`, bisection's search space, the engine and the tests) reads the
// table returned by Toggles(); nothing else lists toggle names. A Config is a
// complete assignment name -> value, starting from the table's defaults; every
// value that enters it is validated against the toggle's domain.
//
// EngineConfig is the typed view the engine reads (ResolveConfig). It is a
// plain struct so kernels and planners never parse strings.
//
// Thread safety: the table is immutable; Config is a value type.
// Errors: InvalidArgument naming the toggle, the value, the domain and, for an
// unknown name, the nearest known name.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"

namespace crashreplay {
class ConfigValue;
}

namespace crashreplay::replay {

enum class ToggleType { kEnum, kInt, kFloat, kBool };

struct ToggleSpec {
  std::string_view name;
  ToggleType type;
  // kEnum: the allowed values; empty for the other types.
  std::vector<std::string_view> choices;
  // kInt/kFloat: inclusive range.
  double min = 0;
  double max = 0;
  std::string_view default_value;  // as text, parsed with the same rules as --set
  std::string_view meaning;
  // Whether bisection may vary this toggle (false for things that describe the
  // recorded machine rather than a choice the user makes).
  bool searchable = true;
};

// The table, in the order `crashreplay toggles` prints it.
std::span<const ToggleSpec> Toggles();
const ToggleSpec* FindToggle(std::string_view name);
std::string_view TypeName(ToggleType t);

// One toggle value; enums are stored as their text.
using ToggleValue = std::variant<std::string, int64_t, double, bool>;
std::string ToggleValueText(const ToggleValue& v);

// Parses `text` for `spec`, checking the domain.
absl::StatusOr<ToggleValue> ParseToggleValue(const ToggleSpec& spec, std::string_view text);

class Config {
 public:
  // Every toggle at its default.
  static Config Defaults();

  absl::Status Set(std::string_view name, std::string_view text);
  // "name=value" as given to --set.
  absl::Status ApplySetFlag(std::string_view assignment);
  // Reads a flat TOML file (formats/config_file.h, docs/formats/config.md).
  // A file whose `engine` key names a serving engine (sglang, vllm) is in
  // that engine's words (engine_vocab.h); what they cannot model is a note.
  absl::Status ApplyFile(const std::string& path, std::vector<std::string>* notes = nullptr);
  absl::Status ApplyText(std::string_view text, std::string_view origin, std::vector<std::string>* notes = nullptr);

  const ToggleValue& Get(std::string_view name) const;
  const std::string& Enum(std::string_view name) const;
  int64_t Int(std::string_view name) const;
  double Float(std::string_view name) const;
  bool Bool(std::string_view name) const;

  // name -> value text, in table order; the canonical form used in captures
  // and reports. Names of toggles whose value differs from `other`.
  std::vector<std::pair<std::string, std::string>> Items() const;
  std::vector<std::string> DiffNames(const Config& other) const;
  // Canonical flat TOML (FormatConfig) that ApplyText reads back to the same Config.
  std::string ToText() const;

  friend bool operator==(const Config&, const Config&) = default;

 private:
  absl::Status ApplyParsed(const std::map<std::string, crashreplay::ConfigValue>& parsed, std::string_view origin,
                           std::vector<std::string>* notes);
  std::map<std::string, ToggleValue, std::less<>> values_;
};

enum class AttentionBackend { kReference, kFlashDecode, kPaged64 };
enum class GemmBackend { kDequantMatmul, kFusedBlockScaled };
enum class ScaleFormat { kCheckpoint, kFp32, kUe8m0Requant, kUe8m0, kDeepGemmUe8m0 };
enum class Nvfp4Activation { kW4a4, kW4a16 };
enum class KvCacheDType { kBf16, kFp8E4m3 };
enum class ActivationDType { kF32, kBf16, kF16 };
enum class MlaDecode { kNaive, kAbsorbed };
enum class DsaDecode { kReference, kTiled64 };
enum class SamplingBackend { kSorted, kThreshold };
enum class RopeConfig { kCheckpoint, kLegacy, kRopeParameters };
enum class MoeParallel { kTensor, kExpert };
enum class WeightResidency { kAuto, kResident, kStream };

struct EngineConfig {
  AttentionBackend attention_backend = AttentionBackend::kReference;
  GemmBackend gemm_backend = GemmBackend::kFusedBlockScaled;
  GemmBackend moe_backend = GemmBackend::kFusedBlockScaled;
  ScaleFormat scale_format = ScaleFormat::kCheckpoint;
  Nvfp4Activation nvfp4_activation = Nvfp4Activation::kW4a4;
  KvCacheDType kv_cache_dtype = KvCacheDType::kBf16;
  ActivationDType activation_dtype = ActivationDType::kF32;
  MlaDecode mla_decode = MlaDecode::kNaive;
  DsaDecode dsa_decode = DsaDecode::kReference;
  KvCacheDType index_cache_dtype = KvCacheDType::kBf16;
  int page_size = 16;
  double mem_fraction_static = 0.88;
  int cuda_graph_max_bs = 32;
  SamplingBackend sampling_backend = SamplingBackend::kSorted;
  RopeConfig rope_config = RopeConfig::kCheckpoint;
  int tp_size = 1;
  MoeParallel moe_parallel = MoeParallel::kTensor;
  double device_memory_gb = 80;
  double device_memory_scale = 1;
  int max_running_requests = 64;
  int max_total_tokens = 0;
  std::string device = "cpu";  // the executor: "cpu" or "cuda" (executor.h)
  int device_arch = 0;         // compute capability, 120 for sm_120; 0: not modelled
  // Library kernels the variants stand for (kernel_archs.h); "any": none named.
  std::string attention_kernel = "any", prefill_attention_kernel = "any";
  std::string dsa_kernel = "any", dsa_prefill_kernel = "any", indexer_kernel = "any", moe_kernel = "any";
  bool shared_experts_fusion = false;
  WeightResidency weights = WeightResidency::kAuto;  // the replaying host's choice, not the engine's
};

EngineConfig ResolveConfig(const Config& config);

}  // namespace crashreplay::replay
