// `crashreplay toggles [--json] [--engine sglang|vllm]`: prints the one toggle
// table, or how a serving engine's settings map onto it.
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "command.h"
#include "commands_decl.h"
#include "crashreplay/replay/config/engine_vocab.h"
#include "crashreplay/replay/config/kernel_archs.h"
#include "crashreplay/replay/config/toggles.h"
#include "exit_codes.h"

namespace crashreplay::tools {

namespace {

// The library kernels a row names, with their architectures.
std::string KernelsOf(const replay::VocabRow& r) {
  std::string out;
  for (const auto& [toggle, value] : r.sets) {
    const replay::KernelLibrary* lib = replay::FindKernelLibrary(value);
    if (lib == nullptr || std::string_view(toggle).find("kernel") == std::string_view::npos) continue;
    if (out.find(std::string(value) + ":") != std::string::npos) continue;
    out += (out.empty() ? "" : "; ") + std::string(value) + ": " + replay::ArchList(*lib);
  }
  return out;
}

int PrintVocabulary(const std::string& engine, bool json) {
  if (!replay::HasVocabulary(engine)) {
    return ReportError(absl::InvalidArgumentError("--engine " + engine + ": no vocabulary; choose sglang or vllm"));
  }
  nlohmann::json out = nlohmann::json::array();
  std::string last_key;
  for (const replay::VocabRow& r : replay::EngineVocabulary()) {
    if (r.engine != engine) continue;
    std::string sets;
    for (const auto& [toggle, value] : r.sets) {
      sets += (sets.empty() ? "" : ", ") + std::string(toggle) + "=" + (value == "$" ? "<value>" : std::string(value));
    }
    if (json) {
      nlohmann::json row = {{"key", r.key}, {"value", r.value}, {"meaning", r.meaning}};
      row["sets"] = nlohmann::json::object();
      for (const auto& [toggle, value] : r.sets) row["sets"][std::string(toggle)] = value == "$" ? "<value>" : value;
      for (const auto& [toggle, value] : r.sets) {
        const replay::KernelLibrary* lib = replay::FindKernelLibrary(value);
        if (lib == nullptr) continue;
        nlohmann::json archs = nlohmann::json::array();
        for (int a : lib->archs) archs.push_back(replay::ArchName(a));
        row["kernels"][std::string(value)] = {{"what", lib->what}, {"any_arch", lib->any_arch}, {"archs", archs}};
      }
      out.push_back(row);
      continue;
    }
    if (r.key != last_key) std::printf("%s\n", std::string(r.key).c_str());
    last_key = std::string(r.key);
    const std::string kernels = KernelsOf(r);
    std::printf("  %-20s -> %s\n", std::string(r.value).c_str(), sets.empty() ? "(no change)" : sets.c_str());
    if (!kernels.empty()) std::printf("  %-20s    runs on %s\n", "", kernels.c_str());
    if (!r.meaning.empty()) std::printf("  %-20s    %s\n", "", std::string(r.meaning).c_str());
  }
  if (json) {
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::printf("\nA value not listed is a note at replay, never an error. Architectures: docs/engines.md.\n");
  }
  return kExitOk;
}

}  // namespace

int RunToggles(int argc, char** argv) {
  CLI::App app("Print the configuration toggles: name, type, domain, default and meaning.", "toggles");
  bool json = false;
  std::string engine;
  app.add_flag("--json", json, "print a JSON array");
  app.add_option("--engine", engine,
                 "print how this serving engine's settings (sglang, vllm) map onto the toggles, with the "
                 "architectures of the library kernels they stand for");
  if (auto rc = ParseArgs(app, argc, argv)) return *rc;
  if (!engine.empty()) return PrintVocabulary(engine, json);
  if (json) {
    nlohmann::json out = nlohmann::json::array();
    for (const replay::ToggleSpec& s : replay::Toggles()) {
      nlohmann::json t;
      t["name"] = s.name;
      t["type"] = replay::TypeName(s.type);
      if (s.type == replay::ToggleType::kEnum) {
        t["choices"] = nlohmann::json::array();
        for (auto c : s.choices) t["choices"].push_back(c);
      } else if (s.type != replay::ToggleType::kBool) {
        t["min"] = s.min;
        t["max"] = s.max;
      }
      t["default"] = s.default_value;
      t["meaning"] = s.meaning;
      t["searchable"] = s.searchable;
      out.push_back(t);
    }
    std::printf("%s\n", out.dump(2).c_str());
    return kExitOk;
  }
  for (const replay::ToggleSpec& s : replay::Toggles()) {
    std::string domain;
    if (s.type == replay::ToggleType::kEnum) {
      for (auto c : s.choices) domain += (domain.empty() ? "" : "|") + std::string(c);
    } else if (s.type == replay::ToggleType::kBool) {
      domain = "true|false";
    } else {
      char buf[64];
      std::snprintf(buf, sizeof buf, "[%g, %g]", s.min, s.max);
      domain = buf;
    }
    std::printf("%-22s %-6s default %-16s %s\n    %s\n", std::string(s.name).c_str(),
                std::string(replay::TypeName(s.type)).c_str(), std::string(s.default_value).c_str(), domain.c_str(),
                std::string(s.meaning).c_str());
  }
  return kExitOk;
}

}  // namespace crashreplay::tools
