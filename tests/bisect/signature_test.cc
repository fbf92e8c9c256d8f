#include "crashreplay/bisect/signature.h"

#include <gtest/gtest.h>

namespace crashreplay::bisect {
namespace {

FailureSignature Assert(const std::string& kernel, std::optional<int64_t> step) {
  FailureSignature s;
  s.failure_class = FailureClass::kDeviceAssert;
  s.stage = FailureStage::kDecode;
  s.kernel = kernel;
  s.check = "page_index_in_pool";
  s.step = step;
  return s;
}

TEST(Signature, SameBugComparesClassStageKernelAndCheckOnly) {
  FailureSignature a = Assert("paged_decode", 17);
  FailureSignature b = Assert("paged_decode", 42);
  b.detail = "index 9000 >= 8192";
  EXPECT_TRUE(SameBug(a, b));  // step and detail vary between runs of one bug
  FailureSignature other_kernel = Assert("flash_decode", 17);
  EXPECT_FALSE(SameBug(a, other_kernel));
  FailureSignature oom = a;
  oom.failure_class = FailureClass::kOom;
  EXPECT_FALSE(SameBug(a, oom));
  FailureSignature prefill = a;
  prefill.stage = FailureStage::kPrefill;
  EXPECT_FALSE(SameBug(a, prefill));
  FailureSignature check = a;
  check.check = "token_id_in_vocab";
  EXPECT_FALSE(SameBug(a, check));
}

TEST(Signature, JsonRoundTripsWithTheDocumentedKeys) {
  FailureSignature s = Assert("paged_decode", 17);
  s.detail = "page 9000";
  const nlohmann::json j = SignatureToJson(s);
  EXPECT_EQ(j["class"], "device_assert");
  EXPECT_EQ(j["stage"], "decode");
  EXPECT_EQ(j["kernel"], "paged_decode");
  EXPECT_EQ(j["check"], "page_index_in_pool");
  EXPECT_EQ(j["step"], 17);
  auto back = SignatureFromJson(j);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, s);
}

TEST(Signature, EveryClassAndStageNameRoundTrips) {
  for (auto c :
       {FailureClass::kNone, FailureClass::kDeviceAssert, FailureClass::kOom, FailureClass::kNonFinite,
        FailureClass::kOutputMismatch, FailureClass::kTimeout, FailureClass::kCrashSignal, FailureClass::kOther}) {
    EXPECT_EQ(ParseFailureClass(FailureClassName(c)), c);
  }
  for (auto s : {FailureStage::kLoad, FailureStage::kGraphCapture, FailureStage::kPrefill, FailureStage::kDecode,
                 FailureStage::kUnknown}) {
    EXPECT_EQ(ParseFailureStage(FailureStageName(s)), s);
  }
}

TEST(Signature, FromJsonRejectsMalformedInputWithAReason) {
  auto missing = SignatureFromJson(nlohmann::json::parse(R"({"stage":"decode"})"));
  EXPECT_NE(std::string(missing.status().message()).find("missing 'class'"), std::string::npos);
  auto unknown = SignatureFromJson(nlohmann::json::parse(R"({"class":"assert"})"));
  EXPECT_NE(std::string(unknown.status().message()).find("unknown class 'assert'"), std::string::npos);
  auto stage = SignatureFromJson(nlohmann::json::parse(R"({"class":"oom","stage":"warmup"})"));
  EXPECT_NE(std::string(stage.status().message()).find("unknown stage"), std::string::npos);
  EXPECT_FALSE(SignatureFromJson(nlohmann::json::parse(R"({"class":"oom","step":"7"})")).ok());
  EXPECT_FALSE(SignatureFromJson(nlohmann::json::parse(R"([1])")).ok());
  // Minimal form: class only.
  auto minimal = SignatureFromJson(nlohmann::json::parse(R"({"class":"oom"})"));
  ASSERT_TRUE(minimal.ok());
  EXPECT_EQ(minimal->stage, FailureStage::kUnknown);
}

TEST(Signature, DescriptionTellsAnOomFromAnAssert) {
  FailureSignature oom;
  oom.failure_class = FailureClass::kOom;
  oom.stage = FailureStage::kGraphCapture;
  EXPECT_EQ(DescribeSignature(oom), "oom during graph_capture");
  EXPECT_EQ(DescribeSignature(Assert("paged_decode", 17)),
            "device_assert during decode at paged_decode/page_index_in_pool (step 17)");
}

}  // namespace
}  // namespace crashreplay::bisect
