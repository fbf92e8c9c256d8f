// tokenizer.json (byte-level BPE) on hand-built files: merge order, added
// tokens, split behaviours, lossy decoding, and errors that name the field.
// The comparison against HF `tokenizers` on trained files is
// python/tests/test_tokenizer_json.py.
#include "crashreplay/replay/tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace crashreplay::replay {
namespace {

using Json = nlohmann::json;

// GPT-2's byte -> character table, written out from its definition.
std::string ByteChar(int b) {
  int cp = b;
  if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)) {
    int n = 0;
    for (int k = 0; k < b; ++k) n += !((k >= 33 && k <= 126) || (k >= 161 && k <= 172) || k >= 174);
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xc0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  }
  return s;
}

// Vocabulary: the 256 byte characters (id = byte), then `extra` in order.
Json Tokenizer(const std::vector<std::string>& extra, const std::vector<std::string>& merges, Json pre) {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteChar(b)] = b;
  for (size_t i = 0; i < extra.size(); ++i) vocab[extra[i]] = 256 + static_cast<int>(i);
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
          {"pre_tokenizer", pre},
          {"decoder", {{"type", "ByteLevel"}}}};
}

Json ByteLevel(bool regex = true) { return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", regex}}; }

std::unique_ptr<replay::Tokenizer> Parse(const Json& j) {
  auto t = ParseTokenizerJson(j.dump(), "test.json");
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

std::vector<int32_t> Ids(const replay::Tokenizer& t, std::string_view text) {
  auto ids = t.Encode(text, true);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

TEST(TokenizerJson, MergesApplyLowestRankFirstWithinEachGpt2Piece) {
  // 256 "he", 257 "ll", 258 "hell", 259 "hello", 260 "Ġw" (space + w)
  auto t = Parse(Tokenizer({"he", "ll", "hell", "hello", "Ġw"}, {"l l", "h e", "he ll", "hell o", "Ġ w"}, ByteLevel()));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(Ids(*t, "hello"), (std::vector<int32_t>{259}));
  // " world" is its own piece: "Ġw" merges, the rest stays bytes.
  EXPECT_EQ(Ids(*t, "hello world"), (std::vector<int32_t>{259, 260, 'o', 'r', 'l', 'd'}));
  // "hellhello": one piece; ranks pick l+l (both), then h+e (both), then he+ll, ...
  EXPECT_EQ(Ids(*t, "hellhello"), (std::vector<int32_t>{258, 259}));
  auto text = t->Decode(Ids(*t, "hello world"));
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "hello world");
}

TEST(TokenizerJson, AddedTokensSplitFirstWithStrip) {
  Json j = Tokenizer({}, {}, ByteLevel());
  j["added_tokens"] = Json::array(
      {{{"id", 300}, {"content", "<s>"}}, {{"id", 301}, {"content", "<sep>"}, {"lstrip", true}, {"rstrip", true}}});
  auto t = Parse(j);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(Ids(*t, "a<s>b"), (std::vector<int32_t>{'a', 300, 'b'}));
  EXPECT_EQ(Ids(*t, "a  <sep>  b"), (std::vector<int32_t>{'a', 301, 'b'}));
  auto text = t->Decode(std::vector<int32_t>{300, 'x'});
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "<s>x");
  EXPECT_EQ(t->VocabSize(), 302);
}

TEST(TokenizerJson, SplitBehavioursDecideWhatMayMerge) {
  auto with = [](const std::string& behavior) {
    Json split = {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", false}};
    return Parse(
        Tokenizer({"a-", "-b"}, {"a -", "- b"}, {{"type", "Sequence"}, {"pretokenizers", {split, ByteLevel(false)}}}));
  };
  EXPECT_EQ(Ids(*with("Isolated"), "a-b"), (std::vector<int32_t>{'a', '-', 'b'}));
  EXPECT_EQ(Ids(*with("Removed"), "a-b"), (std::vector<int32_t>{'a', 'b'}));
  EXPECT_EQ(Ids(*with("MergedWithPrevious"), "a-b"), (std::vector<int32_t>{256, 'b'}));
  EXPECT_EQ(Ids(*with("MergedWithNext"), "a-b"), (std::vector<int32_t>{'a', 257}));
}

TEST(TokenizerJson, TemplateAddsBosUnlessAskedNotTo) {
  Json j = Tokenizer({}, {}, ByteLevel());
  j["added_tokens"] = Json::array({{{"id", 290}, {"content", "<bos>"}}});
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", Json::array({{{"SpecialToken", {{"id", "<bos>"}, {"type_id", 0}}}},
                                                 {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                         {"special_tokens", {{"<bos>", {{"id", "<bos>"}, {"ids", {290}}, {"tokens", {"<bos>"}}}}}}};
  auto t = Parse(j);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(Ids(*t, "hi"), (std::vector<int32_t>{290, 'h', 'i'}));
  auto plain = t->Encode("hi", false);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(*plain, (std::vector<int32_t>{'h', 'i'}));
}

TEST(TokenizerJson, InvalidUtf8InIsRefusedAndDecodedBytesAreReplacedByMaximalSubpart) {
  auto t = Parse(Tokenizer({}, {}, ByteLevel()));
  ASSERT_NE(t, nullptr);
  auto bad = t->Encode("ok\xff", true);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("not valid UTF-8 at byte 2"), std::string::npos) << bad.status();
  // E2 82 is a truncated euro sign: one U+FFFD; F0 80: F0 cannot be
  // followed by 80, so two.
  auto text = t->Decode(std::vector<int32_t>{0xe2, 0x82, 'A', 0xf0, 0x80, 0xe2, 0x82, 0xac});
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text,
            "\xef\xbf\xbd"
            "A"
            "\xef\xbf\xbd\xef\xbf\xbd"
            "\xe2\x82\xac");
  auto unknown = t->Decode(std::vector<int32_t>{999});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("token id 999"), std::string::npos);
}

TEST(TokenizerJson, ErrorsNameTheFileAndField) {
  auto status_of = [](const Json& j) { return ParseTokenizerJson(j.dump(), "tok.json").status(); };
  absl::Status s = status_of(Tokenizer({"ll"}, {"l l", "ab"}, ByteLevel()));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tok.json: model.merges[1] 'ab': expected two tokens"), std::string::npos) << s;
  s = status_of(Tokenizer({}, {"a b"}, ByteLevel()));  // "ab" is not in the vocabulary
  EXPECT_NE(s.message().find("model.merges[0] ('a', 'b'): a part or the merged token is not in model.vocab"),
            std::string::npos)
      << s;
  Json neg = Tokenizer({}, {}, ByteLevel());
  neg["model"]["vocab"]["x y"] = -4;
  s = status_of(neg);
  EXPECT_NE(s.message().find("model.vocab['x y']: expected a token id"), std::string::npos) << s;
  Json wp = Tokenizer({}, {}, ByteLevel());
  wp["model"]["type"] = "WordPiece";
  EXPECT_EQ(status_of(wp).code(), absl::StatusCode::kUnimplemented);
  Json lower = Tokenizer({}, {}, ByteLevel());
  lower["normalizer"] = {{"type", "Lowercase"}};
  s = status_of(lower);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("normalizer type 'Lowercase' is not supported"), std::string::npos) << s;
  Json meta = Tokenizer({}, {}, {{"type", "Metaspace"}});
  EXPECT_NE(status_of(meta).message().find("pre_tokenizer type 'Metaspace'"), std::string::npos);
  Json re = Tokenizer({}, {},
                      {{"type", "Sequence"},
                       {"pretokenizers", {{{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}}, ByteLevel()}}});
  s = status_of(re);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("pre_tokenizer.pretokenizers[0].pattern: regex '(unclosed'"), std::string::npos) << s;
  EXPECT_NE(ParseTokenizerJson("{\"model\": ", "tok.json").status().message().find("tok.json: not a JSON object"),
            std::string::npos);
  EXPECT_EQ(LoadTokenizerJson("/nonexistent/tokenizer.json").status().code(), absl::StatusCode::kNotFound);
}

TEST(TokenizerJson, ByteTokenizerRoundTrips) {
  auto t = MakeByteTokenizer();
  auto ids = t->Encode("a\xff", true);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{'a', 255}));
  EXPECT_EQ(*t->Decode(*ids), "a\xff");
  EXPECT_FALSE(t->Decode(std::vector<int32_t>{256}).ok());
}

}  // namespace
}  // namespace crashreplay::replay
