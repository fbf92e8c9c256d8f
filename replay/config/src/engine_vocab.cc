#include "crashreplay/replay/config/engine_vocab.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>

#include "crashreplay/base/text.h"
#include "crashreplay/replay/config/kernel_archs.h"
#include "crashreplay/replay/config/toggles.h"

namespace crashreplay::replay {
namespace {

using text::Cat;

// sglang: ServerArgs field names (python/sglang/srt/server_args.py, late
// 2026: ATTENTION_BACKEND_CHOICES, DSA_CHOICES, MOE_RUNNER_BACKEND_CHOICES)
// and the environment its deep_gemm_wrapper/configurer.py reads.
// vLLM: the flattened VllmConfig the adapter records and vllm/envs.py.
// Order matters: a later row of the same replay toggle wins.
const std::vector<VocabRow>& Rows() {
  // clang-format off: a table, one row a line as written
  static const std::vector<VocabRow> kRows = {
      // ---- sglang: attention (prefill and decode unless overridden below) ----
      {"sglang", "attention_backend", "triton",
       {{"attention_backend", "reference"}, {"attention_kernel", "triton"}, {"prefill_attention_kernel", "triton"}},
       "Triton decode/extend kernels"},
      {"sglang", "attention_backend", "torch_native",
       {{"attention_backend", "reference"}, {"attention_kernel", "torch_native"},
        {"prefill_attention_kernel", "torch_native"}},
       "PyTorch SDPA"},
      {"sglang", "attention_backend", "flashinfer",
       {{"attention_backend", "flashdecode"}, {"attention_kernel", "flashinfer"},
        {"prefill_attention_kernel", "flashinfer"}},
       "FlashInfer: split-KV decode with a merge of partial softmaxes"},
      {"sglang", "attention_backend", "fa3",
       {{"attention_backend", "flashdecode"}, {"attention_kernel", "fa3"}, {"prefill_attention_kernel", "fa3"}},
       "FlashAttention 3 (split-KV decode), SM80..SM90"},
      {"sglang", "attention_backend", "flashmla",
       {{"attention_backend", "paged64"}, {"attention_kernel", "flashmla_dense"},
        {"prefill_attention_kernel", "flashmla_dense"}},
       "FlashMLA dense decode: one tile per 64-token page, SM90a"},
      {"sglang", "attention_backend", "trtllm_mla",
       {{"attention_backend", "flashdecode"}, {"attention_kernel", "trtllm_gen"},
        {"prefill_attention_kernel", "trtllm_gen"}},
       "TensorRT-LLM gen MLA, SM100 family"},
      {"sglang", "attention_backend", "trtllm_mha",
       {{"attention_backend", "flashdecode"}, {"attention_kernel", "trtllm_gen"},
        {"prefill_attention_kernel", "trtllm_gen"}},
       "TensorRT-LLM gen MHA, SM100 family"},
      {"sglang", "attention_backend", "cutlass_mla",
       {{"attention_backend", "flashdecode"}, {"attention_kernel", "cutlass_mla"}},
       "CUTLASS MLA decode, SM100 family"},
      {"sglang", "attention_backend", "aiter",
       {{"attention_kernel", "aiter"}, {"prefill_attention_kernel", "aiter"}}, "AMD AITER (ROCm only)"},
      {"sglang", "attention_backend", "dsa", {},
       "DeepSeek sparse attention: the kernels come from dsa_prefill_backend/dsa_decode_backend"},
      {"sglang", "attention_backend", "nsa", {}, "the older name of dsa"},
      {"sglang", "prefill_attention_backend", "triton", {{"prefill_attention_kernel", "triton"}},
       "prefill kernel only (the replay's prefill arithmetic is the reference kernel's)"},
      {"sglang", "prefill_attention_backend", "torch_native", {{"prefill_attention_kernel", "torch_native"}}, ""},
      {"sglang", "prefill_attention_backend", "flashinfer", {{"prefill_attention_kernel", "flashinfer"}}, ""},
      {"sglang", "prefill_attention_backend", "fa3", {{"prefill_attention_kernel", "fa3"}}, ""},
      {"sglang", "prefill_attention_backend", "flashmla", {{"prefill_attention_kernel", "flashmla_dense"}}, ""},
      {"sglang", "prefill_attention_backend", "trtllm_mla", {{"prefill_attention_kernel", "trtllm_gen"}}, ""},
      {"sglang", "prefill_attention_backend", "trtllm_mha", {{"prefill_attention_kernel", "trtllm_gen"}}, ""},
      {"sglang", "decode_attention_backend", "triton",
       {{"attention_backend", "reference"}, {"attention_kernel", "triton"}}, "decode kernel only"},
      {"sglang", "decode_attention_backend", "torch_native",
       {{"attention_backend", "reference"}, {"attention_kernel", "torch_native"}}, ""},
      {"sglang", "decode_attention_backend", "flashinfer",
       {{"attention_backend", "flashdecode"}, {"attention_kernel", "flashinfer"}}, ""},
      {"sglang", "decode_attention_backend", "fa3",
       {{"attention_backend", "flashdecode"}, {"attention_kernel", "fa3"}}, ""},
      {"sglang", "decode_attention_backend", "flashmla",
       {{"attention_backend", "paged64"}, {"attention_kernel", "flashmla_dense"}}, ""},
      {"sglang", "decode_attention_backend", "trtllm_mla",
       {{"attention_backend", "flashdecode"}, {"attention_kernel", "trtllm_gen"}}, ""},
      {"sglang", "decode_attention_backend", "trtllm_mha",
       {{"attention_backend", "flashdecode"}, {"attention_kernel", "trtllm_gen"}}, ""},
      {"sglang", "decode_attention_backend", "cutlass_mla",
       {{"attention_backend", "flashdecode"}, {"attention_kernel", "cutlass_mla"}}, ""},
      // ---- sglang: DeepSeek sparse attention (older nsa_* first, dsa_* win) ----
#define CR_DSA_ROWS(KEY, TOGGLE)                                                                                \
  {"sglang", KEY, "flashmla_sparse", {{TOGGLE, "flashmla_sparse"}}, "FlashMLA sparse kernels, SM90a/SM100f"},    \
      {"sglang", KEY, "flashmla_sparse_q8", {{TOGGLE, "flashmla_sparse"}}, "FlashMLA sparse, fp8 queries"},      \
      {"sglang", KEY, "flashmla_kv", {{TOGGLE, "flashmla_sparse"}},                                             \
       "FlashMLA sparse decode over the fp8 paged latent cache (656 bytes per token)"},                         \
      {"sglang", KEY, "flashmla_auto", {{TOGGLE, "flashmla_sparse"}}, "FlashMLA, sparse or kv chosen per batch"}, \
      {"sglang", KEY, "fa3", {{TOGGLE, "fa3_sparse"}}, "FlashAttention 3 over the selected tokens, SM80..SM90"},  \
      {"sglang", KEY, "tilelang", {{TOGGLE, "tilelang"}}, "TileLang sparse MLA (169984 B shared memory)"},      \
      {"sglang", KEY, "trtllm", {{TOGGLE, "trtllm_gen_sparse"}}, "TensorRT-LLM gen sparse MLA, SM100 family"},  \
      {"sglang", KEY, "aiter", {{TOGGLE, "aiter_sparse"}}, "AMD AITER (ROCm only)"},                            \
      {"sglang", KEY, "triton", {{TOGGLE, "triton_sparse"}}, "Triton sparse MLA (portable)"}
      CR_DSA_ROWS("nsa_prefill_backend", "dsa_prefill_kernel"),
      CR_DSA_ROWS("nsa_decode_backend", "dsa_kernel"),
      CR_DSA_ROWS("dsa_prefill_backend", "dsa_prefill_kernel"),
      CR_DSA_ROWS("dsa_decode_backend", "dsa_kernel"),
#undef CR_DSA_ROWS
      // The decode arithmetic: FlashMLA's kernels walk the selection in tiles
      // of 64 with bf16 operands (dsa_decode = tiled64); the others as the
      // reference.
      {"sglang", "nsa_decode_backend", "flashmla_kv", {{"dsa_decode", "tiled64"}}, ""},
      {"sglang", "nsa_decode_backend", "flashmla_sparse", {{"dsa_decode", "tiled64"}}, ""},
      {"sglang", "nsa_decode_backend", "flashmla_auto", {{"dsa_decode", "tiled64"}}, ""},
      {"sglang", "nsa_decode_backend", "fa3", {{"dsa_decode", "reference"}}, ""},
      {"sglang", "nsa_decode_backend", "tilelang", {{"dsa_decode", "reference"}}, ""},
      {"sglang", "nsa_decode_backend", "trtllm", {{"dsa_decode", "reference"}}, ""},
      {"sglang", "dsa_decode_backend", "flashmla_kv", {{"dsa_decode", "tiled64"}}, ""},
      {"sglang", "dsa_decode_backend", "flashmla_sparse", {{"dsa_decode", "tiled64"}}, ""},
      {"sglang", "dsa_decode_backend", "flashmla_auto", {{"dsa_decode", "tiled64"}}, ""},
      {"sglang", "dsa_decode_backend", "fa3", {{"dsa_decode", "reference"}}, ""},
      {"sglang", "dsa_decode_backend", "tilelang", {{"dsa_decode", "reference"}}, ""},
      {"sglang", "dsa_decode_backend", "trtllm", {{"dsa_decode", "reference"}}, ""},
      {"sglang", "dsa_decode_backend", "triton", {{"dsa_decode", "reference"}}, ""},
      {"sglang", "nsa_decode_backend", "triton", {{"dsa_decode", "reference"}}, ""},
      // ---- sglang: MoE ----
      {"sglang", "moe_runner_backend", "auto", {}, "chosen by sglang at run time; the replay keeps moe_backend"},
      {"sglang", "moe_runner_backend", "deep_gemm",
       {{"moe_backend", "fused_blockscaled"}, {"moe_kernel", "deep_gemm"}}, "DeepGEMM grouped GEMM, SM90/SM100"},
      {"sglang", "moe_runner_backend", "triton", {{"moe_backend", "fused_blockscaled"}, {"moe_kernel", "triton_moe"}},
       "Triton fused MoE, block scales applied per block"},
      {"sglang", "moe_runner_backend", "triton_kernel",
       {{"moe_backend", "fused_blockscaled"}, {"moe_kernel", "triton_moe"}}, "triton_kernels MoE"},
      {"sglang", "moe_runner_backend", "flashinfer_cutlass",
       {{"moe_backend", "fused_blockscaled"}, {"moe_kernel", "flashinfer_cutlass"}},
       "FlashInfer CUTLASS fused MoE (fp4 x fp4 for NVFP4)"},
      {"sglang", "moe_runner_backend", "flashinfer_trtllm",
       {{"moe_backend", "fused_blockscaled"}, {"moe_kernel", "flashinfer_trtllm"}}, "trtllm-gen fused MoE, SM100"},
      {"sglang", "moe_runner_backend", "cutlass", {{"moe_backend", "fused_blockscaled"}, {"moe_kernel", "cutlass_moe"}},
       "CUTLASS grouped GEMM"},
      {"sglang", "moe_runner_backend", "marlin",
       {{"moe_backend", "dequant_matmul"}, {"nvfp4_activation", "w4a16"}, {"moe_kernel", "marlin"}},
       "Marlin: weights dequantized, bf16 activations"},
      {"sglang", "disable_shared_experts_fusion", "false", {{"shared_experts_fusion", "true"}},
       "the shared expert is loaded into the routed experts' weights as one more expert"},
      {"sglang", "disable_shared_experts_fusion", "true", {{"shared_experts_fusion", "false"}},
       "the shared expert stays a separate MLP"},
      // ---- sglang: memory, KV cache, graphs, parallelism ----
      {"sglang", "kv_cache_dtype", "auto", {{"kv_cache_dtype", "bf16"}}, "the model's dtype (bf16)"},
      {"sglang", "kv_cache_dtype", "bfloat16", {{"kv_cache_dtype", "bf16"}}, ""},
      {"sglang", "kv_cache_dtype", "bf16", {{"kv_cache_dtype", "bf16"}}, ""},
      {"sglang", "kv_cache_dtype", "fp8_e4m3", {{"kv_cache_dtype", "fp8_e4m3"}}, "fp8 e4m3 KV cache"},
      {"sglang", "page_size", "*", {{"page_size", "$"}}, "tokens per KV page"},
      {"sglang", "mem_fraction_static", "*", {{"mem_fraction_static", "$"}}, "weights + KV pool share of memory"},
      {"sglang", "max_total_tokens", "*", {{"max_total_tokens", "$"}}, "KV pool cap in tokens"},
      {"sglang", "max_running_requests", "*", {{"max_running_requests", "$"}}, "batch size cap"},
      {"sglang", "scheduler.max_running_requests", "*", {{"max_running_requests", "$"}},
       "the cap the scheduler settled on at run time (recorded by the adapter; wins over the argument)"},
      {"sglang", "cuda_graph_max_bs", "*", {{"cuda_graph_max_bs", "$"}}, "largest captured batch"},
      {"sglang", "cuda_graph_max_bs_decode", "*", {{"cuda_graph_max_bs", "$"}},
       "largest captured decode batch (wins over cuda_graph_max_bs)"},
      {"sglang", "disable_cuda_graph", "true", {{"cuda_graph_max_bs", "0"}}, "no CUDA graphs"},
      {"sglang", "disable_cuda_graph", "false", {}, ""},
      {"sglang", "chunked_prefill_size", "*", {},
       "a capture's steps are the chunks sglang made, which the replay follows; `run` does not chunk"},
      {"sglang", "tp_size", "*", {{"tp_size", "$"}}, "tensor-parallel ranks (emulated)"},
      {"sglang", "ep_size", "1", {{"moe_parallel", "tensor"}}, "experts split along their intermediate dim"},
      {"sglang", "ep_size", "*", {{"moe_parallel", "expert"}}, "whole experts per rank"},
      {"sglang", "enable_ep_moe", "true", {{"moe_parallel", "expert"}}, "older spelling of ep_size = tp_size"},
      {"sglang", "enable_ep_moe", "false", {}, ""},
      // sglang's resolved decision, recorded by the adapter when it can import it.
      {"sglang", "deepgemm.DEEPGEMM_SCALE_UE8M0", "true", {{"scale_format", "deepgemm_ue8m0"}},
       "DeepGEMM reads UE8M0 scales (FP8 block weights requantized at load)"},
      {"sglang", "deepgemm.DEEPGEMM_SCALE_UE8M0", "false", {{"scale_format", "checkpoint"}}, ""},
      // ---- vLLM ----
#define CR_VLLM_ATTN(KEY)                                                                                      \
  {"vllm", KEY, "FLASH_ATTN", {{"attention_backend", "flashdecode"}}, "FlashAttention (FA2, or FA3 on SM90)"}, \
      {"vllm", KEY, "FLASHINFER", {{"attention_backend", "flashdecode"}, {"attention_kernel", "flashinfer"}}, ""}, \
      {"vllm", KEY, "TRITON_ATTN", {{"attention_backend", "reference"}, {"attention_kernel", "triton"}}, ""},    \
      {"vllm", KEY, "FLASHMLA", {{"attention_backend", "paged64"}, {"attention_kernel", "flashmla_dense"}}, ""}, \
      {"vllm", KEY, "FLASHMLA_SPARSE", {{"dsa_kernel", "flashmla_sparse"}}, ""},                                 \
      {"vllm", KEY, "CUTLASS_MLA", {{"attention_backend", "flashdecode"}, {"attention_kernel", "cutlass_mla"}}, ""}, \
      {"vllm", KEY, "TRITON_MLA", {{"attention_backend", "reference"}, {"attention_kernel", "triton"}}, ""},      \
      {"vllm", KEY, "FLASHINFER_MLA", {{"attention_backend", "flashdecode"}, {"attention_kernel", "trtllm_gen"}}, ""}, \
      {"vllm", KEY, "FLASH_ATTN_MLA", {{"attention_backend", "flashdecode"}, {"attention_kernel", "fa3"}}, ""}
      CR_VLLM_ATTN("env.VLLM_ATTENTION_BACKEND"),
      CR_VLLM_ATTN("attention_config.backend"),
#undef CR_VLLM_ATTN
      {"vllm", "cache_config.block_size", "*", {{"page_size", "$"}}, "tokens per KV block"},
      {"vllm", "cache_config.cache_dtype", "auto", {{"kv_cache_dtype", "bf16"}}, ""},
      {"vllm", "cache_config.cache_dtype", "bfloat16", {{"kv_cache_dtype", "bf16"}}, ""},
      {"vllm", "cache_config.cache_dtype", "fp8", {{"kv_cache_dtype", "fp8_e4m3"}}, "fp8 means e4m3 on CUDA"},
      {"vllm", "cache_config.cache_dtype", "fp8_e4m3", {{"kv_cache_dtype", "fp8_e4m3"}}, ""},
      {"vllm", "cache_config.gpu_memory_utilization", "*", {{"mem_fraction_static", "$"}},
       "vLLM's share of the device for the whole instance; the planner reads it as weights + KV share"},
      {"vllm", "parallel_config.tensor_parallel_size", "*", {{"tp_size", "$"}}, ""},
      {"vllm", "parallel_config.enable_expert_parallel", "true", {{"moe_parallel", "expert"}}, ""},
      {"vllm", "parallel_config.enable_expert_parallel", "false", {{"moe_parallel", "tensor"}}, ""},
      {"vllm", "scheduler_config.max_num_seqs", "*", {{"max_running_requests", "$"}}, ""},
      {"vllm", "compilation_config.max_capture_size", "*", {{"cuda_graph_max_bs", "$"}}, "older name"},
      {"vllm", "compilation_config.max_cudagraph_capture_size", "*", {{"cuda_graph_max_bs", "$"}}, ""},
      {"vllm", "model_config.enforce_eager", "true", {{"cuda_graph_max_bs", "0"}}, "no CUDA graphs"},
      {"vllm", "model_config.enforce_eager", "false", {}, ""},
      {"vllm", "env.VLLM_USE_DEEP_GEMM", "true", {{"moe_kernel", "deep_gemm"}}, "DeepGEMM for FP8 block MoE"},
      {"vllm", "env.VLLM_USE_DEEP_GEMM", "false", {}, ""},
  };
  // clang-format on
  return kRows;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Python and TOML spell booleans differently; "1"/"0" are the environment's.
std::string Canonical(std::string_view v) {
  const std::string l = Lower(v);
  if (l == "true" || l == "1" || l == "yes" || l == "on") return "true";
  if (l == "false" || l == "0" || l == "no" || l == "off") return "false";
  return std::string(v);
}

bool Unset(std::string_view v) { return v.empty() || v == "None" || v == "none" || v == "null"; }

}  // namespace

std::span<const VocabRow> EngineVocabulary() { return Rows(); }

bool HasVocabulary(std::string_view engine) {
  return std::any_of(Rows().begin(), Rows().end(), [&](const VocabRow& r) { return r.engine == engine; });
}

absl::Status ApplyEngineSettings(std::string_view engine, const EngineSettings& settings, Config* config,
                                 VocabResult* result, bool lenient) {
  std::map<std::string, std::string, std::less<>> given;
  for (const auto& [k, v] : settings) given[k] = v;
  auto set = [&](std::string_view toggle, std::string_view value, std::string_view origin) -> absl::Status {
    if (absl::Status s = config->Set(toggle, value); !s.ok()) {
      if (!lenient) return absl::InvalidArgumentError(Cat(engine, " ", origin, ": ", s.message()));
      result->notes.push_back(Cat(engine, " recorded ", origin, ", which the replay engine cannot model (", s.message(),
                                  "); replaying with ", toggle, " = ", ToggleValueText(config->Get(toggle))));
      return absl::OkStatus();
    }
    if (std::find(result->keys.begin(), result->keys.end(), toggle) == result->keys.end()) {
      result->keys.emplace_back(toggle);
    }
    return absl::OkStatus();
  };
  // The replay's own toggles first, so a device_arch given beside the engine's
  // words is what the derived decisions below see.
  for (const auto& [k, v] : given) {
    if (k.rfind("crashreplay.", 0) == 0) {
      if (absl::Status s = set(std::string_view(k).substr(12), v, k); !s.ok()) return s;
    }
  }
  // Keys the table knows: their values are modelled or noted.
  std::map<std::string, bool, std::less<>> known;
  for (const VocabRow& r : Rows()) {
    if (r.engine == engine) known[std::string(r.key)] = true;
  }
  for (const auto& [k, v] : given) {
    if (!known.count(k)) continue;
    if (Unset(v)) {
      // Unset means "inherit" for a backend (decode_attention_backend falls
      // back to attention_backend) and "no cap" for max_total_tokens, as the
      // replay's defaults do; a number the engine sizes at run time
      // (mem_fraction_static, cuda_graph_max_bs, ...) is worth a note.
      const bool sized_at_run_time = k != "max_total_tokens" && !given.count("scheduler." + k) &&
                                     std::any_of(Rows().begin(), Rows().end(), [&](const VocabRow& r) {
                                       return r.engine == engine && r.key == k && r.value == "*" && !r.sets.empty();
                                     });
      if (sized_at_run_time) {
        result->notes.push_back(Cat(engine, " left ", k, " unset (decided at run time); the replay keeps its value"));
      }
      continue;
    }
    const std::string cv = Canonical(v);
    bool matched = false;
    for (const VocabRow& r : Rows()) {
      if (r.engine != engine || r.key != k || (r.value != "*" && r.value != cv)) continue;
      if (r.value == "*" && std::any_of(Rows().begin(), Rows().end(), [&](const VocabRow& o) {
            return o.engine == engine && o.key == k && o.value == cv;
          })) {
        continue;  // an exact row of the same key decides
      }
      matched = true;
      break;
    }
    if (!matched) {
      result->notes.push_back(Cat(engine, " recorded ", k, " = ", v,
                                  ", which the replay engine cannot model; the step replays without it (`crashreplay "
                                  "toggles --engine ",
                                  engine, "` lists what it models)"));
    }
  }
  // Rows in table order: a later row of the same toggle wins.
  for (const VocabRow& r : Rows()) {
    if (r.engine != engine) continue;
    auto it = given.find(r.key);
    if (it == given.end() || Unset(it->second)) continue;
    const std::string cv = Canonical(it->second);
    if (r.value == "*") {
      const bool exact = std::any_of(Rows().begin(), Rows().end(), [&](const VocabRow& o) {
        return o.engine == engine && o.key == r.key && o.value == cv;
      });
      if (exact) continue;
    } else if (r.value != cv) {
      continue;
    }
    for (const auto& [toggle, value] : r.sets) {
      if (absl::Status s =
              set(toggle, value == "$" ? std::string_view(it->second) : value, Cat(r.key, " = ", it->second));
          !s.ok()) {
        return s;
      }
    }
  }
  // Both engines run MLA decode over the latent cache with W_UK folded into
  // the query (sglang's forward_absorb, vLLM's MLA backends): the absorbed form.
  if (absl::Status s = set("mla_decode", "absorbed", "MLA decode (always the absorbed form)"); !s.ok()) return s;
  // sglang's DeepGEMM scale decision (layers/deep_gemm_wrapper/configurer.py):
  // DEEPGEMM_SCALE_UE8M0 = ENABLE_JIT_DEEPGEMM and the device is SM100 or
  // SM120/121; ENABLE_JIT_DEEPGEMM = SGLANG_ENABLE_JIT_DEEPGEMM (older
  // SGL_ENABLE_JIT_DEEPGEMM, default on) and SM90 or newer. A recorded
  // deepgemm.DEEPGEMM_SCALE_UE8M0 is sglang's own answer and wins (above).
  if (engine == "sglang" && !given.count("deepgemm.DEEPGEMM_SCALE_UE8M0")) {
    std::optional<bool> jit;
    for (const char* k : {"env.SGL_ENABLE_JIT_DEEPGEMM", "env.SGLANG_ENABLE_JIT_DEEPGEMM"}) {
      auto it = given.find(k);
      if (it != given.end() && !Unset(it->second)) jit = Canonical(it->second) == "true";
    }
    const int arch = ParseArch(config->Enum("device_arch"));
    const bool blackwell = arch == 100 || arch == 103 || arch == 120 || arch == 121;
    if (arch == 0) {
      if (jit.value_or(false)) {
        result->notes.push_back(
            "sglang's DeepGEMM scale format (UE8M0 on SM100/SM120) depends on the device, and "
            "device_arch is any: scale_format keeps its value");
      }
    } else {
      const bool ue8m0 = jit.value_or(true) && arch >= 90 && blackwell;
      if (absl::Status s = set(
              "scale_format", ue8m0 ? "deepgemm_ue8m0" : "checkpoint",
              Cat("DEEPGEMM_SCALE_UE8M0 (JIT DeepGEMM ", jit.value_or(true) ? "on" : "off", ", ", ArchName(arch), ")"));
          !s.ok()) {
        return s;
      }
      if (ue8m0) {
        result->notes.push_back(Cat("sglang on ", ArchName(arch), " with JIT DeepGEMM ",
                                    jit.has_value() ? "on" : "on (its default)",
                                    " reads weight scales as UE8M0: scale_format = deepgemm_ue8m0 "
                                    "(SGLANG_ENABLE_JIT_DEEPGEMM=0 turns it off)"));
      }
    }
  }
  // vLLM: VLLM_USE_DEEP_GEMM_E8M0 takes effect only where DeepGEMM runs.
  if (engine == "vllm") {
    auto dg = given.find("env.VLLM_USE_DEEP_GEMM");
    auto e8 = given.find("env.VLLM_USE_DEEP_GEMM_E8M0");
    if (dg != given.end() && e8 != given.end() && Canonical(dg->second) == "true" && Canonical(e8->second) == "true") {
      if (absl::Status s = set("scale_format", "deepgemm_ue8m0", "VLLM_USE_DEEP_GEMM_E8M0"); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace crashreplay::replay
