// The one table of which library kernel runs on which GPU architecture.
//
// The replay engine's kernel variants (toggles.h) give the arithmetic; the
// kernel toggles (attention_kernel, dsa_kernel, indexer_kernel, moe_kernel,
// ...) say which real library kernel a variant stands for, so that a step
// recorded on one architecture fails at replay where the library refused to
// run there: a kernel asked to run on a device_arch its library has no code
// for fails with class "unsupported_arch" (step.cc), before it launches, as
// the libraries' host-side dispatch does ("Unsupported architecture",
// cudaErrorNoKernelImageForDevice).
//
// Each row carries the source of its architecture list (kernel_archs.cc).
// Thread safety: immutable after first use.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace crashreplay::replay {

struct KernelLibrary {
  std::string_view name;         // toggle value, e.g. "flashmla_sparse"
  std::string_view family;       // "attention", "dsa", "indexer" or "moe": which toggles may name it
  bool any_arch = false;         // portable code (Triton, PyTorch): every CUDA architecture
  std::vector<int> archs;        // else: compute capabilities with code, e.g. {90, 100, 103}
  std::string_view what;         // the library kernel, in its authors' words
  std::string_view refusal;      // what the library says elsewhere
};

std::span<const KernelLibrary> KernelLibraries();
const KernelLibrary* FindKernelLibrary(std::string_view name);

// "sm_120" -> 120; "any" -> 0; anything else -> -1.
int ParseArch(std::string_view text);
std::string ArchName(int sm);  // 120 -> "sm_120", 0 -> "any"
// The device_arch toggle's choices, "any" first.
const std::vector<std::string_view>& ArchChoices();

// Whether `library` has code for `sm` (0: the architecture is not modelled, always true).
bool ArchSupported(const KernelLibrary& library, int sm);
// "sm_90, sm_100, sm_103" or "every architecture".
std::string ArchList(const KernelLibrary& library);

}  // namespace crashreplay::replay
