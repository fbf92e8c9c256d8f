#include "crashreplay/replay/config/kernel_archs.h"

#include <algorithm>
#include <charconv>

#include "crashreplay/base/text.h"

namespace crashreplay::replay {

using text::Cat;

// Every entry's architecture list comes from the library's own dispatch or
// build code, named beside it. "sm_100f" (a family target) covers 10.x
// (sm_100, sm_103); "sm_90a" is 9.0 only. A library built per architecture
// has no code for the others, whatever their compute capability.
std::span<const KernelLibrary> KernelLibraries() {
  // clang-format off: a table, one row a line as written
  static const std::vector<KernelLibrary> kTable = {
      // Portable kernels: Triton JIT-compiles for the device it runs on; the
      // PyTorch reference ops run anywhere PyTorch does.
      {"triton", "attention", true, {}, "Triton attention (sglang triton backend, vLLM TRITON_ATTN/TRITON_MLA)", ""},
      {"torch_native", "attention", true, {}, "PyTorch SDPA reference attention (sglang torch_native)", ""},
      // FlashInfer ships SM75..SM121 decode/prefill kernels (its JIT targets the
      // running device; flashinfer/jit/core.py compiles for the current arch).
      {"flashinfer", "attention", true, {}, "FlashInfer batch decode/prefill (sglang flashinfer, vLLM FLASHINFER)",
       ""},
      // FlashAttention 3 is a Hopper kernel; sglang refuses it outside SM80..SM90
      // (server_args.py: "FlashAttention v3 Backend requires SM>=80 and SM<=90").
      {"fa3", "attention", false, {80, 86, 87, 89, 90}, "FlashAttention 3 (sglang fa3, vLLM FLASH_ATTN v3)",
       "FlashAttention v3 Backend requires SM>=80 and SM<=90"},
      // FlashMLA dense decode (flash_mla_with_kvcache over a bf16 latent cache):
      // csrc/api/dense_decode.h dispatches sm90a only ("Dense decode MLA is only
      // supported on SM90a architecture"); page block 64, head dims 576/512.
      {"flashmla_dense", "attention", false, {90}, "FlashMLA dense MLA decode (sglang flashmla, vLLM FLASHMLA)",
       "Dense decode MLA is only supported on SM90a architecture"},
      // TensorRT-LLM gen (trtllm-gen) FMHA/MLA cubins exist for SM100 family
      // only (fmhaRunner.cuh: "Unsupported architecture" on SM120, sglang#37105).
      {"trtllm_gen", "attention", false, {100, 103},
       "TensorRT-LLM gen FMHA/MLA (sglang trtllm_mha/trtllm_mla, DSA trtllm, vLLM FLASHINFER_MLA)",
       "Error in function 'TllmGenFmhaRunner' at fmhaRunner.cuh:37: Unsupported architecture"},
      // CUTLASS MLA decode: an SM100 kernel (sglang cutlass_mla asserts
      // Blackwell datacenter; vLLM CUTLASS_MLA requires compute capability 10.x).
      {"cutlass_mla", "attention", false, {100, 103}, "CUTLASS SM100 MLA decode (sglang cutlass_mla, vLLM CUTLASS_MLA)",
       "CUTLASS MLA requires an SM100 (Blackwell datacenter) device"},
      // AITER is AMD's kernel library: no CUDA architecture at all.
      {"aiter", "attention", false, {}, "AMD AITER attention (ROCm only)", "aiter kernels run on ROCm devices only"},
      // FlashMLA sparse decode/prefill (DeepSeek sparse attention, fp8 656-byte
      // KV): csrc/api/sparse_decode.h and sparse_fwd.h dispatch sm100f and
      // sm90a ("Unsupported architecture for sparse decode fwd"; sglang's
      // flash_mla_sm120.py: on SM120 the flash_mla CUDA kernel is not available).
      {"flashmla_sparse", "dsa", false, {90, 100, 103},
       "FlashMLA sparse MLA decode/prefill (sglang DSA flashmla_kv/flashmla_sparse, vLLM FLASHMLA_SPARSE)",
       "Unsupported architecture for sparse decode fwd"},
      // FA3 as sglang's DSA backend: the same Hopper-only build as above.
      {"fa3_sparse", "dsa", false, {80, 86, 87, 89, 90}, "FlashAttention 3 over the selected tokens (sglang DSA fa3)",
       "FlashAttention v3 Backend requires SM>=80 and SM<=90"},
      // TileLang sparse MLA: JIT for the device, but its tile needs 169984 bytes
      // of shared memory per block, more than SM120's 101376
      // ("Failed to set the allowed dynamic shared memory size to 169984",
      // sglang#39302); modelled as having no kernel for SM120/121 and below SM90.
      {"tilelang", "dsa", false, {90, 100, 103}, "TileLang sparse MLA (sglang DSA tilelang)",
       "Failed to set the allowed dynamic shared memory size to 169984"},
      {"trtllm_gen_sparse", "dsa", false, {100, 103}, "TensorRT-LLM gen sparse MLA (sglang DSA trtllm)",
       "Error in function 'TllmGenFmhaRunner' at fmhaRunner.cuh:37: Unsupported architecture"},
      {"triton_sparse", "dsa", true, {}, "Triton sparse MLA (portable)", ""},
      {"aiter_sparse", "dsa", false, {}, "AMD AITER sparse MLA (ROCm only)", "aiter kernels run on ROCm devices only"},
      // The lightning indexer's logits: DeepGEMM csrc/apis/attention.hpp
      // (fp8_mqa_logits, fp8_paged_mqa_logits, get_paged_mqa_logits_metadata)
      // dispatch arch_major 9 or 10 only: DG_HOST_UNREACHABLE("Unsupported architecture").
      {"deepgemm_mqa_logits", "indexer", false, {90, 100, 103},
       "DeepGEMM fp8_paged_mqa_logits / fp8_mqa_logits (DSA indexer)", "Unsupported architecture"},
      {"triton_indexer", "indexer", true, {}, "Triton/PyTorch indexer logits (portable fallback)", ""},
      // MoE expert GEMMs.
      // DeepGEMM grouped GEMMs are JIT-built for SM90 and SM100 (csrc/jit:
      // arch_major 9 or 10); sglang enables it from SM90 up (configurer.py).
      {"deep_gemm", "moe", false, {90, 100, 103}, "DeepGEMM grouped GEMM (sglang deep_gemm, vLLM VLLM_USE_DEEP_GEMM)",
       "Unsupported architecture"},
      {"triton_moe", "moe", true, {}, "Triton fused MoE (sglang triton, vLLM default)", ""},
      // FlashInfer CUTLASS fused MoE (NVFP4/FP8): built for SM90, SM100 and SM120
      // (flashinfer/fused_moe/core.py: gen_cutlass_fused_moe_sm{90,100,120}_module).
      {"flashinfer_cutlass", "moe", false, {90, 100, 103, 120, 121},
       "FlashInfer CUTLASS fused MoE (sglang flashinfer_cutlass)", "no CUTLASS fused MoE module for this SM"},
      // trtllm-gen fused MoE: SM100 family cubins only.
      {"flashinfer_trtllm", "moe", false, {100, 103}, "FlashInfer trtllm-gen fused MoE (sglang flashinfer_trtllm)",
       "Unsupported architecture"},
      {"cutlass_moe", "moe", false, {90, 100, 103, 120, 121}, "CUTLASS grouped GEMM MoE (sglang cutlass)",
       "no CUTLASS grouped GEMM for this SM"},
      // Marlin weight-only kernels: SM80 and newer (Ampere mma.sync).
      {"marlin", "moe", false, {80, 86, 87, 89, 90, 100, 103, 120, 121}, "Marlin weight-only MoE (sglang/vLLM marlin)",
       "Marlin requires compute capability >= 8.0"},
  };
  // clang-format on
  return kTable;
}

const KernelLibrary* FindKernelLibrary(std::string_view name) {
  for (const KernelLibrary& k : KernelLibraries()) {
    if (k.name == name) return &k;
  }
  return nullptr;
}

const std::vector<std::string_view>& ArchChoices() {
  static const std::vector<std::string_view> kArchs = {"any",    "sm_70",  "sm_75", "sm_80",  "sm_86",
                                                       "sm_87",  "sm_89",  "sm_90", "sm_100", "sm_103",
                                                       "sm_110", "sm_120", "sm_121"};
  return kArchs;
}

int ParseArch(std::string_view text) {
  if (text == "any") return 0;
  if (text.substr(0, 3) != "sm_") return -1;
  int v = -1;
  const char* b = text.data() + 3;
  const char* e = text.data() + text.size();
  auto [p, ec] = std::from_chars(b, e, v);
  if (ec != std::errc() || p != e || v <= 0) return -1;
  return v;
}

std::string ArchName(int sm) { return sm == 0 ? "any" : Cat("sm_", sm); }

bool ArchSupported(const KernelLibrary& library, int sm) {
  if (sm == 0 || library.any_arch) return true;
  return std::find(library.archs.begin(), library.archs.end(), sm) != library.archs.end();
}

std::string ArchList(const KernelLibrary& library) {
  if (library.any_arch) return "every architecture";
  if (library.archs.empty()) return "no CUDA architecture";
  std::string out;
  for (int a : library.archs) out += Cat(out.empty() ? "" : ", ", ArchName(a));
  return out;
}

}  // namespace crashreplay::replay
