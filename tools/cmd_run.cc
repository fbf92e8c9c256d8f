// `crashreplay run MODEL_DIR --prompt TEXT...`: the built-in engine. Prefills
// the prompts, decodes up to --max-new-tokens each with continuous batching,
// and stops at the first failure, printing its signature.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "command.h"
#include "commands_decl.h"
#include "crashreplay/base/status_line.h"
#include "crashreplay/formats/config_file.h"
#include "crashreplay/formats/safetensors_writer.h"
#include "crashreplay/replay/captures/capture_io.h"
#include "crashreplay/replay/kernels/executor.h"
#include "crashreplay/replay/model/checkpoint_io.h"
#include "crashreplay/replay/session/engine.h"
#include "crashreplay/replay/tokenizer/tokenizer.h"
#include "exit_codes.h"
#include "load_model.h"

namespace crashreplay::tools {
namespace {

std::string Printable(const std::vector<int32_t>& tokens) {
  std::string s;
  for (int32_t t : tokens) {
    if (t >= 32 && t < 127) {
      s += static_cast<char>(t);
    } else {
      char buf[16];
      std::snprintf(buf, sizeof buf, "<%d>", t);
      s += buf;
    }
  }
  return s;
}

// Writes every step's logits and sampled tokens as DIR/step_NNNNN.safetensors.
class DumpObserver : public replay::StepObserver {
 public:
  explicit DumpObserver(std::string dir) : dir_(std::move(dir)) {}
  void BeforeStep(const replay::StepInput&) override {}
  void AfterStep(const replay::StepProgram& p) override {
    if (!status_.ok()) return;
    SafetensorsWriter w;
    for (const char* name : {"logits", "next_tokens", "input_ids", "positions"}) {
      const replay::Buffer* b = p.buffer(name);
      if (b == nullptr) continue;
      status_.Update(w.Add(name, b->is_int ? DType::kI32 : DType::kF32, b->shape,
                           std::span<const std::byte>(static_cast<const std::byte*>(b->data()), b->bytes())));
    }
    char file[64];
    std::snprintf(file, sizeof file, "/step_%05lld.safetensors", static_cast<long long>(p.input().step));
    if (status_.ok()) status_.Update(w.Write(dir_ + file));
  }
  absl::Status status() const { return status_; }

 private:
  std::string dir_;
  absl::Status status_;
};

}  // namespace

int RunRun(int argc, char** argv) {
  CLI::App app("Run the built-in engine on a HF checkpoint; stop at the first failure.", "run");
  std::string model_dir, config_file, record, dump_dir, snapshots = "4", snapshot_budget = "64M", page_deltas = "on";
  std::string tokenizer_choice = "auto";
  std::vector<std::string> prompts, prompt_ids, sets;
  int64_t max_new = 16;
  float temperature = 0.0f, top_p = 1.0f, min_p = 0.0f;
  int top_k = 0, threads = 0;
  uint64_t seed = 0;
  bool json = false;
  bool coredumps = false;
  app.add_option("MODEL_DIR", model_dir, "checkpoint directory (config.json + safetensors)")->required();
  app.add_option("--prompt", prompts, "a prompt (tokenized by --tokenizer); repeat for more requests");
  app.add_option("--prompt-ids", prompt_ids, "a prompt as token ids, e.g. 1,2,3; repeatable");
  app.add_option("--max-new-tokens", max_new, "tokens to generate per request")->check(CLI::Range(1, 1 << 20));
  app.add_option("--config", config_file, "flat TOML configuration file (see 'crashreplay toggles')");
  app.add_option("--set", sets, "override one toggle, name=value; repeatable");
  app.add_option("--temperature", temperature, "0: greedy")->check(CLI::Range(0.0, 100.0));
  app.add_option("--top-p", top_p)->check(CLI::Range(0.0, 1.0));
  app.add_option("--top-k", top_k)->check(CLI::Range(0, 1 << 20));
  app.add_option("--min-p", min_p)->check(CLI::Range(0.0, 1.0));
  app.add_option("--seed", seed, "sampling seed");
  app.add_option("--threads", threads, "CPU threads (default CRASHREPLAY_THREADS or 1); never changes results");
  app.add_option("--record", record, "write a capture session of the run to this directory");
  std::string device_name;
  app.add_option("--device-name", device_name,
                 "with --record and a configuration in a serving engine's words: the device name the manifest "
                 "records (e.g. 'NVIDIA RTX PRO 6000 Blackwell Server Edition')");
  app.add_option("--snapshots", snapshots,
                 "with --record: keep state snapshots of the last N steps (written on failure and at the end), "
                 "or 'off'")
      ->default_str("4");
  app.add_option("--snapshot-budget", snapshot_budget,
                 "with --record: host memory for the snapshot ring (bytes, or with K/M/G); a step whose state is "
                 "larger is not kept")
      ->default_str("64M");
  app.add_option("--page-table-deltas", page_deltas,
                 "with --record: write page-table rows as deltas (capture format 2.3) and a step's positions, "
                 "sequence lengths and cache slots as differences from the step before (2.4), or 'off' for every "
                 "row whole and every list as it is (a file crashreplay before 2.3 reads)")
      ->default_str("on")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_flag("--coredumps", coredumps,
               "with --record: arm lightweight GPU core dumps for this process, written beside the capture "
               "(docs/capture.md, \"GPU core dumps\"; off by default: the cost is not measured on a GPU yet)");
  app.add_option("--dump", dump_dir, "write each step's logits and tokens to DIR/step_N.safetensors");
  app.add_option("--tokenizer", tokenizer_choice,
                 "auto: MODEL_DIR/tokenizer.json when present (byte-level BPE), else bytes; 'bytes'; or a "
                 "tokenizer.json path")
      ->default_str("auto");
  app.add_flag("--json", json, "print the result as JSON");
  if (auto rc = ParseArgs(app, argc, argv)) return *rc;

  replay::SnapshotOptions snapshot_options;
  if (snapshots == "off") {
    snapshot_options.steps = 0;
  } else if (!absl::SimpleAtoi(snapshots, &snapshot_options.steps) || snapshot_options.steps == 0 ||
             snapshot_options.steps > 4096) {
    return ReportError(absl::InvalidArgumentError("--snapshots '" + snapshots + "': expected 1..4096 or 'off'"));
  }
  auto budget = ParseBytes("--snapshot-budget", snapshot_budget);
  if (!budget.ok()) return ReportError(budget.status());
  snapshot_options.budget_bytes = *budget;
  snapshot_options.page_table_deltas = page_deltas == "on";
  snapshot_options.step_list_deltas = page_deltas == "on";
  snapshot_options.coredumps = coredumps;

  replay::Config config = replay::Config::Defaults();
  if (!config_file.empty()) {
    std::vector<std::string> file_notes;
    if (absl::Status s = config.ApplyFile(config_file, &file_notes); !s.ok()) return ReportError(s);
    for (const std::string& n : file_notes) std::fprintf(stderr, "crashreplay: note: %s\n", n.c_str());
  }
  for (const std::string& s : sets) {
    if (absl::Status st = config.ApplySetFlag(s); !st.ok()) return ReportError(st);
  }
  std::string tokenizer_note;
  auto tokenizer = replay::TokenizerForCheckpoint(model_dir, tokenizer_choice, &tokenizer_note);
  if (!tokenizer.ok()) return ReportError(tokenizer.status());
  if (!tokenizer_note.empty()) std::fprintf(stderr, "crashreplay: note: %s\n", tokenizer_note.c_str());
  std::vector<replay::Request> requests;
  for (const std::string& p : prompts) {
    replay::Request r;
    auto ids = (*tokenizer)->Encode(p, /*add_special_tokens=*/true);
    if (!ids.ok()) return ReportError(absl::InvalidArgumentError("--prompt: " + std::string(ids.status().message())));
    r.prompt = std::move(*ids);
    if (r.prompt.empty()) return ReportError(absl::InvalidArgumentError("--prompt '" + p + "' has no tokens"));
    requests.push_back(std::move(r));
  }
  for (const std::string& p : prompt_ids) {
    auto ids = ParseIds("--prompt-ids", p);
    if (!ids.ok()) return ReportError(ids.status());
    replay::Request r;
    r.prompt = *ids;
    requests.push_back(std::move(r));
  }
  if (requests.empty()) return ReportError(absl::InvalidArgumentError("give at least one --prompt or --prompt-ids"));
  for (size_t i = 0; i < requests.size(); ++i) {
    requests[i].id = static_cast<int64_t>(i);
    requests[i].max_new_tokens = max_new;
    requests[i].sampling = replay::SamplingParams{temperature, top_k, top_p, min_p, seed};
  }

  // Progress on stderr: redrawn in place on a terminal; plain lines in logs
  // unless the output is --json.
  const bool tty = ::isatty(::fileno(stderr)) == 1;
  StatusLine progress(stderr, tty, "run", json && !tty);
  const replay::EngineConfig ec = replay::ResolveConfig(config);
  auto loaded = LoadModel(model_dir, ec, progress);
  if (!loaded.ok()) return ReportError(loaded.status());
  const replay::LoadedCheckpoint* ckpt = &loaded->checkpoint;
  std::vector<std::string> notes = loaded->notes;
  auto made =
      replay::Engine::Create(std::move(loaded->model), ec, threads, replay::PagesNeeded(requests, ec.page_size));
  if (!made.ok()) return ReportDeviceError(made.status());
  replay::Engine& engine = **made;
  notes.insert(notes.end(), engine.notes().begin(), engine.notes().end());
  if (!notes.empty()) progress.Finish();  // notes stay; the live line is redrawn after them
  for (const std::string& n : notes) std::fprintf(stderr, "crashreplay: note: %s\n", n.c_str());
  std::unique_ptr<replay::CaptureRecorder> recorder;
  if (!record.empty()) {
    // A configuration in a serving engine's words is recorded in that
    // engine's manifest form (capture_io.h: EngineIdentity).
    std::optional<replay::EngineIdentity> as;
    if (!config_file.empty()) {
      auto parsed = ReadConfigFile(config_file);
      if (!parsed.ok()) return ReportError(parsed.status());
      auto e = parsed->find("engine");
      if (e != parsed->end() && e->second.ToDisplay() != "crashreplay") {
        as.emplace();
        as->engine = e->second.ToDisplay();
        as->device_name = device_name;
        as->tensors = &ckpt->tensors;
        for (const auto& [k, v] : *parsed) {
          if (k != "engine") as->settings.emplace_back(k, v);
        }
        // What --set changed beyond the file: the replay's own names.
        replay::Config from_file = replay::Config::Defaults();
        if (absl::Status st = from_file.ApplyFile(config_file); !st.ok()) return ReportError(st);
        as->own_toggles = config.DiffNames(from_file);
      }
    }
    auto rec = replay::CaptureRecorder::Begin(record, model_dir, config, engine.model(), snapshot_options,
                                              as ? &*as : nullptr);
    if (!rec.ok()) return ReportError(rec.status());
    recorder = std::move(*rec);
  }
  std::unique_ptr<DumpObserver> dump;
  if (!dump_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(dump_dir, ec);
    dump = std::make_unique<DumpObserver>(dump_dir);
  }
  // Both observers see every step; the progress line counts them.
  struct Tee : replay::StepObserver {
    std::vector<replay::StepObserver*> to;
    StatusLine* progress = nullptr;
    void StateBeforeStep(const replay::StepInput& in, const replay::KvCache& kv) override {
      for (auto* o : to) o->StateBeforeStep(in, kv);
    }
    void BeforeStep(const replay::StepInput& in) override {
      for (auto* o : to) o->BeforeStep(in);
    }
    void AfterStep(const replay::StepProgram& p) override {
      for (auto* o : to) o->AfterStep(p);
      const replay::StepInput& in = p.input();
      progress->Update("running", in.step + 1, 0,
                       "step " + std::to_string(in.step) + " " + replay::ForwardModeName(in.mode) + ", " +
                           std::to_string(in.rows.size()) + " rows");
    }
  } tee;
  tee.progress = &progress;
  if (recorder) tee.to.push_back(recorder.get());
  if (dump) tee.to.push_back(dump.get());
  const replay::RunResult r = engine.Run(requests, &tee);
  progress.Finish();
  // Generated text: bytes print as before (non-printables as <id>); a
  // tokenizer.json decodes (invalid UTF-8 as U+FFFD).
  const bool byte_tokens = (*tokenizer)->Describe() == "bytes";
  auto text_of = [&](const std::vector<int32_t>& toks) {
    if (byte_tokens) return Printable(toks);
    // Ids the tokenizer has no token for (a model vocab larger than the
    // tokenizer's) print as <id> between the decoded runs.
    std::string text;
    std::vector<int32_t> run;
    auto flush = [&] {
      if (!run.empty()) text += *(*tokenizer)->Decode(run);
      run.clear();
    };
    for (int32_t t : toks) {
      if ((*tokenizer)->HasToken(t)) {
        run.push_back(t);
      } else {
        flush();
        text += Printable({t});
      }
    }
    flush();
    return text;
  };
  if (dump && !dump->status().ok()) return ReportError(dump->status());
  if (recorder) {
    if (absl::Status s = recorder->Finish(r.fault); !s.ok()) return ReportError(s);
    if (auto big = recorder->last_state_oversized()) {
      std::fprintf(stderr,
                   "run: step %lld's state (%.1f MB of KV pages) is over --snapshot-budget (%.1f MB), so the capture "
                   "has no snapshot of it: a replay of that step re-executes the steps before it; --snapshot-budget "
                   "%lluM keeps it\n",
                   static_cast<long long>(big->step), big->bytes / 1e6, snapshot_options.budget_bytes / 1e6,
                   static_cast<unsigned long long>((big->bytes >> 20) + 1));
    }
    if (!json) {
      const capture::RecorderStats st = recorder->stats();
      std::printf("recorded %s (%llu state snapshots taken, %llu dropped)\n", recorder->path().c_str(),
                  static_cast<unsigned long long>(st.snapshots_accepted),
                  static_cast<unsigned long long>(st.snapshots_dropped));
    }
  }

  if (json) {
    nlohmann::json out;
    out["outcome"] = r.fault ? "failed" : "ok";
    out["config"] = nlohmann::json::object();
    for (const auto& [k, v] : config.Items()) out["config"][k] = v;
    out["plan"] = r.plan.ToJson();
    out["steps"] = nlohmann::json::array();
    for (const auto& s : r.steps) {
      out["steps"].push_back({{"step", s.step},
                              {"mode", replay::ForwardModeName(s.mode)},
                              {"rows", s.rows},
                              {"tokens", s.tokens},
                              {"digest", s.digest.Hex()},
                              {"sampled", s.sampled},
                              {"activation_bytes", s.activation_bytes}});
    }
    out["tokenizer"] = (*tokenizer)->Describe();
    out["outputs"] = nlohmann::json::array();
    for (const auto& [id, toks] : r.outputs)
      out["outputs"].push_back({{"request", id}, {"tokens", toks}, {"text", text_of(toks)}});
    if (r.fault) {
      out["fault"] = r.fault->ToJson();
      out["signature"] = out["fault"]["signature"];
    }
    out["first_nonfinite_kernel"] = r.first_nonfinite;
    if (!notes.empty()) out["notes"] = notes;
    out["kernels"] = nlohmann::json::array();
    if (r.fault) {
      for (const auto& k : r.last_step_kernels) out["kernels"].push_back(replay::KernelRecordToJson(k));
    }
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::printf("memory: capacity %llu B, weights %llu B, KV pool %lld pages of %llu B, graphs %llu B\n",
                static_cast<unsigned long long>(r.plan.capacity), static_cast<unsigned long long>(r.plan.weights),
                static_cast<long long>(r.plan.pool_pages), static_cast<unsigned long long>(r.plan.page_bytes),
                static_cast<unsigned long long>(r.plan.graph_reservation));
    for (const auto& s : r.steps) {
      std::printf("step %lld %-7s rows %lld tokens %lld digest %s\n", static_cast<long long>(s.step),
                  replay::ForwardModeName(s.mode), static_cast<long long>(s.rows), static_cast<long long>(s.tokens),
                  s.digest.Hex().c_str());
    }
    for (const auto& [id, toks] : r.outputs)
      std::printf("request %lld: %s\n", static_cast<long long>(id), text_of(toks).c_str());
    if (r.fault) {
      std::printf("FAILED %s\n  %s\n", r.fault->Signature().c_str(), r.fault->message.c_str());
      if (!r.first_nonfinite.empty()) std::printf("  first non-finite output: %s\n", r.first_nonfinite.c_str());
    }
  }
  return r.fault ? kExitFailed : kExitOk;
}

}  // namespace crashreplay::tools
