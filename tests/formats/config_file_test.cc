#include "crashreplay/formats/config_file.h"

#include <cmath>
#include <cstdio>
#include <string>

#include <unistd.h>

#include <gtest/gtest.h>

namespace crashreplay {
namespace {

TEST(ConfigFile, ParsesEveryScalarTypeCommentsAndBlankLines) {
  const char* text =
      "# a comment\n"
      "\n"
      "attention_backend = \"flash_decode\"   # trailing comment\n"
      "page_size = 64\n"
      "mem_fraction_static = 0.95\n"
      "  use_cuda_graph=true\r\n"
      "negative = -3\n"
      "big = 1_000_000\n"
      "exp = 1e-3\n"
      "hex = 0xff\n"
      "literal = 'C:\\path'\n"
      "escaped = \"tab\\tquote\\\" \\u00e9\"\n";
  auto c = ParseConfig(text, "good.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->size(), 10u);
  EXPECT_EQ(c->at("attention_backend").as_string(), "flash_decode");
  EXPECT_EQ(c->at("page_size").as_int(), 64);
  EXPECT_DOUBLE_EQ(c->at("mem_fraction_static").as_float(), 0.95);
  EXPECT_TRUE(c->at("use_cuda_graph").as_bool());
  EXPECT_EQ(c->at("negative").as_int(), -3);
  EXPECT_EQ(c->at("big").as_int(), 1000000);
  EXPECT_DOUBLE_EQ(c->at("exp").as_float(), 1e-3);
  EXPECT_EQ(c->at("hex").as_int(), 255);
  EXPECT_EQ(c->at("literal").as_string(), "C:\\path");
  EXPECT_EQ(c->at("escaped").as_string(), "tab\tquote\" \xc3\xa9");
}

// The engines' adapters record names such as env.SGLANG_ENABLE_JIT_DEEPGEMM
// and cache_config.block_size: a dotted name is one flat name here.
TEST(ConfigFile, ADottedNameIsOneFlatName) {
  auto c = ParseConfig("env.SGLANG_ENABLE_JIT_DEEPGEMM = \"0\"\ncache_config.block_size = 16\n", "e.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->at("env.SGLANG_ENABLE_JIT_DEEPGEMM").as_string(), "0");
  EXPECT_EQ(c->at("cache_config.block_size").as_int(), 16);
  EXPECT_EQ(*ParseConfig(FormatConfig(*c), "again"), *c);
}

struct BadCase {
  const char* text;
  const char* expect;  // substring of the message
};

TEST(ConfigFile, RejectsTablesArraysDuplicatesAndMalformedLinesNamingFileAndLine) {
  const BadCase cases[] = {
      {"a = 1\n[server]\n", "bad.toml:2: tables"},
      {"a = [1, 2]\n", "bad.toml:1: 'a': arrays are not supported"},
      {"a = {x = 1}\n", "inline tables"},
      {"a = 1\nb = 2\na = 3\n", "bad.toml:3: duplicate name 'a' (first set on line 1)"},
      {"a..b = 1\n", "not a valid name"},
      {".a = 1\n", "not a valid name"},
      {"a. = 1\n", "not a valid name"},
      {"a 1\n", "expected '='"},
      {"a =\n", "missing value"},
      {"a = flash\n", "'flash' is not a supported value"},
      {"a = \"open\n", "unterminated string"},
      {"a = 1 2\n", "unexpected text after the value"},
      {"a = 99999999999999999999\n", "does not fit in 64 bits"},
      {"a = 01\n", "not a supported value"},
      {"a = 1__0\n", "not a supported value"},
      {"a = 1979-05-27\n", "dates and times"},
      {"\"a\" = 1\n", "quoted names"},
      {"= 1\n", "expected `name = value`"},
      {"a = \"\\q\"\n", "unknown escape"},
      {"a = \"\"\"x\"\"\"\n", "multi-line"},
  };
  for (const BadCase& bc : cases) {
    auto c = ParseConfig(bc.text, "bad.toml");
    ASSERT_FALSE(c.ok()) << bc.text;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << bc.text;
    EXPECT_NE(std::string(c.status().message()).find(bc.expect), std::string::npos)
        << "input: " << bc.text << "\nmessage: " << c.status().message();
  }
}

TEST(ConfigFile, FormatIsCanonicalAndRoundTrips) {
  Config c;
  c["zeta"] = ConfigValue::Float(1.0);
  c["alpha"] = ConfigValue::String("a \"quoted\"\nline");
  c["mid"] = ConfigValue::Int(-7);
  c["flag"] = ConfigValue::Bool(false);
  c["frac"] = ConfigValue::Float(0.1);
  const std::string text = FormatConfig(c, "header");
  EXPECT_EQ(text,
            "# header\n"
            "alpha = \"a \\\"quoted\\\"\\nline\"\n"
            "flag = false\n"
            "frac = 0.1\n"
            "mid = -7\n"
            "zeta = 1.0\n");
  auto back = ParseConfig(text, "x");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, c);
  EXPECT_TRUE(back->at("zeta").is_float());  // 1.0 stays a float, not an integer
}

TEST(ConfigFile, NonFiniteFloatsRoundTrip) {
  auto c = ParseConfig("a = inf\nb = -inf\nc = nan\n", "x");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(std::isinf(c->at("a").as_float()));
  EXPECT_EQ(FormatConfig(*c), "a = inf\nb = -inf\nc = nan\n");
}

TEST(ConfigFile, SetFlagTakesTomlScalarsAndBareWordsAsStrings) {
  auto a = ParseSetFlag("page_size=64");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->first, "page_size");
  EXPECT_EQ(a->second.as_int(), 64);
  auto b = ParseSetFlag("attention_backend=flash_decode");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->second.as_string(), "flash_decode");
  auto q = ParseSetFlag("s=\"true\"");
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->second.as_string(), "true");
  auto t = ParseSetFlag("use_graphs = true");
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(t->second.as_bool());
  EXPECT_FALSE(ParseSetFlag("novalue").ok());
  EXPECT_FALSE(ParseSetFlag("bad name=1").ok());
  EXPECT_FALSE(ParseSetFlag("x=").ok());
  EXPECT_FALSE(ParseSetFlag("x=\"unterminated").ok());
}

TEST(ConfigFile, ReadAndWriteFiles) {
  char path[] = "/tmp/crashreplay-config-test-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  Config c;
  c["x"] = ConfigValue::Int(3);
  ASSERT_TRUE(WriteConfigFile(path, c).ok());
  auto back = ReadConfigFile(path);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, c);
  std::remove(path);
  auto missing = ReadConfigFile(path);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(missing.status().message()).find(path), std::string::npos);
}

}  // namespace
}  // namespace crashreplay
