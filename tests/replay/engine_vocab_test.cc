// The serving engines' words (engine_vocab.h), the kernel architecture table
// (kernel_archs.h) and the faults they lead to.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "crashreplay/replay/config/engine_vocab.h"
#include "crashreplay/replay/config/kernel_archs.h"
#include "crashreplay/replay/config/toggles.h"
#include "engine_test_util.h"

namespace crashreplay::replay {
namespace {

Config FromSglang(const EngineSettings& s, std::vector<std::string>* notes = nullptr, std::string arch = "any") {
  Config c = Config::Defaults();
  EXPECT_TRUE(c.Set("device_arch", arch).ok());
  VocabResult r;
  absl::Status st = ApplyEngineSettings("sglang", s, &c, &r);
  EXPECT_TRUE(st.ok()) << st;
  if (notes) *notes = r.notes;
  return c;
}

bool AnyContains(const std::vector<std::string>& v, std::string_view what) {
  return std::any_of(v.begin(), v.end(), [&](const std::string& n) { return n.find(what) != std::string::npos; });
}

TEST(EngineVocabulary, EveryRowSetsToggleValuesTheTableAccepts) {
  for (const VocabRow& r : EngineVocabulary()) {
    for (const auto& [toggle, value] : r.sets) {
      const ToggleSpec* spec = FindToggle(toggle);
      ASSERT_NE(spec, nullptr) << r.engine << " " << r.key << " sets unknown toggle " << toggle;
      if (value == "$") {
        EXPECT_EQ(r.value, "*") << r.key;
        continue;
      }
      EXPECT_TRUE(ParseToggleValue(*spec, value).ok()) << r.key << " = " << r.value << " -> " << toggle << "=" << value;
      if (std::string_view(toggle).find("kernel") != std::string_view::npos) {
        EXPECT_NE(FindKernelLibrary(value), nullptr) << value;
      }
    }
  }
}

TEST(EngineVocabulary, SglangBackendsBecomeKernelVariantsAndTheLibrariesTheyStandFor) {
  const Config c = FromSglang({{"attention_backend", "fa3"},
                               {"decode_attention_backend", "flashmla"},
                               {"moe_runner_backend", "deep_gemm"},
                               {"kv_cache_dtype", "fp8_e4m3"},
                               {"page_size", "64"},
                               {"tp_size", "8"},
                               {"ep_size", "8"}});
  EXPECT_EQ(c.Enum("attention_backend"), "paged64") << "decode_attention_backend wins for decode";
  EXPECT_EQ(c.Enum("attention_kernel"), "flashmla_dense");
  EXPECT_EQ(c.Enum("prefill_attention_kernel"), "fa3") << "prefill keeps attention_backend's kernel";
  EXPECT_EQ(c.Enum("moe_kernel"), "deep_gemm");
  EXPECT_EQ(c.Enum("kv_cache_dtype"), "fp8_e4m3");
  EXPECT_EQ(c.Int("page_size"), 64);
  EXPECT_EQ(c.Int("tp_size"), 8);
  EXPECT_EQ(c.Enum("moe_parallel"), "expert");
}

TEST(EngineVocabulary, NewerSpellingsWinOverOlderOnesWhateverTheOrderGiven) {
  const Config c = FromSglang({{"dsa_decode_backend", "flashmla_kv"},
                               {"nsa_decode_backend", "trtllm"},
                               {"nsa_prefill_backend", "tilelang"},
                               {"cuda_graph_max_bs_decode", "256"},
                               {"cuda_graph_max_bs", "512"}});
  EXPECT_EQ(c.Enum("dsa_kernel"), "flashmla_sparse");
  EXPECT_EQ(c.Enum("dsa_prefill_kernel"), "tilelang") << "only the older name given";
  EXPECT_EQ(c.Int("cuda_graph_max_bs"), 256) << "the decode maximum wins";
  const Config off = FromSglang({{"cuda_graph_max_bs", "512"}, {"disable_cuda_graph", "True"}});
  EXPECT_EQ(off.Int("cuda_graph_max_bs"), 0);
}

TEST(EngineVocabulary, AValueWithoutCounterpartIsANoteAndChangesNothing) {
  std::vector<std::string> notes;
  const Config c =
      FromSglang({{"attention_backend", "fa4"}, {"kv_cache_dtype", "fp8_e5m2"}, {"host", "0.0.0.0"}}, &notes);
  Config expected = Config::Defaults();
  ASSERT_TRUE(expected.Set("mla_decode", "absorbed").ok());  // what sglang always runs, whatever it is told
  EXPECT_EQ(c, expected);
  EXPECT_TRUE(AnyContains(notes, "attention_backend = fa4")) << notes.size();
  EXPECT_TRUE(AnyContains(notes, "kv_cache_dtype = fp8_e5m2"));
  EXPECT_FALSE(AnyContains(notes, "host")) << "settings outside the table are not kernel configuration";
}

TEST(EngineVocabulary, SglangDeepGemmReadsUe8m0ScalesOnBlackwellUnlessTurnedOff) {
  std::vector<std::string> notes;
  EXPECT_EQ(FromSglang({}, &notes, "sm_120").Enum("scale_format"), "deepgemm_ue8m0") << "JIT DeepGEMM is on by default";
  EXPECT_TRUE(AnyContains(notes, "SGLANG_ENABLE_JIT_DEEPGEMM=0"));
  EXPECT_EQ(FromSglang({}, nullptr, "sm_100").Enum("scale_format"), "deepgemm_ue8m0");
  EXPECT_EQ(FromSglang({}, nullptr, "sm_90").Enum("scale_format"), "checkpoint") << "Hopper keeps fp32 scales";
  EXPECT_EQ(FromSglang({{"env.SGLANG_ENABLE_JIT_DEEPGEMM", "0"}}, nullptr, "sm_120").Enum("scale_format"),
            "checkpoint");
  EXPECT_EQ(FromSglang({{"env.SGL_ENABLE_JIT_DEEPGEMM", "false"}}, nullptr, "sm_120").Enum("scale_format"),
            "checkpoint")
      << "the older variable name";
  EXPECT_EQ(FromSglang({{"deepgemm.DEEPGEMM_SCALE_UE8M0", "false"}}, nullptr, "sm_120").Enum("scale_format"),
            "checkpoint")
      << "sglang's own recorded decision wins over the derivation";
  EXPECT_EQ(FromSglang({}, nullptr, "any").Enum("scale_format"), "checkpoint") << "unknown device: unchanged";
}

TEST(EngineVocabulary, VllmConfigNamesMapToo) {
  Config c = Config::Defaults();
  VocabResult r;
  ASSERT_TRUE(ApplyEngineSettings("vllm",
                                  {{"cache_config.block_size", "32"},
                                   {"cache_config.cache_dtype", "fp8"},
                                   {"cache_config.gpu_memory_utilization", "0.9"},
                                   {"parallel_config.tensor_parallel_size", "2"},
                                   {"attention_config.backend", "FLASHINFER"},
                                   {"model_config.enforce_eager", "True"},
                                   {"env.VLLM_USE_DEEP_GEMM", "1"},
                                   {"env.VLLM_USE_DEEP_GEMM_E8M0", "1"}},
                                  &c, &r)
                  .ok());
  EXPECT_EQ(c.Int("page_size"), 32);
  EXPECT_EQ(c.Enum("kv_cache_dtype"), "fp8_e4m3");
  EXPECT_DOUBLE_EQ(c.Float("mem_fraction_static"), 0.9);
  EXPECT_EQ(c.Int("tp_size"), 2);
  EXPECT_EQ(c.Enum("attention_kernel"), "flashinfer");
  EXPECT_EQ(c.Int("cuda_graph_max_bs"), 0);
  EXPECT_EQ(c.Enum("moe_kernel"), "deep_gemm");
  EXPECT_EQ(c.Enum("scale_format"), "deepgemm_ue8m0");
}

TEST(EngineVocabulary, AFileValueOutsideTheDomainIsAnErrorARecordedOneANote) {
  Config c = Config::Defaults();
  VocabResult r;
  absl::Status s = ApplyEngineSettings("sglang", {{"page_size", "-3"}}, &c, &r);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("page_size = -3"), std::string::npos) << s;
  ASSERT_TRUE(ApplyEngineSettings("sglang", {{"page_size", "-3"}}, &c, &r, /*lenient=*/true).ok());
  EXPECT_EQ(c.Int("page_size"), 16);
  EXPECT_TRUE(AnyContains(r.notes, "page_size = -3"));
}

TEST(EngineVocabulary, AConfigFileInSglangWordsAppliesThroughTheVocabulary) {
  Config c = Config::Defaults();
  std::vector<std::string> notes;
  ASSERT_TRUE(c.ApplyText("engine = \"sglang\"\nattention_backend = \"flashinfer\"\nmem_fraction_static = 0.95\n"
                          "env.SGLANG_ENABLE_JIT_DEEPGEMM = \"0\"\ncrashreplay.device_arch = \"sm_120\"\n"
                          "speculative_algorithm = \"EAGLE\"\n",
                          "launch.toml", &notes)
                  .ok());
  EXPECT_EQ(c.Enum("attention_backend"), "flashdecode");
  EXPECT_DOUBLE_EQ(c.Float("mem_fraction_static"), 0.95);
  EXPECT_EQ(c.Enum("device_arch"), "sm_120");
  EXPECT_EQ(c.Enum("scale_format"), "checkpoint");
  Config d = Config::Defaults();
  absl::Status s = d.ApplyText("engine = \"tgi\"\npage_size = 16\n", "x.toml");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("engine 'tgi'"), std::string::npos) << s;
}

TEST(KernelArchs, TheTableSaysWhereEachLibraryRuns) {
  const KernelLibrary* sparse = FindKernelLibrary("flashmla_sparse");
  ASSERT_NE(sparse, nullptr);
  EXPECT_TRUE(ArchSupported(*sparse, 90));
  EXPECT_TRUE(ArchSupported(*sparse, 100));
  EXPECT_FALSE(ArchSupported(*sparse, 120)) << "FlashMLA has no SM120 kernels";
  EXPECT_TRUE(ArchSupported(*sparse, 0)) << "device_arch any checks nothing";
  EXPECT_FALSE(ArchSupported(*FindKernelLibrary("deepgemm_mqa_logits"), 120));
  EXPECT_FALSE(ArchSupported(*FindKernelLibrary("fa3"), 100));
  EXPECT_TRUE(ArchSupported(*FindKernelLibrary("triton"), 120));
  EXPECT_FALSE(ArchSupported(*FindKernelLibrary("aiter"), 90)) << "ROCm only";
  EXPECT_EQ(ParseArch("sm_120"), 120);
  EXPECT_EQ(ParseArch("any"), 0);
  EXPECT_EQ(ParseArch("sm120"), -1);
  for (std::string_view a : ArchChoices()) EXPECT_GE(ParseArch(a), 0) << a;
}

// The check runs where the kernel would launch: the step fails at the first
// kernel whose library has no code for the device, with class unsupported_arch.
TEST(KernelArchs, AKernelWithoutCodeForTheDeviceFailsWithItsOwnSignature) {
  MakeModelOptions o;
  o.arch = "qwen3_moe";
  auto bad = testing::MakeEngine(o, {"moe_kernel=deep_gemm", "device_arch=sm_120"});
  ASSERT_NE(bad, nullptr);
  RunResult r = bad->Run(testing::TwoRequests(2));
  ASSERT_TRUE(r.fault.has_value());
  EXPECT_EQ(r.fault->Signature(), "unsupported_arch/prefill/experts/deep_gemm_on_sm_120");
  EXPECT_EQ(r.fault->layer, 0);
  EXPECT_NE(r.fault->message.find("Unsupported architecture"), std::string::npos) << r.fault->message;
  EXPECT_EQ(r.fault->ToJson()["signature"]["class"], "unsupported_arch");

  auto hopper = testing::MakeEngine(o, {"moe_kernel=deep_gemm", "device_arch=sm_90"});
  ASSERT_NE(hopper, nullptr);
  RunResult h = hopper->Run(testing::TwoRequests(2));
  EXPECT_FALSE(h.fault.has_value()) << h.fault->message;
  auto plain = testing::MakeEngine(o, {});
  RunResult p = plain->Run(testing::TwoRequests(2));
  EXPECT_EQ(h.outputs, p.outputs) << "a library name changes where a kernel may run, not its arithmetic";

  auto decode_only = testing::MakeEngine(o, {"attention_kernel=fa3", "device_arch=sm_120"});
  RunResult d = decode_only->Run(testing::TwoRequests(2));
  ASSERT_TRUE(d.fault.has_value());
  EXPECT_EQ(d.fault->Signature(), "unsupported_arch/decode/attention/fa3_on_sm_120") << "prefill used its own kernel";
}

}  // namespace
}  // namespace crashreplay::replay
