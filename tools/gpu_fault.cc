#include "gpu_fault.h"

#include <cctype>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "crashreplay/capture/coredump_arming.h"
#include "crashreplay/formats/coredump/coredump.h"

namespace crashreplay::tools {
namespace {

namespace cd = crashreplay::coredump;

// Library kernels -> the exact engine's op that does the same job: its
// kernels in the replay's program (labels as `replay --dump-kernels` takes
// them, `L*` for every layer) and the boundary that op's output reaches
// (docs/replay.md, "Boundaries"). First match wins, so narrower patterns (a
// MoE router, a KV-cache store) come before the wider ones (moe,
// attention) that would also take them. Patterns are matched as lowercase
// substrings of the demangled name. A kernel no row takes is said to be
// unmatched: a GEMM, for one, runs in many ops (projections, MLP, lm_head)
// and names none of them.
struct Row {
  const char* pattern;
  const char* op;
  const char* kernels;
  const char* boundary;
};
constexpr Row kKernelJobs[] = {
    // MoE routing: top-k over the router's logits, and the sort of tokens
    // by expert that follows it.
    {"topk_softmax", "router top-k", "L*.router,L*.topk", "L*.topk"},
    {"grouped_topk", "router top-k", "L*.router,L*.topk", "L*.topk"},
    {"topk_sigmoid", "router top-k", "L*.router,L*.topk", "L*.topk"},
    {"moe_align", "router top-k", "L*.topk", "L*.topk"},
    // The sparse-attention indexer (DeepSeek V3.2).
    {"indexer", "indexer", "L*.indexer", "L*.indexer"},
    // KV-cache stores and rotary embeddings, kernels of their own in the
    // replay whose outputs the attention reads.
    {"reshape_and_cache", "KV-cache write", "L*.kv_write", "L*.attention"},
    {"store_kvcache", "KV-cache write", "L*.kv_write", "L*.attention"},
    {"set_kv_buffer", "KV-cache write", "L*.kv_write", "L*.attention"},
    {"rotary", "rotary embedding", "L*.rope", "L*.attention"},
    {"_rope", "rotary embedding", "L*.rope", "L*.attention"},
    {"rope_", "rotary embedding", "L*.rope", "L*.attention"},
    {"applyrope", "rotary embedding", "L*.rope", "L*.attention"},
    // Attention kernels.
    {"flashinfer", "attention", "L*.attention", "L*.attention"},
    {"flash_fwd", "attention", "L*.attention", "L*.attention"},
    {"flash_attn", "attention", "L*.attention", "L*.attention"},
    {"flashmla", "attention", "L*.attention", "L*.attention"},
    {"paged_attention", "attention", "L*.attention", "L*.attention"},
    {"fmha", "attention", "L*.attention", "L*.attention"},
    {"decode_attention", "attention", "L*.attention", "L*.attention"},
    {"extend_attention", "attention", "L*.attention", "L*.attention"},
    {"prefill_attention", "attention", "L*.attention", "L*.attention"},
    {"attention", "attention", "L*.attention", "L*.attention"},
    // Experts: fused MoE and grouped GEMMs over experts.
    {"fused_moe", "experts", "L*.experts", "L*.experts"},
    {"moe", "experts", "L*.experts", "L*.experts"},
    {"grouped_gemm", "experts", "L*.experts", "L*.experts"},
    {"groupedgemm", "experts", "L*.experts", "L*.experts"},
    {"m_grouped", "experts", "L*.experts", "L*.experts"},
    // Sampling: the replay's sampler runs after lm_head (no boundary of
    // its own: its check is the sampler's).
    {"top_k_top_p", "sampler", "sampler", "after lm_head"},
    {"top_p_sampling", "sampler", "sampler", "after lm_head"},
    {"top_k_sampling", "sampler", "sampler", "after lm_head"},
    {"min_p_sampling", "sampler", "sampler", "after lm_head"},
    {"sampling", "sampler", "sampler", "after lm_head"},
    {"multinomial", "sampler", "sampler", "after lm_head"},
    // Embedding lookup.
    {"embedding", "embedding", "embedding", "embedding"},
    // The gated activation of a dense MLP.
    {"silu_and_mul", "gated activation", "L*.silu_mul", "L*.mlp"},
    {"gelu_and_mul", "gated activation", "L*.silu_mul", "L*.mlp"},
};

std::string Dim(const cd::Dim3& d) { return absl::StrFormat("(%d,%d,%d)", d.x, d.y, d.z); }

std::string FaultLine(const cd::Coredump& dump, const cd::Fault& f) {
  std::string where = absl::StrFormat("device %d SM %d", f.device_id, f.sm);
  if (f.warp.has_value()) absl::StrAppend(&where, absl::StrFormat(" warp %d", *f.warp));
  std::string what = cd::ExceptionName(f.exception);
  std::string in;
  if (const cd::Location* loc = dump.LocationOf(f); loc != nullptr) {
    if (loc->function.has_value()) {
      in = absl::StrFormat(" in `%s` +0x%x", loc->function->demangled, loc->function->offset);
    } else {
      in = absl::StrFormat(" at pc 0x%x (function unknown: %s)", loc->pc, loc->why_unknown);
    }
  }
  std::string block;
  if (f.block.has_value()) block = absl::StrCat(", block ", Dim(*f.block));
  if (!f.lanes.empty())
    absl::StrAppend(&block, absl::StrFormat(" thread %s (lane %d)", Dim(f.lanes[0].thread), f.lanes[0].lane));
  return absl::StrCat(what, in, ", ", where, block);
}

}  // namespace

std::optional<KernelJob> MatchKernelJob(std::string_view kernel_name) {
  std::string lower(kernel_name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const Row& r : kKernelJobs) {
    if (lower.find(r.pattern) != std::string::npos) return KernelJob{r.pattern, r.op, r.kernels, r.boundary};
  }
  return std::nullopt;
}

std::optional<GpuFault> FindGpuFault(const std::string& capture_path, const SessionManifest& manifest,
                                     const FailureRecord* failure) {
  const std::filesystem::path dir = std::filesystem::path(capture_path).parent_path();
  GpuFault g;
  g.capture = capture_path;
  if (failure != nullptr && !failure->coredump.empty()) {
    // A name, never a path: the record comes from another machine.
    const std::string name = std::filesystem::path(failure->coredump).filename().string();
    g.path = (dir / name).string();
    g.how = failure->coredump_complete ? "named by the failure record"
                                       : "named by the failure record, incomplete when it was written";
  } else if (manifest.coredump.mode == "env" || manifest.coredump.mode == "driver_api") {
    // The armed name for the recorded pid, looked for beside the capture
    // (the pattern's directory is the recording host's).
    const std::string armed = capture::CoredumpPathFor(manifest.coredump.file_pattern, manifest.pid);
    g.path = (dir / std::filesystem::path(armed).filename()).string();
    std::error_code ec;
    if (!std::filesystem::exists(g.path, ec)) return std::nullopt;
    g.how = "found beside the capture by its armed name; no failure record names it";
  } else {
    return std::nullopt;
  }
  absl::StatusOr<cd::Coredump> dump = cd::ReadCoredumpFile(g.path);
  if (!dump.ok()) {
    g.problem = std::string(dump.status().message());
    return g;
  }
  for (const std::string& n : dump->notes) {
    if (n.find("truncated") != std::string::npos) g.problem = n;
  }
  g.complete = g.problem.empty();
  if (!g.complete) return g;
  for (const cd::Fault& f : dump->faults) g.faults.push_back(FaultLine(*dump, f));
  for (const cd::Fault& f : dump->faults) {
    const cd::Location* loc = dump->LocationOf(f);
    if (loc != nullptr && loc->function.has_value()) {
      g.kernel = loc->function->demangled;
      break;
    }
  }
  if (!g.kernel.empty()) g.job = MatchKernelJob(g.kernel);
  return g;
}

std::vector<std::string> GpuFault::Lines() const {
  std::vector<std::string> out;
  out.push_back(absl::StrCat("GPU core dump: ", path, " (", how, ")"));
  if (!complete) {
    out.push_back(
        absl::StrCat("  it does not read whole (incomplete, or not a dump), no fault taken from it: ", problem));
    return out;
  }
  if (faults.empty()) out.push_back("  the dump holds no faulting warp");
  for (size_t i = 0; i < faults.size() && i < 4; ++i) out.push_back(absl::StrCat("  fault: ", faults[i]));
  if (faults.size() > 4) out.push_back(absl::StrFormat("  ... and %d more faults", faults.size() - 4));
  if (kernel.empty()) {
    if (!faults.empty())
      out.push_back("  the faulting kernel is not named in the dump, so no op of the replay is matched");
  } else if (job.has_value()) {
    out.push_back(absl::StrFormat("  the replay's %s at %s runs that kernel's job (matched \"%s\"; its kernels %s)",
                                  job->op, job->boundary, job->pattern, job->kernels));
    out.push_back(
        absl::StrFormat("  next: crashreplay replay %s --dump DIR --dump-kernels '%s'", capture, job->kernels));
  } else {
    out.push_back(absl::StrCat("  no op of the replay is known to run `", kernel,
                               "`'s job (no row of the kernel table matches it)"));
  }
  return out;
}

nlohmann::json GpuFault::ToJson() const {
  nlohmann::json j = {{"path", path}, {"how", how}, {"complete", complete}};
  if (!problem.empty()) j["problem"] = problem;
  j["faults"] = faults;
  j["kernel"] = kernel.empty() ? nlohmann::json(nullptr) : nlohmann::json(kernel);
  if (job.has_value()) {
    j["replay_op"] = {
        {"op", job->op}, {"kernels", job->kernels}, {"boundary", job->boundary}, {"pattern", job->pattern}};
  } else {
    j["replay_op"] = nullptr;
  }
  return j;
}

}  // namespace crashreplay::tools
