// Fingerprints (format 2.1): the summary of a tensor, the departure rule,
// and the record's trip through the container. Element bit patterns are the
// IEEE / bfloat16 encodings themselves (0x3C00 is fp16 1.0, 0x7BFF is 65504),
// not values produced by this project's converters.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "capture_test_util.h"
#include "crashreplay/formats/capture_encoder.h"
#include "crashreplay/formats/capture_writer.h"
#include "crashreplay/formats/fingerprint.h"

namespace crashreplay {
namespace {

using testing::ReadFileBytes;
using testing::TempDir;
using testing::TestManifest;
using testing::TestStep;
using testing::WriteFileBytes;

TEST(Fingerprint, Fp16CountsEachKindOfNonFiniteAndSumsTheRest) {
  // [2 tokens, 3 columns]: 1.0, -2.5, 65504 | +Inf, NaN, -Inf
  const uint16_t h[] = {0x3C00, 0xC100, 0x7BFF, 0x7C00, 0x7E00, 0xFC00};
  const Fingerprint f = SummarizeTensor("L1.mlp", DType::kF16, h, 6, 3);
  EXPECT_EQ(f.name, "L1.mlp");
  EXPECT_EQ(f.dtype, "F16");
  EXPECT_EQ(f.numel, 6u);
  EXPECT_EQ(f.nan, 1u);
  EXPECT_EQ(f.pos_inf, 1u);
  EXPECT_EQ(f.neg_inf, 1u);
  EXPECT_EQ(f.first_nonfinite_token, 1);
  EXPECT_EQ(f.first_nonfinite_column, 0);
  EXPECT_EQ(f.min, -2.5);
  EXPECT_EQ(f.max, 65504.0);
  EXPECT_EQ(f.max_abs, 65504.0);
  EXPECT_EQ(f.sum, 1.0 - 2.5 + 65504.0);
  EXPECT_EQ(f.sum_squares, 1.0 + 6.25 + 65504.0 * 65504.0);
  EXPECT_FALSE(f.is_int);
  EXPECT_FALSE(f.content_hash.has_value());
}

TEST(Fingerprint, Bf16AndF32ValuesDecodeExactly) {
  const uint16_t b[] = {0x3F80, 0xC020, 0x7F7F};  // 1.0, -2.5, bf16's largest finite
  const Fingerprint f = SummarizeTensor("x", DType::kBF16, b, 3, 3);
  EXPECT_EQ(f.nonfinite(), 0u);
  EXPECT_EQ(f.first_nonfinite_token, -1);
  EXPECT_EQ(f.max, 0x1.fep127);
  const float v[] = {0.5f, -0.25f, 3.0f, 0.0f};
  const Fingerprint g = SummarizeTensor("y", DType::kF32, v, 4, 2);
  EXPECT_EQ(g.sum, 3.25);
  EXPECT_EQ(g.sum_squares, 0.25 + 0.0625 + 9.0);
  EXPECT_EQ(g.min, -0.25);
}

TEST(Fingerprint, SumsRunInEightInterleavedLanesAddedPairwise) {
  // Values whose fp64 sum depends on the order: the documented order
  // (element i in lane i % 8, lanes added ((0+1)+(2+3))+((4+5)+(6+7)))
  // gives these bits on every host; element order would give others. 21
  // elements: two whole blocks and a tail, a NaN in the second block (its
  // block goes element by element into the same lanes).
  // 1e17 and -1e17 share lane 0 and cancel there; in element order the
  // ones between them are lost (fp64's spacing at 1e17 is 16).
  std::vector<float> v(21, 1.0f);
  v[0] = 1e17f;
  v[8] = -1e17f;
  v[11] = std::nanf("");
  double lane[8] = {}, lane_sq[8] = {}, serial = 0;
  for (int i = 0; i < 21; ++i) {
    if (i == 11) continue;
    lane[i % 8] += v[i];
    lane_sq[i % 8] += static_cast<double>(v[i]) * v[i];
    serial += v[i];
  }
  auto pairwise = [](const double(&l)[8]) { return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7])); };
  const Fingerprint f = SummarizeTensor("x", DType::kF32, v.data(), v.size(), 21);
  EXPECT_EQ(f.sum, pairwise(lane));
  EXPECT_EQ(f.sum, 18.0);
  EXPECT_EQ(f.sum_squares, pairwise(lane_sq));
  EXPECT_NE(f.sum, serial) << "the data no longer tells the orders apart";
  EXPECT_EQ(f.nan, 1u);
  EXPECT_EQ(f.first_nonfinite_column, 11);
}

TEST(Fingerprint, IntegerTensorsGiveTheirRangeAndAHash) {
  const int64_t ids[] = {3, 250, 0, 7};
  const Fingerprint f = SummarizeTensor("L0.topk", DType::kI64, ids, 4, 2, /*hash=*/true);
  EXPECT_TRUE(f.is_int);
  EXPECT_EQ(f.min, 0.0);
  EXPECT_EQ(f.max, 250.0);
  ASSERT_TRUE(f.content_hash.has_value());
  EXPECT_EQ(*f.content_hash, XXH128Of(ids, sizeof(ids)));
}

TEST(Fingerprint, PackedFormatsAreCountedAndHashedWithoutStatistics) {
  const uint8_t fp4[] = {0x12, 0x34};
  const Fingerprint f = SummarizeTensor("q", DType::kF4E2M1, fp4, 4, 4, true);
  EXPECT_EQ(f.numel, 4u);
  EXPECT_EQ(f.sum, 0.0);
  EXPECT_TRUE(f.content_hash.has_value());
}

Fingerprint Floats(std::vector<float> v, const char* dtype = "F32") {
  Fingerprint f = SummarizeTensor("b", DType::kF32, v.data(), v.size(), v.size());
  f.dtype = dtype;
  return f;
}

TEST(FingerprintDeparts, NonFiniteAgainstFiniteAlwaysDeparts) {
  const Fingerprint ref = Floats({1, 2, 3, 4});
  const Fingerprint eng = Floats({1, 2, INFINITY, 4}, "F16");
  const auto why = FingerprintDeparts(eng, ref);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("1 +Inf"), std::string::npos) << *why;
  EXPECT_NE(why->find("reference is finite"), std::string::npos) << *why;
  EXPECT_TRUE(FingerprintDeparts(ref, eng).has_value());
  // Both non-finite: the reference reproduces the engine.
  EXPECT_FALSE(FingerprintDeparts(eng, Floats({NAN, 2, 3, 4})).has_value());
}

TEST(FingerprintDeparts, RoundingIsWithinToleranceAGrossErrorIsNot) {
  const Fingerprint ref = Floats({1.0f, -2.0f, 3.0f, 0.5f});
  // bf16 rounding of the same values (relative 2^-9).
  EXPECT_FALSE(FingerprintDeparts(Floats({1.00390625f, -2.0f, 2.9921875f, 0.5f}, "BF16"), ref).has_value());
  // A kernel that wrote twice the values, or zeros.
  EXPECT_TRUE(FingerprintDeparts(Floats({2.0f, -4.0f, 6.0f, 1.0f}, "BF16"), ref).has_value());
  EXPECT_TRUE(FingerprintDeparts(Floats({0, 0, 0, 0}, "BF16"), ref).has_value());
  // fp32 storage is held tighter than bf16.
  EXPECT_FALSE(FingerprintDeparts(Floats({1.0f, -2.0f, 3.1f, 0.5f}, "BF16"), ref).has_value());
  EXPECT_TRUE(FingerprintDeparts(Floats({1.0f, -2.0f, 3.1f, 0.5f}, "F32"), ref).has_value());
  // Different element counts.
  EXPECT_TRUE(FingerprintDeparts(Floats({1.0f, -2.0f, 3.0f}), ref).has_value());
}

TEST(FingerprintDeparts, AnIndexOutsideTheReferencesRangeDeparts) {
  const int32_t ref_ids[] = {0, 5, 17, 3};
  const int32_t rerouted[] = {0, 6, 17, 3};  // a near-tie routed elsewhere, inside the range
  const int32_t bad[] = {0, 5, 300, 3};
  const Fingerprint ref = SummarizeTensor("L0.topk", DType::kI32, ref_ids, 4, 2);
  EXPECT_FALSE(FingerprintDeparts(SummarizeTensor("L0.topk", DType::kI32, rerouted, 4, 2), ref).has_value());
  const auto why = FingerprintDeparts(SummarizeTensor("L0.topk", DType::kI32, bad, 4, 2), ref);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("300"), std::string::npos) << *why;
}

FingerprintRecord TestRecord(uint64_t step, bool complete) {
  const uint16_t h[] = {0x3C00, 0x7C00, 0x4000, 0x7E00};
  const int64_t ids[] = {1, 2};
  FingerprintRecord r;
  r.step = step;
  r.rank = 0;
  r.complete = complete;
  r.source = "device";
  r.fingerprints = {SummarizeTensor("L0.attention", DType::kF16, h, 4, 2),
                    SummarizeTensor("L0.topk", DType::kI64, ids, 2, 2, true)};
  return r;
}

// Two steps, each followed by its fingerprints (the second incomplete);
// closed cleanly when `close`.
void WriteTwoSteps(const std::string& path, bool close) {
  auto writer = CaptureWriter::Create(path, TestManifest(0));
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->Append(TestStep(0, 0)).ok());
  ASSERT_TRUE((*writer)->Append(TestRecord(0, true)).ok());
  ASSERT_TRUE((*writer)->Append(TestStep(1, 0)).ok());
  ASSERT_TRUE((*writer)->Append(TestRecord(1, false)).ok());
  if (close) {
    ASSERT_TRUE((*writer)->Close().ok());
  }
}

TEST(FingerprintRecordFile, ReadsBackEqualAndIsSkippable) {
  TempDir dir;
  const std::string path = dir.File("fp.crcap");
  WriteTwoSteps(path, /*close=*/true);
  auto reader = CaptureReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  const CaptureReader& r = **reader;
  ASSERT_EQ(r.fingerprints().size(), 2u);
  EXPECT_EQ(r.fingerprints()[0], TestRecord(0, true));
  EXPECT_EQ(r.fingerprints()[1], TestRecord(1, false));
  EXPECT_EQ(r.Summary().fingerprint_records, 2u);
  EXPECT_GE(r.Summary().format_minor, 1);  // written by a 2.1 writer or later
  EXPECT_TRUE(r.Verify().status.ok()) << r.Verify().status;
  // 2.0 readers know no type 11: the frame carries the skippable bit.
  bool seen = false;
  for (const RecordInfo& info : r.records()) {
    if (info.type == static_cast<uint16_t>(RecordType::kFingerprints)) {
      EXPECT_NE(info.flags & kFrameFlagSkippable, 0);
      seen = true;
    }
  }
  EXPECT_TRUE(seen);
}

TEST(FingerprintRecordFile, CutInsideTheRecordKeepsEverythingBefore) {
  TempDir dir;
  const std::string path = dir.File("fp.crcap");
  WriteTwoSteps(path, /*close=*/false);
  std::vector<unsigned char> bytes = ReadFileBytes(path);
  bytes.resize(bytes.size() - 40);  // inside the last record's payload
  WriteFileBytes(path, bytes);
  auto reader = CaptureReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_TRUE((*reader)->truncated());
  ASSERT_EQ((*reader)->fingerprints().size(), 1u);
  EXPECT_EQ((*reader)->fingerprints()[0], TestRecord(0, true));
  EXPECT_EQ((*reader)->steps().size(), 2u);
}

TEST(FingerprintRecordFile, AMalformedPayloadIsCorruptionNotACrash) {
  // A frame of type 11 whose checksum holds but whose payload is no Cap'n
  // Proto message: the scan stops there with a message, earlier records stay.
  TempDir dir;
  const std::string path = dir.File("fp.crcap");
  auto writer = CaptureWriter::Create(path, TestManifest(0));
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->Append(TestStep(0, 0)).ok());
  EncodedFrame junk;
  junk.type = static_cast<uint16_t>(RecordType::kFingerprints);
  const unsigned char payload[] = {0xff, 0xff, 0xff, 0x7f, 1, 2, 3, 4, 5, 6, 7, 8};
  junk.bytes.resize(kFrameHeaderSize + sizeof(payload));
  std::memcpy(junk.bytes.data() + kFrameHeaderSize, payload, sizeof(payload));
  EncodeFrameHeader(junk.type, 0, payload, sizeof(payload), junk.bytes.data());
  ASSERT_TRUE((*writer)->Append(junk).ok());
  ASSERT_TRUE((*writer)->Close().ok());
  auto reader = CaptureReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_FALSE((*reader)->scan_status().ok());
  EXPECT_TRUE((*reader)->fingerprints().empty());
  EXPECT_EQ((*reader)->steps().size(), 1u);
}

}  // namespace
}  // namespace crashreplay
