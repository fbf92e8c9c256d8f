// config.json parsing: one test per family on real-looking samples
// (tests/data/configs/), both rope forms, every quantization config, the
// error cases, and HfConfigToJson round trips.
#include "crashreplay/formats/hf_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "safetensors_test_util.h"

namespace crashreplay {
namespace {

using testing::ElementsAre;
using testing::HasSubstr;

std::string ConfigPath(const std::string& name) { return testing_util::SourceDir() + "/tests/data/configs/" + name; }

ModelConfig Load(const std::string& name) {
  auto c = LoadHfConfig(ConfigPath(name));
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : ModelConfig();
}

// A minimal valid llama config with `extra` merged over it (JSON text of an
// object's members, e.g. "\"hidden_size\": 7").
std::string Llama(const std::string& extra = "") {
  std::string base =
      R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100,
          "max_position_embeddings": 256)";
  return base + (extra.empty() ? "" : ", " + extra) + "}";
}

void ExpectInvalid(const absl::StatusOr<ModelConfig>& c, absl::StatusCode code, const std::string& detail) {
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), code) << c.status();
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("test.json"));
  EXPECT_THAT(std::string(c.status().message()), HasSubstr(detail));
}

TEST(HfConfigTest, Llama3ReadsLegacyRopeScaling) {
  const ModelConfig c = Load("llama3_8b.json");
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_THAT(c.architectures, ElementsAre("LlamaForCausalLM"));
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 14336);
  EXPECT_EQ(c.num_hidden_layers, 32);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);  // derived: 4096 / 32
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_THAT(c.bos_token_id, ElementsAre(128000));
  EXPECT_THAT(c.eos_token_id, ElementsAre(128001, 128008, 128009));
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  EXPECT_FALSE(c.qk_norm);
  EXPECT_FALSE(c.IsMoe());
  EXPECT_FALSE(c.IsMoeLayer(0));
  EXPECT_EQ(c.rope.form, RopeForm::kLegacy);
  EXPECT_EQ(c.rope.type, RopeType::kLlama3);
  EXPECT_FALSE(c.rope.legacy_type_key);
  EXPECT_DOUBLE_EQ(c.rope.theta, 500000.0);
  EXPECT_DOUBLE_EQ(c.rope.factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rope.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 8192);
  EXPECT_EQ(c.quant.method, QuantMethod::kNone);
  EXPECT_FALSE(c.quant.IsQuantized("model.layers.0.mlp.down_proj"));
}

TEST(HfConfigTest, RopeParametersFormEqualsLegacyForm) {
  const ModelConfig legacy = Load("llama3_8b.json");
  const ModelConfig v5 = Load("llama3_8b_rope_parameters.json");
  EXPECT_EQ(v5.rope.form, RopeForm::kRopeParameters);
  EXPECT_EQ(v5.torch_dtype, "bfloat16");  // from "dtype"
  RopeConfig a = legacy.rope;
  RopeConfig b = v5.rope;
  b.form = RopeForm::kLegacy;
  b.scaling_object = true;
  EXPECT_EQ(a, b);
  EXPECT_FALSE(v5.rope_legacy.has_value());
  EXPECT_FALSE(legacy.rope_parameters.has_value());
}

TEST(HfConfigTest, MistralExplicitHeadDimAndNullSlidingWindow) {
  const ModelConfig c = Load("mistral_7b.json");
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.rope.type, RopeType::kDefault);
  EXPECT_THAT(c.eos_token_id, ElementsAre(2));
}

TEST(HfConfigTest, Qwen2HasQkvBiasAndIgnoresDisabledSlidingWindow) {
  const ModelConfig c = Load("qwen2_7b.json");
  EXPECT_TRUE(c.attention_bias);
  EXPECT_FALSE(c.attention_out_bias);
  EXPECT_EQ(c.sliding_window, 0);  // use_sliding_window is false
  EXPECT_EQ(c.head_dim, 128);      // 3584 / 28
  EXPECT_EQ(c.num_key_value_heads, 4);
}

TEST(HfConfigTest, Qwen3HasQkNormAndNoBias) {
  const ModelConfig c = Load("qwen3_8b.json");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);  // an integer in the file
}

TEST(HfConfigTest, Qwen3HeadDimDefaultsTo128LikeTransformers) {
  auto c = ParseHfConfig(
      R"({"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
          "vocab_size": 100, "max_position_embeddings": 256})",
      "test.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 128);
}

TEST(HfConfigTest, MixtralEveryLayerIsMoeWithFullWidthExperts) {
  const ModelConfig c = Load("mixtral_8x7b.json");
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ(c.moe_intermediate_size, 14336);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.scoring_func, "softmax");
  for (int layer = 0; layer < 32; ++layer) EXPECT_TRUE(c.IsMoeLayer(layer)) << layer;
  EXPECT_FALSE(c.IsMoeLayer(32));
  EXPECT_FALSE(c.IsMoeLayer(-1));
}

TEST(HfConfigTest, Qwen3MoeExperts) {
  const ModelConfig c = Load("qwen3_moe_30b_a3b.json");
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.moe_intermediate_size, 768);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_TRUE(c.IsMoeLayer(0));
  EXPECT_TRUE(c.IsMoeLayer(47));
}

TEST(HfConfigTest, Qwen3MoeSparseStepAndMlpOnlyLayers) {
  const ModelConfig c = Load("qwen3_moe_mxfp4.json");
  // decoder_sparse_step 2: layers 1, 3, 5, 7 are MoE, except mlp_only [0, 5].
  std::vector<int> moe;
  for (int layer = 0; layer < 8; ++layer) {
    if (c.IsMoeLayer(layer)) moe.push_back(layer);
  }
  EXPECT_THAT(moe, ElementsAre(1, 3, 7));
}

TEST(HfConfigTest, Qwen2MoeSharedExpert) {
  const ModelConfig c = Load("qwen2_moe.json");
  EXPECT_EQ(c.num_experts, 60);
  EXPECT_EQ(c.shared_expert_intermediate_size, 5632);
  EXPECT_EQ(c.n_shared_experts, 0);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_TRUE(c.attention_bias);
}

TEST(HfConfigTest, DeepseekV3MlaMoeYarnAndFp8) {
  const ModelConfig c = Load("deepseek_v3.json");
  EXPECT_TRUE(c.UsesMla());
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.qk_nope_head_dim, 128);
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_EQ(c.v_head_dim, 128);
  EXPECT_EQ(c.head_dim, 192);
  EXPECT_EQ(c.num_experts, 256);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_EQ(c.scoring_func, "sigmoid");
  EXPECT_EQ(c.topk_method, "noaux_tc");
  EXPECT_EQ(c.n_group, 8);
  EXPECT_EQ(c.topk_group, 4);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  EXPECT_FALSE(c.IsMoeLayer(2));
  EXPECT_TRUE(c.IsMoeLayer(3));
  EXPECT_TRUE(c.IsMoeLayer(60));
  EXPECT_EQ(c.rope.type, RopeType::kYarn);
  EXPECT_TRUE(c.rope.legacy_type_key);
  EXPECT_DOUBLE_EQ(c.rope.factor, 40);
  EXPECT_DOUBLE_EQ(c.rope.beta_fast, 32);
  EXPECT_DOUBLE_EQ(c.rope.mscale_all_dim, 1.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 4096);
  EXPECT_EQ(c.quant.method, QuantMethod::kFp8Block);
  EXPECT_THAT(c.quant.weight_block_size, ElementsAre(128, 128));
  EXPECT_EQ(c.quant.fmt, "e4m3");
  EXPECT_EQ(c.quant.activation_scheme, "dynamic");
  EXPECT_EQ(c.quant.source, ConfigPath("deepseek_v3.json"));
  EXPECT_TRUE(c.quant.IsQuantized("model.layers.3.mlp.experts.0.down_proj"));
}

TEST(HfConfigTest, Glm4MoeDeepseekRoutingWithGqaAndPartialRope) {
  const ModelConfig c = Load("glm4_moe.json");
  EXPECT_FALSE(c.UsesMla());
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_FALSE(c.attention_out_bias);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_DOUBLE_EQ(c.rope.partial_rotary_factor, 0.5);
  EXPECT_EQ(c.num_experts, 160);
  EXPECT_EQ(c.scoring_func, "sigmoid");
  EXPECT_EQ(c.topk_method, "noaux_tc");
  EXPECT_EQ(c.n_group, 1);
  EXPECT_FALSE(c.IsMoeLayer(2));
  EXPECT_TRUE(c.IsMoeLayer(3));
  EXPECT_THAT(c.eos_token_id, ElementsAre(151329, 151336, 151338));
  EXPECT_TRUE(c.bos_token_id.empty());
}

TEST(HfConfigTest, Fp8BlockWithModulesToNotConvert) {
  const ModelConfig c = Load("qwen3_8b_fp8.json");
  EXPECT_EQ(c.quant.method, QuantMethod::kFp8Block);
  EXPECT_TRUE(c.quant.IsQuantized("model.layers.1.mlp.down_proj"));
  EXPECT_FALSE(c.quant.IsQuantized("lm_head"));
  EXPECT_FALSE(c.quant.IsQuantized("model.embed_tokens"));
  EXPECT_FALSE(c.quant.IsQuantized("model.layers.0.mlp.down_proj"));  // inside a listed module
  EXPECT_TRUE(c.quant.IsQuantized("model.layers.0.self_attn.q_proj"));
  EXPECT_TRUE(c.quant.IsQuantized("model.layers.10.mlp.down_proj"));  // not "layers.1"
  EXPECT_EQ(c.rope.type, RopeType::kYarn);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 32768);
}

TEST(HfConfigTest, ModelOptNvfp4InConfigJson) {
  const ModelConfig c = Load("nvfp4_modelopt/config.json");
  EXPECT_EQ(c.quant.method, QuantMethod::kNvfp4);
  EXPECT_EQ(c.quant.quant_algo, "NVFP4");
  EXPECT_EQ(c.quant.group_size, 16);
  EXPECT_EQ(c.quant.kv_cache_quant_algo, "FP8");
  EXPECT_EQ(c.quant.producer, "modelopt 0.29.0");
  EXPECT_FALSE(c.quant.IsQuantized("lm_head"));
  EXPECT_FALSE(c.quant.IsQuantized("model.layers.0.self_attn.o_proj"));  // glob on a prefix
  EXPECT_TRUE(c.quant.IsQuantized("model.layers.1.self_attn.o_proj"));
  EXPECT_TRUE(c.quant.IsQuantized("model.layers.0.mlp.up_proj"));
}

TEST(HfConfigTest, ModelOptNvfp4FromHfQuantConfigBesideIt) {
  const ModelConfig c = Load("nvfp4_side_file/config.json");
  EXPECT_EQ(c.quant.method, QuantMethod::kNvfp4);
  EXPECT_EQ(c.quant.source, ConfigPath("nvfp4_side_file/hf_quant_config.json"));
  EXPECT_EQ(c.quant.producer, "modelopt 0.27.1");
  EXPECT_TRUE(c.quant.kv_cache_quant_algo.empty());
  EXPECT_FALSE(c.quant.IsQuantized("model.layers.7.mlp.gate"));
  EXPECT_TRUE(c.quant.IsQuantized("model.layers.7.mlp.gate_proj"));
}

TEST(HfConfigTest, Mxfp4) {
  const ModelConfig c = Load("qwen3_moe_mxfp4.json");
  EXPECT_EQ(c.quant.method, QuantMethod::kMxfp4);
  EXPECT_EQ(c.quant.group_size, 32);
  EXPECT_TRUE(c.quant.IsQuantized("model.layers.1.mlp.experts.3.down_proj"));
  EXPECT_FALSE(c.quant.IsQuantized("model.layers.1.mlp.gate"));
  EXPECT_FALSE(c.quant.IsQuantized("model.layers.1.self_attn.q_proj"));
}

TEST(HfConfigTest, EverySampleRoundTripsThroughHfConfigToJson) {
  for (const char* name :
       {"llama3_8b.json", "llama3_8b_rope_parameters.json", "mistral_7b.json", "qwen2_7b.json", "qwen3_8b.json",
        "qwen3_8b_fp8.json", "mixtral_8x7b.json", "qwen3_moe_30b_a3b.json", "qwen3_moe_mxfp4.json", "qwen2_moe.json",
        "deepseek_v3.json", "glm4_moe.json", "nvfp4_modelopt/config.json", "nvfp4_side_file/config.json"}) {
    SCOPED_TRACE(name);
    ModelConfig original = Load(name);
    const std::string json = HfConfigToJson(original);
    auto again = ParseHfConfig(json, "written.json");
    ASSERT_TRUE(again.ok()) << again.status() << "\n" << json;
    again->source = original.source;
    again->quant.source = original.quant.source;
    EXPECT_TRUE(*again == original) << json;
  }
}

TEST(HfConfigTest, WrittenConfigUsesTheFamilysKeyNames) {
  const std::string ds = HfConfigToJson(Load("deepseek_v3.json"));
  EXPECT_THAT(ds, HasSubstr("\"n_routed_experts\": 256"));
  EXPECT_THAT(ds, HasSubstr("\"type\": \"yarn\""));
  EXPECT_THAT(ds, testing::Not(HasSubstr("\"head_dim\"")));
  const std::string mixtral = HfConfigToJson(Load("mixtral_8x7b.json"));
  EXPECT_THAT(mixtral, HasSubstr("\"num_local_experts\": 8"));
  const std::string v5 = HfConfigToJson(Load("llama3_8b_rope_parameters.json"));
  EXPECT_THAT(v5, HasSubstr("\"rope_parameters\""));
  EXPECT_THAT(v5, testing::Not(HasSubstr("\"rope_scaling\"")));
}

TEST(HfConfigTest, RopeTypeKeyVariantsAndRopeParameterTheta) {
  auto a = ParseHfConfig(Llama(R"("rope_scaling": {"type": "linear", "factor": 2.0})"), "test.json");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->rope.type, RopeType::kLinear);
  EXPECT_TRUE(a->rope.legacy_type_key);
  auto b = ParseHfConfig(Llama(R"("rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e6})"),
                         "test.json");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->rope.type, RopeType::kDynamic);
  EXPECT_DOUBLE_EQ(b->rope.theta, 1e6);
  auto c = ParseHfConfig(Llama(R"("rope_parameters": {"rope_type": "longrope",
      "short_factor": [1.0, 1.5], "long_factor": [2.0, 3.0], "original_max_position_embeddings": 4096})"),
                         "test.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope.type, RopeType::kLongRope);
  EXPECT_THAT(c->rope.long_factor, ElementsAre(2.0, 3.0));
}

// --- transformers' defaults and aliases (values from transformers 5.24's
// models/<type>/configuration_<type>.py; 4.57 where it differs is noted) ---

TEST(HfConfigDefaultsTest, AbsentKeysTakeTheConfigClassDefaults) {
  struct Want {
    const char* model_type;
    int64_t hidden, heads, kv_heads, head_dim, vocab, max_pos;
    double eps, theta, partial;
  };
  for (const Want& w : {
           Want{"llama", 4096, 32, 32, 128, 32000, 2048, 1e-6, 1e4, 1.0},
           Want{"mistral", 4096, 32, 8, 128, 32000, 131072, 1e-6, 1e4, 1.0},
           Want{"qwen2", 4096, 32, 32, 128, 151936, 32768, 1e-6, 1e4, 1.0},
           Want{"qwen3", 4096, 32, 32, 128, 151936, 32768, 1e-6, 1e4, 1.0},
           // Qwen3MoeConfig has no head_dim field: hidden / heads = 2048 / 32.
           Want{"qwen3_moe", 2048, 32, 4, 64, 151936, 32768, 1e-6, 1e4, 1.0},
           Want{"mixtral", 4096, 32, 8, 128, 32000, 131072, 1e-5, 1e6, 1.0},
           // Glm4MoeConfig has no head_dim field either: 4096 / 96 is not whole,
           // so a file must say it (GLM-4.5's does); partial rotary 0.5.
       }) {
    SCOPED_TRACE(w.model_type);
    auto c = ParseHfConfig(std::string(R"({"model_type": ")") + w.model_type + "\"}", "test.json");
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->hidden_size, w.hidden);
    EXPECT_EQ(c->num_attention_heads, w.heads);
    EXPECT_EQ(c->num_key_value_heads, w.kv_heads);
    EXPECT_EQ(c->head_dim, w.head_dim);
    EXPECT_EQ(c->vocab_size, w.vocab);
    EXPECT_EQ(c->max_position_embeddings, w.max_pos);
    EXPECT_DOUBLE_EQ(c->rms_norm_eps, w.eps);
    EXPECT_DOUBLE_EQ(c->rope.theta, w.theta);
    EXPECT_DOUBLE_EQ(c->rope.partial_rotary_factor, w.partial);
    EXPECT_EQ(c->rope.form, RopeForm::kNone);
  }
  auto glm = ParseHfConfig(R"({"model_type": "glm4_moe"})", "test.json");
  ASSERT_FALSE(glm.ok());
  EXPECT_THAT(std::string(glm.status().message()), HasSubstr("set head_dim explicitly"));
}

TEST(HfConfigDefaultsTest, Glm4MoeHeadDimIsHiddenOverHeadsWithoutTheKey) {
  // transformers 5's Glm4MoeAttention: getattr(config, "head_dim", hidden // heads).
  auto c = ParseHfConfig(R"({"model_type": "glm4_moe", "hidden_size": 64, "num_attention_heads": 4,
      "num_key_value_heads": 2, "n_routed_experts": 4, "num_experts_per_tok": 2})",
                         "test.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_DOUBLE_EQ(c->rope.partial_rotary_factor, 0.5);
  EXPECT_EQ(c->n_shared_experts, 1);
  EXPECT_EQ(c->first_k_dense_replace, 1);
  EXPECT_EQ(c->num_nextn_predict_layers, 1);
}

TEST(HfConfigDefaultsTest, NullMeansDeriveAbsentMeansClassDefault) {
  auto absent = ParseHfConfig(R"({"model_type": "mistral", "num_attention_heads": 16})", "test.json");
  auto null = ParseHfConfig(R"({"model_type": "mistral", "num_attention_heads": 16,
      "num_key_value_heads": null, "sliding_window": null})",
                            "test.json");
  ASSERT_TRUE(absent.ok() && null.ok());
  EXPECT_EQ(absent->num_key_value_heads, 8);  // MistralConfig's default
  EXPECT_EQ(null->num_key_value_heads, 16);   // __post_init__: None -> heads
  EXPECT_EQ(absent->sliding_window, 4096);
  EXPECT_EQ(null->sliding_window, 0);
}

TEST(HfConfigAliasTest, Qwen3MoeReadsBothExpertSpellings) {
  // transformers 5 writes num_local_experts (attribute_map num_experts ->
  // num_local_experts); 4.x wrote num_experts.
  auto v5 =
      ParseHfConfig(R"({"model_type": "qwen3_moe", "num_local_experts": 8, "num_experts_per_tok": 2})", "test.json");
  auto v4 = ParseHfConfig(R"({"model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2})", "test.json");
  auto both = ParseHfConfig(
      R"({"model_type": "qwen3_moe", "num_experts": 8, "num_local_experts": 8, "num_experts_per_tok": 2})",
      "test.json");
  ASSERT_TRUE(v5.ok()) << v5.status();
  ASSERT_TRUE(v4.ok() && both.ok());
  EXPECT_EQ(v5->num_experts, 8);
  EXPECT_EQ(v4->num_experts, 8);
  EXPECT_EQ(both->num_experts, 8);
  EXPECT_THAT(HfConfigToJson(*v4), HasSubstr("\"num_local_experts\": 8"));
}

TEST(HfConfigAliasTest, MixtralGlmAndDeepseekAliases) {
  auto mixtral = ParseHfConfig(R"({"model_type": "mixtral", "num_experts": 4})", "test.json");
  ASSERT_TRUE(mixtral.ok()) << mixtral.status();
  EXPECT_EQ(mixtral->num_experts, 4);
  auto glm = ParseHfConfig(R"({"model_type": "glm4_moe", "head_dim": 128, "num_local_experts": 16,
      "num_mtp_layers": 2})",
                           "test.json");
  ASSERT_TRUE(glm.ok()) << glm.status();
  EXPECT_EQ(glm->num_experts, 16);
  EXPECT_EQ(glm->num_nextn_predict_layers, 2);
  auto ds =
      ParseHfConfig(R"({"model_type": "deepseek_v3", "num_local_experts": 64, "q_lora_rank": null})", "test.json");
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->num_experts, 64);
  EXPECT_EQ(ds->q_lora_rank, 0);   // null: no q compression
  EXPECT_EQ(ds->kv_lora_rank, 512);  // DeepseekV3Config's default
  auto ds_default = ParseHfConfig(R"({"model_type": "deepseek_v3"})", "test.json");
  ASSERT_TRUE(ds_default.ok()) << ds_default.status();
  EXPECT_EQ(ds_default->q_lora_rank, 1536);
}

// --- RoPE resolution as transformers 5 does it ---

TEST(HfConfigRopeTest, RopeScalingObjectWinsOverRopeParameters) {
  auto c = ParseHfConfig(Llama(R"("rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0,
      "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
      "rope_scaling": {"rope_type": "linear", "factor": 2.0}, "rope_theta": 20000.0)"),
                         "test.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope.type, RopeType::kLinear);
  EXPECT_EQ(c->rope.form, RopeForm::kLegacy);
  EXPECT_DOUBLE_EQ(c->rope.theta, 20000.0);
  ASSERT_TRUE(c->rope_parameters.has_value());
  EXPECT_EQ(c->rope_parameters->type, RopeType::kLlama3);
  EXPECT_EQ(c->rope_parameters->original_max_position_embeddings, 256);  // max_position_embeddings
}

TEST(HfConfigRopeTest, BareRopeThetaLosesToRopeParametersButFillsItsTheta) {
  auto c = ParseHfConfig(Llama(R"("rope_parameters": {"rope_type": "linear", "factor": 2.0},
      "rope_theta": 30000.0)"),
                         "test.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope.form, RopeForm::kRopeParameters);
  EXPECT_EQ(c->rope.type, RopeType::kLinear);
  EXPECT_DOUBLE_EQ(c->rope.theta, 30000.0);  // the dict has none: the top-level one
  ASSERT_TRUE(c->rope_legacy.has_value());
  EXPECT_EQ(c->rope_legacy->type, RopeType::kDefault);
}

TEST(HfConfigRopeTest, OriginalMaxPositionAndYarnFactorDefaults) {
  auto top = ParseHfConfig(Llama(R"("original_max_position_embeddings": 64, "rope_scaling": {
      "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 128})"),
                           "test.json");
  ASSERT_TRUE(top.ok()) << top.status();
  EXPECT_EQ(top->rope.original_max_position_embeddings, 64);  // the top-level key wins (Phi-3)
  auto yarn = ParseHfConfig(Llama(R"("rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6,
      "original_max_position_embeddings": 64, "truncate": false})"),
                            "test.json");
  ASSERT_TRUE(yarn.ok()) << yarn.status();
  EXPECT_DOUBLE_EQ(yarn->rope.factor, 4.0);  // max_position_embeddings 256 / 64
  EXPECT_FALSE(yarn->rope.truncate);
}

TEST(HfConfigQuantTest, ModelOptFp8AndWeightOnlyFormats) {
  auto fp8 = ParseHfConfig(Llama(R"("quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8",
      "ignore": ["lm_head"]})"),
                           "test.json");
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  EXPECT_EQ(fp8->quant.method, QuantMethod::kFp8Tensor);
  EXPECT_FALSE(fp8->quant.WeightOnly());
  auto w4a16 = ParseHfQuantConfig(R"({"quantization": {"quant_algo": "W4A16_NVFP4", "group_size": 16}})", "test.json");
  ASSERT_TRUE(w4a16.ok()) << w4a16.status();
  EXPECT_EQ(w4a16->method, QuantMethod::kNvfp4);
  EXPECT_TRUE(w4a16->WeightOnly());
  auto pb = ParseHfQuantConfig(R"({"quantization": {"quant_algo": "fp8_pb_wo"}})", "test.json");
  ASSERT_TRUE(pb.ok()) << pb.status();
  EXPECT_EQ(pb->method, QuantMethod::kFp8Block);
  EXPECT_THAT(pb->weight_block_size, ElementsAre(128, 128));
  EXPECT_TRUE(pb->WeightOnly());
}

TEST(HfConfigErrorTest, UnsupportedInputsCarryTheUnsupportedMarker) {
  for (const std::string& json :
       {std::string(R"({"model_type": "gpt_bigcode"})"), Llama(R"("rope_scaling": {"rope_type": "mrope"})"),
        Llama(R"("quantization_config": {"quant_method": "awq"})")}) {
    auto c = ParseHfConfig(json, "test.json");
    ASSERT_FALSE(c.ok()) << json;
    EXPECT_TRUE(IsUnsupportedModel(c.status())) << c.status();
  }
  auto bad = ParseHfConfig(Llama(R"("num_key_value_heads": 3)"), "test.json");
  EXPECT_FALSE(IsUnsupportedModel(bad.status()));
}

// --- errors ---

TEST(HfConfigErrorTest, UnknownModelTypeIsUnimplementedAndNamed) {
  ExpectInvalid(ParseHfConfig(R"({"model_type": "gpt_bigcode"})", "test.json"), absl::StatusCode::kUnimplemented,
                "model_type 'gpt_bigcode' is not supported");
}

TEST(HfConfigErrorTest, OnlyModelTypeIsRequired) {
  ExpectInvalid(ParseHfConfig(R"({"hidden_size": 64})", "test.json"), absl::StatusCode::kInvalidArgument,
                "field 'model_type' is required");
}

TEST(HfConfigErrorTest, WrongJsonTypesAreClearErrors) {
  ExpectInvalid(ParseHfConfig(Llama(R"("num_key_value_heads": "4")"), "test.json"), absl::StatusCode::kInvalidArgument,
                "field 'num_key_value_heads' is a JSON string (\"4\"), expected an integer");
  ExpectInvalid(ParseHfConfig(Llama(R"("num_key_value_heads": 2.5)"), "test.json"), absl::StatusCode::kInvalidArgument,
                "expected an integer");
  ExpectInvalid(ParseHfConfig(Llama(R"("tie_word_embeddings": 1)"), "test.json"), absl::StatusCode::kInvalidArgument,
                "expected true or false");
  ExpectInvalid(ParseHfConfig(Llama(R"("eos_token_id": [1, "x"])"), "test.json"), absl::StatusCode::kInvalidArgument,
                "field 'eos_token_id'");
  ExpectInvalid(ParseHfConfig(Llama(R"("rope_scaling": [1])"), "test.json"), absl::StatusCode::kInvalidArgument,
                "field 'rope_scaling' must be an object");
  ExpectInvalid(ParseHfConfig(Llama(R"("rope_scaling": {"rope_type": "yarn", "factor": "4"})"), "test.json"),
                absl::StatusCode::kInvalidArgument, "field 'rope_scaling.factor'");
  ExpectInvalid(ParseHfConfig("[1, 2]", "test.json"), absl::StatusCode::kInvalidArgument, "expected a JSON object");
}

TEST(HfConfigErrorTest, MalformedAndDuplicateKeyJson) {
  ExpectInvalid(ParseHfConfig(R"({"model_type": "llama",)", "test.json"), absl::StatusCode::kInvalidArgument,
                "malformed JSON");
  ExpectInvalid(ParseHfConfig(Llama(R"("hidden_size": 128)"), "test.json"), absl::StatusCode::kInvalidArgument,
                "'hidden_size' appears twice");
}

TEST(HfConfigErrorTest, InconsistentShapes) {
  ExpectInvalid(ParseHfConfig(Llama(R"("num_key_value_heads": 3)"), "test.json"), absl::StatusCode::kInvalidArgument,
                "must divide num_attention_heads (4)");
  std::string zero_layers = Llama();
  zero_layers.replace(zero_layers.find("\"num_hidden_layers\": 2"), 22, "\"num_hidden_layers\": 0");
  ExpectInvalid(ParseHfConfig(zero_layers, "test.json"), absl::StatusCode::kInvalidArgument,
                "'num_hidden_layers' must be positive");
  ExpectInvalid(ParseHfConfig(R"({"model_type": "llama", "hidden_size": 66, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100,
          "max_position_embeddings": 256})",
                              "test.json"),
                absl::StatusCode::kInvalidArgument, "set head_dim explicitly");
  ExpectInvalid(ParseHfConfig(Llama(R"("partial_rotary_factor": 0.3)"), "test.json"),
                absl::StatusCode::kInvalidArgument, "even whole number of rotary dimensions");
}

TEST(HfConfigErrorTest, MoeConsistency) {
  const std::string mixtral =
      R"({"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100,
          "max_position_embeddings": 256, "num_key_value_heads": 4, "num_local_experts": 4,
          "num_experts_per_tok": 5})";
  ExpectInvalid(ParseHfConfig(mixtral, "test.json"), absl::StatusCode::kInvalidArgument,
                "field 'num_experts_per_tok' (5) must be in [1, num_local_experts = 4]");
  auto ds = testing_util::ReadBytes(ConfigPath("deepseek_v3.json"));
  const std::string bad_group = std::string(ds).replace(ds.find("\"n_group\": 8"), 12, "\"n_group\": 7");
  ExpectInvalid(ParseHfConfig(bad_group, "test.json"), absl::StatusCode::kInvalidArgument,
                "field 'n_group' (7) must divide the 256 experts");
  const std::string bad_scoring = std::string(ds).replace(ds.find("\"sigmoid\""), 9, "\"relu\"");
  ExpectInvalid(ParseHfConfig(bad_scoring, "test.json"), absl::StatusCode::kUnimplemented, "scoring_func 'relu'");
  ExpectInvalid(ParseHfConfig(R"({"model_type": "qwen3_moe", "num_experts": 4, "num_local_experts": 8})", "test.json"),
                absl::StatusCode::kInvalidArgument, "field 'num_local_experts' (8) disagrees with 'num_experts' (4)");
}

TEST(HfConfigErrorTest, RopeErrors) {
  ExpectInvalid(ParseHfConfig(Llama(R"("rope_scaling": {"rope_type": "mrope", "factor": 2})"), "test.json"),
                absl::StatusCode::kUnimplemented, "rope type 'mrope'");
  ExpectInvalid(ParseHfConfig(Llama(R"("rope_scaling": {"factor": 2.0})"), "test.json"),
                absl::StatusCode::kInvalidArgument, "'rope_scaling.rope_type' is required");
  ExpectInvalid(ParseHfConfig(Llama(R"("rope_scaling": {"rope_type": "linear"})"), "test.json"),
                absl::StatusCode::kInvalidArgument, "'rope_scaling.factor' is required");
  ExpectInvalid(ParseHfConfig(Llama(R"("rope_theta": -1)"), "test.json"), absl::StatusCode::kInvalidArgument,
                "'rope_theta' must be positive");
  ExpectInvalid(ParseHfConfig(Llama(R"("rope_parameters": {"rope_type": "default", "rope_theta": 0})"), "test.json"),
                absl::StatusCode::kInvalidArgument, "'rope_parameters.rope_theta' must be positive");
  ExpectInvalid(ParseHfConfig(Llama(R"("rope_parameters": {"full_attention": {"rope_type": "default"},
                     "sliding_attention": {"rope_type": "default"}})"),
                              "test.json"),
                absl::StatusCode::kUnimplemented, "per layer type");
}

TEST(HfConfigErrorTest, QuantizationErrors) {
  ExpectInvalid(ParseHfConfig(Llama(R"("quantization_config": {"quant_method": "awq", "bits": 4})"), "test.json"),
                absl::StatusCode::kUnimplemented, "quant_method 'awq' is not supported");
  ExpectInvalid(ParseHfConfig(Llama(R"("quantization_config": {"quant_method": "fp8"})"), "test.json"),
                absl::StatusCode::kUnimplemented, "fp8 quantization without weight_block_size");
  ExpectInvalid(ParseHfConfig(Llama(R"("quantization_config": {"quant_method": "fp8",
                     "weight_block_size": [128]})"),
                              "test.json"),
                absl::StatusCode::kInvalidArgument, "weight_block_size");
  ExpectInvalid(ParseHfConfig(Llama(R"("quantization_config": {"quant_method": "modelopt",
                     "quant_algo": "NVFP4", "group_size": 32})"),
                              "test.json"),
                absl::StatusCode::kInvalidArgument, "NVFP4 uses 16");
  ExpectInvalid(ParseHfConfig(Llama(R"("quantization_config": {"quant_method": "modelopt",
                     "quant_algo": "W4A8_AWQ"})"),
                              "test.json"),
                absl::StatusCode::kUnimplemented, "quant_algo 'W4A8_AWQ'");
  ExpectInvalid(ParseHfConfig(Llama(R"("quantization_config": {"quant_method": "mxfp4",
                     "modules_to_not_convert": "lm_head"})"),
                              "test.json"),
                absl::StatusCode::kInvalidArgument, "'quantization_config.modules_to_not_convert' is a JSON string");
  auto side = ParseHfQuantConfig(R"({"producer": {"name": "modelopt"}})", "test.json");
  ASSERT_FALSE(side.ok());
  EXPECT_THAT(std::string(side.status().message()), HasSubstr("'quantization' is required"));
}

TEST(HfConfigErrorTest, MissingFileIsNotFound) {
  auto c = LoadHfConfig(ConfigPath("no_such_config.json"));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("no_such_config.json"));
}

// gpt_oss: GptOssConfig's defaults (transformers 5), including what its
// __post_init__ derives (layer_types, gpt-oss's YaRN).
TEST(HfConfigGptOssTest, DefaultsAreGptOssConfigs) {
  auto c = ParseHfConfig(R"({"model_type": "gpt_oss"})", "test.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hidden_size, 2880);
  EXPECT_EQ(c->num_attention_heads, 64);
  EXPECT_EQ(c->num_key_value_heads, 8);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->vocab_size, 201088);
  EXPECT_EQ(c->num_experts, 128);
  EXPECT_EQ(c->num_experts_per_tok, 4);
  EXPECT_EQ(c->moe_intermediate_size, 2880);
  EXPECT_EQ(c->sliding_window, 128);
  EXPECT_TRUE(c->attention_bias);
  EXPECT_TRUE(c->attention_out_bias);
  EXPECT_TRUE(c->attention_sinks);
  EXPECT_TRUE(c->moe_bias);
  EXPECT_TRUE(c->softmax_after_topk);
  EXPECT_DOUBLE_EQ(c->swiglu_alpha, 1.702);
  EXPECT_DOUBLE_EQ(c->swiglu_limit, 7.0);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-5);
  ASSERT_EQ(c->layer_types.size(), 36u);
  EXPECT_EQ(c->layer_types[0], "sliding_attention");
  EXPECT_EQ(c->layer_types[1], "full_attention");
  EXPECT_EQ(c->LayerWindow(0), 128);
  EXPECT_EQ(c->LayerWindow(1), 0);
  EXPECT_EQ(c->rope.type, RopeType::kYarn);
  EXPECT_DOUBLE_EQ(c->rope.theta, 150000.0);
  EXPECT_DOUBLE_EQ(c->rope.factor, 32.0);
  EXPECT_FALSE(c->rope.truncate);
  EXPECT_EQ(c->rope.original_max_position_embeddings, 4096);
  for (int l = 0; l < 36; ++l) EXPECT_TRUE(c->IsMoeLayer(l));
}

// The keys of the released gpt-oss-20b config.json (transformers 4.55's
// form: rope_theta + rope_scaling, OpenAI's mxfp4 quantization_config),
// at those values.
TEST(HfConfigGptOssTest, ReleasedFormReads) {
  std::string types;
  for (int i = 0; i < 24; ++i)
    types += std::string(i ? ", " : "") + (i % 2 ? "\"full_attention\"" : "\"sliding_attention\"");
  auto c = ParseHfConfig(R"({"model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"], "hidden_size": 2880,
      "intermediate_size": 2880, "num_hidden_layers": 24, "num_attention_heads": 64, "num_key_value_heads": 8,
      "head_dim": 64, "num_local_experts": 32, "num_experts_per_tok": 4, "sliding_window": 128,
      "attention_bias": true, "swiglu_limit": 7.0, "rope_theta": 150000,
      "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": false,
                       "original_max_position_embeddings": 4096},
      "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn",
          "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]},
      "layer_types": [)" + types +
                             "]}",
                         "test.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_experts, 32);
  EXPECT_EQ(c->layer_types.size(), 24u);
  EXPECT_EQ(c->rope.type, RopeType::kYarn);
  EXPECT_FALSE(c->rope.truncate);
  EXPECT_EQ(c->quant.method, QuantMethod::kMxfp4);
  EXPECT_FALSE(c->quant.IsQuantized("model.layers.3.mlp.router"));
  EXPECT_TRUE(c->quant.IsQuantized("model.layers.3.mlp.experts"));
}

TEST(HfConfigGptOssTest, BadLayerTypesAreRefusedNamingTheKey) {
  ExpectInvalid(ParseHfConfig(R"({"model_type": "gpt_oss", "num_hidden_layers": 2,
                                  "layer_types": ["sliding_attention", "chunked_attention"]})",
                              "test.json"),
                absl::StatusCode::kInvalidArgument, "layer_types");
  ExpectInvalid(ParseHfConfig(R"({"model_type": "gpt_oss", "num_hidden_layers": 3,
                                  "layer_types": ["sliding_attention", "full_attention"]})",
                              "test.json"),
                absl::StatusCode::kInvalidArgument, "has 2 entries for num_hidden_layers 3");
  ExpectInvalid(ParseHfConfig(R"({"model_type": "gpt_oss", "swiglu_limit": 0})", "test.json"),
                absl::StatusCode::kInvalidArgument, "swiglu_limit");
}

TEST(HfConfigGptOssTest, RoundTripsThroughHfConfigToJson) {
  auto c = ParseHfConfig(R"({"model_type": "gpt_oss", "hidden_size": 32, "num_hidden_layers": 3,
      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_local_experts": 4,
      "intermediate_size": 16, "sliding_window": 6, "swiglu_alpha": 1.5,
      "layer_types": ["full_attention", "sliding_attention", "sliding_attention"]})",
                         "test.json");
  ASSERT_TRUE(c.ok()) << c.status();
  auto back = ParseHfConfig(HfConfigToJson(*c), "test.json");
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << HfConfigToJson(*c);
  ModelConfig a = *c, b = *back;
  a.source = b.source = "";
  // The writer states the rope the file resolved to as rope_parameters-free
  // legacy keys only when it had them; compare what the engine reads.
  EXPECT_EQ(a.layer_types, b.layer_types);
  EXPECT_EQ(a.sliding_window, b.sliding_window);
  EXPECT_EQ(a.num_experts, b.num_experts);
  EXPECT_DOUBLE_EQ(a.swiglu_alpha, b.swiglu_alpha);
  EXPECT_DOUBLE_EQ(a.swiglu_limit, b.swiglu_limit);
  EXPECT_EQ(a.rope.type, b.rope.type);
  EXPECT_EQ(a.rope.truncate, b.rope.truncate);
  EXPECT_EQ(a.attention_bias, b.attention_bias);
}

}  // namespace
}  // namespace crashreplay
