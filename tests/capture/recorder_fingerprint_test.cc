// The recorder's fingerprints: summaries of host tensors held per step and
// written when the step is over, by a failure path (incomplete, naming the
// last boundary that ran) or by Close().
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "crashreplay/capture/recorder.h"
#include "crashreplay/formats/capture_reader.h"
#include "recorder_test_util.h"

namespace crashreplay::testing {
namespace {

using capture::FailureInfo;
using capture::Recorder;
using capture::RecorderOptions;
using capture::SessionRankPath;
using capture::TensorView;

struct Dir {
  std::string path;
  Dir() {
    char tmpl[] = "/tmp/crashreplay-fp-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~Dir() { std::filesystem::remove_all(path); }
};

RecorderOptions Options(const std::string& dir) {
  RecorderOptions o;
  o.session_dir = dir;
  o.install_signal_handlers = false;
  return o;
}

// fp16 [2, 2]: 1.0, 2.0 | 3.0, +Inf (when `overflow`) or 4.0
const int64_t kShape[] = {2, 2};
std::vector<uint16_t> Half(bool overflow) {
  return {0x3C00, 0x4000, 0x4200, overflow ? uint16_t{0x7C00} : uint16_t{0x4400}};
}

TEST(RecorderFingerprints, HeldPerStepAndWrittenWhenTheNextStepBegins) {
  Dir d;
  auto r = Recorder::Begin(TestManifest(), Options(d.path));
  ASSERT_TRUE(r.ok()) << r.status();
  const std::vector<uint16_t> ok = Half(false), bad = Half(true);
  for (uint64_t step = 0; step < 2; ++step) {
    TestBatch b(static_cast<int>(step), 2);
    ASSERT_TRUE((*r)->RecordStep(b.view()).ok());
    const TensorView a{"", DType::kF16, kShape, ok.data(), 8};
    const TensorView m{"", DType::kF16, kShape, step == 1 ? bad.data() : ok.data(), 8};
    ASSERT_TRUE((*r)->RecordFingerprint(step, "L0.attention", a).ok());
    ASSERT_TRUE((*r)->RecordFingerprint(step, "L0.mlp", m).ok());
  }
  ASSERT_TRUE((*r)->Close().ok());
  auto reader = ReadCapture(SessionRankPath(d.path, 0));
  ASSERT_EQ(reader->fingerprints().size(), 2u);
  const FingerprintRecord& s1 = reader->fingerprints()[1];
  EXPECT_EQ(s1.step, 1u);
  EXPECT_TRUE(s1.complete);
  EXPECT_EQ(s1.source, "host");
  ASSERT_EQ(s1.fingerprints.size(), 2u);
  EXPECT_EQ(s1.fingerprints[0].name, "L0.attention");
  EXPECT_EQ(s1.fingerprints[0].nonfinite(), 0u);
  EXPECT_EQ(s1.fingerprints[1].name, "L0.mlp");
  EXPECT_EQ(s1.fingerprints[1].pos_inf, 1u);
  EXPECT_EQ(s1.fingerprints[1].first_nonfinite_token, 1);
  EXPECT_EQ(s1.fingerprints[1].first_nonfinite_column, 1);
  EXPECT_EQ(s1.fingerprints[1].sum, 6.0);
}

TEST(RecorderFingerprints, AFailureWritesTheFailingStepIncompleteBeforeItsRecord) {
  Dir d;
  auto r = Recorder::Begin(TestManifest(), Options(d.path));
  ASSERT_TRUE(r.ok()) << r.status();
  const std::vector<uint16_t> ok = Half(false);
  TestBatch b(0, 2);
  ASSERT_TRUE((*r)->RecordStep(b.view()).ok());
  const TensorView t{"", DType::kF16, kShape, ok.data(), 8};
  ASSERT_TRUE((*r)->RecordFingerprint(0, "L0.attention", t).ok());
  ASSERT_TRUE((*r)->RecordFingerprint(0, "L0.o_proj", t).ok());
  FailureInfo f;
  f.reason = "CUDA error: device-side assert triggered";
  f.stage = "decode";
  f.step = 0;
  ASSERT_TRUE((*r)->OnFailure(f).ok());
  ASSERT_TRUE((*r)->Close().ok());
  auto reader = ReadCapture(SessionRankPath(d.path, 0));
  ASSERT_EQ(reader->fingerprints().size(), 1u);
  EXPECT_FALSE(reader->fingerprints()[0].complete);
  EXPECT_EQ(reader->fingerprints()[0].fingerprints.back().name, "L0.o_proj");
  // The fingerprints precede the failure record in the file.
  size_t fp_at = 0, failure_at = 0;
  for (const RecordInfo& info : reader->records()) {
    if (info.type == static_cast<uint16_t>(RecordType::kFingerprints)) fp_at = info.index;
    if (info.type == static_cast<uint16_t>(RecordType::kFailure)) failure_at = info.index;
  }
  EXPECT_LT(fp_at, failure_at);
}

TEST(RecorderFingerprints, AMalformedViewIsRefusedAndRecordsNothing) {
  Dir d;
  auto r = Recorder::Begin(TestManifest(), Options(d.path));
  ASSERT_TRUE(r.ok()) << r.status();
  const std::vector<uint16_t> ok = Half(false);
  const TensorView short_bytes{"", DType::kF16, kShape, ok.data(), 6};
  const absl::Status s = (*r)->RecordFingerprint(0, "L0.mlp", short_bytes);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("L0.mlp"), std::string::npos) << s;
  const TensorView no_data{"", DType::kF16, kShape, nullptr, 8};
  EXPECT_TRUE(absl::IsInvalidArgument((*r)->RecordFingerprint(0, "L0.mlp", no_data)));
  ASSERT_TRUE((*r)->Close().ok());
  EXPECT_TRUE(ReadCapture(SessionRankPath(d.path, 0))->fingerprints().empty());
}

}  // namespace
}  // namespace crashreplay::testing
