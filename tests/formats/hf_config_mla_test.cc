// config.json of the MLA families: deepseek_v3, deepseek_v32 and
// glm_moe_dsa, read as transformers 5's DeepseekV3Config, DeepseekV32Config
// and GlmMoeDsaConfig read them (defaults, aliases, the indexer's keys and
// GLM-5's per-layer indexer_types), and written back.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "crashreplay/formats/hf_config.h"
#include "safetensors_test_util.h"

namespace crashreplay {
namespace {

using testing::ElementsAre;
using testing::HasSubstr;

std::string ConfigPath(const std::string& name) { return testing_util::SourceDir() + "/tests/data/configs/" + name; }

absl::StatusOr<ModelConfig> Parse(const std::string& json) { return ParseHfConfig(json, "test.json"); }

TEST(HfConfigMlaTest, AbsentKeysTakeEachClassDefaults) {
  struct Want {
    const char* model_type;
    int64_t hidden, layers, heads, vocab, max_pos, q_lora, nope, v, n_group, topk_group;
    int64_t index_heads, index_topk;
    double eps;
  };
  for (const Want& w : {
           Want{"deepseek_v3", 7168, 61, 128, 129280, 4096, 1536, 128, 128, 8, 4, 0, 0, 1e-6},
           Want{"deepseek_v32", 7168, 61, 128, 129280, 163840, 1536, 128, 128, 8, 4, 64, 2048, 1e-6},
           Want{"glm_moe_dsa", 6144, 78, 64, 154880, 202752, 2048, 192, 256, 1, 1, 32, 2048, 1e-5},
       }) {
    SCOPED_TRACE(w.model_type);
    auto c = Parse(std::string(R"({"model_type": ")") + w.model_type + "\"}");
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->hidden_size, w.hidden);
    EXPECT_EQ(c->num_hidden_layers, w.layers);
    EXPECT_EQ(c->num_attention_heads, w.heads);
    EXPECT_EQ(c->num_key_value_heads, w.heads);
    EXPECT_EQ(c->vocab_size, w.vocab);
    EXPECT_EQ(c->max_position_embeddings, w.max_pos);
    EXPECT_EQ(c->q_lora_rank, w.q_lora);
    EXPECT_EQ(c->kv_lora_rank, 512);
    EXPECT_EQ(c->qk_nope_head_dim, w.nope);
    EXPECT_EQ(c->qk_rope_head_dim, 64);
    EXPECT_EQ(c->v_head_dim, w.v);
    EXPECT_EQ(c->head_dim, w.nope + 64);
    EXPECT_EQ(c->n_group, w.n_group);
    EXPECT_EQ(c->topk_group, w.topk_group);
    EXPECT_EQ(c->num_experts, 256);
    EXPECT_EQ(c->first_k_dense_replace, 3);
    EXPECT_EQ(c->scoring_func, "sigmoid");
    EXPECT_DOUBLE_EQ(c->routed_scaling_factor, 2.5);
    EXPECT_EQ(c->index_n_heads, w.index_heads);
    EXPECT_EQ(c->index_head_dim, w.index_heads > 0 ? 128 : 0);
    EXPECT_EQ(c->index_topk, w.index_topk);
    EXPECT_DOUBLE_EQ(c->rms_norm_eps, w.eps);
    EXPECT_TRUE(c->rope_interleave);
    EXPECT_TRUE(c->indexer_types.empty() || c->IsIndexerLayer(77));
    EXPECT_FALSE(c->IsMoeLayer(2));
    EXPECT_TRUE(c->IsMoeLayer(3));
  }
}

TEST(HfConfigMlaTest, DeepseekV32SampleIsV3WithAnIndexer) {
  auto c = LoadHfConfig(ConfigPath("deepseek_v32.json"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->UsesDsa());
  EXPECT_EQ(c->index_n_heads, 64);
  EXPECT_EQ(c->index_topk, 2048);
  EXPECT_EQ(c->rope.type, RopeType::kYarn);
  EXPECT_DOUBLE_EQ(c->rope.factor, 40);
  EXPECT_EQ(c->quant.method, QuantMethod::kFp8Block);
  for (int l = 0; l < 61; ++l) EXPECT_TRUE(c->IsIndexerLayer(l)) << l;
}

TEST(HfConfigMlaTest, GlmMoeDsaNvfp4SampleLeavesAttentionAndSharedExpertsUnquantized) {
  auto c = LoadHfConfig(ConfigPath("glm_moe_dsa_nvfp4.json"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->quant.method, QuantMethod::kNvfp4);
  EXPECT_FALSE(c->quant.IsQuantized("model.layers.5.self_attn.indexer.wk"));
  EXPECT_FALSE(c->quant.IsQuantized("model.layers.5.self_attn.kv_b_proj"));
  EXPECT_FALSE(c->quant.IsQuantized("model.layers.5.mlp.shared_experts.down_proj"));
  EXPECT_FALSE(c->quant.IsQuantized("model.layers.1.mlp.down_proj"));
  EXPECT_TRUE(c->quant.IsQuantized("model.layers.5.mlp.experts.17.gate_proj"));
  EXPECT_TRUE(c->IsIndexerLayer(2));
  EXPECT_TRUE(c->IsIndexerLayer(6));
  EXPECT_FALSE(c->IsIndexerLayer(3));
  EXPECT_THAT(c->eos_token_id, ElementsAre(154820, 154827, 154829));
  EXPECT_DOUBLE_EQ(c->rope.theta, 1e6);
}

TEST(HfConfigMlaTest, GlmIndexerTypesFromPatternOrFrequency) {
  // GlmMoeDsaConfig.__post_init__: indexer_types, else index_topk_pattern,
  // else full where max(i - offset + 1, 0) % freq == 0 (offset 2, freq 1).
  auto pattern = Parse(R"({"model_type": "glm_moe_dsa", "num_hidden_layers": 4, "index_topk_pattern": "FSSF"})");
  ASSERT_TRUE(pattern.ok()) << pattern.status();
  EXPECT_THAT(pattern->indexer_types, ElementsAre("full", "shared", "shared", "full"));
  auto freq = Parse(R"({"model_type": "glm_moe_dsa", "num_hidden_layers": 6, "index_topk_freq": 2})");
  ASSERT_TRUE(freq.ok()) << freq.status();
  EXPECT_THAT(freq->indexer_types, ElementsAre("full", "full", "shared", "full", "shared", "full"));
  auto every = Parse(R"({"model_type": "glm_moe_dsa", "num_hidden_layers": 3})");
  ASSERT_TRUE(every.ok()) << every.status();
  EXPECT_THAT(every->indexer_types, ElementsAre("full", "full", "full"));
}

TEST(HfConfigMlaTest, MlpLayerTypesOverrideFirstKDense) {
  auto c = Parse(R"({"model_type": "deepseek_v32", "num_hidden_layers": 3, "first_k_dense_replace": 1,
      "mlp_layer_types": ["dense", "sparse", "dense"]})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->IsMoeLayer(0));
  EXPECT_TRUE(c->IsMoeLayer(1));
  EXPECT_FALSE(c->IsMoeLayer(2));
}

TEST(HfConfigMlaTest, AliasesAsEachClassDefinesThem) {
  // All three: num_local_experts -> n_routed_experts. DeepseekV3Config also
  // num_mtp_layers; the DSA classes also take num_experts.
  auto v3 = Parse(R"({"model_type": "deepseek_v3", "num_local_experts": 64, "num_mtp_layers": 2,
      "rope_interleave": false})");
  ASSERT_TRUE(v3.ok()) << v3.status();
  EXPECT_EQ(v3->num_experts, 64);
  EXPECT_EQ(v3->num_nextn_predict_layers, 2);
  EXPECT_FALSE(v3->rope_interleave);
  auto glm = Parse(R"({"model_type": "glm_moe_dsa", "num_experts": 32})");
  ASSERT_TRUE(glm.ok()) << glm.status();
  EXPECT_EQ(glm->num_experts, 32);
  EXPECT_EQ(glm->num_nextn_predict_layers, 0);
  auto v32 = Parse(R"({"model_type": "deepseek_v32", "num_local_experts": 16})");
  ASSERT_TRUE(v32.ok()) << v32.status();
  EXPECT_EQ(v32->num_experts, 16);
  auto clash = Parse(R"({"model_type": "deepseek_v32", "num_local_experts": 16, "num_experts": 8})");
  ASSERT_FALSE(clash.ok());
  EXPECT_THAT(std::string(clash.status().message()), HasSubstr("they name the same setting"));
}

TEST(HfConfigMlaTest, InconsistentIndexerKeysAreNamed) {
  const struct {
    const char* json;
    const char* key;
  } cases[] = {
      {R"({"model_type": "deepseek_v32", "q_lora_rank": null})", "q_lora_rank"},
      {R"({"model_type": "deepseek_v32", "index_topk": 0})", "index_topk"},
      {R"({"model_type": "glm_moe_dsa", "index_head_dim": 32})", "index_head_dim"},
      {R"({"model_type": "glm_moe_dsa", "num_hidden_layers": 2, "indexer_types": ["full"]})", "indexer_types"},
      {R"({"model_type": "glm_moe_dsa", "num_hidden_layers": 2, "indexer_types": ["shared", "full"]})",
       "indexer_types"},
      {R"({"model_type": "glm_moe_dsa", "num_hidden_layers": 2, "index_topk_pattern": "FX"})", "index_topk_pattern"},
      {R"({"model_type": "deepseek_v32", "num_hidden_layers": 2, "mlp_layer_types": ["dense", "moe"]})",
       "mlp_layer_types"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.json);
    auto r = Parse(c.json);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.key));
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("test.json"));
  }
}

TEST(HfConfigMlaTest, EveryMlaSampleRoundTripsWithItsOwnKeys) {
  for (const char* name : {"deepseek_v3.json", "deepseek_v32.json", "glm_moe_dsa_nvfp4.json"}) {
    SCOPED_TRACE(name);
    auto c = LoadHfConfig(ConfigPath(name));
    ASSERT_TRUE(c.ok()) << c.status();
    const std::string text = HfConfigToJson(*c);
    auto back = ParseHfConfig(text, c->source);
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << text;
    back->quant.source = c->quant.source;
    EXPECT_EQ(*back, *c) << text;
    EXPECT_THAT(text, testing::Not(HasSubstr("\"head_dim\"")));
  }
  const std::string glm = HfConfigToJson(*LoadHfConfig(ConfigPath("glm_moe_dsa_nvfp4.json")));
  EXPECT_THAT(glm, HasSubstr("\"indexer_types\""));
  EXPECT_THAT(glm, HasSubstr("\"index_n_heads\": 32"));
  EXPECT_THAT(glm, testing::Not(HasSubstr("rope_interleave")));
}

}  // namespace
}  // namespace crashreplay
