// Weight-shard hashes: the sharding rule, per-rank shard hashes of a real
// safetensors checkpoint against hashes of the slices cut by hand, the root,
// thread-count independence, and one hash against the xxhsum CLI.
#include <cstdio>
#include <fstream>

#include <gtest/gtest.h>

#include "crashreplay/capture/weight_hash.h"
#include "crashreplay/formats/safetensors_writer.h"
#include "crashreplay/formats/sharding.h"
#include "recorder_test_util.h"

namespace crashreplay::testing {
namespace {

using capture::HashCheckpoint;
using capture::HashOptions;

ShardSpec Rule(const char* name, std::vector<int64_t> shape, int64_t tp, int64_t rank, ShardingModel m = {}) {
  return ShardingRuleFor(name, shape, tp, rank, m);
}

TEST(ShardingRule, ColumnRowReplicatedAndKvReplication) {
  const ShardSpec q = Rule("model.layers.0.self_attn.q_proj.weight", {64, 32}, 4, 1);
  EXPECT_EQ(q.kind, ShardKind::kSplit);
  EXPECT_EQ(q.dim, 0);
  EXPECT_EQ(q.part, 1);
  EXPECT_EQ(Rule("model.layers.0.self_attn.o_proj.weight", {32, 64}, 4, 1).dim, 1);
  EXPECT_EQ(Rule("model.layers.3.mlp.down_proj.weight", {32, 64}, 4, 1).dim, 1);
  EXPECT_EQ(Rule("lm_head.weight", {128, 32}, 4, 1).dim, 0);
  EXPECT_EQ(Rule("model.embed_tokens.weight", {128, 32}, 4, 1).kind, ShardKind::kReplicated);
  EXPECT_EQ(Rule("model.norm.weight", {32}, 4, 1).kind, ShardKind::kReplicated);
  EXPECT_EQ(Rule("model.layers.0.mlp.gate.weight", {8, 32}, 4, 1).kind, ShardKind::kReplicated) << "router";
  EXPECT_EQ(Rule("model.layers.0.self_attn.q_proj.weight_scale_2", {}, 4, 1).kind, ShardKind::kReplicated);
  // 2 KV heads over 4 ranks: ranks 0,1 hold head 0 and ranks 2,3 head 1.
  const ShardingModel kv2{.num_kv_heads = 2};
  for (int64_t r = 0; r < 4; ++r) {
    const ShardSpec k = Rule("model.layers.0.self_attn.k_proj.weight", {16, 32}, 4, r, kv2);
    EXPECT_EQ(k.parts, 2);
    EXPECT_EQ(k.part, r / 2);
  }
}

TEST(ShardingRule, ExpertParallelOwnsWholeExpertsTensorParallelSplitsThem) {
  const ShardingModel ep{.num_kv_heads = 4, .num_experts = 8, .expert_parallel = true};
  const ShardSpec e5 = Rule("model.layers.1.mlp.experts.5.down_proj.weight", {32, 16}, 4, 0, ep);
  EXPECT_EQ(e5.kind, ShardKind::kOwned);
  EXPECT_EQ(e5.owner, 2);
  EXPECT_EQ(Rule("model.layers.1.block_sparse_moe.experts.7.w1.weight", {16, 32}, 4, 0, ep).owner, 3);
  ShardingModel tp = ep;
  tp.expert_parallel = false;
  EXPECT_EQ(Rule("model.layers.1.block_sparse_moe.experts.7.w2.weight", {32, 16}, 4, 0, tp).dim, 1);
  EXPECT_EQ(Rule("model.layers.1.mlp.shared_experts.up_proj.weight", {16, 32}, 4, 0, ep).kind, ShardKind::kSplit)
      << "shared experts are never expert-partitioned";
}

TEST(ShardingRule, CompanionTensorsFollowTheirWeight) {
  // A row-parallel weight's 2-D scale splits along columns; its 1-D bias is whole.
  const ShardSpec o = Rule("model.layers.0.self_attn.o_proj.weight_scale_inv", {2, 4}, 2, 1);
  auto block = ShardBlockFor("s", o, std::vector<int64_t>{2, 4}, 2 * 4 * 4);
  ASSERT_TRUE(block.ok());
  EXPECT_EQ(block->col_byte_begin, 8u);
  EXPECT_EQ(block->col_byte_end, 16u);
  auto bias =
      ShardBlockFor("b", Rule("model.layers.0.self_attn.o_proj.bias", {32}, 2, 1), std::vector<int64_t>{32}, 64);
  ASSERT_TRUE(bias.ok());
  EXPECT_EQ(bias->bytes(), 64u);
  auto qbias =
      ShardBlockFor("b", Rule("model.layers.0.self_attn.q_proj.bias", {32}, 2, 1), std::vector<int64_t>{32}, 64);
  ASSERT_TRUE(qbias.ok());
  EXPECT_EQ(qbias->bytes(), 32u);
  EXPECT_EQ(qbias->row_begin, 16);
}

TEST(ShardingRule, IndivisibleSplitIsAnErrorNamingTheTensor) {
  const ShardSpec q = Rule("model.layers.0.self_attn.q_proj.weight", {30, 32}, 4, 0);
  auto b = ShardBlockFor("model.layers.0.self_attn.q_proj.weight", q, std::vector<int64_t>{30, 32}, 30 * 32 * 2);
  ASSERT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find("q_proj"), std::string::npos);
}

// A tiny llama-shaped checkpoint with bf16 weights.
struct TinyCheckpoint {
  std::map<std::string, std::pair<std::vector<int64_t>, std::vector<std::byte>>> tensors;
  explicit TinyCheckpoint(const std::string& dir) {
    auto add = [&](const std::string& name, std::vector<int64_t> shape, uint32_t seed) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      tensors[name] = {shape, RandomBytes(static_cast<size_t>(n) * 2, seed)};
    };
    add("model.embed_tokens.weight", {64, 16}, 1);
    add("model.layers.0.self_attn.q_proj.weight", {16, 16}, 2);
    add("model.layers.0.self_attn.k_proj.weight", {8, 16}, 3);
    add("model.layers.0.self_attn.o_proj.weight", {16, 16}, 4);
    add("model.layers.0.mlp.down_proj.weight", {16, 32}, 5);
    add("model.layers.0.input_layernorm.weight", {16}, 6);
    SafetensorsWriter w;
    for (auto& [name, t] : tensors) EXPECT_TRUE(w.Add(name, DType::kBF16, t.first, t.second).ok());
    EXPECT_TRUE(w.WriteSharded(dir, 4096).ok());  // several shard files + index
    std::ofstream(dir + "/config.json") << R"({"num_attention_heads": 4, "num_key_value_heads": 2})";
  }
  // Rows [r0, r1) x columns [c0, c1) (elements) of a 2-D bf16 tensor.
  std::vector<std::byte> Block(const std::string& name, int64_t r0, int64_t r1, int64_t c0, int64_t c1) const {
    const auto& [shape, bytes] = tensors.at(name);
    std::vector<std::byte> out;
    for (int64_t r = r0; r < r1; ++r) {
      const std::byte* row = bytes.data() + r * shape[1] * 2;
      out.insert(out.end(), row + c0 * 2, row + c1 * 2);
    }
    return out;
  }
};

const TensorHash* Find(const WeightShardHashes& w, const std::string& name) {
  for (const TensorHash& t : w.tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

TEST(HashCheckpoint, EachRankHashesExactlyItsSliceOfEachTensor) {
  RecorderTempDir dir;
  TinyCheckpoint ckpt(dir.path());
  auto model = capture::ReadShardingModel(dir.path(), false);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->num_kv_heads, 2);
  auto ranks = HashCheckpoint(dir.path(), 4, *model);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  ASSERT_EQ(ranks->size(), 4u);
  for (uint32_t r = 0; r < 4; ++r) {
    const WeightShardHashes& w = (*ranks)[r];
    EXPECT_EQ(w.rank, r);
    ASSERT_EQ(w.tensors.size(), 6u);
    const std::string q = "model.layers.0.self_attn.q_proj.weight";
    EXPECT_EQ(Find(w, q)->hash, XXH128Of(ckpt.Block(q, 4 * r, 4 * r + 4, 0, 16)));
    EXPECT_EQ(Find(w, q)->byte_size, 4u * 16 * 2);
    // 2 KV heads of 4 rows over 4 ranks: rank r holds head r / 2.
    const std::string k = "model.layers.0.self_attn.k_proj.weight";
    EXPECT_EQ(Find(w, k)->hash, XXH128Of(ckpt.Block(k, 4 * (r / 2), 4 * (r / 2) + 4, 0, 16)));
    const std::string o = "model.layers.0.self_attn.o_proj.weight";
    EXPECT_EQ(Find(w, o)->hash, XXH128Of(ckpt.Block(o, 0, 16, 4 * r, 4 * r + 4)));
    const std::string d = "model.layers.0.mlp.down_proj.weight";
    EXPECT_EQ(Find(w, d)->hash, XXH128Of(ckpt.Block(d, 0, 16, 8 * r, 8 * r + 8)));
    const std::string e = "model.embed_tokens.weight";
    EXPECT_EQ(Find(w, e)->hash, XXH128Of(ckpt.tensors.at(e).second)) << "replicated";
    std::vector<TensorHash> copy = w.tensors;
    EXPECT_EQ(capture::WeightRoot(&copy), w.root);
  }
  EXPECT_NE((*ranks)[0].root, (*ranks)[1].root);
  EXPECT_NE((*ranks)[1].root, (*ranks)[2].root);
}

TEST(HashCheckpoint, SameHashesWithAnyThreadCount) {
  RecorderTempDir dir;
  TinyCheckpoint ckpt(dir.path());
  auto model = capture::ReadShardingModel(dir.path(), false);
  ASSERT_TRUE(model.ok());
  auto one = HashCheckpoint(dir.path(), 2, *model, HashOptions{1});
  auto many = HashCheckpoint(dir.path(), 2, *model, HashOptions{7});
  ASSERT_TRUE(one.ok() && many.ok());
  EXPECT_EQ(*one, *many);
}

TEST(WeightRoot, DefinitionOverSortedNamesHashesAndSizes) {
  std::vector<TensorHash> t = {{"b", Hash128{1, 2}, 10}, {"a", Hash128{3, 4}, 20}};
  // LE64(len) name LE64(high) LE64(low) LE64(size), in name order.
  std::string buf;
  auto le = [&](uint64_t v) {
    for (int i = 0; i < 8; ++i) buf.push_back(static_cast<char>(v >> (8 * i)));
  };
  le(1);
  buf += "a";
  le(3);
  le(4);
  le(20);
  le(1);
  buf += "b";
  le(1);
  le(2);
  le(10);
  EXPECT_EQ(capture::WeightRoot(&t), XXH128Of(buf.data(), buf.size()));
  EXPECT_EQ(t[0].name, "a");
}

TEST(HashTensors, InMemoryTensorsHashTheirBytes) {
  const std::vector<std::byte> a = RandomBytes(1000, 1), b = RandomBytes(3000, 2);
  const int64_t sa[] = {500}, sb[] = {1500};
  const capture::TensorView views[] = {{"w.b", DType::kBF16, sb, b.data(), b.size()},
                                       {"w.a", DType::kBF16, sa, a.data(), a.size()}};
  auto h = capture::HashTensors(3, views);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->rank, 3u);
  ASSERT_EQ(h->tensors.size(), 2u);
  EXPECT_EQ(h->tensors[0].name, "w.a");
  EXPECT_EQ(h->tensors[0].hash, XXH128Of(a));
  EXPECT_EQ(h->tensors[1].hash, XXH128Of(b));
  const capture::TensorView dup[] = {views[0], views[0]};
  EXPECT_EQ(capture::HashTensors(0, dup).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(HashCheckpoint, ShardHashMatchesTheXxhsumCli) {
  if (std::system("command -v xxhsum > /dev/null 2>&1") != 0) GTEST_SKIP() << "xxhsum not installed";
  RecorderTempDir dir;
  const std::string ck = dir.path() + "/ckpt";
  TinyCheckpoint ckpt(ck);
  auto ranks = HashCheckpoint(ck, 2, ShardingModel{});
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  const std::string o = "model.layers.0.self_attn.o_proj.weight";
  const std::vector<std::byte> shard = ckpt.Block(o, 0, 16, 8, 16);  // rank 1's columns
  const std::string file = dir.path() + "/shard.bin";
  std::ofstream(file, std::ios::binary).write(reinterpret_cast<const char*>(shard.data()), shard.size());
  FILE* p = popen(("xxhsum -H2 " + file + " 2>/dev/null").c_str(), "r");
  ASSERT_NE(p, nullptr);
  char line[256] = {};
  ASSERT_NE(fgets(line, sizeof line, p), nullptr);
  pclose(p);
  const std::string cli(line, 32);
  EXPECT_EQ(Find((*ranks)[1], o)->hash.Hex(), cli) << line;
}

}  // namespace
}  // namespace crashreplay::testing
