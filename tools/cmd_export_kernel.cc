// `crashreplay export-kernel CAPTURE --kernel LABEL -o DIR [--step N] [--config FILE] [--set k=v]...
// [--model DIR] [--json]`: one kernel of a replayed step, as what a user attaches to an upstream issue
// (issue 48, docs/cli.md "export-kernel").
//
// It replays the step in its own process (`replay --dump`, the kernel and the kernels that make its
// inputs), then writes DIR/tensors.safetensors (the kernel's inputs and the exact engine's outputs,
// under plain names), DIR/params.json (the step, the signature, the configuration, each request's
// page table and sampling parameters, never its token ids) and DIR/repro.py: a stand-alone script that
// runs the equivalent operation of the engine's library (torch) on those tensors. Which kernels map to
// which library call is in docs/cli.md; a kernel with none gets a script that loads and describes its
// tensors and says so.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "command.h"
#include "commands_decl.h"
#include "crashreplay/bisect/process.h"
#include "crashreplay/formats/safetensors_file.h"
#include "crashreplay/formats/safetensors_writer.h"
#include "crashreplay/replay/captures/capture_io.h"
#include "exit_codes.h"

namespace crashreplay::tools {
namespace {

namespace fs = std::filesystem;

enum class Kind { kSampler, kPagedAttention, kOther };

// torch.multinomial over the exact engine's probabilities: torch's own
// check raises on a NaN, an Inf or a negative entry, as generate() and the
// engines' pytorch samplers do.
constexpr char kSamplerScript[] = R"PY(#!/usr/bin/env python3
"""The sampler of a replayed step, in torch (written by crashreplay export-kernel).

tensors.safetensors: probs [rows, vocab] (the exact engine's probabilities after temperature,
top-k/top-p/min-p), logits [rows, vocab] (before them), next_tokens [rows] (what the exact engine
sampled; absent when its check fired). params.json: the step, its signature, each row's sampling
parameters. torch.multinomial checks its input as every torch-based sampler does: a NaN, an Inf or a
negative probability raises torch's own RuntimeError here.
"""
import json
import os

import torch
from safetensors.torch import load_file

here = os.path.dirname(os.path.abspath(__file__))
t = load_file(os.path.join(here, "tensors.safetensors"))
params = json.load(open(os.path.join(here, "params.json")))
probs = t["probs"]
print(f"step {params['step']}: {probs.shape[0]} rows, vocab {probs.shape[1]}; "
      f"{int(torch.isnan(probs).sum())} NaN, {int(torch.isinf(probs).sum())} Inf, {int((probs < 0).sum())} negative")
sampled = torch.multinomial(probs, num_samples=1, generator=torch.Generator().manual_seed(0)).squeeze(1)
print("torch.multinomial sampled", sampled.tolist())
if "next_tokens" in t:
    greedy = [i for i, r in enumerate(params["rows"]) if r["sampling"]["temperature"] == 0]
    argmax = torch.argmax(t["logits"], dim=-1)
    same = all(int(argmax[i]) == int(t["next_tokens"][i]) for i in greedy)
    print(f"greedy rows {greedy}: torch.argmax {'agrees' if same else 'DISAGREES'} with the exact engine")
    raise SystemExit(0 if same else 1)
)PY";

// The pages a paged attention kernel reads, gathered from a pool of the
// replay's size with torch's index_select, which checks every index.
constexpr char kAttentionScript[] = R"PY(#!/usr/bin/env python3
"""The page reads of a replayed step's paged attention, in torch (written by crashreplay export-kernel).

params.json: each row's page table (pool page ids at the replay's page_size), its start position and
token count, the KV pool's size in pages (`pool_pages`, when the replay's page check knew it) and the
signature. Gathering each row's pages from a pool of that size with torch.index_select checks every
page index as a gather kernel's bounds check does: an index outside the pool raises torch's own
IndexError. tensors.safetensors holds the kernel's outputs as the exact engine left them.
"""
import json
import os

import torch

here = os.path.dirname(os.path.abspath(__file__))
params = json.load(open(os.path.join(here, "params.json")))
page_size = int(params["page_size"])
pool_pages = params.get("pool_pages")
if pool_pages is None:
    print("the replay's page checks passed: no page index is outside the pool")
    raise SystemExit(0)
pool = torch.zeros(int(pool_pages), page_size)
for row in params["rows"]:
    used = (row["start_pos"] + row["tokens"] + page_size - 1) // page_size
    pages = torch.tensor(row["page_table"][:used], dtype=torch.long)
    print(f"request {row['request']}: pages {pages.tolist()} of a pool of {pool_pages}")
    pool.index_select(0, pages)
)PY";

constexpr char kOtherScript[] = R"PY(#!/usr/bin/env python3
"""A replayed step's kernel tensors (written by crashreplay export-kernel). No library call is mapped
to this kernel yet (docs/cli.md, "export-kernel"): this loads and describes what the exact engine
computed, for a reproduction written by hand."""
import json
import os

from safetensors.numpy import load_file

here = os.path.dirname(os.path.abspath(__file__))
params = json.load(open(os.path.join(here, "params.json")))
print(f"kernel {params['kernel']}, step {params['step']}: {params['detail']}")
for name, a in load_file(os.path.join(here, "tensors.safetensors")).items():
    print(f"  {name}: {a.dtype} {list(a.shape)}")
)PY";

Kind KindOf(const std::string& label) {
  if (label == "sampler") return Kind::kSampler;
  const std::string tail = label.substr(label.rfind('.') == std::string::npos ? 0 : label.rfind('.') + 1);
  if (tail == "attention") return Kind::kPagedAttention;
  return Kind::kOther;
}

int Fail(int code, const std::string& message) {
  std::fprintf(stderr, "crashreplay: %s\n", message.c_str());
  return code;
}

}  // namespace

int RunExportKernel(int argc, char** argv) {
  CLI::App app(
      "Export one kernel of a replayed step: its inputs and the exact engine's outputs as safetensors, its "
      "parameters as JSON, and a stand-alone script that runs the library's equivalent operation on them.",
      "export-kernel");
  std::string capture, label, out, config_file, model_dir;
  std::vector<std::string> sets;
  int64_t step = -1;
  bool json = false;
  app.add_option("CAPTURE", capture, "capture file or session directory")->required();
  app.add_option("--kernel", label, "the kernel's label: sampler, L3.attention, ... (replay --json lists them)")
      ->required();
  app.add_option("-o,--out", out, "output directory")->required();
  app.add_option("--step", step, "step to replay (default: the failing step, else the last)");
  app.add_option("--config", config_file, "configuration applied over the recorded one (flat TOML)");
  app.add_option("--set", sets, "override one toggle, name=value; repeatable");
  app.add_option("--model", model_dir, "checkpoint directory (default: the recorded path)");
  app.add_flag("--json", json, "print params.json on stdout");
  if (auto rc = ParseArgs(app, argc, argv)) return *rc;

  const Kind kind = KindOf(label);
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) return Fail(kExitDataError, absl::StrCat("-o ", out, ": ", ec.message()));
  const std::string dump_dir = out + "/.dump";
  fs::remove_all(dump_dir, ec);
  bisect::ProcessSpec spec;
  spec.argv = {SelfPath(argv[0]), "replay",
               capture,           "--json",
               "--dump",          dump_dir,
               "--dump-kernels",  kind == Kind::kSampler ? "logits_all_gather,logits_processor,sampler" : label};
  if (step >= 0) spec.argv.insert(spec.argv.end(), {"--step", absl::StrCat(step)});
  if (!config_file.empty()) spec.argv.insert(spec.argv.end(), {"--config", config_file});
  for (const std::string& s : sets) spec.argv.insert(spec.argv.end(), {"--set", s});
  if (!model_dir.empty()) spec.argv.insert(spec.argv.end(), {"--model", model_dir});
  const bisect::ProcessResult p = bisect::RunProcess(spec);
  if (!p.exited || (p.exit_code != 0 && p.exit_code != 1)) {
    const std::string err = bisect::KeptStderr(p);
    std::fputs(err.c_str(), stderr);
    return p.exited ? p.exit_code : kExitFailed;
  }
  const nlohmann::json rep = nlohmann::json::parse(p.stdout_text, nullptr, false);
  if (!rep.is_object()) return Fail(kExitFailed, "the replay printed no JSON report");
  const int64_t replayed_step = rep.value("step", int64_t{0});

  // The dumped tensors, under plain names.
  std::vector<fs::path> dumps;
  for (const auto& e : fs::directory_iterator(dump_dir, ec)) dumps.push_back(e.path());
  if (dumps.size() != 1) return Fail(kExitFailed, absl::StrCat("the replay left ", dumps.size(), " dump files"));
  auto file = SafetensorsFile::Open(dumps[0].string());
  if (!file.ok()) return ReportError(file.status());
  SafetensorsWriter tensors;
  for (const TensorInfo& t : (*file)->tensors()) {
    std::string name;
    if (kind == Kind::kSampler) {
      if (t.name == "logits_processor.probs") name = "probs";
      if (t.name == "logits_all_gather.logits") name = "logits";
      if (t.name == "sampler.next_tokens") name = "next_tokens";
    } else if (t.name.rfind(label + ".", 0) == 0) {
      name = t.name.substr(label.size() + 1);
    }
    if (name.empty()) continue;
    if (absl::Status s = tensors.Add(name, t.dtype, t.shape, (*file)->Data(t)); !s.ok()) return ReportError(s);
  }
  if (kind == Kind::kSampler && tensors.num_tensors() == 0) {
    return Fail(kExitFailed, "the step ran no sampler (an earlier kernel failed: export that one)");
  }
  file->reset();
  if (absl::Status s = tensors.Write(out + "/tensors.safetensors"); !s.ok()) return ReportError(s);
  fs::remove_all(dump_dir, ec);

  // The parameters: each request's page table at the replay's page size and
  // its sampling; never its token ids.
  nlohmann::json params = {{"kernel", label},
                           {"step", replayed_step},
                           {"outcome", rep.value("outcome", std::string())},
                           {"detail", rep.value("detail", std::string())},
                           {"config", rep.value("config", nlohmann::json::object())}};
  if (rep.contains("signature")) params["signature"] = rep["signature"];
  if (rep.contains("fault")) params["fault"] = rep["fault"];
  int page_size = 16;
  if (params["config"].contains("page_size")) page_size = std::stoi(params["config"]["page_size"].get<std::string>());
  params["page_size"] = page_size;
  if (rep.contains("fault") && rep.contains("signature") &&
      rep["signature"].value("check", std::string()) == "page_index_in_pool") {
    params["pool_pages"] = static_cast<int64_t>(rep["fault"].value("value", 0.0));
  }
  auto cap = replay::LoadCapture(capture);
  if (!cap.ok()) return ReportError(cap.status());
  if (absl::Status s = replay::RepageSteps(&*cap, page_size); !s.ok()) return ReportError(s);
  params["rows"] = nlohmann::json::array();
  if (replayed_step >= 0 && replayed_step < static_cast<int64_t>(cap->steps.size())) {
    for (const replay::StepRow& r : cap->steps[static_cast<size_t>(replayed_step)].input.rows) {
      params["rows"].push_back({{"request", r.request_name.empty() ? absl::StrCat(r.request_id) : r.request_name},
                                {"start_pos", r.start_pos},
                                {"tokens", r.tokens.size()},
                                {"page_table", r.page_table},
                                {"sampling",
                                 {{"temperature", r.sampling.temperature},
                                  {"top_p", r.sampling.top_p},
                                  {"top_k", r.sampling.top_k},
                                  {"min_p", r.sampling.min_p}}}});
    }
  }
  std::ofstream pf(out + "/params.json");
  pf << params.dump(2) << "\n";
  std::ofstream script(out + "/repro.py");
  script << (kind == Kind::kSampler ? kSamplerScript : kind == Kind::kPagedAttention ? kAttentionScript : kOtherScript);
  if (!pf || !script) return Fail(kExitDataError, absl::StrCat("cannot write ", out, "/params.json or repro.py"));
  if (json) {
    std::printf("%s\n", params.dump(2).c_str());
  } else {
    std::printf(
        "%s of step %lld: %s\nwrote %s/tensors.safetensors (%zu tensors), params.json, repro.py\nrun: python3 "
        "%s/repro.py\n",
        label.c_str(), static_cast<long long>(replayed_step), rep.value("detail", std::string()).c_str(), out.c_str(),
        tensors.num_tensors(), out.c_str());
  }
  return kExitOk;
}

}  // namespace crashreplay::tools
