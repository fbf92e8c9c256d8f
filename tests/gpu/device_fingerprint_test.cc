// Device fingerprints for real (capture/device_fingerprints.h): our summary
// kernel writes each boundary's record into pinned host memory mapped into
// the device; the next kernel faults (an illegal address, sticky); after
// the error the host reads exactly the records of the boundaries that
// finished, and the recorder writes them, incomplete, before the failure
// record. Also: the same launches captured in a CUDA graph stamp each replay
// with its own step. Each faulting case runs in a child process (a
// "threadsafe" death test) so the poisoned context dies with it. Skips
// without a CUDA device.
#include <cuda_runtime.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "../capture/recorder_test_util.h"
#include "crashreplay/capture/device_fingerprints.h"
#include "crashreplay/capture/recorder.h"
#include "crashreplay/formats/capture_reader.h"
#include "crashreplay/formats/fingerprint.h"
#include "crashreplay/formats/numeric.h"
#include "gpu_test_util.h"

namespace crashreplay::capture {
namespace {

using ::testing::HasSubstr;

// bf16 [4, 6144] of multiples of 0.5 below 64 (every partial sum and sum of
// squares is exact in fp64, in any order, so the device's summary must equal
// the host's SummarizeTensor bit for bit), with a NaN at (1, 7), +Inf at
// (2, 3) and -Inf at (3, 100).
constexpr int64_t kRows = 4, kCols = 6144;
std::vector<uint16_t> Activations(float scale) {
  std::vector<uint16_t> v(kRows * kCols);
  for (size_t i = 0; i < v.size(); ++i) v[i] = FloatToBf16(scale * (static_cast<float>(i % 127) * 0.5f - 31.5f));
  v[1 * kCols + 7] = 0x7fc0;
  v[2 * kCols + 3] = 0x7f80;
  v[3 * kCols + 100] = 0xff80;
  return v;
}

template <typename T>
T* ToDevice(const std::vector<T>& host) {
  void* d = nullptr;
  if (cudaMalloc(&d, host.size() * sizeof(T)) != cudaSuccess) std::_Exit(20);
  if (cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice) != cudaSuccess) std::_Exit(21);
  return static_cast<T*>(d);
}

// Equal to the host summary but for the content hash (the device has none).
bool SameAsHost(const Fingerprint& device, DType dtype, const void* host, uint64_t numel, uint64_t cols) {
  Fingerprint want = SummarizeTensor(device.name, dtype, host, numel, cols);
  want.content_hash.reset();
  if (device == want) return true;
  std::fprintf(stderr, "device: %s\nhost:   %s\n", FingerprintText(device).c_str(), FingerprintText(want).c_str());
  return false;
}

// Child: two boundaries summarised, then a summary of an address the device
// cannot read faults; the host reads the two records after the sticky
// error and the recorder writes them with the failure. Exits 3 when every
// check held, another code naming the first that did not.
[[noreturn]] void FingerprintThenFault(const std::string& dir) {
  auto table = DeviceFingerprints::Create(8);
  if (!table.ok()) std::_Exit(10);
  const std::vector<uint16_t> act = Activations(1.0f);
  std::vector<int32_t> ids(kRows * 8);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 37) % 256);
  uint16_t* d_act = ToDevice(act);
  int32_t* d_ids = ToDevice(ids);
  const int64_t act_shape[] = {kRows, kCols}, ids_shape[] = {kRows, 8}, big[] = {1 << 20};
  if (!(*table)->BeginStep(41, nullptr).ok()) std::_Exit(11);
  if (!(*table)->Enqueue(TensorView{"L3.attention", DType::kBF16, act_shape, d_act, act.size() * 2}, nullptr).ok()) {
    std::_Exit(12);
  }
  if (!(*table)->Enqueue(TensorView{"L3.topk", DType::kI32, ids_shape, d_ids, ids.size() * 4}, nullptr).ok()) {
    std::_Exit(13);
  }
  // Not device memory: the kernel's first load faults (illegal address).
  const void* wild = reinterpret_cast<const void*>(uintptr_t{0x10});
  if (!(*table)->Enqueue(TensorView{"L3.o_proj", DType::kF32, big, wild, 4u << 20}, nullptr).ok()) std::_Exit(14);
  const cudaError_t err = cudaDeviceSynchronize();
  std::fprintf(stderr, "sync: %s\n", cudaGetErrorName(err));
  if (err == cudaSuccess) std::_Exit(15);
  if (cudaDeviceSynchronize() == cudaSuccess) std::_Exit(16);  // sticky

  const FingerprintRecord r = (*table)->Collect(false);
  std::fprintf(stderr, "collected step=%llu boundaries=%zu\n", static_cast<unsigned long long>(r.step),
               r.fingerprints.size());
  if (r.step != 41 || r.complete || r.source != "device" || r.fingerprints.size() != 2) std::_Exit(17);
  if (r.fingerprints[0].name != "L3.attention" || r.fingerprints[1].name != "L3.topk") std::_Exit(18);
  if (!SameAsHost(r.fingerprints[0], DType::kBF16, act.data(), act.size(), kCols)) std::_Exit(19);
  if (!SameAsHost(r.fingerprints[1], DType::kI32, ids.data(), ids.size(), 8)) std::_Exit(22);
  std::fprintf(stderr, "first non-finite (%lld, %lld)\n",
               static_cast<long long>(r.fingerprints[0].first_nonfinite_token),
               static_cast<long long>(r.fingerprints[0].first_nonfinite_column));

  RecorderOptions o;
  o.session_dir = dir;
  o.install_signal_handlers = false;
  auto rec = Recorder::Begin(testing::TestManifest(), o);
  if (!rec.ok()) std::_Exit(23);
  testing::TestBatch b(41, 2);
  if (!(*rec)->RecordStep(b.view()).ok()) std::_Exit(24);
  if (!(*rec)->RecordFingerprints(r).ok()) std::_Exit(25);
  FailureInfo f;
  f.reason = cudaGetErrorString(err);
  f.stage = "decode";
  f.step = 41;
  f.failure_class = FailureClass::kDeviceAssert;
  if (!(*rec)->OnFailure(f).ok()) std::_Exit(26);
  (void)(*rec)->Close();
  auto reader = testing::ReadCapture(SessionRankPath(dir, 0));
  if (reader == nullptr || reader->fingerprints().size() != 1) std::_Exit(27);
  if (!(reader->fingerprints()[0] == FingerprintRecord{41, 0, r.fingerprints, false, "device"})) std::_Exit(28);
  std::fprintf(stderr, "written: last boundary %s\n", reader->fingerprints()[0].fingerprints.back().name.c_str());
  std::_Exit(3);
}

class DeviceFingerprintsTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(DeviceFingerprintsTest, RecordsOfFinishedBoundariesSurviveTheStickyErrorAndAreWritten) {
  CR_REQUIRE_CUDA_DEVICE();
  char tmpl[] = "/tmp/crashreplay-devfp-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  EXPECT_EXIT(FingerprintThenFault(dir), ::testing::ExitedWithCode(3),
              ::testing::AllOf(HasSubstr("sync: cudaErrorIllegalAddress"), HasSubstr("collected step=41 boundaries=2"),
                               HasSubstr("first non-finite (1, 7)"), HasSubstr("written: last boundary L3.topk")));
  std::filesystem::remove_all(dir);
}

TEST_F(DeviceFingerprintsTest, LaunchesCapturedInAGraphStampEachReplayWithItsStep) {
  CR_REQUIRE_CUDA_DEVICE();
  auto table = DeviceFingerprints::Create(4);
  ASSERT_TRUE(table.ok()) << table.status();
  std::vector<uint16_t> act = Activations(1.0f);
  uint16_t* d_act = ToDevice(act);
  const int64_t shape[] = {kRows, kCols};
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_TRUE((*table)->BeginStep(0, stream).ok());
  ASSERT_TRUE((*table)->Enqueue(TensorView{"L0.mlp", DType::kBF16, shape, d_act, act.size() * 2}, stream).ok());
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (uint64_t step = 7; step < 10; ++step) {
    act = Activations(static_cast<float>(step - 6));  // new values at the same address
    ASSERT_EQ(cudaMemcpyAsync(d_act, act.data(), act.size() * 2, cudaMemcpyHostToDevice, stream), cudaSuccess);
    (*table)->NoteGraphStep(step);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const FingerprintRecord r = (*table)->Collect(true);
    EXPECT_EQ(r.step, step);
    ASSERT_EQ(r.fingerprints.size(), 1u);
    EXPECT_TRUE(SameAsHost(r.fingerprints[0], DType::kBF16, act.data(), act.size(), kCols)) << "step " << step;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  cudaFree(d_act);
}

TEST_F(DeviceFingerprintsTest, ABoundaryKeepsItsShapeAndSlotsRunOut) {
  CR_REQUIRE_CUDA_DEVICE();
  auto table = DeviceFingerprints::Create(1);
  ASSERT_TRUE(table.ok()) << table.status();
  std::vector<uint16_t> act = Activations(1.0f);
  uint16_t* d_act = ToDevice(act);
  const int64_t shape[] = {kRows, kCols}, half[] = {kRows / 2, kCols};
  ASSERT_TRUE((*table)->BeginStep(0, nullptr).ok());
  ASSERT_TRUE((*table)->Enqueue(TensorView{"L0.mlp", DType::kBF16, shape, d_act, act.size() * 2}, nullptr).ok());
  const absl::Status reshaped = (*table)->Enqueue(TensorView{"L0.mlp", DType::kBF16, half, d_act, act.size()}, nullptr);
  EXPECT_EQ(reshaped.code(), absl::StatusCode::kInvalidArgument) << reshaped;
  const absl::Status full =
      (*table)->Enqueue(TensorView{"L1.mlp", DType::kBF16, shape, d_act, act.size() * 2}, nullptr);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(d_act);
}

}  // namespace
}  // namespace crashreplay::capture
