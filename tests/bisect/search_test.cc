// End-to-end searches over trial commands with known culprits: real
// processes, real TOML files, the real scheduler and isolation. The oracle
// cases live beside this file (oracles/cases.txt, oracles/oracle.sh); each
// is its own test.
#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <sstream>

#include <gtest/gtest.h>

#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "crashreplay/bisect/bisect.h"
#include "crashreplay/bisect/command_trial.h"
#include "crashreplay/bisect/report.h"
#include "test_util.h"

namespace crashreplay::bisect {
namespace {

using testing::BoolToggles;
using testing::CulpritNames;
using testing::ReadLines;
using testing::TempDir;
using testing::WriteTrialScript;

// --- The oracle cases -------------------------------------------------------

struct OracleCase {
  std::string name;
  int keys = 0;
  std::map<std::string, std::string> options;
  std::vector<std::string> rules;
  std::vector<std::string> statuses = {"culprit_found"};
  std::set<std::string> culprit;
  std::string target_class;
  std::vector<std::pair<std::set<std::string>, std::string>> others;  // culprit, class
  bool flaky = false;
};

std::set<std::string> KeySet(std::string_view plus_list) {
  std::set<std::string> out;
  for (absl::string_view k : absl::StrSplit(absl::string_view(plus_list.data(), plus_list.size()), '+')) {
    out.emplace(k);
  }
  return out;
}

std::vector<OracleCase> LoadCases() {
  std::vector<OracleCase> cases;
  for (const std::string& line : ReadLines(testing::SourcePath(__FILE__, "oracles/cases.txt"))) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> f;
    for (absl::string_view part : absl::StrSplit(line, '|')) f.emplace_back(absl::StripAsciiWhitespace(part));
    if (f.size() != 5) continue;
    OracleCase c;
    c.name = f[0];
    for (char& ch : c.name)
      if (ch == '-') ch = '_';
    c.keys = std::stoi(f[1]);
    for (absl::string_view o : absl::StrSplit(f[2], ' ', absl::SkipEmpty())) {
      const size_t eq = o.find('=');
      c.options[std::string(o.substr(0, eq))] = std::string(o.substr(eq + 1));
    }
    for (absl::string_view r : absl::StrSplit(f[3], ' ', absl::SkipEmpty())) c.rules.emplace_back(r);
    for (absl::string_view e : absl::StrSplit(f[4], ' ', absl::SkipEmpty())) {
      const std::string tok(e);
      if (tok == "flaky")
        c.flaky = true;
      else if (tok.rfind("status=", 0) == 0)
        c.statuses = absl::StrSplit(tok.substr(7), ',');
      else if (tok.rfind("culprit=", 0) == 0)
        c.culprit = KeySet(tok.substr(8));
      else if (tok.rfind("class=", 0) == 0)
        c.target_class = tok.substr(6);
      else if (tok.rfind("other=", 0) == 0) {
        const size_t colon = tok.find(':');
        c.others.push_back({KeySet(tok.substr(6, colon - 6)), tok.substr(colon + 1)});
      }
    }
    cases.push_back(std::move(c));
  }
  return cases;
}

// gtest prints a parameter's bytes unless told otherwise.
void PrintTo(const OracleCase& c, std::ostream* os) { *os << c.name; }

class OracleCases : public ::testing::TestWithParam<OracleCase> {};

std::string Option(const OracleCase& c, const std::string& key, const std::string& fallback) {
  auto it = c.options.find(key);
  return it == c.options.end() ? fallback : it->second;
}

TEST_P(OracleCases, GiveTheKnownCulpritOrClaimNone) {
  const OracleCase& c = GetParam();
  if (Option(c, "memory", "").size() > 0 && std::system("python3 -c pass 2>/dev/null") != 0) {
    GTEST_SKIP() << "python3 is needed for the memory oracle";
  }
  const std::string script = testing::SourcePath(__FILE__, "oracles/oracle.sh");
  const int seeds = std::stoi(Option(c, "seeds", "1"));
  for (int seed = 0; seed < seeds; ++seed) {
    SCOPED_TRACE(c.name + " seed " + std::to_string(seed));
    TempDir dir;
    std::vector<std::string> command = {"sh", script, "--seed=" + std::to_string(seed)};
    command.insert(command.end(), c.rules.begin(), c.rules.end());
    TrialLimits limits;
    if (c.options.count("timeout")) {
      limits.timeout_s = std::stod(c.options.at("timeout"));
      limits.kill_grace_s = 0.2;
    }
    if (c.options.count("memory")) limits.memory_limit_bytes = 1ull << 30;
    CommandTrialRunner runner({command, {}, dir.path(), limits});
    SchedulerOptions so;
    so.jobs = std::stoi(Option(c, "jobs", "1"));
    so.repeat = std::stoi(Option(c, "repeat", "1"));
    so.confirm = std::stoi(Option(c, "confirm", std::to_string(kDefaultConfirmRuns)));
    Scheduler scheduler(runner, so);
    auto [good, bad] = testing::Keys(c.keys);
    BisectOptions o;
    o.good = good;
    o.bad = bad;
    o.workdir = dir.path();
    const BisectReport r = RunBisect(scheduler, o, nullptr);
    const std::string status(BisectStatusName(r.status));
    ASSERT_NE(std::find(c.statuses.begin(), c.statuses.end(), status), c.statuses.end())
        << "status " << status << ": " << r.message;
    if (r.status == BisectStatus::kCulpritFound) {
      EXPECT_EQ(CulpritNames(r), c.culprit) << r.message;
      EXPECT_TRUE(r.culprit_minimal);
      if (!c.target_class.empty()) {
        EXPECT_EQ(FailureClassName(r.target_signature.failure_class), c.target_class);
      }
      for (const auto& [culprit, cls] : c.others) {
        const bool found = std::any_of(r.other_findings.begin(), r.other_findings.end(), [&](const OtherFinding& f) {
          return FailureClassName(f.signature.failure_class) == cls && f.status == FindingStatus::kNarrowed &&
                 std::set<std::string>(f.culprit.begin(), f.culprit.end()) == culprit;
        });
        EXPECT_TRUE(found) << "no other finding " << cls << " narrowed to its culprit\n" << ReportText(r);
      }
      if (c.others.empty() && seeds == 1) {
        EXPECT_TRUE(r.other_findings.empty()) << ReportText(r);
      }
      // The culprit file reproduces the target.
      auto culprit = ReadConfigFile(r.culprit_config_path);
      ASSERT_TRUE(culprit.ok());
    }
    if (r.status == BisectStatus::kFlaky && c.flaky) {
      EXPECT_FALSE(r.flaky.empty()) << r.message;
    }
    if (r.status != BisectStatus::kCulpritFound) {
      EXPECT_TRUE(r.culprit.empty());
    }
    const std::string found = !r.culprit.empty()   ? SummarizeChanges(r.changes, r.culprit, 30)
                              : !r.suspect.empty() ? "suspect " + SummarizeChanges(r.changes, r.suspect, 22)
                                                   : std::string("-");
    std::printf("[ oracle   ] %-24s seed %2d: %-14s %-30s %3d trials %3d runs\n", c.name.c_str(), seed, status.c_str(),
                found.c_str(), r.trials, r.runs);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, OracleCases, ::testing::ValuesIn(LoadCases()),
                         [](const ::testing::TestParamInfo<OracleCase>& info) { return info.param.name; });

TEST(OracleCases, AllCasesWereLoaded) { EXPECT_GE(LoadCases().size(), 30u); }

// --- Specific behaviours ----------------------------------------------------

struct Search {
  BisectReport report;
  int invocations = 0;
};

Search RunSearch(const TempDir& dir, const std::string& script, const Config& good, const Config& bad,
                 SchedulerOptions so = {}, TrialLimits limits = {},
                 std::optional<std::string> threshold = std::nullopt) {
  CommandTrialRunner runner({{script, "{config}"}, {}, dir.path(), limits});
  Progress progress(stderr, /*live=*/false, /*quiet=*/true);
  Scheduler scheduler(runner, so, &progress);
  BisectOptions o;
  o.good = good;
  o.bad = bad;
  o.workdir = dir.path();
  o.threshold_toggle = threshold;
  o.threshold_precision = 0.001;
  Search s;
  s.report = RunBisect(scheduler, o, &progress);
  s.invocations = static_cast<int>(ReadLines(dir / "invocations.log").size());
  return s;
}

SchedulerOptions Options(int jobs, int repeat = 1, int confirm = kDefaultConfirmRuns) {
  SchedulerOptions so;
  so.jobs = jobs;
  so.repeat = repeat;
  so.confirm = confirm;
  return so;
}

TEST(BisectSearch, TheCulpritFileReproducesAndTheCommandSaysHow) {
  TempDir dir;
  const std::string script = WriteTrialScript(dir, "one.sh", "on t11 && exit 1\nexit 0");
  auto [good, bad] = BoolToggles(16);
  Search s = RunSearch(dir, script, good, bad);
  ASSERT_EQ(s.report.status, BisectStatus::kCulpritFound) << s.report.message;
  EXPECT_EQ(CulpritNames(s.report), (std::set<std::string>{"t11"}));
  EXPECT_EQ(s.invocations, s.report.runs);
  auto culprit = ReadConfigFile(s.report.culprit_config_path);
  ASSERT_TRUE(culprit.ok());
  EXPECT_TRUE(culprit->at("t11").as_bool());
  EXPECT_FALSE(culprit->at("t3").as_bool());
  EXPECT_NE(s.report.reproduce.find("culprit.toml"), std::string::npos);
  EXPECT_NE(s.report.reproduce.find(script), std::string::npos);
}

TEST(BisectSearch, WithoutConfirmationNoConfigurationRunsTwice) {
  TempDir dir;
  const std::string script = WriteTrialScript(dir, "pair.sh", "on t0 && on t7 && exit 1\nexit 0");
  auto [good, bad] = BoolToggles(12);
  Search s = RunSearch(dir, script, good, bad, Options(3, 1, 0));
  ASSERT_EQ(s.report.status, BisectStatus::kCulpritFound);
  const std::vector<std::string> lines = ReadLines(dir / "invocations.log");
  const std::set<std::string> distinct(lines.begin(), lines.end());
  EXPECT_EQ(distinct.size(), lines.size()) << "a configuration ran twice";
  EXPECT_EQ(static_cast<int>(lines.size()), s.report.trials);
}

TEST(BisectSearch, ConfirmationRerunsOnlyTheConfigurationsTheCulpritRestsOn) {
  TempDir dir;
  const std::string script = WriteTrialScript(dir, "pair.sh", "on t0 && on t7 && exit 1\nexit 0");
  auto [good, bad] = BoolToggles(12);
  Search s = RunSearch(dir, script, good, bad, Options(3, 1, 2));
  ASSERT_EQ(s.report.status, BisectStatus::kCulpritFound);
  std::map<std::string, int> count;
  for (const std::string& l : ReadLines(dir / "invocations.log")) ++count[l];
  int rerun = 0;
  for (const auto& [config, n] : count) {
    EXPECT_TRUE(n == 1 || n == 3) << config;
    rerun += n == 3;
  }
  EXPECT_EQ(rerun, 4);  // good, {t0, t7}, {t0}, {t7}
  EXPECT_EQ(s.report.runs, s.report.trials + 4 * 2);
}

TEST(BisectSearch, ResultDoesNotDependOnParallelism) {
  TempDir d1, d2;
  const char* body = "on t1 && on t6 && exit 1\nexit 0";
  auto [good, bad] = BoolToggles(10);
  Search s1 = RunSearch(d1, WriteTrialScript(d1, "s.sh", body), good, bad, Options(1));
  Search s4 = RunSearch(d2, WriteTrialScript(d2, "s.sh", body), good, bad, Options(4));
  EXPECT_EQ(CulpritNames(s1.report), (std::set<std::string>{"t1", "t6"}));
  EXPECT_EQ(s1.report.culprit, s4.report.culprit);
}

TEST(BisectSearch, AFlakyConfigurationMakesTheSearchFlakyNotCulpritFound) {
  TempDir dir;
  // t6 always fails. t1 without t6 fails every other run of the same
  // configuration (a counter file per configuration), with the same exit
  // code: a second, intermittent cause of the same failure.
  const std::string script =
      WriteTrialScript(dir, "flaky.sh",
                       "on t6 && exit 1\n"
                       "if on t1; then\n"
                       "  f=\"" +
                           dir.path() +
                           "/count-$(grep -v '^#' \"$cfg\" | cksum | cut -d' ' -f1)\"\n"
                           "  n=$(cat \"$f\" 2>/dev/null || echo 0); n=$((n+1)); echo $n > \"$f\"\n"
                           "  [ $((n % 2)) -eq 1 ] && exit 1\n"
                           "fi\nexit 0");
  auto [good, bad] = BoolToggles(8);
  Search s = RunSearch(dir, script, good, bad, Options(1, 2));
  ASSERT_EQ(s.report.status, BisectStatus::kFlaky) << s.report.message;
  EXPECT_TRUE(s.report.culprit.empty());
  // The search stops at the first configuration that reproduced the target
  // only in some runs: no further trial could earn a culprit.
  EXPECT_FALSE(s.report.candidates.empty());
  ASSERT_FALSE(s.report.flaky.empty());
  for (const FlakyConfig& f : s.report.flaky) {
    EXPECT_TRUE(f.config.at("t1").as_bool());
    EXPECT_FALSE(f.config.at("t6").as_bool());
    EXPECT_EQ(f.result.bad_runs * 2, f.result.runs);
  }
  EXPECT_NE(s.report.message.find("flaky"), std::string::npos);
  EXPECT_EQ(s.report.message.find("--repeat to see"), std::string::npos);
}

TEST(BisectSearch, AFlakyBadConfigurationIsReportedAsSuchWithoutRepeatAdvice) {
  TempDir dir;
  // Fails on odd runs only.
  const std::string script =
      WriteTrialScript(dir, "odd.sh",
                       "on t2 || exit 0\n"
                       "f=\"" +
                           dir.path() +
                           "/count\"\n"
                           "n=$(cat \"$f\" 2>/dev/null || echo 0); n=$((n+1)); echo $n > \"$f\"\n"
                           "[ $((n % 2)) -eq 0 ] && exit 1\nexit 0");
  auto [good, bad] = BoolToggles(4);
  Search s = RunSearch(dir, script, good, bad);
  EXPECT_EQ(s.report.status, BisectStatus::kFlaky) << s.report.message;
  EXPECT_NE(s.report.message.find("bad configuration"), std::string::npos);
  EXPECT_NE(s.report.message.find("is flaky"), std::string::npos);
  EXPECT_EQ(s.report.message.find("rerun with --repeat"), std::string::npos);
}

TEST(BisectSearch, CrashBySignalIsClassifiedAndBisected) {
  TempDir dir;
  const std::string script = WriteTrialScript(dir, "segv.sh", "on t5 && kill -SEGV $$\nexit 0");
  auto [good, bad] = BoolToggles(8);
  Search s = RunSearch(dir, script, good, bad);
  ASSERT_EQ(s.report.status, BisectStatus::kCulpritFound) << s.report.message;
  EXPECT_EQ(s.report.target_signature.failure_class, FailureClass::kCrashSignal);
  EXPECT_EQ(s.report.target_signature.check, "SIGSEGV");
  EXPECT_EQ(CulpritNames(s.report), (std::set<std::string>{"t5"}));
}

TEST(BisectSearch, HangIsClassifiedTimeoutAndBisected) {
  TempDir dir;
  const std::string script = WriteTrialScript(dir, "hang.sh", "on t2 && sleep 30\nexit 0");
  auto [good, bad] = BoolToggles(4);
  TrialLimits limits;
  limits.timeout_s = 0.4;
  limits.kill_grace_s = 0.2;
  Search s = RunSearch(dir, script, good, bad, Options(4), limits);
  ASSERT_EQ(s.report.status, BisectStatus::kCulpritFound) << s.report.message;
  EXPECT_EQ(s.report.target_signature.failure_class, FailureClass::kTimeout);
  EXPECT_EQ(CulpritNames(s.report), (std::set<std::string>{"t2"}));
  for (const HistoryEntry& h : s.report.history) EXPECT_LT(h.result.duration_s, 5.0);
}

TEST(BisectSearch, ASignatureFileNamesTheBugAndTheThresholdIsSearched) {
  TempDir dir;
  // The target: a device assert in decode when t3 is on. With the bad
  // configuration's mem_fraction_static=0.95 but t3 off, graph capture OOMs.
  const std::string script =
      WriteTrialScript(dir, "sig.sh",
                       "if on t3; then\n"
                       "  echo "
                       "'{\"class\":\"device_assert\",\"stage\":\"decode\",\"kernel\":\"paged_decode\",\"check\":"
                       "\"page_index_in_pool\",\"step\":17}' > \"$CRASHREPLAY_SIGNATURE_OUT\"\n"
                       "  exit 1\n"
                       "fi\n"
                       "if [ \"$(val mem_fraction_static)\" = 0.95 ]; then\n"
                       "  echo '{\"class\":\"oom\",\"stage\":\"graph_capture\"}' > \"$CRASHREPLAY_SIGNATURE_OUT\"\n"
                       "  exit 1\n"
                       "fi\nexit 0");
  auto [good, bad] = BoolToggles(6);
  good["mem_fraction_static"] = ConfigValue::Float(0.85);
  bad["mem_fraction_static"] = ConfigValue::Float(0.95);
  Search s = RunSearch(dir, script, good, bad, {}, {}, std::string("mem_fraction_static"));
  ASSERT_EQ(s.report.status, BisectStatus::kCulpritFound) << s.report.message;
  EXPECT_EQ(s.report.target_signature.failure_class, FailureClass::kDeviceAssert);
  EXPECT_EQ(s.report.target_signature.kernel, "paged_decode");
  EXPECT_EQ(CulpritNames(s.report), (std::set<std::string>{"t3"}));
  ASSERT_EQ(s.report.other_findings.size(), 1u);
  const OtherFinding& f = s.report.other_findings[0];
  EXPECT_EQ(f.signature.failure_class, FailureClass::kOom);
  EXPECT_EQ(f.signature.stage, FailureStage::kGraphCapture);
  EXPECT_EQ(f.status, FindingStatus::kNarrowed);
  EXPECT_EQ(f.culprit, std::vector<std::string>{"mem_fraction_static"});
  auto finding = ReadConfigFile(f.config_path);
  ASSERT_TRUE(finding.ok());
  EXPECT_DOUBLE_EQ(finding->at("mem_fraction_static").as_float(), 0.95);
  EXPECT_FALSE(finding->at("t3").as_bool());
  // mem_fraction_static is not in the culprit, so the threshold is searched
  // on the good configuration: everything below 0.95 passes.
  ASSERT_TRUE(s.report.threshold.has_value());
  EXPECT_TRUE(s.report.threshold->bracketed);
  EXPECT_EQ(s.report.threshold->fail_signature.failure_class, FailureClass::kOom);
  EXPECT_GE(s.report.threshold->last_pass, 0.949);
  EXPECT_DOUBLE_EQ(s.report.threshold->first_fail, 0.95);
}

TEST(BisectSearch, AnIntegerThresholdIsFoundAndWrittenAsAnInteger) {
  TempDir dir;
  const std::string script = WriteTrialScript(dir, "batch.sh", "[ \"$(val max_batch)\" -ge 37 ] && exit 1\nexit 0");
  Config good = {{"max_batch", ConfigValue::Int(16)}, {"t0", ConfigValue::Bool(false)}};
  Config bad = {{"max_batch", ConfigValue::Int(64)}, {"t0", ConfigValue::Bool(true)}};
  Search s = RunSearch(dir, script, good, bad, {}, {}, std::string("max_batch"));
  ASSERT_EQ(s.report.status, BisectStatus::kCulpritFound) << s.report.message;
  EXPECT_EQ(CulpritNames(s.report), (std::set<std::string>{"max_batch"}));
  ASSERT_TRUE(s.report.threshold.has_value());
  EXPECT_EQ(s.report.threshold->last_pass, 36);
  EXPECT_EQ(s.report.threshold->first_fail, 37);
  const nlohmann::json j = ReportJson(s.report);
  EXPECT_TRUE(j["threshold"]["first_fail"].is_number_integer());
  EXPECT_EQ(j["threshold"]["first_fail"].dump(), "37");
  EXPECT_NE(ReportText(s.report).find("passes up to 36 and fails from 37"), std::string::npos);
}

TEST(BisectSearch, HostileConfigurationValuesAreDataNeverCode) {
  TempDir dir;
  const std::string script = WriteTrialScript(dir, "hostile.sh", "on t4 && exit 1\nexit 0");
  auto [good, bad] = BoolToggles(6);
  const std::string pwned = dir / "pwned";
  bad["h_shell"] = ConfigValue::String("$(touch " + pwned + ")`touch " + pwned + "`; touch " + pwned);
  bad["h_quotes"] = ConfigValue::String("'\"\\ </td><script>alert(1)</script>");
  static constexpr char kBytes[] = "nul\0byte \xff\xfe invalid utf-8";
  bad["h_bytes"] = ConfigValue::String(std::string(kBytes, sizeof(kBytes) - 1));
  bad["h_newline"] = ConfigValue::String("line one\nline two\r\n");
  bad["h_long"] = ConfigValue::String(std::string(100000, 'x'));
  Search s = RunSearch(dir, script, good, bad);
  ASSERT_EQ(s.report.status, BisectStatus::kCulpritFound) << s.report.message;
  EXPECT_EQ(CulpritNames(s.report), (std::set<std::string>{"t4"}));
  struct stat st;
  EXPECT_NE(::stat(pwned.c_str(), &st), 0) << "a configuration value was executed";
  // Every report renders: JSON stays valid UTF-8, HTML escapes the markup.
  const std::string json = ReportJson(s.report).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  EXPECT_FALSE(nlohmann::json::parse(json, nullptr, false).is_discarded());
  const std::string html = ReportHtml(s.report);
  EXPECT_EQ(html.find("<script>alert"), std::string::npos);
  EXPECT_NE(html.find("&lt;script&gt;alert(1)"), std::string::npos);
  EXPECT_EQ(html.find('\xff'), std::string::npos);
  EXPECT_LT(html.size(), 60000u) << "a 100 KB value must not be copied into every row";
}

TEST(BisectSearch, GoodConfigurationFailingTooStopsWithGoodFails) {
  TempDir dir;
  const std::string script = WriteTrialScript(dir, "always.sh", "exit 3");
  auto [good, bad] = BoolToggles(4);
  Search s = RunSearch(dir, script, good, bad);
  EXPECT_EQ(s.report.status, BisectStatus::kGoodFails);
  EXPECT_NE(s.report.message.find("good configuration"), std::string::npos);
  EXPECT_EQ(s.report.trials, 2);
  EXPECT_EQ(s.report.good_result.runs, 1 + kDefaultConfirmRuns);  // confirmed before concluding
}

TEST(BisectSearch, BadConfigurationPassingStopsWithNotReproducible) {
  TempDir dir;
  const std::string script = WriteTrialScript(dir, "never.sh", "exit 0");
  auto [good, bad] = BoolToggles(4);
  Search s = RunSearch(dir, script, good, bad);
  EXPECT_EQ(s.report.status, BisectStatus::kNotReproducible);
  EXPECT_NE(s.report.message.find("does not fail"), std::string::npos);
}

TEST(BisectSearch, AnAbortingExitCodeStopsTheSearch) {
  TempDir dir;
  // The first probe, {t0}, exits 255: like git bisect run, that aborts.
  const std::string script = WriteTrialScript(dir, "abort.sh", "on t1 && exit 1\non t0 && exit 255\nexit 0");
  auto [good, bad] = BoolToggles(2);
  Search s = RunSearch(dir, script, good, bad);
  EXPECT_EQ(s.report.status, BisectStatus::kAborted);
  EXPECT_NE(s.report.message.find("exit code 255"), std::string::npos) << s.report.message;
  EXPECT_EQ(s.report.trials, 3);
}

}  // namespace
}  // namespace crashreplay::bisect
