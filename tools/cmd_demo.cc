// `crashreplay demo [--out DIR] [--json]`: the README's first command. Tells
// the Blackwell crash story end to end with the real machinery:
//   1. `make-model`: a small GLM-style NVFP4 MoE checkpoint;
//   2. launch 1 (`run --config configs/demo/launch1_oom.toml`): OOM at graph
//      capture, from the memory planner's arithmetic;
//   3. launch 2 (`run --config configs/demo/launch2_assert.toml`): starts,
//      prefills, fails in decode with the paged decode kernel's precondition;
//   4. replay of launch 2's failing step from its step log, kernel by kernel
//      (ReplayStep), and the first bad kernel against the conservative
//      configuration replayed on the same recorded inputs;
//   5. one bisection per failing launch against configs/demo/conservative.toml
//      (RunBisect, trials are `crashreplay run` processes), and the reports.
// Steps 1-3 and the bisect trials exec this binary's own subcommands; step 4
// calls the replay library. Nothing here decides a failure: the
// configuration files and the engine do.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "crashreplay/base/status.h"
#include "command.h"
#include "commands_decl.h"
#include "crashreplay/bisect/bisect.h"
#include "crashreplay/bisect/process.h"
#include "crashreplay/bisect/report.h"
#include "crashreplay/bisect/scheduler.h"
#include "crashreplay/formats/config_file.h"
#include "crashreplay/replay/checkpoint_io.h"
#include "crashreplay/replay/engine.h"
#include "crashreplay/replay/replay_session.h"
#include "exit_codes.h"
#include "run_trial.h"

#ifndef CRASHREPLAY_SOURCE_DIR
#define CRASHREPLAY_SOURCE_DIR "."
#endif

namespace crashreplay::tools {
namespace {

constexpr char kPrompt[] = "Say hello in one sentence";
constexpr int kMaxNewTokens = 8;

std::string SelfExe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("crashreplay");
}

// Runs one of this binary's subcommands; stdout is returned, stderr kept for errors.
absl::StatusOr<bisect::ProcessResult> Exec(const std::vector<std::string>& argv) {
  bisect::ProcessSpec spec;
  spec.argv = argv;
  bisect::ProcessResult p = bisect::RunProcess(spec);
  if (!p.started) return absl::FailedPreconditionError(absl::StrCat("cannot run ", argv[0], ": ", p.start_error));
  return p;
}

struct Launch {
  std::string config_path;
  int exit_code = -1;
  nlohmann::json result;  // `run --json`
};

absl::StatusOr<Launch> RunLaunch(const std::string& self, const std::string& model, const std::string& config) {
  CR_ASSIGN_OR_RETURN(bisect::ProcessResult p,
                      Exec({self, "run", model, "--config", config, "--prompt", kPrompt, "--max-new-tokens",
                            std::to_string(kMaxNewTokens), "--json"}));
  Launch l;
  l.config_path = config;
  l.exit_code = p.exited ? p.exit_code : -1;
  l.result = nlohmann::json::parse(p.stdout_text, nullptr, /*allow_exceptions=*/false);
  if (l.result.is_discarded() || (l.exit_code != kExitOk && l.exit_code != kExitFailed)) {
    return absl::InternalError(absl::StrCat("crashreplay run --config ", config, " exited ", l.exit_code, ": ",
                                            p.stderr_tail));
  }
  return l;
}

std::vector<replay::Request> DemoRequests() {
  replay::Request r;
  for (const char* c = kPrompt; *c != '\0'; ++c) r.prompt.push_back(static_cast<unsigned char>(*c));
  r.id = 0;
  r.max_new_tokens = kMaxNewTokens;
  r.sampling = replay::SamplingParams{0.0f, 0, 1.0f, 0.0f, 0};
  return {r};
}

// An engine for `config_file` on the loaded checkpoint, as `run` builds it.
absl::StatusOr<std::unique_ptr<replay::Engine>> MakeEngine(const replay::LoadedCheckpoint& ckpt,
                                                           const std::string& config_file, int threads) {
  replay::Config config = replay::Config::Defaults();
  CR_RETURN_IF_ERROR(config.ApplyFile(config_file));
  const replay::EngineConfig ec = replay::ResolveConfig(config);
  CR_ASSIGN_OR_RETURN(std::unique_ptr<replay::Model> model, replay::BuildModel(ckpt.spec, ckpt.tensors, ec));
  return std::make_unique<replay::Engine>(std::move(model), ec, threads,
                                          replay::PagesNeeded(DemoRequests(), ec.page_size));
}

std::vector<bisect::KernelRow> Rows(const std::vector<replay::KernelRecord>& records) {
  std::vector<bisect::KernelRow> rows;
  for (const auto& k : records) rows.push_back(KernelRowFromRunRecord(replay::KernelRecordToJson(k)));
  return rows;
}

// Launch 2 recorded in process (StepLogRecorder, the engine-side recorder):
// the step log a capture holds, and the index of the failing step.
struct Recording {
  replay::LoadedCheckpoint checkpoint;
  std::vector<replay::RecordedStep> log;
  int64_t target = -1;
};

absl::StatusOr<Recording> Record(const std::string& model_dir, const std::string& config, int threads) {
  Recording rec;
  CR_ASSIGN_OR_RETURN(rec.checkpoint, replay::LoadCheckpointDir(model_dir));
  replay::StepLogRecorder recorder;
  CR_ASSIGN_OR_RETURN(auto engine, MakeEngine(rec.checkpoint, config, threads));
  engine->Run(DemoRequests(), &recorder);
  rec.log = recorder.steps();
  for (size_t i = 0; i < rec.log.size(); ++i) {
    if (rec.log[i].fault) {
      rec.target = static_cast<int64_t>(i);
      break;
    }
  }
  if (rec.target < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(config, ": the recorded run did not fail in a step; nothing to replay"));
  }
  return rec;
}

// The recorded failing step replayed on a fresh engine under `config`.
absl::StatusOr<replay::ReplayReport> ReplayUnder(const Recording& rec, const std::string& config, int threads) {
  CR_ASSIGN_OR_RETURN(auto engine, MakeEngine(rec.checkpoint, config, threads));
  return replay::ReplayStep(*engine, rec.log, rec.target);
}

// First bad kernel of `test` against `reference` (bisect/kernel_table.h);
// a kernel whose check fired before any earlier divergence is the first bad
// one itself.
nlohmann::json FirstBad(const replay::ReplayReport& reference, const replay::ReplayReport& test) {
  const auto f = bisect::FirstBadKernel(Rows(reference.kernels), Rows(test.kernels));
  for (size_t i = 0; i < test.kernels.size(); ++i) {
    if (!test.kernels[i].failed) continue;
    if (f && f->index < i) break;
    nlohmann::json j = {{"reason", "check_failed"}, {"index", i}, {"kernel", test.kernels[i].label},
                        {"layer", test.kernels[i].layer}};
    if (test.fault) j["check"] = test.fault->check;
    return j;
  }
  return f ? bisect::KernelFindingToJson(*f) : nlohmann::json();
}

struct Bisection {
  bisect::BisectReport report;
  nlohmann::json json;
  std::string html_path;
};

absl::StatusOr<Bisection> Bisect(const std::string& self, const std::string& model, const std::string& good,
                                 const std::string& bad, const std::string& workdir, const std::string& html_path) {
  CR_ASSIGN_OR_RETURN(Config good_config, ReadConfigFile(good));
  CR_ASSIGN_OR_RETURN(Config bad_config, ReadConfigFile(bad));
  std::filesystem::create_directories(workdir);
  bisect::CommandTrialOptions co;
  co.command = {self, "run", model, "--config", "{config}", "--prompt", kPrompt, "--max-new-tokens",
                std::to_string(kMaxNewTokens), "--json"};
  co.workdir = workdir;
  co.limits.timeout_s = 120;
  RunTrialRunner runner(co);
  bisect::SchedulerOptions so;
  so.jobs = 2;
  bisect::Progress progress = bisect::Progress::ForStderr(/*quiet=*/true);
  bisect::Scheduler scheduler(runner, so, &progress);
  bisect::BisectOptions bo;
  bo.good = good_config;
  bo.bad = bad_config;
  bo.good_label = good;
  bo.bad_label = bad;
  bo.workdir = workdir;
  Bisection b;
  b.report = bisect::RunBisect(scheduler, bo, &progress);
  b.report.jobs = scheduler.parallelism();
  b.json = bisect::ReportJson(b.report);
  std::ofstream(workdir + "/report.json") << b.json.dump(2) << "\n";
  std::ofstream html(html_path, std::ios::binary);
  html << bisect::ReportHtml(b.report);
  if (!html) return absl::InternalError(absl::StrCat("cannot write the HTML report ", html_path));
  b.html_path = html_path;
  return b;
}

std::string HtmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// The summary page: one row per finding, relative links to each bisection's
// own report. Inline CSS only; nothing is fetched.
std::string SummaryHtml(const nlohmann::json& findings) {
  std::string h =
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>crashreplay demo</title>\n"
      "<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:70em}table{border-collapse:collapse}"
      "td,th{border:1px solid #bbb;padding:.3em .6em;text-align:left}th{background:#eee}code{background:#f4f4f4}"
      "</style></head><body>\n<h1>crashreplay demo: two bugs</h1>\n"
      "<table><tr><th>launch</th><th>signature</th><th>culprit</th><th>first bad kernel</th><th>report</th></tr>\n";
  for (const auto& f : findings) {
    std::string culprit;
    for (const auto& [k, v] : f["culprit"].items()) {
      absl::StrAppend(&culprit, culprit.empty() ? "" : ", ", k, " = ", v.is_string() ? v.get<std::string>() : v.dump());
    }
    const auto& s = f["signature"];
    absl::StrAppend(&h, "<tr><td>", HtmlEscape(f["launch"].get<std::string>()), "</td><td><code>",
                    HtmlEscape(absl::StrCat(s["class"].get<std::string>(), "/", s["stage"].get<std::string>(), "/",
                                            s["kernel"].get<std::string>(), "/", s["check"].get<std::string>())),
                    "</code></td><td><code>", HtmlEscape(culprit), "</code></td><td><code>",
                    HtmlEscape(f["first_bad_kernel"]["kernel"].get<std::string>()), "</code></td><td><a href=\"",
                    HtmlEscape(std::filesystem::path(f["report"].get<std::string>()).filename().string()),
                    "\">bisection report</a></td></tr>\n");
  }
  h += "</table>\n</body></html>\n";
  return h;
}

std::string CulpritText(const nlohmann::json& culprit) {
  std::string s;
  for (const auto& [k, v] : culprit.items()) {
    absl::StrAppend(&s, s.empty() ? "" : " + ", k, "=", v.is_string() ? v.get<std::string>() : v.dump());
  }
  return s.empty() ? "(none)" : s;
}

}  // namespace

int RunDemo(int argc, char** argv) {
  CLI::App app(
      "End-to-end demo: build a small GLM-style NVFP4 MoE, launch it with the failing session's two "
      "configurations (OOM at graph capture, then an assert in decode), replay the failing step kernel by "
      "kernel, and bisect both failures against a conservative configuration.",
      "demo");
  std::string out_dir = "crashreplay-demo";
  std::string configs = std::string(CRASHREPLAY_SOURCE_DIR) + "/configs/demo";
  bool json = false;
  int threads = 1;
  app.add_option("--out", out_dir, "output directory (model, bisection work dirs, reports)");
  app.add_option("--configs", configs, "directory holding launch1_oom.toml, launch2_assert.toml, conservative.toml");
  app.add_option("--threads", threads, "CPU threads of the in-process replay (never changes results)")
      ->check(CLI::Range(1, 256));
  app.add_flag("--json", json, "print the findings as JSON instead of the story");
  if (auto rc = ParseArgs(app, argc, argv)) return *rc;

  std::error_code fs_error;
  std::filesystem::create_directories(out_dir, fs_error);
  out_dir = std::filesystem::absolute(out_dir).lexically_normal().string();
  const std::string self = SelfExe();
  const std::string model = out_dir + "/model";
  const std::string launch1 = configs + "/launch1_oom.toml";
  const std::string launch2 = configs + "/launch2_assert.toml";
  const std::string conservative = configs + "/conservative.toml";
  FILE* story = json ? stderr : stdout;  // with --json the story goes to stderr
  auto say = [&](const std::string& line) { std::fprintf(story, "%s\n", line.c_str()); };

  // 1. The checkpoint.
  auto made = Exec({self, "make-model", model, "--arch", "deepseek_v3", "--quant", "nvfp4", "--layers", "3",
                    "--heads", "8", "--kv-heads", "2", "--intermediate", "128", "--moe-intermediate", "128",
                    "--experts", "16", "--experts-per-tok", "4", "--shared-experts", "1", "--n-group", "4",
                    "--topk-group", "2"});
  if (!made.ok()) return ReportError(made.status());
  if (!made->exited || made->exit_code != 0) {
    return ReportError(absl::InternalError(absl::StrCat("make-model failed: ", made->stderr_tail)));
  }
  say("== 1. model: " + std::string(absl::StripTrailingAsciiWhitespace(made->stdout_text)));
  say("   (GLM-4.5 layout: NVFP4 ModelOpt weights, 3 layers, 16 routed experts + 1 shared, top-4 of 4 groups)");

  // 2-3. The two launches of the failing session.
  auto l1 = RunLaunch(self, model, launch1);
  if (!l1.ok()) return ReportError(l1.status());
  auto l2 = RunLaunch(self, model, launch2);
  if (!l2.ok()) return ReportError(l2.status());
  auto describe_launch = [&](const char* title, const Launch& l) {
    const auto& p = l.result["plan"];
    say(absl::StrCat("== ", title, ": crashreplay run ", model, " --config ", l.config_path));
    say(absl::StrCat("   plan: capacity ", p.value("capacity", uint64_t{0}), " B, static ",
                     p.value("static_budget", uint64_t{0}), " B (weights ", p.value("weights", uint64_t{0}),
                     " B, KV ", p.value("pool_pages", int64_t{0}), " pages), dynamic ",
                     p.value("dynamic_budget", uint64_t{0}), " B for workspace ", p.value("workspace", uint64_t{0}),
                     " B + CUDA graphs ", p.value("graph_reservation", uint64_t{0}), " B"));
    for (const auto& s : l.result["steps"]) {
      say(absl::StrCat("   step ", s["step"].get<int64_t>(), " ", s["mode"].get<std::string>(), " tokens ",
                       s["tokens"].get<int64_t>(), " digest ", s["digest"].get<std::string>()));
    }
    if (l.result.contains("fault")) {
      say(absl::StrCat("   FAILED ", l.result["fault"]["signature"]["class"].get<std::string>(), " at stage ",
                       l.result["fault"]["signature"]["stage"].get<std::string>(), ": ",
                       l.result["fault"].value("message", std::string())));
    } else {
      say("   ok");
    }
  };
  describe_launch("2. launch 1", *l1);
  describe_launch("3. launch 2", *l2);

  // 4. Replay of launch 2's failing step.
  auto recording = Record(model, launch2, threads);
  if (!recording.ok()) return ReportError(recording.status());
  auto replayed = ReplayUnder(*recording, launch2, threads);
  if (!replayed.ok()) return ReportError(replayed.status());
  auto reference = ReplayUnder(*recording, conservative, threads);
  if (!reference.ok()) return ReportError(reference.status());
  const replay::ReplayReport& fr = *replayed;
  say(absl::StrCat("== 4. replay of launch 2's step ", fr.step, " (", recording->log.size(),
                   " steps recorded), kernel by kernel on CPU: ", fr.outcome));
  say(absl::StrCat("   ", fr.kernels.size(), " kernels ran; last: ",
                   fr.kernels.empty() ? std::string("none") : fr.kernels.back().label));
  if (fr.fault) {
    say(absl::StrCat("   check fired: kernel ", fr.fault->kernel, " layer ", fr.fault->layer, " check ",
                     fr.fault->check, " index ", fr.fault->index, " value ", fr.fault->value));
  }
  say(absl::StrCat("   first non-finite kernel: ", fr.first_nonfinite.empty() ? "none" : fr.first_nonfinite));
  const nlohmann::json replay_bad = FirstBad(*reference, fr);
  say(absl::StrCat("   against conservative.toml on the same recorded inputs: first bad kernel ",
                   replay_bad.is_null() ? std::string("none") : replay_bad["kernel"].get<std::string>(),
                   replay_bad.is_null() ? std::string() : absl::StrCat(" (", replay_bad["reason"].get<std::string>(), ")")));
  std::ofstream(out_dir + "/replay_trace.json") << replay::ChromeTrace(fr.kernels, fr.step).dump() << "\n";
  say("   Chrome trace: " + out_dir + "/replay_trace.json");

  // 5. Bisection of each failure against the conservative configuration.
  struct Case {
    const char* name;
    const std::string* bad;
    const Launch* launch;
  };
  const Case cases[] = {{"oom", &launch1, &*l1}, {"assert", &launch2, &*l2}};
  nlohmann::json findings = nlohmann::json::array();
  std::vector<bisect::FailureSignature> targets;
  for (const Case& c : cases) {
    auto b = Bisect(self, model, conservative, *c.bad, out_dir + "/bisect-" + c.name,
                    out_dir + "/bisect-" + c.name + ".html");
    if (!b.ok()) return ReportError(b.status());
    const nlohmann::json& j = b->json;
    say(absl::StrCat("== 5. bisect ", std::filesystem::path(conservative).filename().string(), " -> ",
                     std::filesystem::path(*c.bad).filename().string(), ": ", j["status"].get<std::string>(), ", ",
                     j["trials"].get<int>(), " trials"));
    if (b->report.status != bisect::BisectStatus::kCulpritFound) {
      return ReportError(absl::InternalError(absl::StrCat("bisect ", *c.bad, ": ", b->report.message)));
    }
    nlohmann::json finding;
    finding["launch"] = std::filesystem::path(*c.bad).filename().string();
    finding["signature"] = {{"class", std::string(bisect::FailureClassName(b->report.target_signature.failure_class))},
                            {"stage", std::string(bisect::FailureStageName(b->report.target_signature.stage))},
                            {"kernel", b->report.target_signature.kernel},
                            {"check", b->report.target_signature.check}};
    finding["culprit"] = j["culprit"];
    finding["culprit_minimal"] = j["culprit_minimal"];
    finding["trials"] = j["trials"];
    finding["reproduce"] = j["reproduce"];
    finding["report"] = b->html_path;
    // First bad kernel. A step fault: the recorded failing step replayed
    // under the bisection's culprit configuration (good + culprit) against
    // the good one, as `bisect CAPTURE` compares kernel tables. A failure
    // before any step (the planner) has no kernel table: it names the
    // component that refused.
    const bool step_fault = recording->log[recording->target].fault->Signature() ==
                            c.launch->result["fault"]["signature"]["class"].get<std::string>() + "/" +
                                c.launch->result["fault"]["signature"]["stage"].get<std::string>() + "/" +
                                c.launch->result["fault"]["signature"]["kernel"].get<std::string>() + "/" +
                                c.launch->result["fault"]["signature"]["check"].get<std::string>();
    if (step_fault) {
      auto culprit_replay = ReplayUnder(*recording, b->report.culprit_config_path, threads);
      if (!culprit_replay.ok()) return ReportError(culprit_replay.status());
      finding["first_bad_kernel"] = FirstBad(*reference, *culprit_replay);
      finding["first_bad_kernel"]["source"] = "recorded step replayed under culprit.toml vs conservative.toml";
    } else if (!j["first_bad_kernel"].is_null()) {
      finding["first_bad_kernel"] = j["first_bad_kernel"];
      finding["first_bad_kernel"]["source"] = "bisection kernel tables";
    } else {
      finding["first_bad_kernel"] = {{"kernel", b->report.target_signature.kernel},
                                     {"reason", "failed before any kernel ran"},
                                     {"source", "failure signature"}};
    }
    say(absl::StrCat("   target: ", bisect::DescribeSignature(b->report.target_signature)));
    say(absl::StrCat("   culprit: ", CulpritText(j["culprit"]),
                     j["culprit_minimal"].get<bool>() ? " (1-minimal)" : " (minimality not proven)"));
    say(absl::StrCat("   first bad kernel: ", finding["first_bad_kernel"]["kernel"].get<std::string>(), " (",
                     finding["first_bad_kernel"]["reason"].get<std::string>(), ")"));
    say(absl::StrCat("   reproduce: ", j["reproduce"].get<std::string>()));
    say(absl::StrCat("   report: ", b->html_path));
    targets.push_back(b->report.target_signature);
    findings.push_back(finding);
  }
  const bool distinct = !bisect::SameBug(targets[0], targets[1]);
  const std::string summary_path = out_dir + "/report.html";
  std::ofstream(summary_path, std::ios::binary) << SummaryHtml(findings);
  say(absl::StrCat("== ", distinct ? "two different bugs" : "ONE bug (same signature)", ": ",
                   bisect::DescribeSignature(targets[0]), " | ", bisect::DescribeSignature(targets[1])));
  say("   summary report: " + summary_path);

  if (json) {
    nlohmann::json out;
    out["model"] = model;
    out["launches"] = {{"launch1", {{"config", l1->config_path}, {"exit_code", l1->exit_code},
                                     {"signature", l1->result.value("signature", nlohmann::json())}}},
                       {"launch2", {{"config", l2->config_path}, {"exit_code", l2->exit_code},
                                     {"signature", l2->result.value("signature", nlohmann::json())},
                                     {"steps", l2->result["steps"]}}}};
    out["replay"] = fr.ToJson();
    out["replay"].erase("kernels");
    out["replay"]["kernels_run"] = fr.kernels.size();
    out["replay"]["first_bad_kernel"] = replay_bad;
    out["findings"] = findings;
    out["distinct_bugs"] = distinct;
    out["report"] = summary_path;
    std::printf("%s\n", out.dump(2).c_str());
  }
  return kExitOk;
}

}  // namespace crashreplay::tools
