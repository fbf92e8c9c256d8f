// `crashreplay toggles [--json]`: prints the one toggle table.
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "command.h"
#include "commands_decl.h"
#include "crashreplay/replay/toggles.h"
#include "exit_codes.h"

namespace crashreplay::tools {

int RunToggles(int argc, char** argv) {
  CLI::App app("Print the configuration toggles: name, type, domain, default and meaning.", "toggles");
  bool json = false;
  app.add_flag("--json", json, "print a JSON array");
  if (auto rc = ParseArgs(app, argc, argv)) return *rc;
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
                std::string(replay::TypeName(s.type)).c_str(), std::string(s.default_value).c_str(),
                domain.c_str(), std::string(s.meaning).c_str());
  }
  return kExitOk;
}

}  // namespace crashreplay::tools
