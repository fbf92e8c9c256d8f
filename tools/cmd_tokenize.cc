// `crashreplay tokenize`: text -> ids (and ids -> text) with the tokenizer
// `run` would use for a checkpoint.
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "command.h"
#include "commands_decl.h"
#include "crashreplay/replay/tokenizer/tokenizer.h"
#include "exit_codes.h"

namespace crashreplay::tools {

int RunTokenize(int argc, char** argv) {
  CLI::App app("Tokenize text (or decode ids) with the tokenizer `run` uses for a checkpoint.", "tokenize");
  std::string model_dir, choice = "auto";
  std::vector<std::string> texts, id_lists;
  bool json = false, no_special = false;
  app.add_option("MODEL_DIR", model_dir, "checkpoint directory")->required();
  app.add_option("TEXT", texts, "texts to encode");
  app.add_option("--ids", id_lists, "comma-separated ids to decode; repeatable");
  app.add_option("--tokenizer", choice, "auto | bytes | a tokenizer.json path (as for run)")->default_str("auto");
  app.add_flag("--no-special", no_special, "leave out the post-processor's special tokens (BOS)");
  app.add_flag("--json", json, "print {tokenizer, encoded: [{text, ids}], decoded: [{ids, text}]}");
  if (auto rc = ParseArgs(app, argc, argv)) return *rc;
  std::string note;
  auto tok = replay::TokenizerForCheckpoint(model_dir, choice, &note);
  if (!tok.ok()) return ReportError(tok.status());
  if (!note.empty()) std::fprintf(stderr, "crashreplay: note: %s\n", note.c_str());
  nlohmann::json out = {
      {"tokenizer", (*tok)->Describe()}, {"encoded", nlohmann::json::array()}, {"decoded", nlohmann::json::array()}};
  for (const std::string& t : texts) {
    auto ids = (*tok)->Encode(t, !no_special);
    if (!ids.ok()) return ReportError(absl::InvalidArgumentError("TEXT: " + std::string(ids.status().message())));
    out["encoded"].push_back({{"text", t}, {"ids", *ids}});
  }
  for (const std::string& list : id_lists) {
    auto ids = ParseIds("--ids", list);
    if (!ids.ok()) return ReportError(ids.status());
    auto text = (*tok)->Decode(*ids);
    if (!text.ok()) return ReportError(absl::InvalidArgumentError("--ids: " + std::string(text.status().message())));
    out["decoded"].push_back({{"ids", *ids}, {"text", *text}});
  }
  if (json) {
    std::printf("%s\n", out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return kExitOk;
  }
  std::printf("tokenizer: %s\n", (*tok)->Describe().c_str());
  for (const auto& e : out["encoded"]) std::printf("%s\n", e["ids"].dump().c_str());
  for (const auto& d : out["decoded"]) std::printf("%s\n", d["text"].get<std::string>().c_str());
  return kExitOk;
}

}  // namespace crashreplay::tools
