// Layer streaming (weights=stream): a model whose layers' weights are read
// from a deferred checkpoint just before the layer runs and released after.
// It must give the bits of resident weights, hold one layer at a time, and
// refuse a checkpoint that changed under it.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "crashreplay/replay/model/checkpoint_io.h"
#include "crashreplay/replay/program/device_model.h"
#include "engine_test_util.h"
#include "guarded_executor.h"

namespace crashreplay::replay {
namespace {

using ::testing::HasSubstr;

std::string WriteModel(const MakeModelOptions& o, const std::string& name) {
  const auto d =
      std::filesystem::temp_directory_path() / ("crashreplay_stream_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  auto ck = GenerateRandomCheckpoint(o);
  EXPECT_TRUE(ck.ok()) << ck.status();
  EXPECT_TRUE(WriteCheckpointDir(d.string(), ck->spec, ck->tensors, 96 << 10).ok());  // several shards
  return d.string();
}

EngineConfig Resolve(const std::vector<std::string>& sets) {
  Config c = Config::Defaults();
  for (const std::string& s : sets) EXPECT_TRUE(c.ApplySetFlag(s).ok()) << s;
  return ResolveConfig(c);
}

// device: run on GuardedDeviceExecutor (the device path: uploads, and Hold
// rewriting a layer's view arrays in executor memory) instead of the CPU.
std::unique_ptr<Engine> Load(const std::string& dir, const EngineConfig& ec, bool stream, bool device = false) {
  auto ck = LoadCheckpointDir(dir, {.deferred = stream});
  EXPECT_TRUE(ck.ok()) << ck.status();
  if (!ck.ok()) return nullptr;
  auto m = BuildModel(ck->spec, ck->tensors, ec, {.stream = stream});
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return nullptr;
  // (A small pool on the device: a guarded launch costs in proportion to the
  // memory it opens.)
  auto e = device ? Engine::Create(std::move(*m), ec, std::make_unique<testing::GuardedDeviceExecutor>(2), 64)
                  : Engine::Create(std::move(*m), ec, 2, 4096);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

// A two-layer llama written to `name` and loaded streaming under `sets`.
std::unique_ptr<Engine> StreamedLlama(const std::string& name, const std::vector<std::string>& sets, std::string* dir) {
  MakeModelOptions o;
  o.layers = 2;
  *dir = WriteModel(o, name);
  return Load(*dir, Resolve(sets), true);
}

// Every streamed shard of layer l has its bytes (or none has).
bool LayerHeld(const Model& m, size_t l) {
  const RankLayer& r = m.layers[l].ranks[0];
  return !r.o.data.empty() || (!r.experts.empty() && !r.experts[0].down.data.empty());
}

struct Case {
  MakeModelOptions model;
  std::vector<std::string> sets;
};

TEST(LayerStream, GivesTheBitsOfResidentWeightsKernelByKernel) {
  std::vector<Case> cases;
  auto add = [&](const char* arch, const char* quant, std::vector<std::string> sets) {
    Case c;
    c.model.arch = arch;
    c.model.quant = quant;
    c.model.layers = 3;
    if (std::string(quant) == "fp8") {  // whole 128x128 blocks at tp 2
      c.model.hidden = 512, c.model.heads = 4, c.model.kv_heads = 2, c.model.head_dim = 128;
      c.model.intermediate = 512, c.model.moe_intermediate = 256;
    }
    c.sets = std::move(sets);
    cases.push_back(std::move(c));
  };
  add("llama", "bf16", {"tp_size=2"});                                  // column splits are copies
  add("qwen3_moe", "nvfp4", {"tp_size=2"});                             // w4a4 experts
  add("qwen3_moe", "nvfp4", {"tp_size=2", "moe_parallel=expert"});
  add("glm4_moe", "fp8", {"tp_size=2", "scale_format=ue8m0_requant"});  // rewritten weights
  add("glm_moe_dsa", "nvfp4", {"tp_size=2", "kv_cache_dtype=fp8_e4m3"});
  add("deepseek_v3", "fp8", {"mla_decode=absorbed", "page_size=64"});
  add("deepseek_v3", "fp8", {"mla_decode=absorbed"});  // FlashMLA's page_size_is_64 fires in decode: the same fault
  for (const Case& c : cases) {
    SCOPED_TRACE(c.model.arch + "/" + c.model.quant + " " + ::testing::PrintToString(c.sets));
    const std::string dir = WriteModel(c.model, c.model.arch + c.model.quant);
    const EngineConfig ec = Resolve(c.sets);
    auto resident = Load(dir, ec, false);
    for (bool device : {false, true}) {
      SCOPED_TRACE(device ? "streamed on the guarded device executor" : "streamed on the cpu");
      auto streamed = Load(dir, ec, true, device);
      ASSERT_TRUE(resident && streamed);
      EXPECT_FALSE(resident->streaming());
      EXPECT_TRUE(streamed->streaming());
      EXPECT_EQ(streamed->model().shard_hashes, resident->model().shard_hashes);
      EXPECT_EQ(streamed->model().rank_weight_bytes, resident->model().rank_weight_bytes);
      const RunResult a = resident->Run(testing::TwoRequests(3));
      const RunResult b = streamed->Run(testing::TwoRequests(3));
      ASSERT_EQ(b.fault.has_value(), a.fault.has_value());
      if (a.fault) {
        EXPECT_EQ(b.fault->Signature(), a.fault->Signature());
        EXPECT_EQ(b.fault->message, a.fault->message);
      }
      EXPECT_EQ(b.outputs, a.outputs);
      ASSERT_EQ(b.steps.size(), a.steps.size());
      for (size_t i = 0; i < a.steps.size(); ++i) EXPECT_EQ(b.steps[i].digest, a.steps[i].digest) << "step " << i;
      ASSERT_EQ(b.last_step_kernels.size(), a.last_step_kernels.size());
      for (size_t k = 0; k < a.last_step_kernels.size(); ++k) {
        EXPECT_EQ(b.last_step_kernels[k].digest, a.last_step_kernels[k].digest) << a.last_step_kernels[k].label;
      }
      for (size_t l = 0; l < streamed->model().layers.size() && !a.fault; ++l) {  // a fault keeps its layer
        EXPECT_FALSE(LayerHeld(streamed->model(), l)) << "layer " << l << " is still held after the run";
      }
    }
    std::filesystem::remove_all(dir);
  }
}

TEST(LayerStream, HoldsOneLayerAtATime) {
  MakeModelOptions o;
  o.layers = 3;
  const std::string dir = WriteModel(o, "hold");
  const EngineConfig ec = Resolve({"tp_size=2"});
  auto ck = LoadCheckpointDir(dir, {.deferred = true});
  ASSERT_TRUE(ck.ok()) << ck.status();
  for (const auto& [name, t] : ck->tensors) EXPECT_TRUE(t.bytes.deferred()) << name;
  auto built = BuildModel(ck->spec, ck->tensors, ec, {.stream = true});
  ASSERT_TRUE(built.ok()) << built.status();
  Model& m = **built;
  ASSERT_TRUE(m.streaming());
  for (size_t l = 0; l < 3; ++l) {
    EXPECT_FALSE(LayerHeld(m, l));
    EXPECT_EQ(m.layers[l].ranks[0].q.w.rows, 32) << "a released shard keeps its shape";
    EXPECT_EQ(m.layers[l].ranks[0].q.w.data, nullptr);
  }
  ASSERT_TRUE(LoadLayerWeights(m, 1).ok());
  EXPECT_TRUE(LayerHeld(m, 1));
  EXPECT_EQ(m.layers[1].ranks[1].o.w.data, m.layers[1].ranks[1].o.data.data());
  ASSERT_TRUE(LoadLayerWeights(m, 2).ok());
  EXPECT_FALSE(LayerHeld(m, 1));
  EXPECT_TRUE(LayerHeld(m, 2));
  ASSERT_TRUE(LoadLayerWeights(m, -1).ok());
  EXPECT_FALSE(LayerHeld(m, 2));
  // The resident part is there throughout.
  EXPECT_FALSE(m.embed.data.empty());
  EXPECT_FALSE(m.lm_head[1].data.empty());
  EXPECT_EQ(m.layers[0].input_norm.size(), 64u);
  std::filesystem::remove_all(dir);
}

// Overwrites `n` bytes in the middle of tensor `name`'s data in its shard.
void Scribble(const std::string& dir, const std::string& name) {
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    if (f.path().extension() != ".safetensors") continue;
    std::fstream io(f.path(), std::ios::in | std::ios::out | std::ios::binary);
    uint64_t header = 0;
    io.read(reinterpret_cast<char*>(&header), 8);
    std::string json(header, '\0');
    io.read(json.data(), static_cast<std::streamsize>(header));
    const size_t at = json.find("\"" + name + "\"");
    if (at == std::string::npos) continue;
    const size_t off = json.find("data_offsets", at);
    const uint64_t begin = std::stoull(json.substr(json.find('[', off) + 1));
    io.seekp(static_cast<std::streamoff>(8 + header + begin + 7));
    io.put('\x5a').put('\x5b');
    return;
  }
  FAIL() << name << " not found";
}

TEST(LayerStream, ACheckpointChangedDuringTheReplayIsAnErrorNamingTheFile) {
  std::string dir;
  auto engine = StreamedLlama("changed", {"tp_size=2"}, &dir);
  ASSERT_TRUE(engine);
  Scribble(dir, "model.layers.1.mlp.up_proj.weight");
  const RunResult r = engine->Run(testing::TwoRequests(2));
  ASSERT_TRUE(r.fault.has_value());
  EXPECT_EQ(r.fault->klass, "error");
  EXPECT_EQ(r.fault->stage, "load");
  EXPECT_EQ(r.fault->kernel, "layer_weights");
  EXPECT_EQ(r.fault->layer, 1);
  EXPECT_THAT(r.fault->message, HasSubstr("tensor 'model.layers.1."));
  EXPECT_THAT(r.fault->message, HasSubstr("was modified after it was opened"));
  EXPECT_THAT(r.fault->message, HasSubstr("the file changed while it was in use"));
  std::filesystem::remove_all(dir);
}

TEST(LayerStream, ATruncatedCheckpointIsAnErrorNotASigbus) {
  std::string dir;
  auto engine = StreamedLlama("truncated", {}, &dir);
  ASSERT_TRUE(engine);
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    if (f.path().extension() == ".safetensors") std::filesystem::resize_file(f.path(), 100);
  }
  const RunResult r = engine->Run(testing::TwoRequests(2));
  ASSERT_TRUE(r.fault.has_value());
  EXPECT_EQ(r.fault->stage, "load");
  EXPECT_THAT(r.fault->message, HasSubstr("changed while it was in use"));
  std::filesystem::remove_all(dir);
}

// The executor side on the CPU: the arrays the ops read keep their address
// while the layers come and go, and hold views of the held layer only.
TEST(LayerStream, DeviceViewsFollowTheHeldLayer) {
  std::string dir;
  auto engine = StreamedLlama("views", {"tp_size=2"}, &dir);
  ASSERT_TRUE(engine);
  const DeviceModel* dm = engine->device_model();
  ASSERT_TRUE(dm->streaming());
  const LinearShardView* q0 = dm->layers()[0].q;
  ASSERT_NE(q0, nullptr);
  EXPECT_EQ(q0[0].w.data, nullptr);
  EXPECT_EQ(q0[0].w.rows, 0);
  ASSERT_TRUE(const_cast<DeviceModel*>(dm)->Hold(0).ok());
  EXPECT_EQ(dm->layers()[0].q, q0);
  EXPECT_EQ(q0[1].w.data, engine->model().layers[0].ranks[1].q.data.data());
  EXPECT_EQ(q0[1].w.rows, 32);
  ASSERT_TRUE(const_cast<DeviceModel*>(dm)->Hold(1).ok());
  EXPECT_EQ(q0[1].w.data, nullptr);
  EXPECT_NE(dm->layers()[1].q[0].w.data, nullptr);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace crashreplay::replay
