// Reports and progress output, from a real search whose trials produce
// per-kernel tables (written with the signature, as an external command may).
#include "crashreplay/bisect/report.h"

#include <cstdio>

#include <gtest/gtest.h>

#include "test_util.h"

namespace crashreplay::bisect {
namespace {

using testing::ReadFile;
using testing::TempDir;
using testing::WriteTrialScript;

// With t2 on, attention in layer 1 produces NaN and the run fails non-finite.
std::string KernelScript(const TempDir& dir) {
  return WriteTrialScript(
      dir, "kern.sh",
      "row() { printf "
      "'{\"name\":\"%s\",\"layer\":%s,\"numel\":64,\"nan_count\":%s,\"inf_count\":0,\"digest\":\"%s\",\"max_abs\":%s}' "
      "\"$@\"; }\n"
      "if on t2; then nan=5; dig=bad; mx=9.0; else nan=0; dig=ok; mx=1.0; fi\n"
      "k=\"[$(row embedding -1 0 e 1.0),$(row attention 0 0 a0 2.0),$(row attention 1 $nan $dig $mx),$(row lm_head -1 "
      "$nan $dig $mx)]\"\n"
      "if on t2; then\n"
      "  printf "
      "'{\"signature\":{\"class\":\"non_finite\",\"stage\":\"decode\",\"kernel\":\"sampling\",\"check\":\"probs_"
      "finite\"},\"kernels\":%s}' \"$k\" > \"$CRASHREPLAY_SIGNATURE_OUT\"\n"
      "  exit 1\n"
      "fi\n"
      "printf '{\"signature\":{\"class\":\"none\"},\"kernels\":%s}' \"$k\" > \"$CRASHREPLAY_SIGNATURE_OUT\"\nexit 0");
}

BisectReport Search(const TempDir& dir) {
  CommandTrialRunner runner({{KernelScript(dir)}, {}, dir.path(), {}});
  Progress progress(stderr, false, true);
  Scheduler s(runner, {}, &progress);
  auto [good, bad] = testing::BoolToggles(6);
  BisectOptions o;
  o.good = good;
  o.bad = bad;
  o.workdir = dir.path();
  return RunBisect(s, o, &progress);
}

TEST(Report, FirstBadKernelComesFromTheTrialsKernelTables) {
  TempDir dir;
  BisectReport r = Search(dir);
  ASSERT_EQ(r.status, BisectStatus::kCulpritFound);
  ASSERT_TRUE(r.first_bad_kernel.has_value());
  EXPECT_EQ(r.first_bad_kernel->reason, KernelFinding::Reason::kNonFinite);
  EXPECT_EQ(r.first_bad_kernel->test.name, "attention");
  EXPECT_EQ(r.first_bad_kernel->test.layer, 1);
  const std::string text = ReportText(r);
  EXPECT_NE(text.find("first bad kernel: kernel #2 attention (layer 1) goes non-finite"), std::string::npos) << text;
  EXPECT_NE(text.find("t2 = true"), std::string::npos);
  EXPECT_NE(text.find("reproduce:"), std::string::npos);
}

TEST(Report, ReferenceConfigurationSuppliesTheReferenceTable) {
  TempDir dir;
  CommandTrialRunner runner({{KernelScript(dir)}, {}, dir.path(), {}});
  Scheduler s(runner, {});
  auto [good, bad] = testing::BoolToggles(6);
  BisectOptions o;
  o.good = good;
  o.bad = bad;
  o.workdir = dir.path();
  // A reference run that is itself non-finite at attention layer 1 (as a
  // wrong reference would be) must not be blamed: that kernel is skipped, and
  // lm_head, non-finite in the reference too, is skipped as well.
  Config reference = good;
  reference["t2"] = ConfigValue::Bool(true);
  reference["reference_backend"] = ConfigValue::Bool(true);
  o.reference = reference;
  BisectReport r = RunBisect(s, o, nullptr);
  ASSERT_EQ(r.status, BisectStatus::kCulpritFound);
  EXPECT_EQ(r.reference_kernels[2].nan_count, 5);
  EXPECT_FALSE(r.first_bad_kernel.has_value());
  EXPECT_EQ(r.history.back().phase, "reference");
}

TEST(Report, JsonHasTheDocumentedKeys) {
  TempDir dir;
  const nlohmann::json j = ReportJson(Search(dir));
  EXPECT_EQ(j["status"], "culprit_found");
  EXPECT_EQ(j["culprit"], (nlohmann::json{{"t2", true}}));
  EXPECT_EQ(j["culprit_good"], (nlohmann::json{{"t2", false}}));
  EXPECT_EQ(j["target_signature"]["class"], "non_finite");
  EXPECT_EQ(j["target_signature"]["kernel"], "sampling");
  EXPECT_TRUE(j["trials"].is_number_integer());
  EXPECT_TRUE(j["other_findings"].is_array());
  EXPECT_EQ(j["first_bad_kernel"]["kernel"], "attention");
  EXPECT_NE(j["reproduce"].get<std::string>().find("culprit.toml"), std::string::npos);
  ASSERT_TRUE(j["history"].is_array());
  EXPECT_EQ(j["history"].size(), static_cast<size_t>(j["trials"].get<int>()));
  EXPECT_EQ(j["history"][0]["changes"], "(good configuration)");
}

TEST(Report, HtmlIsSelfContainedWithHistoryAndKernelChart) {
  TempDir dir;
  BisectReport r = Search(dir);
  const std::string html = ReportHtml(r);
  EXPECT_EQ(html.rfind("<!doctype html>", 0), 0u);
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_NE(html.find("class='nonfinite first'"), std::string::npos);  // the first bad kernel's bar
  EXPECT_NE(html.find("<table id='hist'>"), std::string::npos);
  // Nothing is fetched: no external scripts, styles, images or fonts.
  for (const char* forbidden : {"src=", "<link", "@import", "url(", "https://"}) {
    EXPECT_EQ(html.find(forbidden), std::string::npos) << forbidden;
  }
}

// A 10,000-key search with two bugs, in process.
BisectReport LargeSearch(Progress* progress) {
  static testing::FakeRunner runner([](const Config& c, int) -> std::optional<FailureSignature> {
    if (testing::On(c, testing::Key(7321, 4))) return testing::Failure(FailureClass::kOom, "cuda");
    if (testing::On(c, testing::Key(1234, 4))) return testing::Failure(FailureClass::kDeviceAssert);
    return std::nullopt;
  });
  Scheduler s(runner, {}, progress);
  auto [good, bad] = testing::Keys(10000, 4);
  BisectOptions o;
  o.good = good;
  o.bad = bad;
  return RunBisect(s, o, progress);
}

TEST(Report, TenThousandKeySearchIsReadable) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  BisectReport r;
  {
    Progress p(f, /*live=*/false);
    r = LargeSearch(&p);
  }
  std::fflush(f);
  const std::string progress(buf, len);
  std::fclose(f);
  std::free(buf);
  ASSERT_EQ(r.status, BisectStatus::kCulpritFound) << r.message;
  EXPECT_EQ(testing::CulpritNames(r), (std::set<std::string>{"k7321"}));
  // The other bug is narrowed to its own key, not left as a half of the keys.
  ASSERT_EQ(r.other_findings.size(), 1u);
  EXPECT_EQ(r.other_findings[0].status, FindingStatus::kNarrowed);
  EXPECT_EQ(r.other_findings[0].culprit, std::vector<std::string>{"k1234"});
  // Progress lines are bounded.
  size_t longest = 0, start = 0;
  for (size_t nl; (nl = progress.find('\n', start)) != std::string::npos; start = nl + 1) {
    longest = std::max(longest, nl - start);
  }
  EXPECT_LE(longest, 200u);
  EXPECT_LT(progress.size(), 20000u);
  // The HTML report: small, the culprit before the history, findings coloured.
  const std::string html = ReportHtml(r);
  EXPECT_LT(html.size(), 60000u);
  EXPECT_LT(html.find("<h2>Culprit</h2>"), html.find("<h2>Search history</h2>"));
  EXPECT_NE(html.find("class='other f1'"), std::string::npos);
  EXPECT_NE(html.find("10000 changes: k0000..k9999"), std::string::npos);
  EXPECT_EQ(html.find("Per-kernel"), std::string::npos) << "no kernel tables, no kernel section";
  EXPECT_EQ(html.find("k5000=true, k5001=true"), std::string::npos) << "long change lists are grouped";
  const std::string text = ReportText(r);
  EXPECT_LT(text.size(), 4000u);
}

TEST(Report, FlakyRunsAreMarked) {
  testing::FakeRunner runner([](const Config& c, int run) -> std::optional<FailureSignature> {
    if (testing::On(c, testing::Key(5))) return testing::Failure(FailureClass::kDeviceAssert);
    if (testing::On(c, testing::Key(1)) && run % 2 == 0) return testing::Failure(FailureClass::kDeviceAssert);
    return std::nullopt;
  });
  SchedulerOptions so;
  so.repeat = 2;
  Scheduler s(runner, so);
  auto [good, bad] = testing::Keys(8);
  BisectOptions o;
  o.good = good;
  o.bad = bad;
  const BisectReport r = RunBisect(s, o, nullptr);
  ASSERT_EQ(r.status, BisectStatus::kFlaky);
  const std::string html = ReportHtml(r);
  EXPECT_NE(html.find("<h2>Flaky configurations</h2>"), std::string::npos);
  EXPECT_NE(html.find("<tr class='flaky'>"), std::string::npos);
  EXPECT_NE(html.find("1/2 runs failed"), std::string::npos);
  const nlohmann::json j = ReportJson(r);
  EXPECT_EQ(j["status"], "flaky");
  EXPECT_TRUE(j["culprit"].is_null());
  EXPECT_FALSE(j["flaky"].empty());
  EXPECT_EQ(j["flaky"][0]["runs"], 2);
  EXPECT_NE(ReportText(r).find("flaky configurations"), std::string::npos);
}

TEST(Progress, PlainLinesWhenNotATerminalAndRedrawOnOne) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  {
    Progress p(f, /*live=*/false);
    p.SetPhase("isolate");
    p.TrialStarted(1, "{a=1}");
    p.TrialFinished(1, "{a=1}", "good");
    p.SetCandidates("2 of 5 changes");
  }
  std::fflush(f);
  std::string plain(buf, len);
  EXPECT_EQ(plain.find('\r'), std::string::npos);
  EXPECT_NE(plain.find("bisect: trial 1 good: {a=1}\n"), std::string::npos);
  EXPECT_NE(plain.find("candidates now: 2 of 5 changes"), std::string::npos);
  std::fclose(f);
  std::free(buf);

  buf = nullptr;
  f = open_memstream(&buf, &len);
  {
    Progress p(f, /*live=*/true);
    p.SetPhase("isolate");
    p.TrialStarted(1, "{a=1}");
    p.SetCandidates("2 of 5 changes");
    p.Finish();
  }
  std::fflush(f);
  std::string live(buf, len);
  EXPECT_NE(live.find("\r\033[K[bisect isolate] trials 0 done, 1 running | candidates: 2 of 5 changes"),
            std::string::npos);
  std::fclose(f);
  std::free(buf);
}

}  // namespace
}  // namespace crashreplay::bisect
