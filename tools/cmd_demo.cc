// `crashreplay demo [--out DIR] [--json]`: the README's first command. Tells
// the seed's crash story end to end with the real machinery, in sglang's words:
//   1. `make-model`: a tiny GLM-5 (glm_moe_dsa: MLA + DSA indexer) ModelOpt
//      NVFP4 checkpoint with the real exclude list;
//   2. launch 1 (`run --config configs/demo/launch1_oom.toml`, sglang server
//      arguments on a recorded RTX PRO 6000, sm_120, 96 GB): OOM at graph
//      capture, from the memory planner's arithmetic;
//   3. launch 2 (`run --config configs/demo/launch2_assert.toml`): starts,
//      prefills, fails in decode: the DSA decode backend's kernel has no
//      sm_120 code (kernel_archs.cc);
//   4. `replay` of launch 2's capture: the failing step kernel by kernel, and
//      the same recorded step under the conservative configuration;
//   5. one bisection per failing launch against configs/demo/conservative.toml
//      (RunBisect; each trial is a `crashreplay run` process), the first bad
//      kernel from replays of the capture, and the HTML reports.
// Launches carry `--record`, which writes sglang's manifest form (the same
// path a capture from the sglang adapter takes). Every step execs this binary's
// own subcommands or calls the bisect library as `crashreplay bisect` does.
// Nothing here decides a failure: the configuration files and the engine do.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "command.h"
#include "commands_decl.h"
#include "crashreplay/base/status.h"
#include "crashreplay/bisect/bisect.h"
#include "crashreplay/bisect/kernel_table.h"
#include "crashreplay/bisect/process.h"
#include "crashreplay/bisect/report.h"
#include "crashreplay/bisect/scheduler.h"
#include "crashreplay/formats/config_file.h"
#include "exit_codes.h"
#include "run_trial.h"

#ifndef CRASHREPLAY_SOURCE_DIR
#define CRASHREPLAY_SOURCE_DIR "."
#endif

namespace crashreplay::tools {
namespace {

constexpr char kPrompt[] = "Say hello in one sentence";
constexpr char kDevice[] = "NVIDIA RTX PRO 6000 Blackwell Server Edition";  // the recorded device's name
constexpr int kMaxNewTokens = 8;

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
  std::string capture;  // the session directory `run --record` wrote
  int exit_code = -1;
  nlohmann::json result;  // `run --json`
};

absl::StatusOr<Launch> RunLaunch(const std::string& self, const std::string& model, const std::string& config,
                                 const std::string& record) {
  std::error_code ignored;
  std::filesystem::remove_all(record, ignored);  // a rerun records afresh
  CR_ASSIGN_OR_RETURN(bisect::ProcessResult p,
                      Exec({self, "run", model, "--config", config, "--prompt", kPrompt, "--max-new-tokens",
                            std::to_string(kMaxNewTokens), "--record", record, "--device-name", kDevice, "--json"}));
  Launch l;
  l.capture = record;
  l.config_path = config;
  l.exit_code = p.exited ? p.exit_code : -1;
  l.result = nlohmann::json::parse(p.stdout_text, nullptr, /*allow_exceptions=*/false);
  if (l.result.is_discarded() || (l.exit_code != kExitOk && l.exit_code != kExitFailed)) {
    return absl::InternalError(
        absl::StrCat("crashreplay run --config ", config, " exited ", l.exit_code, ": ", p.stderr_tail));
  }
  return l;
}

// `crashreplay replay CAPTURE --json [--config FILE] [--trace OUT]`.
absl::StatusOr<nlohmann::json> Replay(const std::string& self, const std::string& capture, const std::string& config,
                                      const std::string& trace) {
  std::vector<std::string> argv = {self, "replay", capture, "--json"};
  if (!config.empty()) argv.insert(argv.end(), {"--config", config});
  if (!trace.empty()) argv.insert(argv.end(), {"--trace", trace});
  CR_ASSIGN_OR_RETURN(bisect::ProcessResult p, Exec(argv));
  nlohmann::json j = nlohmann::json::parse(p.stdout_text, nullptr, /*allow_exceptions=*/false);
  if (!p.exited || (p.exit_code != kExitOk && p.exit_code != kExitFailed) || j.is_discarded()) {
    return absl::InternalError(absl::StrCat(bisect::ShellJoin(argv), " exited ", p.exit_code, ": ", p.stderr_tail));
  }
  return j;
}

// First bad kernel of replay `test` against replay `reference`
// (bisect/kernel_table.h); a kernel whose check fired before any earlier
// divergence is the first bad one itself.
absl::StatusOr<nlohmann::json> FirstBad(const nlohmann::json& reference, const nlohmann::json& test) {
  CR_ASSIGN_OR_RETURN(std::vector<bisect::KernelRow> ref_rows, bisect::KernelRowsFromJson(reference["kernels"]));
  CR_ASSIGN_OR_RETURN(std::vector<bisect::KernelRow> test_rows, bisect::KernelRowsFromJson(test["kernels"]));
  const auto f = bisect::FirstBadKernel(ref_rows, test_rows);
  const nlohmann::json& kernels = test["kernels"];
  for (size_t i = 0; i < kernels.size(); ++i) {
    if (!kernels[i].value("failed", false)) continue;
    if (f && f->index < i) break;
    nlohmann::json j = {
        {"reason", "check_failed"}, {"index", i}, {"kernel", kernels[i]["name"]}, {"layer", kernels[i]["layer"]}};
    if (test.contains("fault")) j["check"] = test["fault"]["signature"]["check"];
    return j;
  }
  return f ? bisect::KernelFindingToJson(*f) : nlohmann::json();
}

struct Bisection {
  bisect::BisectReport report;
  nlohmann::json json;  // ReportJson, after WriteReports
  std::string html_path;
};

absl::StatusOr<Bisection> Bisect(const std::string& self, const std::string& model, const std::string& good,
                                 const std::string& bad, const std::string& workdir, const std::string& html_path) {
  CR_ASSIGN_OR_RETURN(Config good_config, ReadConfigFile(good));
  CR_ASSIGN_OR_RETURN(Config bad_config, ReadConfigFile(bad));
  std::error_code ignored;
  std::filesystem::remove_all(workdir, ignored);  // a rerun starts a fresh search
  std::filesystem::create_directories(workdir);
  bisect::CommandTrialOptions co;
  co.command = {self,
                "run",
                model,
                "--config",
                "{config}",
                "--prompt",
                kPrompt,
                "--max-new-tokens",
                std::to_string(kMaxNewTokens),
                "--json"};
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
  b.html_path = html_path;
  return b;
}

// Writes report.json into the bisection's work directory and the HTML report.
absl::Status WriteReports(Bisection& b, const std::string& workdir) {
  b.json = bisect::ReportJson(b.report);
  std::ofstream(workdir + "/report.json") << b.json.dump(2) << "\n";
  std::ofstream html(b.html_path, std::ios::binary);
  html << bisect::ReportHtml(b.report);
  if (!html) return absl::InternalError(absl::StrCat("cannot write the HTML report ", b.html_path));
  return absl::OkStatus();
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
      "End-to-end demo: build a tiny GLM-5 (glm_moe_dsa) NVFP4 checkpoint, launch it with the failing "
      "session's two sglang configurations on a recorded RTX PRO 6000 (sm_120): OOM at graph capture, then a "
      "decode failure; replay the failing step kernel by kernel, and bisect both against a conservative "
      "configuration.",
      "demo");
  std::string out_dir = "demo-out";
  std::string configs = std::string(CRASHREPLAY_SOURCE_DIR) + "/configs/demo";
  bool json = false;
  app.add_option("--out", out_dir, "output directory (model, bisection work dirs, reports)");
  app.add_option("--configs", configs, "directory holding launch1_oom.toml, launch2_assert.toml, conservative.toml");
  app.add_flag("--json", json, "print the findings as JSON instead of the story");
  if (auto rc = ParseArgs(app, argc, argv)) return *rc;

  std::error_code fs_error;
  std::filesystem::create_directories(out_dir, fs_error);
  out_dir = std::filesystem::absolute(out_dir).lexically_normal().string();
  const std::string self = SelfPath("crashreplay");
  const std::string model = out_dir + "/model";
  const std::string launch1 = configs + "/launch1_oom.toml";
  const std::string launch2 = configs + "/launch2_assert.toml";
  const std::string conservative = configs + "/conservative.toml";
  FILE* story = json ? stderr : stdout;  // with --json the story goes to stderr
  auto say = [&](const std::string& line) { std::fprintf(story, "%s\n", line.c_str()); };

  // The three files first, so a typo fails before any work.
  for (const std::string* path : {&launch1, &launch2, &conservative}) {
    if (auto c = ReadConfigFile(*path); !c.ok()) return ReportError(c.status());
  }

  // 1. The checkpoint.
  auto made = Exec({self,    "make-model",         model, "--arch",    "glm_moe_dsa", "--quant",
                    "nvfp4", "--layers",           "3",   "--heads",   "8",           "--intermediate",
                    "256",   "--moe-intermediate", "128", "--experts", "16",          "--experts-per-tok",
                    "4",     "--shared-experts",   "1",   "--n-group", "4",           "--topk-group",
                    "2"});
  if (!made.ok()) return ReportError(made.status());
  if (!made->exited || made->exit_code != 0) {
    return ReportError(absl::InternalError(absl::StrCat("make-model failed: ", made->stderr_tail)));
  }
  say("== 1. model: " + std::string(absl::StripTrailingAsciiWhitespace(made->stdout_text)));
  say("   (GLM-5 layout, glm_moe_dsa: MLA with a 512+64 latent and the DSA lightning indexer; ModelOpt NVFP4 "
      "routed experts, attention, indexer and shared experts bf16 in its exclude list; 3 layers, 16 routed "
      "experts + 1 shared, top-4 of 4 groups)");
  say(std::string("   recorded device: ") + kDevice + " (sm_120, 96 GB), 8 ranks");

  // 2-3. The two launches of the failing session.
  auto l1 = RunLaunch(self, model, launch1, out_dir + "/launch1");
  if (!l1.ok()) return ReportError(l1.status());
  auto l2 = RunLaunch(self, model, launch2, out_dir + "/launch2");
  if (!l2.ok()) return ReportError(l2.status());
  auto describe_launch = [&](const char* title, const Launch& l) {
    const auto& p = l.result["plan"];
    say(absl::StrCat("== ", title, ": crashreplay run ", model, " --config ", l.config_path, " --record ", l.capture));
    say(absl::StrCat("   plan: capacity ", p.value("capacity", uint64_t{0}), " B, static ",
                     p.value("static_budget", uint64_t{0}), " B (weights ", p.value("weights", uint64_t{0}), " B, KV ",
                     p.value("pool_pages", int64_t{0}), " pages), dynamic ", p.value("dynamic_budget", uint64_t{0}),
                     " B for workspace ", p.value("workspace", uint64_t{0}), " B + CUDA graphs ",
                     p.value("graph_reservation", uint64_t{0}), " B"));
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

  // 4. Replay of launch 2's failing step from its capture.
  const std::string trace = out_dir + "/replay_trace.json";
  auto replayed = Replay(self, l2->capture, "", trace);
  if (!replayed.ok()) return ReportError(replayed.status());
  auto reference = Replay(self, l2->capture, conservative, "");
  if (!reference.ok()) return ReportError(reference.status());
  const nlohmann::json& fr = *replayed;
  const nlohmann::json& fr_kernels = fr["kernels"];
  say(absl::StrCat("== 4. crashreplay replay ", l2->capture, " (step ", fr["step"].get<int64_t>(),
                   ", kernel by kernel on CPU): ", fr["outcome"].get<std::string>(), "; weights ",
                   fr.value("weights", std::string("?"))));
  say(absl::StrCat("   ", fr.value("detail", std::string())));
  say(absl::StrCat("   ", fr_kernels.size(), " kernels ran; last: ",
                   fr_kernels.empty() ? std::string("none") : fr_kernels.back()["name"].get<std::string>()));
  if (fr.contains("fault")) {
    const auto& f = fr["fault"];
    say(absl::StrCat("   check fired: kernel ", f["signature"].value("kernel", std::string()), " layer ",
                     f.value("layer", -1), " check ", f["signature"].value("check", std::string()), " index ",
                     f.value("index", int64_t{0}), " value ", f.value("value", 0.0), " (matches the recorded failure: ",
                     fr.value("matches_recorded_failure", false) ? "yes" : "no", ")"));
  }
  const std::string nonfinite = fr.value("first_nonfinite_kernel", std::string());
  say(absl::StrCat("   first non-finite kernel: ", nonfinite.empty() ? "none" : nonfinite));
  auto replay_bad = FirstBad(*reference, fr);
  if (!replay_bad.ok()) return ReportError(replay_bad.status());
  say(absl::StrCat("   same step under conservative.toml: ", reference->value("outcome", std::string()),
                   "; first bad kernel against it: ",
                   replay_bad->is_null() ? std::string("none")
                                         : absl::StrCat((*replay_bad)["kernel"].get<std::string>(), " (",
                                                        (*replay_bad)["reason"].get<std::string>(), ")")));
  say("   Chrome trace: " + trace);

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
    const std::string workdir = out_dir + "/bisect-" + c.name;
    auto b = Bisect(self, model, conservative, *c.bad, workdir, out_dir + "/bisect-" + c.name + ".html");
    if (!b.ok()) return ReportError(b.status());
    if (b->report.status != bisect::BisectStatus::kCulpritFound) {
      (void)WriteReports(*b, workdir);
      return ReportError(absl::InternalError(absl::StrCat("bisect ", *c.bad, ": ", b->report.message)));
    }
    // First bad kernel. A failure inside a recorded step: the step replayed
    // under the bisection's culprit configuration (good + culprit) against the
    // good one, as `bisect CAPTURE` compares kernel tables; these tables also
    // feed the report's kernel chart. A failure before any step (the planner)
    // has no kernel table: it names what refused.
    nlohmann::json first_bad;
    const nlohmann::json& launch_fault = c.launch->result["fault"];
    if (launch_fault.value("step", int64_t{-1}) >= 0) {
      auto culprit_replay = Replay(self, c.launch->capture, b->report.culprit_config_path, "");
      if (!culprit_replay.ok()) return ReportError(culprit_replay.status());
      auto good_replay = Replay(self, c.launch->capture, conservative, "");
      if (!good_replay.ok()) return ReportError(good_replay.status());
      auto fb = FirstBad(*good_replay, *culprit_replay);
      if (!fb.ok()) return ReportError(fb.status());
      first_bad = *fb;
      first_bad["source"] = "replay of the recorded step: culprit.toml vs conservative.toml";
      auto ref_rows = bisect::KernelRowsFromJson((*good_replay)["kernels"]);
      auto test_rows = bisect::KernelRowsFromJson((*culprit_replay)["kernels"]);
      if (ref_rows.ok() && test_rows.ok()) {
        b->report.reference_kernels = *ref_rows;
        b->report.culprit_kernels = *test_rows;
        b->report.first_bad_kernel = bisect::FirstBadKernel(*ref_rows, *test_rows, b->report.tolerance);
      }
    }
    if (absl::Status s = WriteReports(*b, workdir); !s.ok()) return ReportError(s);
    const nlohmann::json& j = b->json;
    say(absl::StrCat("== 5. bisect ", std::filesystem::path(conservative).filename().string(), " -> ",
                     std::filesystem::path(*c.bad).filename().string(), ": ", j["status"].get<std::string>(), ", ",
                     j["trials"].get<int>(), " trials"));
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
    if (!first_bad.is_null()) {
      finding["first_bad_kernel"] = first_bad;
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
  auto short_sig = [](const nlohmann::json& s) {
    return absl::StrCat(s["class"].get<std::string>(), "/", s["stage"].get<std::string>(), "/",
                        s["kernel"].get<std::string>(), "/", s["check"].get<std::string>());
  };
  say(absl::StrCat("== ", distinct ? "two different bugs" : "ONE bug (same signature)", ": ",
                   short_sig(findings[0]["signature"]), " and ", short_sig(findings[1]["signature"])));
  say("   summary report: " + summary_path);

  if (json) {
    nlohmann::json out;
    out["model"] = model;
    out["launches"] = {{"launch1",
                        {{"config", l1->config_path},
                         {"exit_code", l1->exit_code},
                         {"capture", l1->capture},
                         {"signature", l1->result.value("signature", nlohmann::json())}}},
                       {"launch2",
                        {{"config", l2->config_path},
                         {"exit_code", l2->exit_code},
                         {"capture", l2->capture},
                         {"signature", l2->result.value("signature", nlohmann::json())},
                         {"steps", l2->result["steps"]}}}};
    out["replay"] = fr;
    out["replay"].erase("kernels");
    out["replay"]["capture"] = l2->capture;
    out["replay"]["kernels_run"] = fr_kernels.size();
    out["replay"]["trace"] = trace;
    out["replay"]["first_bad_kernel_vs_conservative"] = *replay_bad;
    out["findings"] = findings;
    out["distinct_bugs"] = distinct;
    out["report"] = summary_path;
    std::printf("%s\n", out.dump(2).c_str());
  }
  return kExitOk;
}

}  // namespace crashreplay::tools
