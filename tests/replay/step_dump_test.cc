// Dumping a replayed step's kernel outputs: patterns select kernels by label,
// every dumped kernel's tensors hash to the digest the replay reported, the
// file does not depend on the thread count, and a faulting step dumps what
// ran up to and including the faulting kernel.
#include "crashreplay/replay/session/step_dump.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"

#include "crashreplay/formats/safetensors_file.h"
#include "engine_test_util.h"

namespace crashreplay::replay {
namespace {

using testing::MakeEngine;
using testing::TwoRequests;

MakeModelOptions Glm() {
  MakeModelOptions o;
  o.arch = "glm4_moe";
  o.quant = "nvfp4";
  return o;
}

std::vector<RecordedStep> Record(const std::vector<std::string>& sets) {
  auto e = MakeEngine(Glm(), sets);
  StepLogRecorder rec;
  e->Run(TwoRequests(3), &rec);
  return rec.steps();
}

std::string TempPath(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("step_dump_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Replays `step` with a dump of `patterns`, writes it to `path`.
ReplayReport ReplayAndDump(const std::vector<RecordedStep>& log, const std::vector<std::string>& sets, int64_t step,
                           const std::string& patterns, const std::string& path, int threads = 1) {
  auto e = MakeEngine(Glm(), sets, threads);
  auto p = KernelPatterns::Parse(patterns);
  EXPECT_TRUE(p.ok()) << p.status();
  StepDump dump(std::move(*p));
  ReplayOptions o;
  o.observer = &dump;
  ReplayReport r = ReplayStep(*e, log, step, o);
  DumpContext ctx;
  ctx.capture = "in-memory";
  ctx.step = step;
  ctx.start = "re-executed";
  EXPECT_TRUE(dump.Write(path, ctx, r).ok());
  return r;
}

TEST(KernelPatterns, GlobsOverLabelsCommaSeparated) {
  auto p = KernelPatterns::Parse("L*.attention, logits_*");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->Matches("L0.attention"));
  EXPECT_TRUE(p->Matches("L12.attention"));
  EXPECT_TRUE(p->Matches("logits_all_gather"));
  EXPECT_FALSE(p->Matches("L0.o_proj"));
  EXPECT_FALSE(p->Matches("lm_head"));
  auto all = KernelPatterns::Parse("");
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(all->Matches("anything"));
  EXPECT_FALSE(KernelPatterns::Parse("L0.*,,lm_head").ok());
}

TEST(KernelPatterns, APatternMatchingNoKernelNamesItAndListsKernels) {
  auto p = KernelPatterns::Parse("L0.*,L9.attention");
  ASSERT_TRUE(p.ok());
  const std::vector<std::string> labels = {"embedding", "L0.input_norm", "L0.attention", "lm_head"};
  absl::Status s = p->CheckAgainst(labels);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  const std::string m(s.message());
  EXPECT_NE(m.find("'L9.attention'"), std::string::npos) << m;
  EXPECT_EQ(m.find("'L0.*'"), std::string::npos) << m;  // that one matches
  EXPECT_NE(m.find("L0.input_norm"), std::string::npos) << m;
  EXPECT_NE(m.find("L<layer>.<kernel>"), std::string::npos) << m;
  EXPECT_TRUE(KernelPatterns::Parse("L0.*,lm_head")->CheckAgainst(labels).ok());
}

TEST(StepDump, EveryKernelsTensorsHashToItsReportedDigest) {
  const auto log = Record({});
  const std::string path = TempPath("all.safetensors");
  ReplayReport r = ReplayAndDump(log, {}, 1, "", path);
  ASSERT_EQ(r.outcome, "reproduced") << r.detail;
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  const auto& md = (*f)->metadata();
  EXPECT_EQ(md.at("step"), "1");
  EXPECT_EQ(md.at("mode"), "decode");
  EXPECT_EQ(md.at("complete"), "true");
  EXPECT_EQ(md.at("outcome"), "reproduced");
  const auto order = nlohmann::json::parse(md.at("kernel_order"));
  ASSERT_EQ(order.size(), r.kernels.size());
  // Every kernel with an activation output is there; its tensors, hashed in
  // output order, give the digest the replay computed.
  auto e = MakeEngine(Glm(), {});
  auto prog = e->Prepare(log[1].input);
  size_t tensors = 0;
  for (size_t i = 0; i < prog->kernels().size(); ++i) {
    const KernelCall& k = prog->kernels()[i];
    EXPECT_EQ(order[i], k.Label());
    Hasher128 h;
    for (const std::string& out : k.outputs) {
      if (out == "kv_cache") continue;
      const TensorInfo* t = (*f)->Find(k.Label() + "." + out);
      ASSERT_NE(t, nullptr) << k.Label() << "." << out;
      // NVFP4-quantized activations (the w4a4 default) are packed bytes.
      const bool packed = absl::EndsWith(k.name, "act_quant");
      EXPECT_EQ(t->dtype, out == "next_tokens" || out == "topk_ids" ? DType::kI32
                          : packed                                  ? DType::kU8
                                                                    : DType::kF32)
          << k.Label() << "." << out;
      auto bytes = (*f)->Data(*t);
      h.Update(bytes.data(), bytes.size());
      tensors += 1;
    }
    EXPECT_EQ(h.Digest(), r.kernels[i].digest) << k.Label();
  }
  EXPECT_EQ((*f)->tensors().size(), tensors);
  // The logits' argmax is the greedy token the recording sampled.
  const TensorInfo* lg = (*f)->Find("logits_all_gather.logits");
  ASSERT_NE(lg, nullptr);
  ASSERT_EQ(lg->shape.size(), 2u);
  const float* v = reinterpret_cast<const float*>((*f)->Data(*lg).data());
  for (int64_t row = 0; row < lg->shape[0]; ++row) {
    int64_t best = 0;
    for (int64_t j = 1; j < lg->shape[1]; ++j)
      best = v[row * lg->shape[1] + j] > v[row * lg->shape[1] + best] ? j : best;
    EXPECT_EQ(best, log[1].sampled[row]) << "row " << row;
  }
}

TEST(StepDump, PatternsSelectKernelsAndTheFileDoesNotDependOnThreads) {
  const auto log = Record({});
  const std::string a = TempPath("sel1.safetensors"), b = TempPath("sel2.safetensors");
  ReplayAndDump(log, {}, 2, "L*.attention,sampler", a, 1);
  ReplayAndDump(log, {}, 2, "L*.attention,sampler", b, 2);
  const std::string bytes = ReadAll(a);
  ASSERT_FALSE(bytes.empty());
  EXPECT_EQ(bytes, ReadAll(b));
  auto f = SafetensorsFile::Open(a);
  ASSERT_TRUE(f.ok()) << f.status();
  std::vector<std::string> names;
  for (const TensorInfo& t : (*f)->tensors()) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"L0.attention.attn", "L1.attention.attn", "sampler.next_tokens"}));
  EXPECT_EQ(nlohmann::json::parse((*f)->metadata().at("kernels")),
            nlohmann::json({"L0.attention", "L1.attention", "sampler"}));
}

TEST(StepDump, AFaultingStepDumpsUpToAndIncludingTheFaultingKernel) {
  const std::vector<std::string> bad = {"attention_backend=paged64"};
  const auto log = Record(bad);
  ASSERT_EQ(log.size(), 2u);
  const std::string path = TempPath("fault.safetensors");
  ReplayReport r = ReplayAndDump(log, bad, 1, "", path);
  ASSERT_EQ(r.outcome, "failed");
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  const auto& md = (*f)->metadata();
  EXPECT_EQ(md.at("complete"), "false");
  EXPECT_EQ(md.at("fault"), "assert/decode/attention/page_size_is_64");
  EXPECT_EQ(md.at("fault_kernel"), "L0.attention");
  const auto order = nlohmann::json::parse(md.at("kernel_order"));
  EXPECT_EQ(order.back(), "L0.attention");
  EXPECT_NE((*f)->Find("L0.attention.attn"), nullptr);
  EXPECT_NE((*f)->Find("L0.rope.q"), nullptr);
  EXPECT_EQ((*f)->Find("L0.o_proj.partial"), nullptr);  // never ran
}

}  // namespace
}  // namespace crashreplay::replay
