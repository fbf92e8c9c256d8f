#include "crashreplay/replay/config/toggles.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "crashreplay/base/status.h"
#include "crashreplay/base/text.h"
#include "crashreplay/formats/config_file.h"
#include "crashreplay/replay/config/engine_vocab.h"
#include "crashreplay/replay/config/kernel_archs.h"

namespace crashreplay::replay {
namespace {

using text::Cat;
using text::Strip;

// "any" and every library kernel of one family (kernel_archs.cc).
std::vector<std::string_view> LibraryChoices(std::string_view family) {
  std::vector<std::string_view> out = {"any"};
  for (const KernelLibrary& k : KernelLibraries()) {
    if (k.family == family) out.push_back(k.name);
  }
  return out;
}

const std::vector<ToggleSpec>& Table() {
  // clang-format off: a table, one row a line as written
  static const std::vector<ToggleSpec> kTable = {
      {"attention_backend", ToggleType::kEnum, {"reference", "flashdecode", "paged64"}, 0, 0, "reference",
       "decode attention kernel: reference (two-pass softmax over positions in order); flashdecode "
       "(split-KV chunks of 32 positions with online softmax, partials merged in chunk order: a "
       "different reduction order); paged64 (one tile per KV page, as FlashMLA: precondition "
       "page_size == 64). Prefill always uses the reference kernel."},
      {"gemm_backend", ToggleType::kEnum, {"dequant_matmul", "fused_blockscaled"}, 0, 0, "fused_blockscaled",
       "dense projections of quantized weights: fused_blockscaled (dot product of raw values per scale block, "
       "scale applied per block: the weights exactly as the quantizer defines them); dequant_matmul "
       "(dequantize each weight to bf16 first, then an fp32 dot product, as a bf16 dequantize-then-matmul "
       "kernel does)"},
      {"moe_backend", ToggleType::kEnum, {"dequant_matmul", "fused_blockscaled"}, 0, 0, "fused_blockscaled",
       "expert GEMMs (routed and shared experts), same choices as gemm_backend"},
      {"scale_format", ToggleType::kEnum, {"checkpoint", "fp32", "ue8m0_requant", "ue8m0", "deepgemm_ue8m0"}, 0, 0, "checkpoint",
       "block scales of quantized weights: checkpoint (as stored: e4m3/e8m0/fp32, decoded in the "
       "kernel); fp32 (expanded to fp32 at load); ue8m0_requant (rounded up to powers of two at "
       "load, as DeepGEMM's requantization does); ue8m0 (passed to a kernel that reads only the "
       "exponent and checks (bits & 0x807fffff) == 0 first, as DeepGEMM's UE8M0 path); deepgemm_ue8m0 (what "
       "sglang's DEEPGEMM_SCALE_UE8M0 does: FP8 block weights ue8m0_requant, every other format's scales "
       "(NVFP4's e4m3) read by the UE8M0 kernels as they are)"},
      {"nvfp4_activation", ToggleType::kEnum, {"w4a4", "w4a16"}, 0, 0, "w4a4",
       "activations of NVFP4 linear layers: w4a4 (quantized on the fly to NVFP4 with the checkpoint's "
       "input_scale, e2m1 values and e4m3 scales per 16, then an fp4 x fp4 GEMM: what serving engines run "
       "a ModelOpt NVFP4 checkpoint with on Blackwell) or w4a16 (bf16 activations against dequantized "
       "fp4 weights, as a weight-only kernel such as vLLM's Marlin fallback on older GPUs)"},
      {"kv_cache_dtype", ToggleType::kEnum, {"bf16", "fp8_e4m3"}, 0, 0, "bf16",
       "element type of the paged KV cache: GQA K/V as e4m3 with scale 1; for MLA models (deepseek_v3, "
       "deepseek_v32, glm_moe_dsa) fp8_e4m3 is FlashMLA's FP8 latent layout, e4m3 latent in 128-value tiles "
       "with one fp32 scale each plus the bf16 rope part (656 bytes a token for 512 + 64)"},
      {"mla_decode", ToggleType::kEnum, {"naive", "absorbed"}, 0, 0, "naive",
       "decode attention of dense MLA models (deepseek_v3): naive (cached latents expanded by kv_b_proj into "
       "per-head K and V, fp32 two-pass softmax; the form engines run for prefill) or absorbed (W_UK folded "
       "into q, attention over the 576-wide latent in 64-token pages with online softmax and bf16 operands, "
       "W_UV after: FlashMLA's dense decode; preconditions page_size == 64, kv_lora_rank + qk_rope_head_dim "
       "== 576, kv_lora_rank == 512). Prefill always uses naive."},
      {"dsa_decode", ToggleType::kEnum, {"reference", "tiled64"}, 0, 0, "reference",
       "decode attention of DSA models (deepseek_v32, glm_moe_dsa) over the indexer's top-k, on the latent "
       "(absorbed): reference (two-pass softmax over the top-k in order, fp32) or tiled64 (FlashMLA's sparse "
       "decode: tiles of 64 indices, online softmax, bf16 operands; preconditions 576 / 512 as mla_decode, "
       "heads per rank <= 128, index_topk a multiple of 64). Prefill is the expanded form over the top-k."},
      {"index_cache_dtype", ToggleType::kEnum, {"bf16", "fp8_e4m3"}, 0, 0, "bf16",
       "the DSA indexer's key cache and score arithmetic: bf16 (bf16 keys, fp32 queries: transformers) or "
       "fp8_e4m3 (q and k Hadamard-rotated, e4m3 with a power-of-two scale per vector, relu(q8 . k8) weighted "
       "and scaled: DeepSeek's reference and sglang's indexer; needs index_head_dim a power of two <= 128)"},
      {"activation_dtype", ToggleType::kEnum, {"fp32", "bf16", "fp16"}, 0, 0, "fp32",
       "the dtype kernels store their float outputs in (hidden states, projections, attention and expert "
       "outputs, logits; accumulation stays fp32, sampling probabilities stay fp32): fp32, or bf16 / fp16 as "
       "an engine running the model in that dtype stores them, so rounding and fp16's overflow to Inf past "
       "65504 happen where the engine's do. A capture records the engine's dtype here"},
      {"page_size", ToggleType::kInt, {}, 1, 1024, "16", "tokens per KV-cache page"},
      {"mem_fraction_static", ToggleType::kFloat, {}, 0.05, 1.0, "0.88",
       "fraction of the device's memory for weights and the KV pool; the rest holds activations "
       "and CUDA graphs"},
      {"cuda_graph_max_bs", ToggleType::kInt, {}, 0, 1024, "32",
       "largest decode batch captured as a CUDA graph (0: no graphs); sizes the graph reservation"},
      {"sampling_backend", ToggleType::kEnum, {"sorted", "threshold"}, 0, 0, "sorted",
       "top-k/top-p filtering: sorted (full sort, cumulative sum in sorted order); threshold "
       "(pivot search on probability without a sort, sums in vocabulary order)"},
      {"rope_config", ToggleType::kEnum, {"checkpoint", "legacy", "rope_parameters"}, 0, 0, "checkpoint",
       "which config.json keys give RoPE: checkpoint (the file as transformers 5 reads it: a rope_scaling "
       "object, else rope_parameters, else rope_theta); legacy (only rope_theta + rope_scaling, as an engine "
       "that predates rope_parameters) or rope_parameters (only that dict): the other keys are ignored and a "
       "missing form means theta 10000 without scaling, with a note when that changes RoPE"},
      {"tp_size", ToggleType::kInt, {}, 1, 64, "1",
       "tensor-parallel ranks (emulated in one process; all-gather + fixed-order sum)"},
      {"moe_parallel", ToggleType::kEnum, {"tensor", "expert"}, 0, 0, "tensor",
       "how experts are sharded over tp ranks: tensor (every expert split along its intermediate "
       "dim) or expert (whole experts split across ranks)"},
      {"max_running_requests", ToggleType::kInt, {}, 1, 4096, "64", "most requests in one batch"},
      {"max_total_tokens", ToggleType::kInt, {}, 0, 1 << 30, "0",
       "cap on KV pool tokens (0: what the memory planner gives)"},
      {"device_memory_gb", ToggleType::kFloat, {}, 0.001, 4096, "80",
       "recorded device's memory capacity per rank, GB (1e9 bytes)", false},
      {"device_memory_scale", ToggleType::kFloat, {}, 1e-9, 1, "1",
       "factor applied to device_memory_gb so a small model sees the memory arithmetic of a large "
       "one (capacity = device_memory_gb * 1e9 * device_memory_scale)",
       false},
      {"device_arch", ToggleType::kEnum, ArchChoices(), 0, 0, "any",
       "compute capability of the recorded GPU (from the capture's manifest): every kernel toggle below names a "
       "library kernel, and a kernel whose library has no code for this architecture fails with class "
       "unsupported_arch before it runs (docs/engines.md has the table); any: not modelled, every kernel runs"},
      {"attention_kernel", ToggleType::kEnum, LibraryChoices("attention"), 0, 0, "any",
       "the library kernel decode attention stands for (GQA and dense MLA): its architectures are checked "
       "against device_arch; the arithmetic is attention_backend's"},
      {"prefill_attention_kernel", ToggleType::kEnum, LibraryChoices("attention"), 0, 0, "any",
       "the library kernel prefill attention stands for (checked against device_arch)"},
      {"dsa_kernel", ToggleType::kEnum, LibraryChoices("dsa"), 0, 0, "any",
       "the library kernel DeepSeek sparse attention's decode stands for (checked against device_arch)"},
      {"dsa_prefill_kernel", ToggleType::kEnum, LibraryChoices("dsa"), 0, 0, "any",
       "the library kernel DeepSeek sparse attention's prefill stands for (checked against device_arch)"},
      {"indexer_kernel", ToggleType::kEnum, LibraryChoices("indexer"), 0, 0, "any",
       "the library kernel the DSA lightning indexer's logits stand for (checked against device_arch)"},
      {"moe_kernel", ToggleType::kEnum, LibraryChoices("moe"), 0, 0, "any",
       "the library kernel the routed experts' GEMMs stand for (checked against device_arch); the arithmetic is "
       "moe_backend's"},
      {"shared_experts_fusion", ToggleType::kBool, {}, 0, 0, "false",
       "load the shared expert into the routed experts' weight stack as one more expert, as sglang does for "
       "DeepSeek-style MoE unless --disable-shared-experts-fusion: its tensors must have the routed experts' "
       "stored shape and dtype, else loading fails (the experts then still run as separate kernels)"},
      {"device", ToggleType::kEnum, {"cpu", "cuda"}, 0, 0, "cpu",
       "backend that runs the step's kernels: cpu (reference, always present) or cuda (the same kernel "
       "bodies on the GPU, device-side asserts; fails with 'no CUDA device' where there is none)",
       false},
      {"weights", ToggleType::kEnum, {"auto", "resident", "stream"}, 0, 0, "auto",
       "how the replaying host holds the weights (the same bits either way): resident (read in place from "
       "the mapped checkpoint, uploaded once on the GPU); stream (layer streaming: each layer's weights are "
       "mapped, sharded and on the GPU uploaded just before its kernels and released after them, so one "
       "layer's weights are in memory at a time); auto (stream when the checkpoint does not fit in the "
       "memory this process may use, or the weights do not fit on the GPU)",
       false},
  };
  // clang-format on
  return kTable;
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> last(b.size() + 1), row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) last[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      row[j] = std::min({last[j] + 1, row[j - 1] + 1, last[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    }
    std::swap(row, last);
  }
  return last[b.size()];
}

std::string Domain(const ToggleSpec& s) {
  switch (s.type) {
    case ToggleType::kEnum: {
      std::string out = "one of {";
      for (size_t i = 0; i < s.choices.size(); ++i) out += Cat(i ? ", " : "", s.choices[i]);
      return out + "}";
    }
    case ToggleType::kInt:
      return Cat("an integer in [", static_cast<int64_t>(s.min), ", ", static_cast<int64_t>(s.max), "]");
    case ToggleType::kFloat: return Cat("a number in [", s.min, ", ", s.max, "]");
    case ToggleType::kBool: return "true or false";
  }
  return "";
}

absl::Status UnknownToggle(std::string_view name) {
  std::string hint;
  size_t best = 4;
  for (const ToggleSpec& s : Table()) {
    const size_t d = EditDistance(name, s.name);
    if (d < best) {
      best = d;
      hint = Cat(" (did you mean '", s.name, "'?)");
    }
  }
  return absl::InvalidArgumentError(
      Cat("unknown toggle '", name, "'", hint, "; run 'crashreplay toggles' for the list"));
}

}  // namespace

std::span<const ToggleSpec> Toggles() { return Table(); }

const ToggleSpec* FindToggle(std::string_view name) {
  for (const ToggleSpec& s : Table()) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

std::string_view TypeName(ToggleType t) {
  switch (t) {
    case ToggleType::kEnum: return "enum";
    case ToggleType::kInt: return "int";
    case ToggleType::kFloat: return "float";
    case ToggleType::kBool: return "bool";
  }
  return "?";
}

std::string ToggleValueText(const ToggleValue& v) {
  if (const auto* s = std::get_if<std::string>(&v)) return *s;
  if (const auto* i = std::get_if<int64_t>(&v)) return Cat(*i);
  if (const auto* d = std::get_if<double>(&v)) {
    // Shortest text that reads back to the same double.
    char buf[40];
    for (int prec = 1; prec <= 17; ++prec) {
      std::snprintf(buf, sizeof buf, "%.*g", prec, *d);
      if (std::strtod(buf, nullptr) == *d) return buf;
    }
    return buf;
  }
  return std::get<bool>(v) ? "true" : "false";
}

// GCC 12 with -fsanitize=address reports a false -Wmaybe-uninitialized on
// moving a std::variant holding a std::string into a StatusOr.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
absl::StatusOr<ToggleValue> ParseToggleValue(const ToggleSpec& spec, std::string_view raw) {
  std::string_view text = Strip(raw);
  if (text.size() >= 2 && (text.front() == '"' || text.front() == '\'') && text.back() == text.front()) {
    text = text.substr(1, text.size() - 2);
  }
  auto bad = [&]() {
    return absl::InvalidArgumentError(Cat("toggle ", spec.name, ": '", text, "' is not ", Domain(spec)));
  };
  switch (spec.type) {
    case ToggleType::kEnum:
      for (std::string_view c : spec.choices) {
        if (c == text) return ToggleValue(std::string(c));
      }
      return bad();
    case ToggleType::kInt: {
      const std::string t(text);
      char* end = nullptr;
      errno = 0;
      const long long v = t.empty() ? 0 : std::strtoll(t.c_str(), &end, 10);
      if (t.empty() || errno != 0 || *end != '\0' || v < spec.min || v > spec.max) return bad();
      return ToggleValue(static_cast<int64_t>(v));
    }
    case ToggleType::kFloat: {
      const std::string t(text);
      char* end = nullptr;
      const double v = t.empty() ? 0 : std::strtod(t.c_str(), &end);
      if (t.empty() || *end != '\0' || !std::isfinite(v) || v < spec.min || v > spec.max) return bad();
      return ToggleValue(v);
    }
    case ToggleType::kBool:
      if (text == "true" || text == "1") return ToggleValue(true);
      if (text == "false" || text == "0") return ToggleValue(false);
      return bad();
  }
  return bad();
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

Config Config::Defaults() {
  Config c;
  for (const ToggleSpec& s : Table()) {
    auto v = ParseToggleValue(s, s.default_value);
    if (!v.ok()) std::abort();  // the table's own defaults must parse
    c.values_.emplace(std::string(s.name), *std::move(v));
  }
  return c;
}

absl::Status Config::Set(std::string_view name, std::string_view text) {
  const ToggleSpec* spec = FindToggle(name);
  if (spec == nullptr) return UnknownToggle(name);
  CR_ASSIGN_OR_RETURN(ToggleValue v, ParseToggleValue(*spec, text));
  values_.find(name)->second = std::move(v);
  return absl::OkStatus();
}

// --set, files and text all go through formats/config_file.h (the one
// parser of flat TOML); this class only checks names and domains.
absl::Status Config::ApplySetFlag(std::string_view assignment) {
  if (assignment.find('=') == std::string_view::npos) {
    return absl::InvalidArgumentError(Cat("--set expects name=value, got '", assignment, "'"));
  }
  CR_ASSIGN_OR_RETURN(auto kv, ParseSetFlag(assignment));
  return Set(kv.first, kv.second.ToDisplay());
}

absl::Status Config::ApplyParsed(const crashreplay::Config& parsed, std::string_view origin,
                                 std::vector<std::string>* notes) {
  auto engine = parsed.find("engine");
  if (engine != parsed.end()) {
    const std::string name = engine->second.ToDisplay();
    if (name != "crashreplay") {
      if (!HasVocabulary(name)) {
        return absl::InvalidArgumentError(Cat(origin, ": engine '", name,
                                              "' has no vocabulary here; the engines with one are sglang and vllm "
                                              "(or leave out `engine` for the replay's own toggle names)"));
      }
      EngineSettings settings;
      for (const auto& [k, v] : parsed) {
        if (k != "engine") settings.emplace_back(k, v.ToDisplay());
      }
      VocabResult result;
      if (absl::Status s = ApplyEngineSettings(name, settings, this, &result); !s.ok()) {
        return absl::InvalidArgumentError(Cat(origin, ": ", s.message()));
      }
      if (notes != nullptr) {
        for (std::string& n : result.notes) notes->push_back(Cat(origin, ": ", n));
      }
      return absl::OkStatus();
    }
  }
  for (const auto& [name, value] : parsed) {
    if (name == "engine") continue;
    absl::Status s = Set(name, value.ToDisplay());
    if (!s.ok()) return absl::InvalidArgumentError(Cat(origin, ": ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status Config::ApplyText(std::string_view text, std::string_view origin, std::vector<std::string>* notes) {
  CR_ASSIGN_OR_RETURN(crashreplay::Config parsed, ParseConfig(text, origin));
  return ApplyParsed(parsed, origin, notes);
}

absl::Status Config::ApplyFile(const std::string& path, std::vector<std::string>* notes) {
  CR_ASSIGN_OR_RETURN(crashreplay::Config parsed, ReadConfigFile(path));
  return ApplyParsed(parsed, path, notes);
}

const ToggleValue& Config::Get(std::string_view name) const {
  auto it = values_.find(name);
  if (it == values_.end()) std::abort();  // callers use names from the table
  return it->second;
}
const std::string& Config::Enum(std::string_view name) const { return std::get<std::string>(Get(name)); }
int64_t Config::Int(std::string_view name) const { return std::get<int64_t>(Get(name)); }
double Config::Float(std::string_view name) const { return std::get<double>(Get(name)); }
bool Config::Bool(std::string_view name) const { return std::get<bool>(Get(name)); }

std::vector<std::pair<std::string, std::string>> Config::Items() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const ToggleSpec& s : Table()) out.emplace_back(std::string(s.name), ToggleValueText(Get(s.name)));
  return out;
}

std::vector<std::string> Config::DiffNames(const Config& other) const {
  std::vector<std::string> out;
  for (const ToggleSpec& s : Table()) {
    if (Get(s.name) != other.Get(s.name)) out.emplace_back(s.name);
  }
  return out;
}

std::string Config::ToText() const {
  crashreplay::Config out;
  for (const ToggleSpec& t : Table()) {
    const ToggleValue& v = Get(t.name);
    if (const auto* e = std::get_if<std::string>(&v)) out[std::string(t.name)] = ConfigValue::String(*e);
    if (const auto* i = std::get_if<int64_t>(&v)) out[std::string(t.name)] = ConfigValue::Int(*i);
    if (const auto* d = std::get_if<double>(&v)) out[std::string(t.name)] = ConfigValue::Float(*d);
    if (const auto* b = std::get_if<bool>(&v)) out[std::string(t.name)] = ConfigValue::Bool(*b);
  }
  return FormatConfig(out);
}

EngineConfig ResolveConfig(const Config& c) {
  EngineConfig e;
  const std::string& ab = c.Enum("attention_backend");
  e.attention_backend = ab == "flashdecode" ? AttentionBackend::kFlashDecode
                        : ab == "paged64"   ? AttentionBackend::kPaged64
                                            : AttentionBackend::kReference;
  e.gemm_backend =
      c.Enum("gemm_backend") == "fused_blockscaled" ? GemmBackend::kFusedBlockScaled : GemmBackend::kDequantMatmul;
  e.moe_backend =
      c.Enum("moe_backend") == "fused_blockscaled" ? GemmBackend::kFusedBlockScaled : GemmBackend::kDequantMatmul;
  const std::string& sf = c.Enum("scale_format");
  e.scale_format = sf == "fp32"             ? ScaleFormat::kFp32
                   : sf == "ue8m0_requant"  ? ScaleFormat::kUe8m0Requant
                   : sf == "ue8m0"          ? ScaleFormat::kUe8m0
                   : sf == "deepgemm_ue8m0" ? ScaleFormat::kDeepGemmUe8m0
                                            : ScaleFormat::kCheckpoint;
  e.nvfp4_activation = c.Enum("nvfp4_activation") == "w4a16" ? Nvfp4Activation::kW4a16 : Nvfp4Activation::kW4a4;
  e.kv_cache_dtype = c.Enum("kv_cache_dtype") == "fp8_e4m3" ? KvCacheDType::kFp8E4m3 : KvCacheDType::kBf16;
  const std::string act = c.Enum("activation_dtype");
  e.activation_dtype = act == "bf16"   ? ActivationDType::kBf16
                       : act == "fp16" ? ActivationDType::kF16
                                       : ActivationDType::kF32;
  e.mla_decode = c.Enum("mla_decode") == "absorbed" ? MlaDecode::kAbsorbed : MlaDecode::kNaive;
  e.dsa_decode = c.Enum("dsa_decode") == "tiled64" ? DsaDecode::kTiled64 : DsaDecode::kReference;
  e.index_cache_dtype = c.Enum("index_cache_dtype") == "fp8_e4m3" ? KvCacheDType::kFp8E4m3 : KvCacheDType::kBf16;
  e.page_size = static_cast<int>(c.Int("page_size"));
  e.mem_fraction_static = c.Float("mem_fraction_static");
  e.cuda_graph_max_bs = static_cast<int>(c.Int("cuda_graph_max_bs"));
  e.sampling_backend =
      c.Enum("sampling_backend") == "threshold" ? SamplingBackend::kThreshold : SamplingBackend::kSorted;
  const std::string& rc = c.Enum("rope_config");
  e.rope_config = rc == "legacy"            ? RopeConfig::kLegacy
                  : rc == "rope_parameters" ? RopeConfig::kRopeParameters
                                            : RopeConfig::kCheckpoint;
  e.tp_size = static_cast<int>(c.Int("tp_size"));
  e.moe_parallel = c.Enum("moe_parallel") == "expert" ? MoeParallel::kExpert : MoeParallel::kTensor;
  e.max_running_requests = static_cast<int>(c.Int("max_running_requests"));
  e.max_total_tokens = static_cast<int>(c.Int("max_total_tokens"));
  e.device_memory_gb = c.Float("device_memory_gb");
  e.device_memory_scale = c.Float("device_memory_scale");
  e.device = c.Enum("device");
  e.device_arch = ParseArch(c.Enum("device_arch"));
  e.attention_kernel = c.Enum("attention_kernel");
  e.prefill_attention_kernel = c.Enum("prefill_attention_kernel");
  e.dsa_kernel = c.Enum("dsa_kernel");
  e.dsa_prefill_kernel = c.Enum("dsa_prefill_kernel");
  e.indexer_kernel = c.Enum("indexer_kernel");
  e.moe_kernel = c.Enum("moe_kernel");
  e.shared_experts_fusion = c.Bool("shared_experts_fusion");
  const std::string& w = c.Enum("weights");
  e.weights = w == "resident" ? WeightResidency::kResident
              : w == "stream" ? WeightResidency::kStream
                              : WeightResidency::kAuto;
  return e;
}

}  // namespace crashreplay::replay
