#include "crashreplay/replay/config/toggles.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace crashreplay::replay {
namespace {

TEST(Toggles, TableHasRequiredTogglesWithParsableDefaults) {
  for (const char* name : {"attention_backend", "gemm_backend", "moe_backend", "scale_format", "kv_cache_dtype",
                           "page_size", "mem_fraction_static", "cuda_graph_max_bs", "sampling_backend", "rope_config",
                           "tp_size", "device_memory_gb", "nvfp4_activation"}) {
    const ToggleSpec* s = FindToggle(name);
    ASSERT_NE(s, nullptr) << name;
    EXPECT_TRUE(ParseToggleValue(*s, s->default_value).ok()) << name;
    EXPECT_FALSE(s->meaning.empty()) << name;
  }
  std::set<std::string_view> names;
  for (const ToggleSpec& s : Toggles()) EXPECT_TRUE(names.insert(s.name).second) << "duplicate " << s.name;
}

TEST(Toggles, SetValidatesDomain) {
  Config c = Config::Defaults();
  EXPECT_TRUE(c.Set("attention_backend", "paged64").ok());
  EXPECT_EQ(c.Enum("attention_backend"), "paged64");
  EXPECT_EQ(c.Set("attention_backend", "flashinfer").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.Set("page_size", "0").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.Set("page_size", "12x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.Set("mem_fraction_static", "1.5").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(c.Set("mem_fraction_static", "0.95").ok());
  EXPECT_DOUBLE_EQ(c.Float("mem_fraction_static"), 0.95);
}

TEST(Toggles, UnknownNameSuggestsNearest) {
  Config c = Config::Defaults();
  absl::Status s = c.ApplySetFlag("page_sise=64");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("page_size"), std::string::npos) << s;
  EXPECT_EQ(c.ApplySetFlag("page_size").code(), absl::StatusCode::kInvalidArgument);
}

TEST(Toggles, TextRoundTripsAndReportsLine) {
  Config c = Config::Defaults();
  ASSERT_TRUE(c.ApplyText("# demo\nscale_format = \"ue8m0\"\npage_size = 64  # flashmla\n"
                          "mem_fraction_static = 0.95\n",
                          "demo.toml")
                  .ok());
  EXPECT_EQ(c.Enum("scale_format"), "ue8m0");
  EXPECT_EQ(c.Int("page_size"), 64);
  Config d = Config::Defaults();
  ASSERT_TRUE(d.ApplyText(c.ToText(), "roundtrip").ok());
  EXPECT_EQ(c, d);
  EXPECT_EQ(d.DiffNames(Config::Defaults()),
            (std::vector<std::string>{"scale_format", "page_size", "mem_fraction_static"}));
  absl::Status s = d.ApplyText("page_size = 8\nbogus line\n", "x.toml");
  EXPECT_NE(std::string(s.message()).find("x.toml:2"), std::string::npos) << s;
}

TEST(Toggles, ResolveGivesTypedView) {
  Config c = Config::Defaults();
  ASSERT_TRUE(c.ApplySetFlag("attention_backend=flashdecode").ok());
  ASSERT_TRUE(c.ApplySetFlag("kv_cache_dtype=fp8_e4m3").ok());
  ASSERT_TRUE(c.ApplySetFlag("tp_size=8").ok());
  EngineConfig e = ResolveConfig(c);
  EXPECT_EQ(e.attention_backend, AttentionBackend::kFlashDecode);
  EXPECT_EQ(e.kv_cache_dtype, KvCacheDType::kFp8E4m3);
  EXPECT_EQ(e.tp_size, 8);
}

}  // namespace
}  // namespace crashreplay::replay
