// activation_dtype: every float a kernel leaves in an activation buffer is a
// value of the engine's storage dtype (bf16 or fp16; the sampler's
// probabilities stay fp32), fp16 overflows to Inf where an fp16 store does,
// fp32 adds nothing to the kernel list, and the step's fingerprints carry
// the stored dtype. Representability is checked against the IEEE bit
// layouts directly (a bf16 value has its low 16 bits zero; an fp16 value
// has at most 11 significant bits and an exponent in fp16's range).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "crashreplay/replay/session/replay_session.h"
#include "engine_test_util.h"

namespace crashreplay::replay {
namespace {

using testing::MakeEngine;
using testing::TwoRequests;

bool IsBf16Value(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return std::isnan(v) || (u & 0xffffu) == 0;
}

bool IsFp16Value(float v) {
  if (!std::isfinite(v) || v == 0.0f) return true;
  const double a = std::fabs(static_cast<double>(v));
  if (a > 65504.0) return false;
  // Subnormals are multiples of 2^-24; normals have 11 significant bits.
  const int e = std::max(std::ilogb(a), -14);
  const double q = std::ldexp(a, 10 - e);
  return q == std::floor(q);
}

// Runs every step of a two-request run kernel by kernel and checks each
// kernel's float outputs after it ran.
void ExpectStored(const std::string& arch, const std::string& dtype, bool (*stored)(float)) {
  MakeModelOptions o;
  o.arch = arch;
  o.quant = "bf16";
  auto engine = MakeEngine(o, {"activation_dtype=" + dtype});
  ASSERT_TRUE(engine);
  StepLogRecorder log;
  RunResult run = engine->Run(TwoRequests(2), &log);
  ASSERT_FALSE(run.fault) << run.fault->message;
  auto fresh = MakeEngine(o, {"activation_dtype=" + dtype});
  ASSERT_TRUE(fresh);
  int64_t checked = 0;
  for (const RecordedStep& rs : log.steps()) {
    auto prog = fresh->Prepare(rs.input);
    while (!prog->done()) {
      prog->RunNext();
      const KernelCall& k = prog->kernels()[prog->records().size() - 1];
      for (const std::string& name : k.outputs) {
        const Buffer* b = prog->buffer(name);
        ASSERT_NE(b, nullptr);
        if (b->is_int || b->is_bytes || name == "probs") continue;
        for (float v : b->f) {
          ASSERT_TRUE(stored(v)) << k.Label() << " wrote " << v << " into " << name << ", not a " << dtype << " value";
          ++checked;
        }
      }
    }
    ASSERT_FALSE(prog->fault());
    for (const crashreplay::Fingerprint& f : prog->fingerprints()) {
      EXPECT_EQ(f.dtype, f.is_int ? "I32" : (dtype == "bf16" ? "BF16" : "F16")) << f.name;
    }
  }
  EXPECT_GT(checked, 1000);
}

TEST(ActivationStore, Bf16OutputsAreBf16ValuesOnGqaAndMla) {
  ExpectStored("llama", "bf16", IsBf16Value);
  ExpectStored("deepseek_v3", "bf16", IsBf16Value);
}

TEST(ActivationStore, Fp16OutputsAreFp16ValuesOnAnMoe) { ExpectStored("qwen3_moe", "fp16", IsFp16Value); }

TEST(ActivationStore, Fp16OverflowsToInfWhereBf16HoldsTheValue) {
  float x[] = {65504.0f, 65519.0f, 65520.0f, -1.0e5f, 1.0e-8f, 3.14159265f};
  StoreOp op;
  op.x = x;
  op.n = 6;
  op.dtype = StoreDType::kF16;
  for (int64_t i = 0; i < Items(op); ++i) RunItem(op, i, nullptr, nullptr);
  EXPECT_EQ(x[0], 65504.0f);
  EXPECT_EQ(x[1], 65504.0f);  // below the rounding boundary
  EXPECT_EQ(x[2], INFINITY);  // 65520 rounds up past fp16's largest finite
  EXPECT_EQ(x[3], -INFINITY);
  EXPECT_EQ(x[4], 0.0f);      // under half of fp16's smallest subnormal (2^-24)
  EXPECT_EQ(x[5], 3.140625f);
  float y[] = {1.0e5f, 3.14159265f};
  op.x = y;
  op.n = 2;
  op.dtype = StoreDType::kBf16;
  for (int64_t i = 0; i < Items(op); ++i) RunItem(op, i, nullptr, nullptr);
  EXPECT_EQ(y[0], 99840.0f);  // bf16: 8 significant bits
  EXPECT_EQ(y[1], 3.140625f);
}

TEST(ActivationStore, Fp32AddsNoStoreAndKeepsTheDigests) {
  MakeModelOptions o;
  o.arch = "qwen3";
  o.quant = "fp8";
  auto plain = MakeEngine(o, {});
  auto f32 = MakeEngine(o, {"activation_dtype=fp32"});
  ASSERT_TRUE(plain && f32);
  StepLogRecorder a, b;
  plain->Run(TwoRequests(3, 0.8f), &a);
  f32->Run(TwoRequests(3, 0.8f), &b);
  ASSERT_EQ(a.steps().size(), b.steps().size());
  for (size_t i = 0; i < a.steps().size(); ++i) {
    EXPECT_EQ(a.steps()[i].digest, b.steps()[i].digest);
    EXPECT_EQ(a.steps()[i].kernel_digests, b.steps()[i].kernel_digests);
  }
  auto prog = f32->Prepare(a.steps()[0].input);
  for (const KernelCall& k : prog->kernels()) {
    for (const Op& op : k.ops) EXPECT_NE(KindOf(op), OpKind::kStore) << k.Label();
  }
  // And bf16 does change the bits.
  auto bf16 = MakeEngine(o, {"activation_dtype=bf16"});
  StepLogRecorder c;
  bf16->Run(TwoRequests(3, 0.8f), &c);
  EXPECT_NE(a.steps()[0].digest, c.steps()[0].digest);
}

}  // namespace
}  // namespace crashreplay::replay
