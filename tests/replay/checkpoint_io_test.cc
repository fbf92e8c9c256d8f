// make-model's checkpoints read back into the same model: config.json and
// safetensors round trips, and the engine gives the same bits from disk as
// from memory.
#include <gtest/gtest.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "crashreplay/replay/model/checkpoint_io.h"
#include "engine_test_util.h"

namespace crashreplay::replay {
namespace {

std::string TempDir(const std::string& name) {
  const auto d =
      std::filesystem::temp_directory_path() / ("crashreplay_replay_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  return d.string();
}

TEST(CheckpointIo, EveryArchRoundTripsThroughDisk) {
  for (const char* arch : {"llama", "qwen3", "qwen3_moe", "mixtral", "glm4_moe"}) {
    for (const char* quant : {"bf16", "fp8", "nvfp4", "mxfp4"}) {
      MakeModelOptions o;
      o.arch = arch;
      o.quant = quant;
      auto ck = GenerateRandomCheckpoint(o);
      ASSERT_TRUE(ck.ok());
      const std::string dir = TempDir(std::string(arch) + quant);
      ASSERT_TRUE(WriteCheckpointDir(dir, ck->spec, ck->tensors, 64 << 10).ok());
      auto back = LoadCheckpointDir(dir);
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(back->tensors.size(), ck->tensors.size());
      for (const auto& [name, t] : ck->tensors) {
        ASSERT_TRUE(back->tensors.count(name)) << name;
        EXPECT_EQ(back->tensors[name].bytes, t.bytes) << name;
        EXPECT_EQ(back->tensors[name].shape, t.shape) << name;
      }
      EXPECT_EQ(back->spec.model_type, ck->spec.model_type);
      EXPECT_EQ(back->spec.num_experts, ck->spec.num_experts);
      EXPECT_EQ(back->spec.qk_norm, ck->spec.qk_norm);
      EXPECT_EQ(back->spec.quant, ck->spec.quant);
      EXPECT_EQ(back->spec.scoring, ck->spec.scoring);
      EXPECT_EQ(back->spec.rope_legacy->type, ck->spec.rope_legacy->type);
      std::filesystem::remove_all(dir);
    }
  }
}

// A loaded checkpoint's tensors view the mapped file, and so do the model's
// shards that are a contiguous run of them (a whole tensor, a row range);
// a column split too, with a row stride; a rewritten weight is a copy. The model keeps the
// mapping alive after the loaded tensors are gone, with the bits of a model
// built from the same tensors in memory.
TEST(CheckpointIo, WeightsViewTheMappedFileAndOutliveTheLoadedSet) {
  for (const char* quant : {"bf16", "fp8"}) {
    MakeModelOptions o;
    o.arch = "llama";
    o.quant = quant;
    auto ck = GenerateRandomCheckpoint(o);
    ASSERT_TRUE(ck.ok());
    const std::string dir = TempDir(std::string("views_") + quant);
    ASSERT_TRUE(WriteCheckpointDir(dir, ck->spec, ck->tensors, 64 << 10).ok());
    const bool fp8 = std::string(quant) == "fp8";
    for (const ScaleFormat sf : {ScaleFormat::kCheckpoint, ScaleFormat::kUe8m0Requant}) {
      if (!fp8 && sf != ScaleFormat::kCheckpoint) continue;
      EngineConfig c;
      c.tp_size = fp8 ? 1 : 2;  // the test model's fp8 blocks are whole only at tp 1
      c.scale_format = sf;
      std::unique_ptr<Model> from_disk;
      {
        auto back = LoadCheckpointDir(dir);
        ASSERT_TRUE(back.ok()) << back.status();
        for (const auto& [name, t] : back->tensors) EXPECT_TRUE(t.bytes.is_view()) << name;
        auto m = BuildModel(back->spec, back->tensors, c);
        ASSERT_TRUE(m.ok()) << m.status();
        from_disk = std::move(*m);
      }  // the loaded set, and its references to the mapping, are gone
      auto in_memory = BuildModel(ck->spec, ck->tensors, c);
      ASSERT_TRUE(in_memory.ok());
      const RankLayer& d = from_disk->layers[0].ranks[0];
      const RankLayer& mem = (*in_memory)->layers[0].ranks[0];
      EXPECT_FALSE(mem.q.data.is_view());  // tensors made in memory are copied into the shard
      if (fp8) {
        const bool requant = sf == ScaleFormat::kUe8m0Requant;
        EXPECT_EQ(d.q.data.is_view(), !requant);  // requantization rewrites the weight: a copy
        EXPECT_EQ(d.q.scales.is_view(), !requant);
      } else {
        EXPECT_TRUE(d.q.data.is_view());  // split along rows: a contiguous run
        EXPECT_EQ(d.q.w.row_stride, 0);
        // Split along columns: read in place, rows the full tensor's width
        // apart; the shard's own bytes are half the rows.
        EXPECT_TRUE(d.o.data.is_view());
        EXPECT_EQ(d.o.w.row_stride, 2 * d.o.w.cols);
        EXPECT_EQ(d.o.data_bytes(), mem.o.data.size());
        EXPECT_GT(d.o.data.size(), d.o.data_bytes());
        EXPECT_EQ(mem.o.w.row_stride, 0);  // made in memory: packed
        EXPECT_TRUE(d.o.scales.empty() || !d.o.scales.is_view());  // a column split's scales: packed copies
      }
      // The hashes of strided shards are those of their packed rows (the
      // capture side's).
      EXPECT_EQ(from_disk->shard_hashes.size(), (*in_memory)->shard_hashes.size());
      for (size_t r = 0; r < from_disk->shard_hashes.size(); ++r) {
        for (const auto& [name, h] : (*in_memory)->shard_hashes[r]) {
          auto it = from_disk->shard_hashes[r].find(name);
          ASSERT_NE(it, from_disk->shard_hashes[r].end()) << name;
          EXPECT_EQ(it->second.hash, h.hash) << "rank " << r << " " << name;
          EXPECT_EQ(it->second.bytes, h.bytes) << "rank " << r << " " << name;
        }
      }
      for (size_t l = 0; l < from_disk->layers.size(); ++l) {
        for (size_t r = 0; r < from_disk->layers[l].ranks.size(); ++r) {
          const RankLayer& a = from_disk->layers[l].ranks[r];
          const RankLayer& b = (*in_memory)->layers[l].ranks[r];
          for (auto member : {&RankLayer::q, &RankLayer::k, &RankLayer::v, &RankLayer::o, &RankLayer::gate,
                              &RankLayer::up, &RankLayer::down}) {
            EXPECT_EQ(DenseRows((a.*member).w), DenseRows((b.*member).w)) << "layer " << l << " rank " << r;
            EXPECT_EQ((b.*member).data.size(), DenseRows((b.*member).w).size());
            EXPECT_TRUE((a.*member).scales == (b.*member).scales) << "layer " << l << " rank " << r;
            EXPECT_EQ((a.*member).w.data, (a.*member).data.data());
          }
        }
      }
      EXPECT_TRUE(from_disk->embed.data == (*in_memory)->embed.data);
    }
    std::filesystem::remove_all(dir);
  }
}

// Column-split shards (o_proj, down_proj, a tensor-mode expert's down_proj)
// are read in place with a row stride; a run gives the bits of the same
// model built from packed copies in memory, step by step and kernel by
// kernel, for every weight format and on one and two threads.
TEST(CheckpointIo, ColumnSplitsReadInPlaceGiveTheBitsOfPackedCopies) {
  struct Case {
    const char* arch;
    const char* quant;
    std::vector<std::string> sets;
    bool fp8_blocks = false;  // shapes whose halves hold whole 128 x 128 blocks
  };
  const Case cases[] = {
      {"llama", "bf16", {"tp_size=2"}},
      {"qwen3", "fp8", {"tp_size=2", "gemm_backend=fused_blockscaled"}, true},
      {"qwen3", "fp8", {"tp_size=2", "gemm_backend=dequant_matmul"}, true},
      {"qwen3_moe", "nvfp4", {"tp_size=2", "moe_parallel=tensor"}},
      {"glm4_moe", "mxfp4", {"tp_size=2", "moe_parallel=tensor", "scale_format=ue8m0"}},
      {"glm_moe_dsa", "nvfp4", {"tp_size=2"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.arch, " ", c.quant));
    MakeModelOptions o;
    o.arch = c.arch;
    o.quant = c.quant;
    o.moe_intermediate = 64;  // halves of whole 32-column MXFP4 blocks
    if (c.fp8_blocks) {
      o.hidden = 256;
      o.heads = o.kv_heads = 8;
      o.head_dim = 32;
      o.intermediate = 512;
    }
    auto ck = GenerateRandomCheckpoint(o);
    ASSERT_TRUE(ck.ok()) << ck.status();
    const std::string dir = TempDir(absl::StrCat("strided_", c.arch, c.quant, c.sets.back()));
    ASSERT_TRUE(WriteCheckpointDir(dir, ck->spec, ck->tensors, 64 << 10).ok());
    Config cfg = Config::Defaults();
    for (const std::string& s : c.sets) ASSERT_TRUE(cfg.ApplySetFlag(s).ok()) << s;
    const EngineConfig ec = ResolveConfig(cfg);
    auto back = LoadCheckpointDir(dir);
    ASSERT_TRUE(back.ok()) << back.status();
    auto from_disk = BuildModel(back->spec, back->tensors, ec);
    ASSERT_TRUE(from_disk.ok()) << from_disk.status();
    int64_t strided = 0;
    for (const Layer& l : (*from_disk)->layers) {
      for (const RankLayer& r : l.ranks) {
        for (const LinearShard* s : {&r.o, &r.down, &r.shared.down}) strided += s->w.row_stride != 0;
        for (const ExpertShard& e : r.experts) strided += e.down.w.row_stride != 0;
      }
    }
    EXPECT_GT(strided, 0) << "no shard of this case is read in place with a stride";
    auto in_memory = BuildModel(ck->spec, ck->tensors, ec);
    ASSERT_TRUE(in_memory.ok()) << in_memory.status();
    for (int threads : {1, 2}) {
      auto a = Engine::Create(std::move(*from_disk), ec, threads, 4096);
      ASSERT_TRUE(a.ok()) << a.status();
      auto b = Engine::Create(std::move(*in_memory), ec, threads, 4096);
      ASSERT_TRUE(b.ok()) << b.status();
      const RunResult ra = (*a)->Run(testing::TwoRequests(3));
      const RunResult rb = (*b)->Run(testing::TwoRequests(3));
      ASSERT_FALSE(ra.fault.has_value()) << ra.fault->Signature();
      ASSERT_FALSE(rb.fault.has_value());
      EXPECT_EQ(ra.outputs, rb.outputs);
      ASSERT_EQ(ra.steps.size(), rb.steps.size());
      for (size_t i = 0; i < ra.steps.size(); ++i) EXPECT_EQ(ra.steps[i].digest, rb.steps[i].digest) << "step " << i;
      ASSERT_EQ(ra.last_step_kernels.size(), rb.last_step_kernels.size());
      for (size_t k = 0; k < ra.last_step_kernels.size(); ++k) {
        EXPECT_EQ(ra.last_step_kernels[k].digest, rb.last_step_kernels[k].digest) << ra.last_step_kernels[k].label;
      }
      // Rebuild for the next thread count (Create took the models).
      from_disk = BuildModel(back->spec, back->tensors, ec);
      in_memory = BuildModel(ck->spec, ck->tensors, ec);
      ASSERT_TRUE(from_disk.ok() && in_memory.ok());
    }
    std::filesystem::remove_all(dir);
  }
}

TEST(CheckpointIo, RopeConfigToggleReadsOnlyTheChosenForm) {
  MakeModelOptions o;
  o.arch = "llama";
  auto ck = GenerateRandomCheckpoint(o);
  ASSERT_TRUE(ck.ok());
  ck->spec.rope_parameters = ck->spec.rope_legacy;  // a transformers 5 file: rope_parameters only
  ck->spec.rope_legacy.reset();
  auto back = ModelSpecFromHfConfig(HfConfigFromModelSpec(ck->spec));
  ASSERT_TRUE(back.ok());
  ASSERT_TRUE(back->rope_parameters.has_value());
  EXPECT_FALSE(back->rope_legacy.has_value());
  EngineConfig checkpoint, legacy, params;
  legacy.rope_config = RopeConfig::kLegacy;
  params.rope_config = RopeConfig::kRopeParameters;
  auto m0 = BuildModel(*back, ck->tensors, checkpoint);
  auto m1 = BuildModel(*back, ck->tensors, legacy);
  auto m2 = BuildModel(*back, ck->tensors, params);
  ASSERT_TRUE(m0.ok() && m1.ok() && m2.ok());
  EXPECT_EQ((*m0)->rope.used.type, "llama3");  // the default reads the file as it is
  EXPECT_TRUE((*m0)->notes.empty());
  EXPECT_TRUE((*m1)->rope.from_default);  // llama3 scaling and theta 500000 are lost...
  ASSERT_EQ((*m1)->notes.size(), 1u);      // ...and it says so
  EXPECT_NE((*m1)->notes[0].find("ignores config.json's rope_parameters (llama3, theta 500000"), std::string::npos)
      << (*m1)->notes[0];
  EXPECT_FALSE((*m2)->rope.from_default);
  EXPECT_EQ((*m0)->rope.inv_freq, (*m2)->rope.inv_freq);
  EXPECT_NE((*m1)->rope.inv_freq, (*m2)->rope.inv_freq);
}

TEST(CheckpointIo, DisagreeingRopeFormsResolveAsTransformers5AndSaySo) {
  ModelSpec s;
  RopeSpec llama3;
  llama3.type = "llama3";
  llama3.theta = 500000;
  llama3.factor = 8;
  RopeSpec linear;
  linear.type = "linear";
  linear.factor = 2;
  s.rope_parameters = llama3;
  s.rope_legacy = linear;
  s.rope_scaling_wins = true;  // a rope_scaling object: transformers 5 reads it
  RopeChoice c = ChooseRope(s, RopeConfig::kCheckpoint);
  EXPECT_EQ(c.rope, linear);
  EXPECT_NE(c.note.find("using rope_scaling"), std::string::npos) << c.note;
  s.rope_scaling_wins = false;  // only a bare rope_theta beside rope_parameters
  s.rope_legacy = RopeSpec{};
  c = ChooseRope(s, RopeConfig::kCheckpoint);
  EXPECT_EQ(c.rope, llama3);
  EXPECT_NE(c.note.find("using rope_parameters"), std::string::npos) << c.note;
  s.rope_legacy = llama3;  // both forms agree: nothing to say
  EXPECT_TRUE(ChooseRope(s, RopeConfig::kCheckpoint).note.empty());
  EXPECT_TRUE(ChooseRope(s, RopeConfig::kLegacy).note.empty());
}

TEST(CheckpointIo, MlaConfigBecomesTheEnginesMlaSpecAndBack) {
  // GLM-5's shape (GlmMoeDsaConfig's defaults) with ModelOpt NVFP4 and an
  // indexer on layers 0-2 and every fourth after.
  std::string types;
  for (int l = 0; l < 78; ++l) {
    types += absl::StrCat(l ? ", " : "", l < 3 || (l - 2) % 4 == 0 ? "\"full\"" : "\"shared\"");
  }
  auto c = ParseHfConfig(absl::StrCat(R"({"model_type": "glm_moe_dsa", "indexer_types": [)", types,
                                      R"(], "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4",
                                 "group_size": 16, "ignore": ["lm_head", "model.layers.*.self_attn*"]}})"),
                         "x/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  auto s = ModelSpecFromHfConfig(*c);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->mla.kv_lora_rank, 512);
  EXPECT_EQ(s->mla.q_lora_rank, 2048);
  EXPECT_EQ(s->mla.qk_head_dim(), 256);
  EXPECT_EQ(s->head_dim, 64);  // RoPE spans the rope part, as transformers' head_dim
  EXPECT_EQ(s->kv_heads, 64);
  EXPECT_TRUE(s->mla.dsa());
  EXPECT_TRUE(s->mla.index_rope_interleave);  // GLM-5's indexer; DeepSeek-V3.2's is half-split
  EXPECT_TRUE(s->mla.layer_has_indexer(2));
  EXPECT_FALSE(s->mla.layer_has_indexer(3));
  EXPECT_EQ(s->quant, QuantKind::kNvfp4);
  const ModelConfig back = HfConfigFromModelSpec(*s);
  EXPECT_EQ(back.architectures, std::vector<std::string>{"GlmMoeDsaForCausalLM"});
  EXPECT_EQ(back.indexer_types, c->indexer_types);
  EXPECT_EQ(back.index_n_heads, 32);
  EXPECT_EQ(back.head_dim, 256);
}

TEST(CheckpointIo, MlaWithAttentionBiasIsRefusedByName) {
  ModelConfig c;
  c.model_type = "deepseek_v3";
  c.source = "x/config.json";
  c.kv_lora_rank = 512;
  c.attention_bias = true;
  auto s = ModelSpecFromHfConfig(c);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(IsUnsupportedModel(s.status()));
  EXPECT_NE(std::string(s.status().message()).find("attention_bias true"), std::string::npos);
}

TEST(CheckpointIo, ActivationOtherThanSiluIsRefused) {
  ModelConfig c;
  c.model_type = "llama";
  c.source = "x/config.json";
  c.hidden_act = "gelu";
  auto s = ModelSpecFromHfConfig(c);
  EXPECT_TRUE(IsUnsupportedModel(s.status())) << s.status();
  EXPECT_NE(std::string(s.status().message()).find("hidden_act 'gelu'"), std::string::npos);
}

}  // namespace
}  // namespace crashreplay::replay

namespace crashreplay::replay {
namespace {

TEST(ShardHashes, MatchTheSameCheckpointAndNameTheTamperedTensor) {
  MakeModelOptions o;
  o.arch = "qwen3_moe";
  o.quant = "nvfp4";
  auto ck = GenerateRandomCheckpoint(o);
  ASSERT_TRUE(ck.ok());
  EngineConfig c;
  c.tp_size = 2;
  auto a = BuildModel(ck->spec, ck->tensors, c);
  ASSERT_TRUE(a.ok());
  std::vector<std::map<std::string, Hash128>> recorded((*a)->shard_hashes.size());
  for (size_t r = 0; r < recorded.size(); ++r)
    for (const auto& [n, h] : (*a)->shard_hashes[r]) recorded[r][n] = h.hash;
  EXPECT_TRUE(VerifyShardHashes(**a, recorded).ok());
  c.scale_format = ScaleFormat::kUe8m0Requant;  // scale conversion does not change what is hashed
  auto b = BuildModel(ck->spec, ck->tensors, c);
  EXPECT_TRUE(VerifyShardHashes(**b, recorded).ok());
  ck->tensors["model.layers.1.self_attn.o_proj.weight"].bytes.mutable_data()[20] ^=
      1;  // packed byte 20 = columns 40, 41: rank 1's half
  auto t = BuildModel(ck->spec, ck->tensors, c);
  absl::Status s = VerifyShardHashes(**t, recorded);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(std::string(s.message()).find("rank 1 tensor 'model.layers.1.self_attn.o_proj.weight'"), std::string::npos)
      << s;
  c.tp_size = 1;
  auto one = BuildModel(ck->spec, ck->tensors, c);
  EXPECT_EQ(VerifyShardHashes(**one, recorded).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace crashreplay::replay
