// Rendering a BisectReport: text for people, JSON for programs, and one
// self-contained HTML file (inline CSS, JS and SVG; opens without network)
// with the search history and a per-kernel divergence chart.
//
// JSON keys (docs/bisect.md): status, message, culprit {toggle: bad value},
// culprit_good {toggle: good value}, culprit_minimal, trials, runs,
// target_signature, other_findings [{config, changes, signature}],
// first_bad_kernel (object or null), reproduce, culprit_config, threshold,
// first_failing_step, history [...], changes_total, subject, seconds.
// Pure functions; thread-safe.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "crashreplay/bisect/bisect.h"

namespace crashreplay::bisect {

std::string ReportText(const BisectReport& r);
nlohmann::json ReportJson(const BisectReport& r);
std::string ReportHtml(const BisectReport& r);

}  // namespace crashreplay::bisect
