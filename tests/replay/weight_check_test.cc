// Every tensor against what config.json implies (weight_check.h): a mismatch
// names the tensor, the shape found and the shape the config implies; tensors
// the config does not imply are dropped with a note or refused where they
// would hide a mismatch.
#include "crashreplay/replay/model/weight_check.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "crashreplay/replay/make_model/random_checkpoint.h"
#include "crashreplay/replay/model/checkpoint_io.h"

namespace crashreplay::replay {
namespace {

using ::testing::HasSubstr;

struct Fixture {
  ModelConfig config;
  ModelSpec spec;
  TensorSet tensors;
};

Fixture Make(const char* arch, const char* quant = "bf16") {
  MakeModelOptions o;
  o.arch = arch;
  o.quant = quant;
  auto ck = GenerateRandomCheckpoint(o);
  EXPECT_TRUE(ck.ok()) << ck.status();
  Fixture f;
  f.config = HfConfigFromModelSpec(ck->spec);
  auto spec = ModelSpecFromHfConfig(f.config);
  EXPECT_TRUE(spec.ok()) << spec.status();
  f.spec = *spec;
  f.tensors = std::move(ck->tensors);
  return f;
}

absl::Status Check(Fixture& f, std::vector<std::string>* notes = nullptr) {
  std::vector<std::string> ignored;
  return CheckWeights(f.config, f.spec, "ckpt", &f.tensors, notes ? notes : &ignored);
}

TEST(WeightCheck, EveryMakeModelCheckpointPasses) {
  for (const char* arch :
       {"llama", "qwen3", "qwen3_moe", "mixtral", "glm4_moe", "deepseek_v3", "deepseek_v32", "glm_moe_dsa"}) {
    for (const char* quant : {"bf16", "fp8", "nvfp4", "mxfp4"}) {
      SCOPED_TRACE(std::string(arch) + "/" + quant);
      Fixture f = Make(arch, quant);
      const size_t n = f.tensors.size();
      std::vector<std::string> notes;
      EXPECT_TRUE(Check(f, &notes).ok()) << Check(f);
      EXPECT_TRUE(notes.empty()) << notes[0];
      EXPECT_EQ(f.tensors.size(), n);
    }
  }
}

TEST(WeightCheck, HeadDimThatDisagreesWithTheWeightsNamesTensorAndShapes) {
  // The case: a config whose head_dim does not match the weights (a
  // glm4_moe config without head_dim read with the wrong default) must not run.
  Fixture f = Make("glm4_moe");  // hidden 64, 4 heads of 16
  f.spec.head_dim = 32;
  absl::Status s = Check(f);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("ckpt: tensor 'model.layers.0.self_attn.q_proj.weight' has shape [64, 64], config.json "
                        "(glm4_moe) implies [128, 64] (num_attention_heads 4 x head_dim 32 x hidden_size 64)"));
}

TEST(WeightCheck, ExpertsVocabAndIntermediateAreChecked) {
  Fixture a = Make("qwen3_moe");
  a.spec.moe_intermediate *= 2;
  EXPECT_THAT(std::string(Check(a).message()), HasSubstr("moe_intermediate_size"));
  Fixture b = Make("llama");
  b.spec.vocab += 1;
  EXPECT_THAT(std::string(Check(b).message()), HasSubstr("'model.embed_tokens.weight' has shape"));
  Fixture c = Make("mixtral");
  c.spec.num_experts += 1;
  c.spec.moe_layer_mask.assign(c.spec.layers, 1);
  absl::Status s = Check(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;  // the router's rows come first
  EXPECT_THAT(std::string(s.message()), HasSubstr("block_sparse_moe.gate.weight"));
}

TEST(WeightCheck, MissingTensorIsNotFoundWithTheReason) {
  Fixture f = Make("llama");
  f.tensors.erase("lm_head.weight");
  absl::Status s = Check(f);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr("no tensor 'lm_head.weight'"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("tie_word_embeddings is false"));
  f.spec.tie_embeddings = true;  // tied: no lm_head is expected
  EXPECT_TRUE(Check(f).ok());
}

TEST(WeightCheck, FusedExpertTensorsGetAHint) {
  Fixture f = Make("qwen3_moe");
  const std::string p = "model.layers.0.mlp.experts.";
  for (auto it = f.tensors.begin(); it != f.tensors.end();) {
    it = it->first.rfind(p, 0) == 0 ? f.tensors.erase(it) : std::next(it);
  }
  f.tensors[p + "gate_up_proj"] = HostTensor{DType::kBF16, {4, 64, 64}, std::vector<uint8_t>(4 * 64 * 64 * 2)};
  EXPECT_THAT(std::string(Check(f).message()), HasSubstr("fused expert tensors"));
}

TEST(WeightCheck, DtypeAndQuantizationMismatches) {
  Fixture f = Make("llama");
  f.tensors["model.norm.weight"].dtype = DType::kI16;
  EXPECT_THAT(std::string(Check(f).message()), HasSubstr("'model.norm.weight' has dtype I16"));
  Fixture g = Make("llama", "fp8");
  g.config.quant = QuantConfig();  // fp8 tensors, but a config without quantization
  absl::Status s = Check(g);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("config.json has no quantization"));
  Fixture h = Make("qwen3", "nvfp4");
  h.tensors["model.layers.1.mlp.down_proj.weight_scale"].shape = {64, 4};
  EXPECT_THAT(std::string(Check(h).message()),
              HasSubstr("'model.layers.1.mlp.down_proj.weight_scale' has shape [64, 4], config.json (qwen3) implies "
                        "[64, 8] (one e4m3 scale per 16 columns)"));
}

TEST(WeightCheck, UnexpectedBiasAndExtraLayersAreMismatches) {
  Fixture f = Make("llama");
  f.tensors["model.layers.0.self_attn.q_proj.bias"] = HostTensor{DType::kBF16, {64}, std::vector<uint8_t>(128)};
  absl::Status s = Check(f);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("gives this projection no bias (attention_bias is false)"));
  Fixture g = Make("llama");
  g.tensors["model.layers.7.input_layernorm.weight"] = g.tensors["model.norm.weight"];
  EXPECT_THAT(std::string(Check(g).message()),
              HasSubstr("belongs to layer 7, but config.json has num_hidden_layers 2"));
}

TEST(WeightCheck, TensorsTheConfigDoesNotImplyAreDroppedWithANote) {
  Fixture f = Make("glm4_moe");
  f.config.num_nextn_predict_layers = 1;
  f.tensors["model.layers.2.eh_proj.weight"] = f.tensors["model.norm.weight"];  // an MTP layer
  f.tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = HostTensor{DType::kF32, {8}, std::vector<uint8_t>(32)};
  std::vector<std::string> notes;
  ASSERT_TRUE(Check(f, &notes).ok());
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_THAT(notes[0], HasSubstr("multi-token-prediction"));
  EXPECT_THAT(notes[1], HasSubstr("model.layers.0.self_attn.rotary_emb.inv_freq"));
  EXPECT_EQ(f.tensors.count("model.layers.2.eh_proj.weight"), 0u);
  EXPECT_EQ(f.tensors.count("model.layers.0.self_attn.rotary_emb.inv_freq"), 0u);
}

TEST(WeightCheck, MlaShapesComeFromTheLatentAndIndexerKeys) {
  Fixture f = Make("deepseek_v32");  // latent 512 + rope 64, q latent 96, 4 heads of 32 + 64
  f.spec.mla.v_head_dim = 16;
  EXPECT_THAT(std::string(Check(f).message()),
              HasSubstr("'model.layers.0.self_attn.kv_b_proj.weight' has shape [256, 512], config.json "
                        "(deepseek_v32) implies [192, 512] (num_attention_heads 4 x (qk_nope_head_dim 32 + "
                        "v_head_dim 16) x kv_lora_rank 512)"));
  Fixture g = Make("glm_moe_dsa");
  g.spec.mla.index_head_dim = 32;
  EXPECT_THAT(std::string(Check(g).message()),
              HasSubstr("'model.layers.0.self_attn.indexer.wq_b.weight' has shape [1024, 96], config.json "
                        "(glm_moe_dsa) implies [512, 96] (index_n_heads 16 x index_head_dim 32 x q_lora_rank 96)"));
  Fixture h = Make("deepseek_v3");
  h.tensors.erase("model.layers.1.self_attn.kv_a_layernorm.weight");
  absl::Status s = Check(h);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr("no tensor 'model.layers.1.self_attn.kv_a_layernorm.weight'"));
}

TEST(WeightCheck, GlmSharedIndexerLayersHaveNoIndexerTensors) {
  MakeModelOptions o;
  o.arch = "glm_moe_dsa";
  o.index_pattern = "FS";
  auto ck = GenerateRandomCheckpoint(o);
  ASSERT_TRUE(ck.ok()) << ck.status();
  Fixture f;
  f.config = HfConfigFromModelSpec(ck->spec);
  f.spec = *ModelSpecFromHfConfig(f.config);
  f.tensors = std::move(ck->tensors);
  EXPECT_EQ(f.tensors.count("model.layers.1.self_attn.indexer.wk.weight"), 0u);
  std::vector<std::string> notes;
  ASSERT_TRUE(Check(f, &notes).ok());
  EXPECT_TRUE(notes.empty());
  // The same tensors read with every layer "full": layer 1's indexer is missing.
  f.spec.mla.index_full_layers.clear();
  EXPECT_THAT(std::string(Check(f).message()), HasSubstr("no tensor 'model.layers.1.self_attn.indexer.wq_b.weight'"));
}

TEST(WeightCheck, TiedEmbeddingsWithTheirOwnLmHeadSaySo) {
  Fixture f = Make("llama");
  f.spec.tie_embeddings = true;
  std::vector<std::string> notes;
  ASSERT_TRUE(Check(f, &notes).ok());
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_THAT(notes[0], HasSubstr("using it, as transformers 5 does"));
}

TEST(WeightCheck, ModelOptBlockScalesAreViewedAsTheirGrid) {
  Fixture f = Make("llama", "fp8");
  f.config.quant.quant_algo = "fp8_pb_wo";  // ModelOpt's names and scale layout
  f.spec.quant_weight_only = true;
  for (auto& [name, t] : TensorSet(f.tensors)) {
    const std::string suffix = ".weight_scale_inv";
    if (name.size() < suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    HostTensor s = t;
    s.shape =
        s.shape[0] * s.shape[1] == 1 ? std::vector<int64_t>{} : std::vector<int64_t>{s.shape[0], 1, s.shape[1], 1};
    f.tensors.erase(name);
    f.tensors[name.substr(0, name.size() - 4)] = s;  // ".weight_scale"
  }
  ASSERT_TRUE(Check(f).ok()) << Check(f);
  EXPECT_EQ(f.tensors.at("model.layers.0.self_attn.q_proj.weight_scale").shape, (std::vector<int64_t>{1, 1}));
}

TEST(WeightCheck, LoadCheckpointDirRefusesAMismatchedCheckpoint) {
  Fixture f = Make("qwen3");
  const auto dir = std::filesystem::temp_directory_path() / ("crashreplay_weight_check_" + std::to_string(::getpid()));
  ModelSpec wrong = f.spec;
  wrong.intermediate += 16;
  ASSERT_TRUE(WriteCheckpointDir(dir.string(), wrong, f.tensors).ok());
  auto back = LoadCheckpointDir(dir.string());
  EXPECT_EQ(back.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(back.status().message()), HasSubstr("mlp.gate_proj.weight' has shape"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace crashreplay::replay
