// The per-step weight integrity check: a write past the end of a buffer
// into a registered weight is reported within K steps, with tensor and
// byte range; untouched weights never are.
#include <cstring>

#include <gtest/gtest.h>

#include "crashreplay/capture/chunked_hash.h"
#include "crashreplay/capture/recorder.h"
#include "crashreplay/formats/capture_reader.h"
#include "recorder_test_util.h"

namespace crashreplay::testing {
namespace {

using capture::Recorder;
using capture::RecorderOptions;
using capture::TensorView;

constexpr uint64_t kChunk = 4096;
constexpr uint64_t kPerStep = 2 * kChunk;

TEST(WeightIntegrity, OutOfBoundsWriteIntoAWeightIsCaughtWithinKSteps) {
  RecorderTempDir dir;
  // One allocation: an "activation" buffer followed by two weights, as a
  // caching allocator lays them out. A kernel writing past the end of the
  // activation buffer lands in the first weight.
  constexpr size_t kAct = 8192, kW0 = 40960, kW1 = 24576;
  std::vector<std::byte> arena = RandomBytes(kAct + kW0 + kW1, 42);
  std::byte* act = arena.data();
  const int64_t s0[] = {kW0 / 2}, s1[] = {kW1 / 2};
  const TensorView weights[] = {
      {"model.layers.0.mlp.down_proj.weight", DType::kBF16, s0, arena.data() + kAct, kW0},
      {"model.layers.0.mlp.up_proj.weight", DType::kBF16, s1, arena.data() + kAct + kW0, kW1},
  };
  RecorderOptions o;
  o.session_dir = dir.path();
  o.install_signal_handlers = false;
  o.snapshot_ring_bytes = 1 << 20;
  o.weight_chunk_bytes = kChunk;
  o.weight_check_bytes_per_step = kPerStep;
  auto rec = Recorder::Begin(TestManifest(), o);
  ASSERT_TRUE(rec.ok()) << rec.status();
  ASSERT_TRUE((*rec)->RegisterWeights(weights).ok());
  // (40960 + 24576) / 4096 = 16 chunks, 2 per step: K = 8.
  constexpr uint64_t kK = 8, kCorruptAt = 11;
  constexpr size_t kOverrun = kAct + 20000;  // byte 20000 of down_proj
  for (uint64_t step = 0; step < kCorruptAt + kK; ++step) {
    if (step == kCorruptAt) std::memset(act + kOverrun, 0x7f, 16);  // the faulty kernel
    ASSERT_TRUE((*rec)->RecordStep(TestBatch(step, 4).view()).ok());
    ASSERT_TRUE((*rec)->Flush().ok());  // the check of a step runs after it; keep the test's order exact
  }
  EXPECT_EQ((*rec)->stats().weight_check_period_steps, kK);
  ASSERT_TRUE((*rec)->Close().ok());

  auto r = ReadCapture(capture::SessionRankPath(dir.path(), 0));
  ASSERT_NE(r, nullptr);
  ASSERT_EQ(r->weight_checks().size(), kCorruptAt + kK);
  std::optional<uint64_t> caught;
  std::vector<int> covered(16, 0);
  for (const WeightCheckRecord& c : r->weight_checks()) {
    EXPECT_EQ(c.period_steps, kK);
    for (const WeightSlice& s : c.slices) {
      if (c.step < kCorruptAt) {
        EXPECT_FALSE(s.corrupt) << "nothing was corrupt before step " << kCorruptAt << ", step " << c.step;
        const size_t base = s.tensor == weights[0].name ? 0 : kW0;
        covered[(base + s.byte_begin) / kChunk]++;
      }
      if (s.corrupt) {
        EXPECT_EQ(s.tensor, "model.layers.0.mlp.down_proj.weight");
        EXPECT_LE(s.byte_begin, 20000u);
        EXPECT_GE(s.byte_end, 20016u);
        EXPECT_NE(s.hash, s.expected);
        if (!caught) caught = c.step;
      }
    }
  }
  for (int n : covered) EXPECT_GE(n, 1) << "every chunk is checked within K steps";
  ASSERT_TRUE(caught.has_value()) << "the overwrite was never reported";
  EXPECT_LT(*caught, kCorruptAt + kK);
  EXPECT_EQ(r->Summary().corrupt_weight_slices > 0, true);
}

TEST(WeightIntegrity, BudgetSizesTheSliceFromTheStepInterval) {
  RecorderTempDir dir;
  std::vector<std::byte> w = RandomBytes(4 << 20, 7);
  const int64_t shape[] = {static_cast<int64_t>(w.size())};
  const TensorView view{"w", DType::kU8, shape, w.data(), w.size()};
  RecorderOptions o;
  o.session_dir = dir.path();
  o.install_signal_handlers = false;
  o.snapshot_ring_bytes = 1 << 20;
  o.weight_chunk_bytes = 64 << 10;  // budget mode: weight_check_bytes_per_step = 0
  auto rec = Recorder::Begin(TestManifest(), o);
  ASSERT_TRUE(rec.ok()) << rec.status();
  ASSERT_TRUE((*rec)->RegisterWeights({&view, 1}).ok());
  for (uint64_t step = 0; step < 6; ++step) {
    TestBatch b(step, 2);
    capture::StepView v = b.view();
    v.timestamp_nanos = 1'000'000'000 + static_cast<int64_t>(step) * 1'000'000;  // 1 ms steps
    ASSERT_TRUE((*rec)->RecordStep(v).ok());
  }
  ASSERT_TRUE((*rec)->Close().ok());
  auto r = ReadCapture(capture::SessionRankPath(dir.path(), 0));
  ASSERT_NE(r, nullptr);
  ASSERT_EQ(r->weight_checks().size(), 6u);
  // 1% of 1 ms at several GB/s is some tens of KiB: one 64 KiB chunk per
  // step, so K = 64 for 4 MiB; the first step has no interval yet.
  const WeightCheckRecord& last = r->weight_checks().back();
  EXPECT_GE(last.period_steps, 1u);
  EXPECT_EQ(static_cast<uint64_t>(last.period_steps) * last.slices.size() >= 64, true);
  for (const WeightCheckRecord& c : r->weight_checks()) {
    for (const WeightSlice& s : c.slices) EXPECT_FALSE(s.corrupt);
  }
}

}  // namespace
}  // namespace crashreplay::testing

namespace crashreplay::testing {
namespace {

TEST(WeightIntegrity, DeviceWeightsNeedACudaBuildAndDeviceMemory) {
  if (capture::DeviceHashAvailable()) GTEST_SKIP() << "a GPU is present";
  RecorderTempDir dir;
  capture::RecorderOptions o;
  o.session_dir = dir.path();
  o.install_signal_handlers = false;
  o.snapshot_ring_bytes = 1 << 20;
  auto rec = capture::Recorder::Begin(TestManifest(), o);
  ASSERT_TRUE(rec.ok()) << rec.status();
  std::vector<std::byte> host = RandomBytes(4096, 1);
  const int64_t shape[] = {4096};
  const capture::TensorView v{"w", DType::kU8, shape, host.data(), host.size()};
  EXPECT_FALSE((*rec)->RegisterDeviceWeights({&v, 1}).ok());
  EXPECT_EQ((*rec)->stats().weight_bytes, 0u) << "nothing registered after a refusal";
}

}  // namespace
}  // namespace crashreplay::testing
