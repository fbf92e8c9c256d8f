#include "crashreplay/replay/tokenizer/tokenizer.h"

#include <oniguruma.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "crashreplay/base/status.h"
#include "crashreplay/base/utf8.h"

namespace crashreplay::replay {
namespace {

using absl::StrCat;
using Json = nlohmann::json;

// ---- UTF-8 -------------------------------------------------------------

// UTF-8 as Unicode defines it (no overlongs, surrogates or code points
// past U+10FFFF). At s[i]: `valid` the length of a whole valid character,
// else 0; `span` the bytes of the maximal invalid subpart otherwise (the
// lead byte and the continuation bytes that were still possible), which a
// lossy decode replaces with one U+FFFD, as Rust's from_utf8_lossy and
// Python's "replace" do.
struct Utf8At {
  size_t valid = 0;
  size_t span = 1;
};

Utf8At Utf8Scan(std::string_view s, size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) return {1, 1};
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xbf;  // range of the second byte
  if (b >= 0xc2 && b <= 0xdf) {
    n = 2;
  } else if (b >= 0xe0 && b <= 0xef) {
    n = 3;
    if (b == 0xe0) lo = 0xa0;
    if (b == 0xed) hi = 0x9f;
  } else if (b >= 0xf0 && b <= 0xf4) {
    n = 4;
    if (b == 0xf0) lo = 0x90;
    if (b == 0xf4) hi = 0x8f;
  } else {
    return {0, 1};
  }
  size_t k = 1;
  for (; k < n && i + k < s.size(); ++k) {
    const auto c = static_cast<unsigned char>(s[i + k]);
    const bool ok = k == 1 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xbf);
    if (!ok) break;
  }
  if (k == n) return {n, n};
  return {0, k};
}

size_t Utf8Len(std::string_view s, size_t i) { return Utf8Scan(s, i).valid; }

// Byte offset of the first invalid UTF-8 sequence, npos when valid.
size_t FirstInvalidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = Utf8Len(s, i);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

// Invalid sequences become U+FFFD, as a lossy UTF-8 decode does.
std::string ReplaceInvalidUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const Utf8At u = Utf8Scan(s, i);
    if (u.valid == 0) {
      AppendUtf8(out, 0xfffd);
    } else {
      out.append(s.substr(i, u.valid));
    }
    i += u.span;
  }
  return out;
}

// ---- byte-level alphabet (GPT-2) ---------------------------------------

// Byte b -> the code point that stands for it: printable bytes stand for
// themselves, the others are moved to 256 + k.
struct ByteAlphabet {
  std::string to_char[256];
  absl::flat_hash_map<std::string, uint8_t> from_char;
  ByteAlphabet() {
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      AppendUtf8(to_char[b], printable ? static_cast<uint32_t>(b) : next++);
      from_char[to_char[b]] = static_cast<uint8_t>(b);
    }
  }
};

const ByteAlphabet& Bytes() {
  static const ByteAlphabet a;
  return a;
}

// ---- regex splitting (Oniguruma) ---------------------------------------

void InitOniguruma() {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding encs[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encs, 1);
  });
}

class Regex {
 public:
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(const std::string& pattern, const std::string& where) {
    InitOniguruma();
    auto r = std::unique_ptr<Regex>(new Regex);
    OnigErrorInfo info;
    const auto* p = reinterpret_cast<const OnigUChar*>(pattern.data());
    const int rc =
        onig_new(&r->reg_, p, p + pattern.size(), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8, ONIG_SYNTAX_DEFAULT, &info);
    if (rc != ONIG_NORMAL) {
      r->reg_ = nullptr;
      OnigUChar msg[ONIG_MAX_ERROR_MESSAGE_LEN];
      onig_error_code_to_str(msg, rc, &info);
      return absl::InvalidArgumentError(StrCat(where, ": regex '", pattern, "': ", reinterpret_cast<char*>(msg)));
    }
    return r;
  }
  ~Regex() {
    if (reg_ != nullptr) onig_free(reg_);
  }
  // [begin, end) of every match, left to right; an empty match advances by
  // one character.
  absl::StatusOr<std::vector<std::pair<size_t, size_t>>> FindAll(std::string_view s) const {
    std::vector<std::pair<size_t, size_t>> out;
    OnigRegion* region = onig_region_new();
    const auto* str = reinterpret_cast<const OnigUChar*>(s.data());
    const OnigUChar* end = str + s.size();
    size_t at = 0;
    absl::Status status;
    while (at <= s.size()) {
      const int rc = onig_search(reg_, str, end, str + at, end, region, ONIG_OPTION_NONE);
      if (rc == ONIG_MISMATCH) break;
      if (rc < 0) {
        status = absl::InternalError(StrCat("regex search failed (Oniguruma code ", rc, ")"));
        break;
      }
      const auto b = static_cast<size_t>(region->beg[0]), e = static_cast<size_t>(region->end[0]);
      if (e > b) out.emplace_back(b, e);
      if (e > at) {
        at = e;
      } else {
        if (at >= s.size()) break;
        at += std::max<size_t>(1, Utf8Len(s, at));
      }
      onig_region_clear(region);
    }
    onig_region_free(region, 1);
    if (!status.ok()) return status;
    return out;
  }

 private:
  Regex() = default;
  regex_t* reg_ = nullptr;
};

// GPT-2's split, what ByteLevel(use_regex = true) applies.
constexpr char kGpt2Pattern[] = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

enum class SplitBehavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext };

struct SplitStep {
  std::unique_ptr<Regex> regex;  // null: literal
  std::string literal;
  SplitBehavior behavior = SplitBehavior::kIsolated;
};

absl::Status ApplySplit(const SplitStep& step, std::vector<std::string>& pieces) {
  std::vector<std::string> out;
  for (const std::string& piece : pieces) {
    std::vector<std::pair<size_t, size_t>> m;
    if (step.regex) {
      auto found = step.regex->FindAll(piece);
      if (!found.ok()) return found.status();
      m = std::move(*found);
    } else if (!step.literal.empty()) {
      for (size_t at = piece.find(step.literal); at != std::string::npos;
           at = piece.find(step.literal, at + step.literal.size())) {
        m.emplace_back(at, at + step.literal.size());
      }
    }
    // Alternate gaps and matches, then combine per behaviour.
    std::vector<std::pair<std::string, bool>> parts;  // text, is_match
    size_t at = 0;
    for (const auto& [b, e] : m) {
      if (b > at) parts.emplace_back(piece.substr(at, b - at), false);
      parts.emplace_back(piece.substr(b, e - b), true);
      at = e;
    }
    if (at < piece.size()) parts.emplace_back(piece.substr(at), false);
    switch (step.behavior) {
      case SplitBehavior::kIsolated:
        for (auto& p : parts) out.push_back(std::move(p.first));
        break;
      case SplitBehavior::kRemoved:
        for (auto& p : parts)
          if (!p.second) out.push_back(std::move(p.first));
        break;
      case SplitBehavior::kMergedWithPrevious: {
        std::vector<std::string> merged;
        for (auto& p : parts) {
          if (p.second && !merged.empty()) {
            merged.back() += p.first;
          } else {
            merged.push_back(std::move(p.first));
          }
        }
        for (auto& s : merged) out.push_back(std::move(s));
        break;
      }
      case SplitBehavior::kMergedWithNext: {
        std::vector<std::string> merged;
        std::string carry;
        for (auto& p : parts) {
          if (p.second) {
            carry += p.first;
          } else {
            merged.push_back(carry + p.first);
            carry.clear();
          }
        }
        if (!carry.empty()) merged.push_back(std::move(carry));
        for (auto& s : merged) out.push_back(std::move(s));
        break;
      }
    }
  }
  pieces = std::move(out);
  return absl::OkStatus();
}

// ---- the BPE tokenizer -------------------------------------------------

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool lstrip = false, rstrip = false;
};

struct PairHash {
  size_t operator()(const std::pair<int32_t, int32_t>& p) const {
    return std::hash<uint64_t>()((static_cast<uint64_t>(static_cast<uint32_t>(p.first)) << 32) |
                                 static_cast<uint32_t>(p.second));
  }
};

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

class BpeTokenizer final : public Tokenizer {
 public:
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_special_tokens) const override {
    if (size_t bad = FirstInvalidUtf8(text); bad != std::string_view::npos) {
      return absl::InvalidArgumentError(StrCat("text is not valid UTF-8 at byte ", bad));
    }
    std::vector<int32_t> ids;
    // Added tokens first (leftmost, then longest), each an id of its own.
    std::string_view rest = text;
    std::string segment;
    while (!rest.empty()) {
      size_t best_at = std::string_view::npos;
      const AddedToken* best = nullptr;
      for (const AddedToken& a : added_) {
        const size_t at = rest.find(a.content);
        if (at == std::string_view::npos) continue;
        if (at < best_at || (at == best_at && a.content.size() > best->content.size())) {
          best_at = at;
          best = &a;
        }
      }
      std::string_view before = best ? rest.substr(0, best_at) : rest;
      std::string_view after = best ? rest.substr(best_at + best->content.size()) : std::string_view();
      if (best && best->lstrip) {
        while (!before.empty() && IsSpace(before.back())) before.remove_suffix(1);
      }
      CR_RETURN_IF_ERROR(EncodeOrdinary(before, ids));
      if (!best) break;
      ids.push_back(best->id);
      if (best->rstrip) {
        while (!after.empty() && IsSpace(after.front())) after.remove_prefix(1);
      }
      rest = after;
    }
    if (!add_special_tokens) return ids;
    std::vector<int32_t> out;
    bool placed = template_.empty();
    for (const auto& item : template_) {
      if (item.empty()) {
        out.insert(out.end(), ids.begin(), ids.end());
        placed = true;
      } else {
        out.insert(out.end(), item.begin(), item.end());
      }
    }
    if (!placed) out.insert(out.end(), ids.begin(), ids.end());
    return template_.empty() ? ids : out;
  }

  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids) const override {
    std::string bytes;
    for (int32_t id : ids) {
      if (!HasToken(id)) {
        return absl::InvalidArgumentError(StrCat("token id ", id, " is not in the tokenizer's vocabulary"));
      }
      const std::string& tok = id_to_token_[static_cast<size_t>(id)];
      if (is_added_[static_cast<size_t>(id)]) {
        bytes += tok;
        continue;
      }
      for (size_t i = 0; i < tok.size();) {
        const size_t n = std::max<size_t>(1, Utf8Len(tok, i));
        const auto it = Bytes().from_char.find(tok.substr(i, n));
        if (it != Bytes().from_char.end()) {
          bytes += static_cast<char>(it->second);
        } else {
          bytes.append(tok, i, n);
        }
        i += n;
      }
    }
    return ReplaceInvalidUtf8(bytes);
  }

  bool HasToken(int32_t id) const override {
    return id >= 0 && static_cast<size_t>(id) < id_to_token_.size() && has_token_[static_cast<size_t>(id)];
  }

  std::string Describe() const override {
    return StrCat(origin_, ": BPE, ", vocab_.size(), " tokens, ", merges_.size(), " merges, ", added_.size(),
                  " added tokens");
  }
  int64_t VocabSize() const override { return static_cast<int64_t>(id_to_token_.size()); }

 private:
  absl::Status EncodeOrdinary(std::string_view text, std::vector<int32_t>& ids) const {
    if (text.empty()) return absl::OkStatus();
    std::vector<std::string> pieces{std::string(text)};
    if (add_prefix_space_ && !IsSpace(pieces[0][0])) pieces[0].insert(0, " ");
    for (const SplitStep& s : splits_) CR_RETURN_IF_ERROR(ApplySplit(s, pieces));
    for (const std::string& piece : pieces) {
      std::string word;
      for (unsigned char c : piece) word += Bytes().to_char[c];
      CR_RETURN_IF_ERROR(EncodeWord(word, ids));
    }
    return absl::OkStatus();
  }

  absl::Status EncodeWord(const std::string& word, std::vector<int32_t>& ids) const {
    if (word.empty()) return absl::OkStatus();
    if (ignore_merges_) {
      if (auto it = vocab_.find(word); it != vocab_.end()) {
        ids.push_back(it->second);
        return absl::OkStatus();
      }
    }
    std::vector<int32_t> sym;
    for (size_t i = 0; i < word.size();) {
      const size_t n = std::max<size_t>(1, Utf8Len(word, i));
      const auto it = vocab_.find(word.substr(i, n));
      if (it == vocab_.end()) {
        if (unk_ < 0) {
          return absl::InvalidArgumentError(StrCat("the byte-level symbol '", word.substr(i, n),
                                                   "' is not in the vocabulary and there is no unk_token"));
        }
        sym.push_back(unk_);
      } else {
        sym.push_back(it->second);
      }
      i += n;
    }
    // Merge the lowest-ranked adjacent pair (leftmost on ties) until none
    // is left: the order `tokenizers` merges in.
    while (sym.size() > 1) {
      size_t best = 0;
      int64_t best_rank = -1;
      int32_t best_id = 0;
      for (size_t i = 0; i + 1 < sym.size(); ++i) {
        const auto it = merges_.find({sym[i], sym[i + 1]});
        if (it != merges_.end() && (best_rank < 0 || it->second.first < best_rank)) {
          best = i;
          best_rank = it->second.first;
          best_id = it->second.second;
        }
      }
      if (best_rank < 0) break;
      sym[best] = best_id;
      sym.erase(sym.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    }
    ids.insert(ids.end(), sym.begin(), sym.end());
    return absl::OkStatus();
  }

 public:  // filled by ParseTokenizerJson
  std::string origin_;
  absl::flat_hash_map<std::string, int32_t> vocab_;
  absl::flat_hash_map<std::pair<int32_t, int32_t>, std::pair<int64_t, int32_t>, PairHash> merges_;
  std::vector<AddedToken> added_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_token_, is_added_;
  std::vector<SplitStep> splits_;
  bool add_prefix_space_ = false;
  bool ignore_merges_ = false;
  int32_t unk_ = -1;
  // Post-processor template: a list of id runs; an empty run is the text.
  std::vector<std::vector<int32_t>> template_;
};

class ByteTokenizer final : public Tokenizer {
 public:
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool) const override {
    std::vector<int32_t> ids;
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids) const override {
    std::string s;
    for (int32_t id : ids) {
      if (!HasToken(id)) return absl::InvalidArgumentError(StrCat("token id ", id, " is not a byte"));
      s += static_cast<char>(id);
    }
    return s;
  }
  bool HasToken(int32_t id) const override { return id >= 0 && id <= 255; }
  std::string Describe() const override { return "bytes"; }
  int64_t VocabSize() const override { return 256; }
};

// ---- parsing -----------------------------------------------------------

std::string TypeOf(const Json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : "";
}

absl::Status Unsupported(const std::string& origin, const std::string& field, const std::string& what) {
  return absl::UnimplementedError(
      StrCat(origin, ": ", field, " ", what, " is not supported (byte-level BPE tokenizers only: docs/replay.md)"));
}

absl::Status ParsePreTokenizer(const Json& p, const std::string& origin, const std::string& field,
                               std::vector<SplitStep>* splits, bool* byte_level, bool* add_prefix_space) {
  const std::string type = TypeOf(p);
  if (type == "Sequence") {
    if (!p.contains("pretokenizers") || !p["pretokenizers"].is_array()) {
      return absl::InvalidArgumentError(StrCat(origin, ": ", field, ".pretokenizers: expected an array"));
    }
    for (size_t i = 0; i < p["pretokenizers"].size(); ++i) {
      CR_RETURN_IF_ERROR(ParsePreTokenizer(p["pretokenizers"][i], origin, StrCat(field, ".pretokenizers[", i, "]"),
                                           splits, byte_level, add_prefix_space));
    }
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    *byte_level = true;
    *add_prefix_space = p.value("add_prefix_space", false);
    if (p.value("use_regex", true)) {
      SplitStep s;
      CR_ASSIGN_OR_RETURN(s.regex, Regex::Compile(kGpt2Pattern, StrCat(origin, ": ", field)));
      splits->push_back(std::move(s));
    }
    return absl::OkStatus();
  }
  if (type == "Split") {
    if (p.value("invert", false)) return Unsupported(origin, field, "Split with invert = true");
    SplitStep s;
    const std::string behavior = p.value("behavior", "Isolated");
    if (behavior == "Isolated") {
      s.behavior = SplitBehavior::kIsolated;
    } else if (behavior == "Removed") {
      s.behavior = SplitBehavior::kRemoved;
    } else if (behavior == "MergedWithPrevious") {
      s.behavior = SplitBehavior::kMergedWithPrevious;
    } else if (behavior == "MergedWithNext") {
      s.behavior = SplitBehavior::kMergedWithNext;
    } else {
      return Unsupported(origin, StrCat(field, ".behavior"), "'" + behavior + "'");
    }
    const Json& pat = p.contains("pattern") ? p["pattern"] : Json();
    if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string()) {
      CR_ASSIGN_OR_RETURN(s.regex,
                          Regex::Compile(pat["Regex"].get<std::string>(), StrCat(origin, ": ", field, ".pattern")));
    } else if (pat.is_object() && pat.contains("String") && pat["String"].is_string()) {
      s.literal = pat["String"].get<std::string>();
    } else {
      return absl::InvalidArgumentError(
          StrCat(origin, ": ", field, ".pattern: expected {\"Regex\": ...} or {\"String\": ...}"));
    }
    splits->push_back(std::move(s));
    return absl::OkStatus();
  }
  return Unsupported(origin, field, "type '" + type + "'");
}

absl::StatusOr<int32_t> IdOf(const Json& j, const std::string& where) {
  if (!j.is_number_integer() || j.get<int64_t>() < 0 || j.get<int64_t>() > INT32_MAX) {
    return absl::InvalidArgumentError(StrCat(where, ": expected a token id (0..2^31-1), got ", j.dump()));
  }
  return static_cast<int32_t>(j.get<int64_t>());
}

absl::Status ParsePostProcessor(const Json& p, const std::string& origin, const std::string& field,
                                std::vector<std::vector<int32_t>>* tmpl) {
  const std::string type = TypeOf(p);
  if (type == "ByteLevel") return absl::OkStatus();  // offsets only
  if (type == "Sequence") {
    if (!p.contains("processors") || !p["processors"].is_array()) {
      return absl::InvalidArgumentError(StrCat(origin, ": ", field, ".processors: expected an array"));
    }
    for (size_t i = 0; i < p["processors"].size(); ++i) {
      CR_RETURN_IF_ERROR(ParsePostProcessor(p["processors"][i], origin, StrCat(field, ".processors[", i, "]"), tmpl));
    }
    return absl::OkStatus();
  }
  if (type == "TemplateProcessing") {
    const Json& single = p.contains("single") ? p["single"] : Json();
    const Json& specials = p.contains("special_tokens") ? p["special_tokens"] : Json::object();
    if (!single.is_array())
      return absl::InvalidArgumentError(StrCat(origin, ": ", field, ".single: expected an array"));
    tmpl->clear();
    for (size_t i = 0; i < single.size(); ++i) {
      const Json& item = single[i];
      const std::string where = StrCat(origin, ": ", field, ".single[", i, "]");
      if (item.contains("Sequence")) {
        tmpl->push_back({});
      } else if (item.contains("SpecialToken") && item["SpecialToken"].contains("id")) {
        const std::string name = item["SpecialToken"]["id"].get<std::string>();
        if (!specials.contains(name) || !specials[name].contains("ids") || !specials[name]["ids"].is_array()) {
          return absl::InvalidArgumentError(StrCat(where, ": special token '", name, "' has no ids in special_tokens"));
        }
        std::vector<int32_t> ids;
        for (const Json& id : specials[name]["ids"]) {
          CR_ASSIGN_OR_RETURN(int32_t v, IdOf(id, where));
          ids.push_back(v);
        }
        tmpl->push_back(std::move(ids));
      } else {
        return absl::InvalidArgumentError(StrCat(where, ": expected Sequence or SpecialToken"));
      }
    }
    return absl::OkStatus();
  }
  return Unsupported(origin, field, "type '" + type + "'");
}

}  // namespace

std::unique_ptr<Tokenizer> MakeByteTokenizer() { return std::make_unique<ByteTokenizer>(); }

absl::StatusOr<std::unique_ptr<Tokenizer>> ParseTokenizerJson(std::string_view text, const std::string& origin) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError(StrCat(origin, ": not a JSON object"));
  auto t = std::make_unique<BpeTokenizer>();
  t->origin_ = origin;
  const Json& model = j.contains("model") ? j["model"] : Json();
  if (!model.is_object()) return absl::InvalidArgumentError(StrCat(origin, ": no 'model' object"));
  const std::string mtype = model.contains("type") ? TypeOf(model) : "BPE";
  if (mtype != "BPE") return Unsupported(origin, "model.type", "'" + mtype + "'");
  if (model.value("byte_fallback", false)) return Unsupported(origin, "model.byte_fallback", "true");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(k) && model[k].is_string() && !model[k].get<std::string>().empty()) {
      return Unsupported(origin, StrCat("model.", k), "'" + model[k].get<std::string>() + "'");
    }
  }
  if (model.contains("dropout") && model["dropout"].is_number() && model["dropout"].get<double>() > 0) {
    return Unsupported(origin, "model.dropout", model["dropout"].dump());
  }
  t->ignore_merges_ = model.value("ignore_merges", false);
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return absl::InvalidArgumentError(StrCat(origin, ": model.vocab: expected an object of token -> id"));
  }
  int32_t max_id = -1;
  for (const auto& [tok, id] : model["vocab"].items()) {
    CR_ASSIGN_OR_RETURN(int32_t v, IdOf(id, StrCat(origin, ": model.vocab['", tok, "']")));
    t->vocab_[tok] = v;
    max_id = std::max(max_id, v);
  }
  const Json& added = j.contains("added_tokens") && j["added_tokens"].is_array() ? j["added_tokens"] : Json::array();
  for (size_t i = 0; i < added.size(); ++i) {
    const Json& a = added[i];
    const std::string where = StrCat(origin, ": added_tokens[", i, "]");
    if (!a.is_object() || !a.contains("content") || !a["content"].is_string() || !a.contains("id")) {
      return absl::InvalidArgumentError(StrCat(where, ": expected {\"id\": N, \"content\": \"...\"}"));
    }
    AddedToken tok;
    tok.content = a["content"].get<std::string>();
    CR_ASSIGN_OR_RETURN(tok.id, IdOf(a["id"], where + ".id"));
    tok.lstrip = a.value("lstrip", false);
    tok.rstrip = a.value("rstrip", false);
    if (tok.content.empty()) return absl::InvalidArgumentError(StrCat(where, ": empty content"));
    max_id = std::max(max_id, tok.id);
    t->added_.push_back(std::move(tok));
  }
  t->id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
  t->has_token_.assign(t->id_to_token_.size(), false);
  t->is_added_.assign(t->id_to_token_.size(), false);
  for (const auto& [tok, id] : t->vocab_) {
    t->id_to_token_[static_cast<size_t>(id)] = tok;
    t->has_token_[static_cast<size_t>(id)] = true;
  }
  for (const AddedToken& a : t->added_) {
    t->id_to_token_[static_cast<size_t>(a.id)] = a.content;
    t->has_token_[static_cast<size_t>(a.id)] = true;
    t->is_added_[static_cast<size_t>(a.id)] = true;
  }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    const auto it = t->vocab_.find(model["unk_token"].get<std::string>());
    if (it != t->vocab_.end()) t->unk_ = it->second;
  }
  const Json& merges = model.contains("merges") ? model["merges"] : Json::array();
  if (!merges.is_array()) return absl::InvalidArgumentError(StrCat(origin, ": model.merges: expected an array"));
  for (size_t i = 0; i < merges.size(); ++i) {
    const Json& m = merges[i];
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 >= s.size() || s.find(' ', sp + 1) != std::string::npos) {
        return absl::InvalidArgumentError(
            StrCat(origin, ": model.merges[", i, "] '", s, "': expected two tokens separated by one space"));
      }
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      return absl::InvalidArgumentError(StrCat(origin, ": model.merges[", i, "]: expected \"a b\" or [\"a\", \"b\"]"));
    }
    const auto ia = t->vocab_.find(a), ib = t->vocab_.find(b), im = t->vocab_.find(a + b);
    if (ia == t->vocab_.end() || ib == t->vocab_.end() || im == t->vocab_.end()) {
      return absl::InvalidArgumentError(StrCat(origin, ": model.merges[", i, "] ('", a, "', '", b,
                                               "'): a part or the merged token is not in model.vocab"));
    }
    t->merges_.try_emplace({ia->second, ib->second}, static_cast<int64_t>(i), im->second);  // first rank wins
  }
  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    const std::string nt = TypeOf(j["normalizer"]);
    if (nt != "NFC") return Unsupported(origin, "normalizer", "type '" + nt + "'");
  }
  bool byte_level = false;
  if (!j.contains("pre_tokenizer") || j["pre_tokenizer"].is_null()) {
    return Unsupported(origin, "pre_tokenizer", "null");
  }
  CR_RETURN_IF_ERROR(
      ParsePreTokenizer(j["pre_tokenizer"], origin, "pre_tokenizer", &t->splits_, &byte_level, &t->add_prefix_space_));
  if (!byte_level) return Unsupported(origin, "pre_tokenizer", "without ByteLevel");
  if (j.contains("post_processor") && !j["post_processor"].is_null()) {
    CR_RETURN_IF_ERROR(ParsePostProcessor(j["post_processor"], origin, "post_processor", &t->template_));
  }
  if (j.contains("decoder") && !j["decoder"].is_null()) {
    const std::string dt = TypeOf(j["decoder"]);
    if (dt != "ByteLevel" && dt != "Sequence") return Unsupported(origin, "decoder", "type '" + dt + "'");
  }
  return std::unique_ptr<Tokenizer>(std::move(t));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizerJson(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(StrCat("cannot open '", path, "'"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseTokenizerJson(ss.str(), path);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> TokenizerForCheckpoint(const std::string& dir, const std::string& choice,
                                                                  std::string* note) {
  note->clear();
  if (choice == "bytes") return MakeByteTokenizer();
  if (choice != "auto") return LoadTokenizerJson(choice);
  const std::string path = dir + "/tokenizer.json";
  if (!std::filesystem::exists(path)) return MakeByteTokenizer();
  auto t = LoadTokenizerJson(path);
  if (t.ok()) return t;
  if (t.status().code() != absl::StatusCode::kUnimplemented) return t.status();
  *note = StrCat(t.status().message(), "; prompts are tokenized as bytes (--tokenizer bytes to silence this)");
  return MakeByteTokenizer();
}

}  // namespace crashreplay::replay
