// `crashreplay make-model DIR --arch ARCH --quant Q [size options]
// [--threads N]` (or `--like CHECKPOINT_DIR [--seed S]`: the model that
// checkpoint's config describes, random values): writes a random checkpoint (config.json + safetensors) in
// real HF layouts, tensor by tensor into the files (memory of about one
// tensor, or one layer while an NVFP4 checkpoint is calibrated), with
// progress on stderr (redrawn on a terminal, plain lines otherwise).
#include <cstdio>

#include "absl/strings/str_format.h"
#include "crashreplay/base/status_line.h"

#include "command.h"
#include "commands_decl.h"
#include "crashreplay/replay/make_model/random_checkpoint.h"
#include "exit_codes.h"

namespace crashreplay::tools {

int RunMakeModel(int argc, char** argv) {
  CLI::App app("Write a small random HF checkpoint of a supported architecture and quantization.", "make-model");
  std::string dir;
  replay::MakeModelOptions o;
  std::string rope_form = "legacy";
  app.add_option("DIR", dir, "output directory")->required();
  app.add_option("--arch", o.arch,
                 "llama | qwen3 | qwen3_moe | mixtral | glm4_moe (GQA + DeepSeek-V3 routing) | deepseek_v3 (MLA) | "
                 "deepseek_v32 | glm_moe_dsa (MLA + DSA indexer) | gpt_oss (sinks, sliding window, biased "
                 "experts; bf16 only)")
      ->check(CLI::IsMember({"llama", "qwen3", "qwen3_moe", "mixtral", "glm4_moe", "deepseek_v3", "deepseek_v32",
                             "glm_moe_dsa", "gpt_oss"}));
  app.add_option("--quant", o.quant, "bf16 | fp8 | nvfp4 | mxfp4")
      ->check(CLI::IsMember({"bf16", "fp8", "nvfp4", "mxfp4"}));
  app.add_option("--layers", o.layers)->check(CLI::Range(1, 1024));
  app.add_option("--hidden", o.hidden)->check(CLI::Range(16, 1 << 16));
  app.add_option("--heads", o.heads)->check(CLI::Range(1, 1024));
  app.add_option("--kv-heads", o.kv_heads)->check(CLI::Range(1, 1024));
  app.add_option("--head-dim", o.head_dim)->check(CLI::Range(2, 1024));
  app.add_option("--intermediate", o.intermediate)->check(CLI::Range(1, 1 << 20));
  app.add_option("--moe-intermediate", o.moe_intermediate)->check(CLI::Range(1, 1 << 20));
  app.add_option("--experts", o.experts)->check(CLI::Range(1, 1024));
  app.add_option("--experts-per-tok", o.experts_per_tok)->check(CLI::Range(1, 16));
  app.add_option("--sliding-window", o.sliding_window, "gpt_oss: the sliding layers' window (0: none)")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--shared-experts", o.n_shared_experts)->check(CLI::Range(0, 16));
  app.add_option("--n-group", o.n_group)->check(CLI::Range(1, 64));
  app.add_option("--topk-group", o.topk_group)->check(CLI::Range(1, 64));
  app.add_option("--vocab", o.vocab, "vocabulary size (>= 256 for the byte-level tokenizer)")
      ->check(CLI::Range(2, 1 << 20));
  app.add_option("--seed", o.seed);
  app.add_option("--q-lora-rank", o.q_lora_rank, "MLA: q latent width (0: q_proj, deepseek_v3 only)")
      ->check(CLI::Range(0, 1 << 16));
  app.add_option("--kv-lora-rank", o.kv_lora_rank, "MLA: KV latent width (512 for FlashMLA's kernels)")
      ->check(CLI::Range(2, 1 << 16));
  app.add_option("--qk-nope-head-dim", o.qk_nope_head_dim)->check(CLI::Range(1, 1024));
  app.add_option("--qk-rope-head-dim", o.qk_rope_head_dim, "MLA: rotary dims (64 for FlashMLA's kernels)")
      ->check(CLI::Range(2, 1024));
  app.add_option("--v-head-dim", o.v_head_dim)->check(CLI::Range(1, 1024));
  app.add_option("--index-n-heads", o.index_n_heads, "DSA indexer heads")->check(CLI::Range(1, 1024));
  app.add_option("--index-head-dim", o.index_head_dim, "DSA indexer head dim (>= qk rope dims)")
      ->check(CLI::Range(2, 1024));
  app.add_option("--index-topk", o.index_topk, "DSA: positions each query attends to")->check(CLI::Range(1, 1 << 20));
  app.add_option("--index-pattern", o.index_pattern,
                 "glm_moe_dsa: one letter a layer, F (own indexer) or S (reuse the last top-k)");
  app.add_option("--rope-form", rope_form, "legacy (rope_theta/rope_scaling) | rope_parameters | both")
      ->check(CLI::IsMember({"legacy", "rope_parameters", "both"}));
  CLI::Option* like = app.add_option("--like", o.like,
                                     "a checkpoint directory (its config.json is enough): the model its config "
                                     "describes, with values drawn from --seed, and its config files copied")
                          ->check(CLI::ExistingDirectory);
  // The shape options say what --like's config says: one or the other.
  for (CLI::Option* opt : app.get_options()) {
    const std::string n = opt->get_name();
    if (opt != like && n != "DIR" && n != "--seed" && n != "--help" && n.rfind("--", 0) == 0) like->excludes(opt);
  }
  o.threads = 0;
  app.add_option("--threads", o.threads, "worker threads (0: one per core); never changes the bytes written")
      ->check(CLI::Range(0, 256));
  if (auto rc = ParseArgs(app, argc, argv)) return *rc;
  StatusLine progress = StatusLine::ForStderr("make-model");
  o.progress = [&progress](std::string_view phase, int64_t done, int64_t total, int64_t bytes) {
    progress.Update(phase, done, total, bytes > 0 ? absl::StrFormat("%.1f MB", static_cast<double>(bytes) * 1e-6) : "");
  };
  o.rope_form = rope_form;
  // Bounded memory: each tensor goes to its place in the files as it is made
  // (random_checkpoint.h WriteRandomCheckpoint).
  auto written = replay::WriteRandomCheckpoint(dir, o);
  if (!written.ok()) return ReportError(written.status());
  progress.Finish();
  std::printf("wrote %s: %s %s, %zu tensors, %llu bytes\n", dir.c_str(), written->spec.model_type.c_str(),
              o.like.empty() ? o.quant.c_str() : ("like " + o.like).c_str(), written->tensors,
              static_cast<unsigned long long>(written->tensor_bytes));
  return kExitOk;
}

}  // namespace crashreplay::tools
