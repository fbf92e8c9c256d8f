#include "crashreplay/bisect/report.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace crashreplay::bisect {
namespace {

nlohmann::json GoodValues(const BisectReport& r) {
  nlohmann::json j = nlohmann::json::object();
  for (size_t i : r.culprit) {
    const Change& c = r.changes[i];
    j[c.name] = c.good ? ConfigValueToJson(*c.good) : nlohmann::json(nullptr);
  }
  return j;
}

std::string Changes(const BisectReport& r, const Config& config) {
  const std::vector<Change> d = Differences(r.good, config);
  ChangeSet all;
  for (size_t i = 0; i < d.size(); ++i) all.push_back(i);
  return d.empty() ? std::string("(good configuration)") : DescribeChanges(d, all);
}

std::string Html(std::string_view s) {
  std::string out;
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
  if (bars.empty()) return "<p>No per-kernel tables: the trials did not report any (external commands may write them with their signature).</p>";
  const int bw = 14, h = 240, top = 20, left = 50;
  const int w = left + static_cast<int>(bars.size()) * bw + 90;  // room for the slanted labels
  auto y_of = [&](double l) { return top + (4.0 - l) / 8.0 * h; };
  std::string svg = absl::StrFormat(
      "<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d' role='img' aria-label='per-kernel error vs tolerance'>",
      w, h + top + 110);
  for (int l = -4; l <= 4; l += 2) {
    svg += absl::StrFormat("<text x='%d' y='%.1f' class='ax'>1e%d</text><line x1='%d' x2='%d' y1='%.1f' y2='%.1f' class='grid'/>",
                           4, y_of(l) + 4, l, left, w - 10, y_of(l), y_of(l));
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

}  // namespace

std::string ReportText(const BisectReport& r) {
  std::string out = absl::StrFormat("crashreplay bisect: %s after %d trials (%d runs) in %.1f s\n",
                                    std::string(BisectStatusName(r.status)), r.trials, r.runs, r.seconds);
  absl::StrAppend(&out, "  ", r.message, "\n");
  if (r.target_signature.is_failure()) {
    absl::StrAppend(&out, "  target failure: ", DescribeSignature(r.target_signature), "\n");
  }
  if (!r.culprit.empty()) {
    absl::StrAppend(&out, absl::StrFormat("  culprit (%s, %d of %d changes):\n",
                                          r.culprit_minimal ? "1-minimal" : "minimality unconfirmed",
                                          r.culprit.size(), r.changes.size()));
    for (size_t i : r.culprit) {
      const Change& c = r.changes[i];
      absl::StrAppend(&out, "    ", c.name, " = ", c.bad ? c.bad->ToToml() : std::string("(unset)"),
                      "    (good: ", c.good ? c.good->ToToml() : std::string("unset"), ")\n");
    }
  } else if (!r.candidates.empty()) {
    absl::StrAppend(&out, "  candidates when stopped: ", r.candidates, "\n");
  }
  if (!r.other_findings.empty()) {
    absl::StrAppend(&out, "  other findings (different failures, not counted as reproductions):\n");
    for (const OtherFinding& f : r.other_findings) {
      absl::StrAppend(&out, "    at ", f.changes.empty() ? "(good configuration)" : f.changes,
                      f.step ? absl::StrCat(" step ", *f.step) : std::string(), ": ",
                      DescribeSignature(f.signature), "\n");
    }
  }
  if (r.threshold) absl::StrAppend(&out, "  threshold: ", DescribeThreshold(*r.threshold), "\n");
  if (r.first_step) {
    absl::StrAppend(&out, "  first failing step: ",
                    r.first_step->first_fail ? absl::StrCat(*r.first_step->first_fail) : std::string("none in range"),
                    "\n");
  }
  if (r.first_bad_kernel) {
    absl::StrAppend(&out, "  first bad kernel: ", DescribeKernelFinding(*r.first_bad_kernel), "\n");
  } else if (r.status == BisectStatus::kCulpritFound && !r.culprit_kernels.empty()) {
    absl::StrAppend(&out, "  first bad kernel: none (every kernel within tolerance)\n");
  }
  if (!r.reproduce.empty()) absl::StrAppend(&out, "  reproduce:\n    ", r.reproduce, "\n");
  return out;
}

nlohmann::json ReportJson(const BisectReport& r) {
  nlohmann::json j;
  j["status"] = std::string(BisectStatusName(r.status));
  j["message"] = r.message;
  j["subject"] = r.subject;
  if (!r.culprit.empty()) {  // also when a later phase was interrupted
    j["culprit"] = ChangesToJson(r.changes, r.culprit);
    j["culprit_good"] = GoodValues(r);
  } else {
    j["culprit"] = nullptr;
  }
  j["culprit_minimal"] = r.culprit_minimal;
  if (!r.candidates.empty()) j["candidates"] = r.candidates;
  j["changes_total"] = r.changes.size();
  j["trials"] = r.trials;
  j["runs"] = r.runs;
  j["jobs"] = r.jobs;
  j["repeat"] = r.repeat;
  j["seconds"] = r.seconds;
  j["target_signature"] = r.target_signature.is_failure() ? SignatureToJson(r.target_signature) : nlohmann::json(nullptr);
  j["good_result"] = TrialResultToJson(r.good_result);
  j["bad_result"] = TrialResultToJson(r.bad_result);
  nlohmann::json others = nlohmann::json::array();
  for (const OtherFinding& f : r.other_findings) {
    nlohmann::json o = {{"config", ConfigToJson(f.config)}, {"changes", f.changes},
                        {"signature", SignatureToJson(f.signature)}};
    if (f.step) o["step"] = *f.step;
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
                        {"changes", Changes(r, h.config)},
                        {"verdict", std::string(VerdictName(h.result.verdict))},
                        {"signature", SignatureToJson(h.result.signature)},
                        {"duration_s", h.result.duration_s},
                        {"runs", h.result.runs}};
    if (h.step) e["step"] = *h.step;
    if (!h.result.note.empty()) e["note"] = h.result.note;
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
code,pre{font:13px ui-monospace,monospace;background:#f4f4f4;padding:2px 4px;border-radius:3px}
pre{padding:8px;overflow-x:auto;white-space:pre-wrap}
table{border-collapse:collapse;width:100%}td,th{border-bottom:1px solid #eee;padding:3px 6px;text-align:left;vertical-align:top}
tr.good td.v{color:#176f2c}tr.bad td.v{color:#b00020}tr.skip td.v,tr.flaky td.v{color:#a66a00}tr.abort td.v{color:#555}
.status{display:inline-block;padding:2px 8px;border-radius:4px;background:#eef;font-weight:600}
rect.under{fill:#7aa7d9}rect.over{fill:#e07b39}rect.nonfinite{fill:#b00020}rect.same{fill:#b9d8b9}rect.first{stroke:#000;stroke-width:2}
line.grid{stroke:#eee}line.tol{stroke:#b00020;stroke-dasharray:4 3}text.ax{font-size:10px;fill:#666}text.kl{font-size:9px;fill:#444}
button{font-size:12px}
</style></head><body>
)";
  absl::StrAppend(&h, "<h1>crashreplay bisect</h1><p><span class='status'>", Html(std::string(BisectStatusName(r.status))),
                  "</span> ", Html(r.message), "</p>");
  absl::StrAppend(&h, absl::StrFormat("<p>%d trials (%d runs, jobs %d, repeat %d) in %.1f s on <code>%s</code></p>",
                                      r.trials, r.runs, r.jobs, r.repeat, r.seconds, Html(r.subject)));
  if (r.target_signature.is_failure()) {
    absl::StrAppend(&h, "<p>Target failure: <b>", Html(DescribeSignature(r.target_signature)), "</b></p>");
  }
  if (!r.culprit.empty()) {
    absl::StrAppend(&h, "<h2>Culprit</h2><table><tr><th>toggle</th><th>bad value</th><th>good value</th></tr>");
    for (size_t i : r.culprit) {
      const Change& c = r.changes[i];
      absl::StrAppend(&h, "<tr><td><code>", Html(c.name), "</code></td><td><code>",
                      Html(c.bad ? c.bad->ToToml() : "(unset)"), "</code></td><td><code>",
                      Html(c.good ? c.good->ToToml() : "(unset)"), "</code></td></tr>");
    }
    absl::StrAppend(&h, "</table><p>", r.culprit_minimal ? "1-minimal: removing any one of these makes the failure go away."
                                                          : "Minimality unconfirmed: some trials were unresolved.",
                    "</p>");
  } else if (!r.candidates.empty()) {
    absl::StrAppend(&h, "<p>Candidates when the search stopped: <code>", Html(r.candidates), "</code></p>");
  }
  if (!r.reproduce.empty()) {
    absl::StrAppend(&h, "<h2>Reproduce</h2><pre id='repro'>", Html(r.reproduce),
                    "</pre><button onclick=\"navigator.clipboard&&navigator.clipboard.writeText(document.getElementById('repro').textContent)\">copy</button>");
  }
  if (r.first_bad_kernel) {
    absl::StrAppend(&h, "<h2>First bad kernel</h2><p>", Html(DescribeKernelFinding(*r.first_bad_kernel)), "</p>");
  }
  absl::StrAppend(&h, "<h2>Per-kernel divergence (culprit vs good configuration)</h2>",
                  "<p>Bar height: log10(error / (atol + |ref|&middot;rtol)); above the dashed line is out of tolerance; ",
                  "red: non-finite; green: identical bits; outlined: the first bad kernel.</p>", KernelChart(r));
  if (r.threshold) absl::StrAppend(&h, "<h2>Threshold</h2><p>", Html(DescribeThreshold(*r.threshold)), "</p>");
  if (r.first_step && r.first_step->first_fail) {
    absl::StrAppend(&h, "<h2>First failing step</h2><p>", *r.first_step->first_fail, "</p>");
  }
  if (!r.other_findings.empty()) {
    absl::StrAppend(&h, "<h2>Other findings</h2><p>Configurations that failed differently (not counted as reproductions).</p><table><tr><th>configuration (changes from good)</th><th>failure</th></tr>");
    for (const OtherFinding& f : r.other_findings) {
      absl::StrAppend(&h, "<tr><td><code>", Html(f.changes), "</code></td><td>", Html(DescribeSignature(f.signature)),
                      "</td></tr>");
    }
    absl::StrAppend(&h, "</table>");
  }
  absl::StrAppend(&h, "<h2>Search history</h2><label><input type='checkbox' id='onlybad' onchange='filt()'> failures only</label>",
                  "<table id='hist'><tr><th>#</th><th>phase</th><th>changes from good</th><th>step</th><th>verdict</th><th>signature</th><th>s</th></tr>");
  for (const HistoryEntry& e : r.history) {
    const std::string v(VerdictName(e.result.verdict));
    absl::StrAppend(&h, "<tr class='", v, "'><td>", e.id, "</td><td>", Html(e.phase), "</td><td><code>",
                    Html(Changes(r, e.config)), "</code></td><td>", e.step ? absl::StrCat(*e.step) : std::string(),
                    "</td><td class='v'>", v, e.result.runs > 1 ? absl::StrCat(" (", e.result.bad_runs, "/", e.result.runs, " bad)") : std::string(),
                    "</td><td>", e.result.signature.is_failure() ? Html(DescribeSignature(e.result.signature)) : std::string(),
                    "</td><td>", absl::StrFormat("%.2f", e.result.duration_s), "</td></tr>");
  }
  absl::StrAppend(&h, "</table>\n<script>function filt(){var on=document.getElementById('onlybad').checked;",
                  "document.querySelectorAll('#hist tr').forEach(function(t,i){if(i>0)t.style.display=(on&&!t.classList.contains('bad'))?'none':'';});}</script>\n",
                  "</body></html>\n");
  return h;
}

}  // namespace crashreplay::bisect
