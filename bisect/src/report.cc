#include "crashreplay/bisect/report.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "crashreplay/bisect/failure_text.h"

namespace crashreplay::bisect {
namespace {

constexpr size_t kListShown = 20;      // flaky configurations, findings shown in full
constexpr size_t kChangesShown = 200;  // differences listed one per row in the HTML

nlohmann::json GoodValues(const BisectReport& r, const ChangeSet& set) {
  nlohmann::json j = nlohmann::json::object();
  for (size_t i : set) {
    const Change& c = r.changes[i];
    j[c.name] = c.good ? ConfigValueToJson(*c.good) : nlohmann::json(nullptr);
  }
  return j;
}

std::string Html(std::string_view raw) {
  const std::string s = PrintableText(raw);
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// A value as TOML writes it, cut for display: a 100 KB string is shown by
// its start and its size.
std::string Value(const std::optional<ConfigValue>& v, const char* unset = "(unset)") {
  if (!v) return unset;
  std::string s = v->ToToml();
  constexpr size_t kMax = 120;
  if (s.size() <= kMax) return s;
  size_t cut = kMax;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return absl::StrCat(s.substr(0, cut), "... (", s.size(), " bytes)");
}

std::string Runs(const TrialResult& t) { return absl::StrCat(t.bad_runs, "/", t.runs, " runs failed"); }

// Which other finding a history row's failure belongs to (1-based; 0 none).
size_t FindingOf(const BisectReport& r, const HistoryEntry& h) {
  if (h.result.verdict != Verdict::kBad || SameBug(h.result.signature, r.target_signature)) return 0;
  for (size_t i = 0; i < r.other_findings.size(); ++i) {
    if (SameBug(r.other_findings[i].signature, h.result.signature)) return i + 1;
  }
  return 0;
}

struct KernelBar {
  std::string label;
  double ratio;       // error / bound; inf for non-finite
  bool same_bits;
};

std::vector<KernelBar> KernelBars(const BisectReport& r) {
  std::vector<KernelBar> bars;
  const size_t n = std::min(r.reference_kernels.size(), r.culprit_kernels.size());
  for (size_t i = 0; i < n; ++i) {
    const KernelRow& ref = r.reference_kernels[i];
    const KernelRow& t = r.culprit_kernels[i];
    KernelBar b;
    b.label = ref.layer >= 0 ? absl::StrCat(ref.name, "[", ref.layer, "]") : ref.name;
    b.same_bits = !ref.digest.empty() && ref.digest == t.digest;
    if (t.nan_count + t.inf_count > 0 && ref.nan_count + ref.inf_count == 0) {
      b.ratio = INFINITY;
    } else {
      const double atol = t.atol.value_or(ref.atol.value_or(r.tolerance.atol));
      const double rtol = t.rtol.value_or(ref.rtol.value_or(r.tolerance.rtol));
      const double err = b.same_bits ? 0.0 : (t.max_err ? *t.max_err : std::fabs(t.max_abs - ref.max_abs));
      b.ratio = err / (atol + std::fabs(ref.max_abs) * rtol);
    }
    bars.push_back(b);
  }
  return bars;
}

// Inline SVG: one bar per kernel, height log10(error / tolerance bound),
// clamped to [-4, 4]; the line at 0 is the tolerance.
std::string KernelChart(const BisectReport& r) {
  const std::vector<KernelBar> bars = KernelBars(r);
  const int bw = 14, h = 240, top = 20, left = 50;
  const int w = left + static_cast<int>(bars.size()) * bw + 90;  // room for the slanted labels
  auto y_of = [&](double l) { return top + (4.0 - l) / 8.0 * h; };
  std::string svg = absl::StrFormat(
      "<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d' role='img' aria-label='per-kernel error vs "
      "tolerance'>",
      w, h + top + 110);
  for (int l = -4; l <= 4; l += 2) {
    svg += absl::StrFormat(
        "<text x='%d' y='%.1f' class='ax'>1e%d</text><line x1='%d' x2='%d' y1='%.1f' y2='%.1f' class='grid'/>", 4,
        y_of(l) + 4, l, left, w - 10, y_of(l), y_of(l));
  }
  const size_t bad = r.first_bad_kernel ? r.first_bad_kernel->index : bars.size();
  for (size_t i = 0; i < bars.size(); ++i) {
    const KernelBar& b = bars[i];
    double l = std::isinf(b.ratio) ? 4.0 : (b.ratio <= 0 ? -4.0 : std::clamp(std::log10(b.ratio), -4.0, 4.0));
    const double y0 = y_of(-4), y1 = y_of(l);
    std::string cls = b.same_bits ? "same" : (std::isinf(b.ratio) ? "nonfinite" : (b.ratio > 1 ? "over" : "under"));
    if (bad == i) cls += " first";
    const std::string ratio_text = std::isinf(b.ratio) ? std::string("non-finite") : absl::StrFormat("%.3g", b.ratio);
    svg += absl::StrFormat(
        "<rect x='%d' y='%.1f' width='%d' height='%.1f' class='%s'><title>#%d %s: error/bound = %s%s</title></rect>",
        left + static_cast<int>(i) * bw + 1, y1, bw - 2, std::max(1.0, y0 - y1), cls, i, Html(b.label), ratio_text,
        b.same_bits ? " (identical bits)" : "");
    svg += absl::StrFormat("<text transform='translate(%d,%d) rotate(60)' class='kl'>%s</text>",
                           left + static_cast<int>(i) * bw + 4, h + top + 6, Html(b.label));
  }
  svg += absl::StrFormat("<line x1='%d' x2='%d' y1='%.1f' y2='%.1f' class='tol'/>", left, w - 80, y_of(0), y_of(0));
  svg += "</svg>";
  return svg;
}

void CulpritRows(std::string& h, const BisectReport& r, const ChangeSet& set) {
  absl::StrAppend(&h, "<table><tr><th>toggle</th><th>bad value</th><th>good value</th></tr>");
  for (size_t i : set) {
    const Change& c = r.changes[i];
    absl::StrAppend(&h, "<tr><td><code>", Html(c.name), "</code></td><td><code>", Html(Value(c.bad)),
                    "</code></td><td><code>", Html(Value(c.good)), "</code></td></tr>");
  }
  absl::StrAppend(&h, "</table>");
}

}  // namespace

std::string ReportText(const BisectReport& r) {
  std::string out = absl::StrFormat("crashreplay bisect: %s after %d trials (%d runs) in %.1f s\n",
                                    std::string(BisectStatusName(r.status)), r.trials, r.runs, r.seconds);
  absl::StrAppend(&out, "  ", PrintableText(r.message), "\n");
  if (r.target_signature.is_failure()) {
    absl::StrAppend(&out, "  target failure: ", PrintableText(DescribeSignature(r.target_signature)), "\n");
  }
  const ChangeSet& shown = r.culprit.empty() ? r.suspect : r.culprit;
  if (!shown.empty()) {
    const std::string what =
        r.culprit.empty() ? "suspect, not claimed" : (r.culprit_minimal ? "1-minimal" : "minimality unconfirmed");
    absl::StrAppend(&out, absl::StrFormat("  %s (%s, %d of %d changes):\n", r.culprit.empty() ? "suspect" : "culprit",
                                          what, shown.size(), r.changes.size()));
    for (size_t k = 0; k < shown.size(); ++k) {
      if (k == kListShown) {
        absl::StrAppend(&out, "    ... and ", shown.size() - k, " more (report.json)\n");
        break;
      }
      const Change& c = r.changes[shown[k]];
      absl::StrAppend(&out, "    ", PrintableText(c.name), " = ", PrintableText(Value(c.bad)),
                      "    (good: ", PrintableText(Value(c.good, "unset")), ")\n");
    }
  } else if (!r.candidates.empty()) {
    absl::StrAppend(&out, "  candidates when stopped: ", PrintableText(r.candidates), "\n");
  }
  if (!r.flaky.empty()) {
    absl::StrAppend(&out, "  flaky configurations (runs disagreed):\n");
    for (size_t i = 0; i < r.flaky.size() && i < kListShown; ++i) {
      const FlakyConfig& f = r.flaky[i];
      absl::StrAppend(&out, "    {", PrintableText(f.changes), "}: ", Runs(f.result),
                      f.result.note.empty() ? "" : absl::StrCat(" ", PrintableText(f.result.note)), "\n");
    }
    if (r.flaky.size() > kListShown) absl::StrAppend(&out, "    ... and ", r.flaky.size() - kListShown, " more\n");
  }
  if (!r.other_findings.empty()) {
    absl::StrAppend(&out, "  other findings (different failures, each its own bug):\n");
    for (size_t i = 0; i < r.other_findings.size(); ++i) {
      const OtherFinding& f = r.other_findings[i];
      absl::StrAppend(&out, "    ", i + 1, ". ", PrintableText(DescribeSignature(f.signature)),
                      f.step ? absl::StrCat(" at step ", *f.step) : std::string(), "\n");
      if (f.status == FindingStatus::kNarrowed) {
        absl::StrAppend(&out, "       culprit", f.culprit_minimal ? " (1-minimal)" : "", ": ",
                        PrintableText(f.culprit_text), "\n");
      } else {
        absl::StrAppend(&out, "       seen at: ", PrintableText(f.changes), "\n");
        if (f.status != FindingStatus::kListed) {
          absl::StrAppend(&out, "       its search: ", std::string(FindingStatusName(f.status)),
                          f.culprit.empty() ? "" : absl::StrCat(" (so far: ", PrintableText(f.culprit_text), ")"),
                          "\n");
        }
      }
      if (!f.reproduce.empty()) absl::StrAppend(&out, "       reproduce: ", PrintableText(f.reproduce), "\n");
    }
  }
  if (r.threshold) absl::StrAppend(&out, "  threshold: ", PrintableText(DescribeThreshold(*r.threshold)), "\n");
  if (r.first_step) {
    absl::StrAppend(&out, "  first failing step: ",
                    r.first_step->first_fail ? absl::StrCat(*r.first_step->first_fail) : std::string("none in range"),
                    "\n");
  }
  if (r.first_bad_kernel) {
    absl::StrAppend(&out, "  first bad kernel: ", PrintableText(DescribeKernelFinding(*r.first_bad_kernel)), "\n");
  } else if (r.status == BisectStatus::kCulpritFound && !r.culprit_kernels.empty()) {
    absl::StrAppend(&out, "  first bad kernel: none (every kernel within tolerance)\n");
  }
  if (!r.reproduce.empty()) absl::StrAppend(&out, "  reproduce:\n    ", PrintableText(r.reproduce), "\n");
  return out;
}

nlohmann::json ReportJson(const BisectReport& r) {
  nlohmann::json j;
  j["status"] = std::string(BisectStatusName(r.status));
  j["message"] = r.message;
  j["subject"] = r.subject;
  if (!r.culprit.empty()) {
    j["culprit"] = ChangesToJson(r.changes, r.culprit);
    j["culprit_good"] = GoodValues(r, r.culprit);
  } else {
    j["culprit"] = nullptr;
  }
  j["culprit_minimal"] = r.culprit_minimal;
  j["suspect"] = r.suspect.empty() ? nlohmann::json(nullptr) : ChangesToJson(r.changes, r.suspect);
  if (!r.candidates.empty()) j["candidates"] = r.candidates;
  j["changes_total"] = r.changes.size();
  j["trials"] = r.trials;
  j["runs"] = r.runs;
  j["jobs"] = r.jobs;
  j["repeat"] = r.repeat;
  j["confirm"] = r.confirm;
  j["seconds"] = r.seconds;
  j["target_signature"] =
      r.target_signature.is_failure() ? SignatureToJson(r.target_signature) : nlohmann::json(nullptr);
  j["good_result"] = TrialResultToJson(r.good_result);
  j["bad_result"] = TrialResultToJson(r.bad_result);
  nlohmann::json flaky = nlohmann::json::array();
  for (const FlakyConfig& f : r.flaky) {
    nlohmann::json e = {{"changes", f.changes},
                        {"runs", f.result.runs},
                        {"bad_runs", f.result.bad_runs},
                        {"signature", SignatureToJson(f.result.signature)}};
    if (f.step) e["step"] = *f.step;
    if (!f.result.note.empty()) e["note"] = f.result.note;
    flaky.push_back(e);
  }
  j["flaky"] = flaky;
  nlohmann::json others = nlohmann::json::array();
  for (const OtherFinding& f : r.other_findings) {
    nlohmann::json o = {{"signature", SignatureToJson(f.signature)},
                        {"changes", f.changes},
                        {"change_count", f.change_count},
                        {"configurations", f.configurations},
                        {"status", std::string(FindingStatusName(f.status))},
                        {"culprit", f.culprit},
                        {"culprit_minimal", f.culprit_minimal},
                        {"trials", f.trials}};
    if (f.step) o["step"] = *f.step;
    if (!f.config_path.empty()) o["config_path"] = f.config_path;
    if (!f.reproduce.empty()) o["reproduce"] = f.reproduce;
    others.push_back(o);
  }
  j["other_findings"] = others;
  j["first_bad_kernel"] = r.first_bad_kernel ? KernelFindingToJson(*r.first_bad_kernel) : nlohmann::json(nullptr);
  j["threshold"] = r.threshold ? ThresholdResultToJson(*r.threshold) : nlohmann::json(nullptr);
  j["first_failing_step"] = r.first_step ? StepSearchResultToJson(*r.first_step) : nlohmann::json(nullptr);
  j["reproduce"] = r.reproduce;
  j["culprit_config"] = r.culprit_config_path;
  nlohmann::json hist = nlohmann::json::array();
  for (const HistoryEntry& h : r.history) {
    nlohmann::json e = {{"id", h.id},
                        {"phase", h.phase},
                        {"changes", SummarizeConfig(r.good, h.config, 200)},
                        {"verdict", std::string(VerdictName(h.result.verdict))},
                        {"signature", SignatureToJson(h.result.signature)},
                        {"duration_s", h.result.duration_s},
                        {"runs", h.result.runs},
                        {"bad_runs", h.result.bad_runs}};
    if (h.step) e["step"] = *h.step;
    if (!h.result.note.empty()) e["note"] = h.result.note;
    if (!h.result.engines.empty()) e["engines"] = h.result.engines;
    hist.push_back(e);
  }
  j["history"] = hist;
  return j;
}

std::string ReportHtml(const BisectReport& r) {
  std::string h = R"(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>crashreplay bisect report</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222;max-width:1200px}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
code,pre{font:13px ui-monospace,monospace;background:#f4f4f4;padding:2px 4px;border-radius:3px;overflow-wrap:anywhere}
pre{padding:8px;overflow-x:auto;white-space:pre-wrap}
table{border-collapse:collapse;width:100%}td,th{border-bottom:1px solid #eee;padding:3px 6px;text-align:left;vertical-align:top}
.status{display:inline-block;padding:2px 8px;border-radius:4px;background:#eef;font-weight:600}
.status.culprit_found{background:#dff3e3}.status.flaky,.status.inconclusive{background:#fff1d6}.status.aborted,.status.interrupted,.status.good_fails,.status.not_reproducible{background:#fde2e2}
tr.good td.v{color:#176f2c}tr.target td.v{color:#b00020;font-weight:600}tr.skip td.v{color:#777}tr.abort td.v{color:#555}
tr.flaky{background:repeating-linear-gradient(135deg,#fff8e6,#fff8e6 6px,#fff 6px,#fff 12px)}tr.flaky td.v{color:#a66a00;font-weight:600}
.f1{--c:#6a3d9a}.f2{--c:#1f78b4}.f3{--c:#e6550d}.f4{--c:#31a354}.f5{--c:#b15928}.f6{--c:#d6604d}
tr.other td.v,span.sw{color:var(--c)}tr.other td:first-child{border-left:4px solid var(--c)}
span.sw::before{content:'\25A0 '}
.culprit{border-left:4px solid #b00020;padding-left:8px}
rect.under{fill:#7aa7d9}rect.over{fill:#e07b39}rect.nonfinite{fill:#b00020}rect.same{fill:#b9d8b9}rect.first{stroke:#000;stroke-width:2}
line.grid{stroke:#eee}line.tol{stroke:#b00020;stroke-dasharray:4 3}text.ax{font-size:10px;fill:#666}text.kl{font-size:9px;fill:#444}
button{font-size:12px}details{margin:.4em 0}
</style></head><body>
)";
  const std::string status(BisectStatusName(r.status));
  absl::StrAppend(&h, "<h1>crashreplay bisect</h1><p><span class='status ", status, "'>", Html(status), "</span> ",
                  Html(r.message), "</p>");
  absl::StrAppend(
      &h, absl::StrFormat(
              "<p>%d trials (%d runs, jobs %d, repeat %d, confirm %d) over %d changes in %.1f s on <code>%s</code></p>",
              r.trials, r.runs, r.jobs, r.repeat, r.confirm, r.changes.size(), r.seconds, Html(r.subject)));
  if (r.target_signature.is_failure()) {
    absl::StrAppend(&h, "<p>Target failure: <b>", Html(DescribeSignature(r.target_signature)), "</b></p>");
  }
  // The answer first: the culprit (or the unclaimed suspect), then how to rerun it.
  if (!r.culprit.empty()) {
    absl::StrAppend(&h, "<h2>Culprit</h2><div class='culprit'>");
    CulpritRows(h, r, r.culprit);
    absl::StrAppend(&h, "<p>",
                    r.culprit_minimal ? "1-minimal: removing any one of these makes the failure go away."
                                      : "Minimality unconfirmed: some removals could not be judged.",
                    r.confirm > 0 ? absl::StrCat(" Every configuration this rests on was run ", r.repeat + r.confirm,
                                                 " times with the same result.")
                                  : std::string(),
                    "</p></div>");
  } else if (!r.suspect.empty()) {
    absl::StrAppend(&h, "<h2>Suspect (not claimed)</h2><div class='culprit'>");
    CulpritRows(h, r, r.suspect);
    absl::StrAppend(
        &h,
        "<p>The search isolated these, but its evidence contradicted itself (see the flaky configurations).</p></div>");
  } else if (!r.candidates.empty()) {
    absl::StrAppend(&h, "<p>Candidates when the search stopped: <code>", Html(r.candidates), "</code></p>");
  }
  if (!r.reproduce.empty()) {
    absl::StrAppend(&h, "<h2>Reproduce</h2><pre id='repro'>", Html(r.reproduce),
                    "</pre><button "
                    "onclick=\"navigator.clipboard&&navigator.clipboard.writeText(document.getElementById('repro')."
                    "textContent)\">copy</button>");
  }
  if (!r.flaky.empty()) {
    absl::StrAppend(&h, "<h2>Flaky configurations</h2><p>Runs of the same configuration disagreed.</p>",
                    "<table><tr><th>configuration (changes from good)</th><th>runs</th><th>verdicts</th></tr>");
    for (size_t i = 0; i < r.flaky.size() && i < kListShown; ++i) {
      const FlakyConfig& f = r.flaky[i];
      absl::StrAppend(&h, "<tr class='flaky'><td><code>", Html(f.changes), "</code></td><td class='v'>",
                      Html(Runs(f.result)), "</td><td>", Html(f.result.note), "</td></tr>");
    }
    absl::StrAppend(&h, "</table>");
    if (r.flaky.size() > kListShown)
      absl::StrAppend(&h, "<p>... and ", r.flaky.size() - kListShown, " more (report.json)</p>");
  }
  if (!r.other_findings.empty()) {
    absl::StrAppend(&h,
                    "<h2>Other findings</h2><p>Failures with another signature: other bugs, each narrowed by a search "
                    "of its own.</p>",
                    "<table><tr><th>failure</th><th>culprit</th><th>search</th></tr>");
    for (size_t i = 0; i < r.other_findings.size(); ++i) {
      const OtherFinding& f = r.other_findings[i];
      const std::string color = absl::StrCat("f", i % 6 + 1);
      absl::StrAppend(&h, "<tr class='other ", color, "'><td><span class='sw'>", i + 1, ".</span> ",
                      Html(DescribeSignature(f.signature)),
                      f.step ? absl::StrCat(" (step ", *f.step, ")") : std::string(), "</td><td><code>",
                      Html(f.status == FindingStatus::kNarrowed ? f.culprit_text : f.changes), "</code>",
                      f.reproduce.empty() ? std::string() : absl::StrCat("<br><code>", Html(f.reproduce), "</code>"),
                      "</td><td>", Html(std::string(FindingStatusName(f.status))),
                      f.trials > 0 ? absl::StrCat(", ", f.trials, " trials") : std::string(), "</td></tr>");
    }
    absl::StrAppend(&h, "</table>");
  }
  if (r.threshold) absl::StrAppend(&h, "<h2>Threshold</h2><p>", Html(DescribeThreshold(*r.threshold)), "</p>");
  if (r.first_step && r.first_step->first_fail) {
    absl::StrAppend(&h, "<h2>First failing step</h2><p>", *r.first_step->first_fail, "</p>");
  }
  // Kernels only where the trials produced tables.
  if (r.first_bad_kernel) {
    absl::StrAppend(&h, "<h2>First bad kernel</h2><p>", Html(DescribeKernelFinding(*r.first_bad_kernel)), "</p>");
  }
  if (!r.reference_kernels.empty() && !r.culprit_kernels.empty()) {
    absl::StrAppend(
        &h, "<h2>Per-kernel divergence (culprit vs reference)</h2>",
        "<p>Bar height: log10(error / (atol + |ref|&middot;rtol)); above the dashed line is out of tolerance; ",
        "red: non-finite; green: identical bits; outlined: the first bad kernel.</p>", KernelChart(r));
  }
  // All differences, grouped: runs of neighbours in name order.
  {
    ChangeSet all(r.changes.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    absl::StrAppend(&h, "<h2>Changes between good and bad</h2><p>", r.changes.size(), " changes: <code>",
                    Html(SummarizeChanges(r.changes, all, 300)), "</code></p>");
    if (!r.changes.empty()) {
      absl::StrAppend(&h,
                      "<details><summary>list them</summary><table><tr><th>toggle</th><th>good</th><th>bad</th></tr>");
      for (size_t i = 0; i < r.changes.size() && i < kChangesShown; ++i) {
        const Change& c = r.changes[i];
        absl::StrAppend(&h, "<tr><td><code>", Html(c.name), "</code></td><td><code>", Html(Value(c.good)),
                        "</code></td><td><code>", Html(Value(c.bad)), "</code></td></tr>");
      }
      absl::StrAppend(&h, "</table>",
                      r.changes.size() > kChangesShown
                          ? absl::StrCat("<p>... and ", r.changes.size() - kChangesShown,
                                         " more: the --good and --bad files hold them all.</p>")
                          : std::string(),
                      "</details>");
    }
  }
  absl::StrAppend(&h,
                  "<h2>Search history</h2><label><input type='checkbox' id='onlybad' onchange='filt()'> failures and "
                  "flaky runs only</label>",
                  "<table id='hist'><tr><th>#</th><th>phase</th><th>changes from "
                  "good</th><th>step</th><th>verdict</th><th>signature</th><th>engines / note</th><th>s</th></tr>");
  for (const HistoryEntry& e : r.history) {
    std::string v(VerdictName(e.result.verdict));
    std::string cls = v;
    std::string label = v;
    if (e.result.verdict == Verdict::kBad) {
      const size_t f = FindingOf(r, e);
      cls = f == 0 ? "target" : absl::StrCat("other f", (f - 1) % 6 + 1);
      label = f == 0 ? "bad (target)" : absl::StrCat("bad (finding ", f, ")");
    }
    if (e.result.runs > 1) absl::StrAppend(&label, " ", e.result.bad_runs, "/", e.result.runs);
    absl::StrAppend(&h, "<tr class='", cls, "'><td>", e.id, "</td><td>", Html(e.phase), "</td><td><code>",
                    Html(SummarizeConfig(r.good, e.config, 160)), "</code></td><td>",
                    e.step ? absl::StrCat(*e.step) : std::string(), "</td><td class='v'>", Html(label), "</td><td>",
                    e.result.signature.is_failure() ? Html(DescribeSignature(e.result.signature)) : std::string(),
                    "</td><td>", Html(e.result.engines.empty() ? e.result.note : e.result.engines), "</td><td>",
                    absl::StrFormat("%.2f", e.result.duration_s), "</td></tr>");
  }
  absl::StrAppend(
      &h, "</table>\n<script>function filt(){var on=document.getElementById('onlybad').checked;",
      "document.querySelectorAll('#hist "
      "tr').forEach(function(t,i){if(i>0)t.style.display=(on&&t.classList.contains('good'))?'none':'';});}</script>\n",
      "</body></html>\n");
  return h;
}

}  // namespace crashreplay::bisect
