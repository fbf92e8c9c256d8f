// Round trips through the capture container: what a writer appends, a
// reader returns unchanged; blobs are stored once per content hash; the
// shuffle is lossless and pays off on bf16; the version rule holds.
#include <gtest/gtest.h>
#include <zstd.h>

#include <limits>
#include <set>
#include <thread>

#include "capture_test_util.h"
#include "crashreplay/formats/blob_codec.h"
#include "crashreplay/formats/capture_encoder.h"

namespace crashreplay {
namespace {

using testing::Bf16Normal;
using testing::Describe;
using testing::ReadFileBytes;
using testing::TempDir;
using testing::TestManifest;
using testing::TestStep;
using testing::WriteFileBytes;
using testing::WriteSmallCapture;

TEST(CaptureRoundTrip, EveryRecordKindReadsBackEqual) {
  TempDir dir;
  const std::string path = dir.File("c.crcap");
  WriteSmallCapture(path, 3, /*close=*/true);
  auto reader = CaptureReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  const CaptureReader& r = **reader;
  EXPECT_TRUE(r.scan_status().ok()) << r.scan_status();

  SessionManifest expected = TestManifest(0);
  expected.format_major = kCaptureMajorVersion;
  expected.format_minor = kCaptureMinorVersion;
  ASSERT_TRUE(r.manifest().has_value());
  EXPECT_EQ(*r.manifest(), expected);

  ASSERT_EQ(r.steps().size(), 3u);
  for (uint64_t i = 0; i < 3; ++i) {
    const auto own = Bf16Normal(64, 100 + static_cast<uint32_t>(i));
    EXPECT_EQ(r.steps()[i], TestStep(i, 0, {Describe("input_ids", own, false)}));
  }
  ASSERT_EQ(r.snapshots().size(), 3u);
  ASSERT_EQ(r.weight_hashes().size(), 1u);
  EXPECT_EQ(r.weight_hashes()[0].shards, expected.weights);
  ASSERT_EQ(r.failures().size(), 1u);
  EXPECT_EQ(r.failures()[0].reason, "CUDA error: device-side assert triggered");
  EXPECT_EQ(r.failures()[0].failure_class, FailureClass::kDeviceAssert);
  EXPECT_EQ(r.failures()[0].step, std::optional<uint64_t>(3));
  ASSERT_EQ(r.weight_checks().size(), 1u);
  EXPECT_EQ(r.weight_checks()[0].slices[0].byte_end, 512u);
  ASSERT_TRUE(r.dropped().has_value());
  EXPECT_EQ(r.dropped()->snapshots_dropped, 2u);

  // Every stored tensor's bytes come back bit-exact.
  for (const SnapshotRecord& s : r.snapshots()) {
    for (const TensorDescriptor& t : s.tensors) {
      auto bytes = r.ReadBlob(t.content_hash);
      ASSERT_TRUE(bytes.ok()) << bytes.status();
      EXPECT_EQ(bytes->size(), t.byte_size);
      EXPECT_EQ(XXH128Of(bytes->data(), bytes->size()), t.content_hash);
    }
  }
  const CaptureSummary sum = r.Summary();
  EXPECT_TRUE(sum.ok);
  EXPECT_FALSE(sum.truncated);
  EXPECT_EQ(sum.steps, 3u);
  EXPECT_EQ(sum.ranks, std::vector<uint32_t>{0});
  EXPECT_EQ(sum.blobs, 4u);  // one shared + three per-step
  EXPECT_EQ(sum.bytes, ReadFileBytes(path).size());
  EXPECT_EQ(sum.snapshots_dropped, 2u);
  ASSERT_TRUE(r.end().has_value());
  EXPECT_TRUE(r.end()->ok);
  EXPECT_TRUE(r.Verify().status.ok()) << r.Verify().status;
}

TEST(CaptureRoundTrip, SameBytesAreStoredOnceHoweverOftenReferenced) {
  TempDir dir;
  const std::string path = dir.File("dedup.crcap");
  WriteSmallCapture(path, 5, /*close=*/true, /*tensor_elems=*/4096);
  auto reader = CaptureReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  size_t blob_frames = 0;
  for (const RecordInfo& rec : (*reader)->records())
    blob_frames += rec.type == static_cast<uint16_t>(RecordType::kBlob);
  EXPECT_EQ(blob_frames, 6u);  // 5 step-own + 1 shared, referenced 5 times
  EXPECT_EQ((*reader)->Summary().duplicate_blobs, 0u);
  const auto shared = Bf16Normal(4096, 7);
  int refs = 0;
  for (const SnapshotRecord& s : (*reader)->snapshots()) {
    for (const TensorDescriptor& t : s.tensors) refs += t.content_hash == XXH128Of(shared.data(), shared.size());
  }
  EXPECT_EQ(refs, 5);
}

TEST(CaptureRoundTrip, ByteShuffleIsLosslessForAnySizeAndElementSize) {
  for (size_t k : {2u, 3u, 4u, 8u}) {
    for (size_t n : {0u, 1u, 2u, 3u, 7u, 8u, 17u, 31u, 32u, 33u, 1000u, 4099u}) {
      std::vector<unsigned char> in(n), mid(n), out(n);
      for (size_t i = 0; i < n; ++i) in[i] = static_cast<unsigned char>(i * 37 + k);
      ShuffleBytePlanes(in.data(), n, k, mid.data());
      const size_t elems = n / k;
      for (size_t i = 0; i < elems * k; ++i) {  // the layout docs/formats/capture.md defines
        ASSERT_EQ(mid[(i % k) * elems + i / k], in[i]) << "k=" << k << " n=" << n << " i=" << i;
      }
      for (size_t i = elems * k; i < n; ++i) ASSERT_EQ(mid[i], in[i]);
      UnshuffleBytePlanes(mid.data(), n, k, out.data());
      EXPECT_EQ(in, out) << "k=" << k << " n=" << n;
    }
  }
}

TEST(CaptureRoundTrip, ByteShuffleCompressesBf16Better) {
  const auto raw = Bf16Normal(1 << 18, 3);
  const Hash128 h = XXH128Of(raw.data(), raw.size());
  BlobEncodeOptions plain;
  plain.byte_plane_shuffle = false;
  const auto shuffled = EncodeBlobPayload(raw, h, 2, BlobEncodeOptions{});
  const auto unshuffled = EncodeBlobPayload(raw, h, 2, plain);
  EXPECT_LT(shuffled.size(), unshuffled.size());
  EXPECT_EQ(shuffled[1], static_cast<unsigned char>(BlobTransform::kBytePlaneShuffle));
  auto back = DecodeBlobPayload(shuffled.data(), shuffled.size(), 1 << 30);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, raw);
}

TEST(CaptureRoundTrip, FloatPlanesAtTheFastLevelAreSmallerThanLevel1AndRoundTrip) {
  const auto raw = Bf16Normal(1 << 20, 4);  // 2 MiB: several 256 KiB chunks a plane
  const Hash128 h = XXH128Of(raw.data(), raw.size());
  BlobEncodeOptions level1;
  level1.plane_level = 0;  // the planes at zstd_level (1), as before
  const auto fast = EncodeBlobPayload(raw, h, 2, BlobEncodeOptions{});
  const auto slow = EncodeBlobPayload(raw, h, 2, level1);
  EXPECT_LT(fast.size(), slow.size());
  EXPECT_GT(static_cast<double>(raw.size()) / static_cast<double>(fast.size()), 1.4);
  for (const auto* payload : {&fast, &slow}) {
    auto back = DecodeBlobPayload(payload->data(), payload->size(), 1 << 30);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, raw);
  }
}

TEST(CaptureRoundTrip, BlobBytesDoNotDependOnTheThreadOrTheHashingVariant) {
  // 5 MiB + 3 bytes: hashed on a second thread by the hashing variant, an
  // odd tail after the planes.
  auto raw = Bf16Normal(5 << 19, 6);
  raw.resize(raw.size() + 3, std::byte{7});
  const Hash128 h = XXH128Of(raw.data(), raw.size());
  const auto first = EncodeBlobPayload(raw, h, 2, {}, 24);
  Hash128 hashed;
  EXPECT_EQ(EncodeBlobPayloadHashing(raw, 2, {}, 24, &hashed), first);
  EXPECT_EQ(hashed, h);
  std::vector<unsigned char> other;
  std::thread t([&] { other = EncodeBlobPayload(raw, h, 2, {}, 24); });
  t.join();
  EXPECT_EQ(other, first);
  EXPECT_EQ(EncodeBlobPayload(raw, h, 2, {}, 24), first);  // this thread's context, reused
  auto back = DecodeBlobPayload(first.data() + 24, first.size() - 24, 1 << 30);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, raw);
}

// The snapshot ring hands the encoder buffers of evicted blobs, full of
// their old bytes: the payload must not depend on what storage it got.
// Storage whose old bytes outlast the new frame, end inside it (the rest
// staged and appended), are too few for the headroom, or whose capacity is
// short of zstd's bound, and an incompressible blob stored raw into it.
TEST(CaptureRoundTrip, BlobBytesDoNotDependOnTheStorageGiven) {
  const auto raw = Bf16Normal(3 << 19, 9);  // 3 MiB
  const Hash128 h = XXH128Of(raw.data(), raw.size());
  const auto fresh = EncodeBlobPayload(raw, h, 2, {}, 24);
  std::vector<std::byte> noise(1 << 20);
  std::mt19937 rng(2);
  for (auto& b : noise) b = static_cast<std::byte>(rng());
  const Hash128 hn = XXH128Of(noise.data(), noise.size());
  const auto fresh_noise = EncodeBlobPayload(noise, hn, 2, {}, 24);
  ASSERT_EQ(fresh_noise[24], static_cast<unsigned char>(BlobCodec::kNone));
  auto old_bytes = [](size_t size, size_t capacity) {
    std::vector<unsigned char> v;
    v.reserve(capacity);
    v.resize(size, 0xa5);
    return v;
  };
  const size_t cap = fresh.size() + (raw.size() * 2);
  for (size_t size : {size_t{0}, size_t{10}, fresh.size() / 2, fresh.size() - 1, fresh.size(), cap}) {
    const auto out = EncodeBlobPayload(raw, h, 2, {}, 24, old_bytes(size, cap));
    EXPECT_EQ(out, fresh) << "storage of " << size << " old bytes";
    Hash128 hashed;
    EXPECT_EQ(EncodeBlobPayloadHashing(raw, 2, {}, 24, &hashed, old_bytes(size, cap)), fresh) << size;
    EXPECT_EQ(EncodeBlobPayload(noise, hn, 2, {}, 24, old_bytes(size, cap)), fresh_noise) << size;
  }
  EXPECT_EQ(EncodeBlobPayload(raw, h, 2, {}, 24, old_bytes(1000, 1000)), fresh) << "capacity short of the bound";
  auto back = DecodeBlobPayload(fresh.data() + 24, fresh.size() - 24, 1 << 30);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, raw);
}

TEST(CaptureRoundTrip, IncompressibleBlobIsStoredRaw) {
  std::vector<std::byte> noise(4096);
  std::mt19937 rng(1);
  for (auto& b : noise) b = static_cast<std::byte>(rng());
  const auto payload = EncodeBlobPayload(noise, XXH128Of(noise.data(), noise.size()), 1, {});
  EXPECT_EQ(payload[0], static_cast<unsigned char>(BlobCodec::kNone));
  auto back = DecodeBlobPayload(payload.data(), payload.size(), 1 << 20);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, noise);
}

TEST(CaptureRoundTrip, WriterDestroyedWithoutCloseReadsAsNotOkButComplete) {
  TempDir dir;
  const std::string path = dir.File("crash.crcap");
  WriteSmallCapture(path, 4, /*close=*/false);
  auto reader = CaptureReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  const CaptureSummary sum = (*reader)->Summary();
  EXPECT_FALSE(sum.ok);
  EXPECT_FALSE(sum.truncated);
  EXPECT_FALSE(sum.corrupt);
  EXPECT_EQ(sum.steps, 4u);
  EXPECT_EQ((*reader)->failures().size(), 1u);
  EXPECT_TRUE((*reader)->Verify().status.ok());  // every checksum holds; it just was not closed
}

TEST(CaptureRoundTrip, SignalPathFramesAreReadableAndCounted) {
  TempDir dir;
  const std::string path = dir.File("sig.crcap");
  auto writer = CaptureWriter::Create(path, TestManifest(1), {});
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Append(TestStep(0, 1)).ok());
  // Encoded ahead of time, appended the way a signal handler would.
  FailureRecord f;
  f.reason = "SIGSEGV";
  f.signal = 11;
  f.failure_class = FailureClass::kCrash;
  auto frame = FrameEncoder::Encode(f);
  ASSERT_TRUE(frame.ok());
  const auto blob = FrameEncoder::EncodeBlob(Bf16Normal(256, 9), 2);
  EXPECT_TRUE((*writer)->AppendEncodedFrame(blob.bytes.data(), blob.bytes.size()));
  EXPECT_TRUE((*writer)->AppendEncodedFrame(frame->bytes.data(), frame->bytes.size()));
  ASSERT_TRUE((*writer)->Close().ok());
  auto reader = CaptureReader::Open(path);
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->failures().size(), 1u);
  EXPECT_EQ((*reader)->failures()[0].signal, 11);
  EXPECT_TRUE((*reader)->HasBlob(blob.blob_hash));
  EXPECT_TRUE((*reader)->Summary().ok);
  EXPECT_TRUE((*reader)->Verify().status.ok()) << (*reader)->Verify().status;
}

TEST(CaptureRoundTrip, CloseTwiceAndAppendAfterCloseAreRefused) {
  TempDir dir;
  auto writer = CaptureWriter::Create(dir.File("x.crcap"), TestManifest(0), {});
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Close().ok());
  EXPECT_EQ((*writer)->Close().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*writer)->Append(TestStep(1, 0)).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(CaptureRoundTrip, CreateRefusesToOverwriteUnlessAsked) {
  TempDir dir;
  const std::string path = dir.File("x.crcap");
  ASSERT_TRUE(CaptureWriter::Create(path, TestManifest(0), {}).ok());
  EXPECT_EQ(CaptureWriter::Create(path, TestManifest(0), {}).status().code(), absl::StatusCode::kAlreadyExists);
  CaptureWriterOptions o;
  o.overwrite = true;
  EXPECT_TRUE(CaptureWriter::Create(path, TestManifest(0), o).ok());
}

// The forward-compatibility rule: unknown record types marked skippable are
// skipped; unknown types without the bit stop the scan with a clear message.
TEST(CaptureCompat, UnknownSkippableRecordIsSkipped) {
  TempDir dir;
  const std::string path = dir.File("skip.crcap");
  auto writer = CaptureWriter::Create(path, TestManifest(0), {});
  ASSERT_TRUE(writer.ok());
  const unsigned char payload[5] = {1, 2, 3, 4, 5};
  ASSERT_TRUE((*writer)->Append(FrameEncoder::EncodeRaw(700, kFrameFlagSkippable, payload)).ok());
  ASSERT_TRUE((*writer)->Append(TestStep(0, 0)).ok());
  ASSERT_TRUE((*writer)->Close().ok());
  auto reader = CaptureReader::Open(path);
  ASSERT_TRUE(reader.ok());
  EXPECT_TRUE((*reader)->scan_status().ok()) << (*reader)->scan_status();
  EXPECT_EQ((*reader)->Summary().skipped_unknown, 1u);
  EXPECT_EQ((*reader)->steps().size(), 1u);
  EXPECT_TRUE((*reader)->Summary().ok);
}

TEST(CaptureCompat, UnknownRequiredRecordStopsTheScanWithAClearMessage) {
  TempDir dir;
  const std::string path = dir.File("req.crcap");
  auto writer = CaptureWriter::Create(path, TestManifest(0), {});
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Append(TestStep(0, 0)).ok());
  const unsigned char payload[3] = {9, 9, 9};
  ASSERT_TRUE((*writer)->Append(FrameEncoder::EncodeRaw(700, 0, payload)).ok());
  ASSERT_TRUE((*writer)->Append(TestStep(1, 0)).ok());
  ASSERT_TRUE((*writer)->Close().ok());
  auto reader = CaptureReader::Open(path);
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->scan_status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE((*reader)->scan_status().message().find("record type 700 is not known"), std::string_view::npos)
      << (*reader)->scan_status();
  EXPECT_EQ((*reader)->steps().size(), 1u);  // the step before it survives
  EXPECT_FALSE((*reader)->Summary().ok);
}

TEST(CaptureCompat, NewerMajorVersionIsRefusedNamingBothVersions) {
  TempDir dir;
  const std::string path = dir.File("v.crcap");
  WriteSmallCapture(path, 1, true);
  auto bytes = ReadFileBytes(path);
  StoreLE16(bytes.data() + 8, kCaptureMajorVersion + 1);
  StoreLE64(bytes.data() + 24, XXH64Of(bytes.data(), 24));
  WriteFileBytes(path, bytes);
  auto reader = CaptureReader::Open(path);
  ASSERT_FALSE(reader.ok());
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(reader.status().message().find(
                absl::StrFormat("version %d.%d is newer", kCaptureMajorVersion + 1, kCaptureMinorVersion)),
            std::string_view::npos)
      << reader.status();
  EXPECT_NE(reader.status().message().find("use a newer crashreplay"), std::string_view::npos);
}

// The frame without compression: what a 1.x writer wrote.
EncodedFrame Uncompressed(const EncodedFrame& f) {
  FrameHeader h;
  ParseFrameHeader(f.bytes.data(), &h);
  std::vector<unsigned char> payload(f.bytes.begin() + kFrameHeaderSize, f.bytes.end());
  if ((h.flags & kFrameFlagZstd) == 0) return f;
  std::vector<unsigned char> raw(ZSTD_getFrameContentSize(payload.data(), payload.size()));
  EXPECT_EQ(ZSTD_decompress(raw.data(), raw.size(), payload.data(), payload.size()), raw.size());
  return FrameEncoder::EncodeRaw(h.type, 0, raw);
}

// Format 2.0: a large step record is stored as a zstd frame (flag bit 1)
// and reads back field for field; a tiny one stays as it is.
TEST(CaptureCompat, LargeStepRecordsAreCompressedAndReadBackExactly) {
  StepRecord big = TestStep(1, 0);
  big.request_ids.clear();
  big.token_ids.clear();
  for (int i = 0; i < 256; ++i) {
    big.request_ids.push_back("chatcmpl-" + std::to_string(1000000 + i));
    big.token_ids.push_back(i * 13 % 151000);
  }
  StepRecord tiny;
  tiny.step = 7;
  const EncodedFrame small_frame = *FrameEncoder::Encode(tiny);
  const EncodedFrame big_frame = *FrameEncoder::Encode(big);
  FrameHeader h;
  ASSERT_TRUE(ParseFrameHeader(small_frame.bytes.data(), &h));
  EXPECT_EQ(h.flags & kFrameFlagZstd, 0);
  ASSERT_TRUE(ParseFrameHeader(big_frame.bytes.data(), &h));
  EXPECT_EQ(h.flags & kFrameFlagZstd, kFrameFlagZstd);
  const size_t raw = ZSTD_getFrameContentSize(big_frame.bytes.data() + kFrameHeaderSize, h.payload_size);
  EXPECT_LT(h.payload_size * 2, raw) << "a 256-request step should compress well";

  TempDir dir;
  const std::string path = dir.File("z.crcap");
  auto writer = CaptureWriter::Create(path, TestManifest(0));
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->Append(tiny).ok());
  ASSERT_TRUE((*writer)->Append(big).ok());
  ASSERT_TRUE((*writer)->Close().ok());
  auto reader = CaptureReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_TRUE((*reader)->Verify().status.ok()) << (*reader)->Verify().status;
  ASSERT_EQ((*reader)->steps().size(), 2u);
  EXPECT_EQ((*reader)->steps()[0], tiny);
  EXPECT_EQ((*reader)->steps()[1], big);
  const CaptureSummary sum = (*reader)->Summary();
  EXPECT_EQ(sum.format_major, kCaptureMajorVersion);
  // Stored: the tiny record as it is plus the big one's zstd frame; raw:
  // both decoded.
  const uint64_t tiny_bytes = small_frame.bytes.size() - kFrameHeaderSize;
  EXPECT_EQ(sum.step_stored_bytes, tiny_bytes + h.payload_size);
  EXPECT_EQ(sum.step_raw_bytes, tiny_bytes + raw);
}

// A file as a writer of version major.minor began it: the file header
// and the session manifest.
std::vector<unsigned char> OldFileStart(uint16_t major, uint16_t minor) {
  std::vector<unsigned char> bytes(kFileHeaderSize);
  EncodeFileHeader(bytes.data());
  StoreLE16(bytes.data() + 8, major);
  StoreLE16(bytes.data() + 10, minor);
  StoreLE64(bytes.data() + 24, XXH64Of(bytes.data(), 24));
  const EncodedFrame m = *FrameEncoder::Encode(TestManifest(0));
  bytes.insert(bytes.end(), m.bytes.begin(), m.bytes.end());
  return bytes;
}

// Files written before 2.0 (no compressed frames, major 1) are still read.
TEST(CaptureCompat, Version1FilesAreRead) {
  TempDir dir;
  const std::string path = dir.File("v1.crcap");
  std::vector<unsigned char> bytes = OldFileStart(1, 0);
  const auto put = [&](const EncodedFrame& f) { bytes.insert(bytes.end(), f.bytes.begin(), f.bytes.end()); };
  for (uint64_t i = 0; i < 3; ++i) put(Uncompressed(*FrameEncoder::Encode(TestStep(i, 0))));
  WriteFileBytes(path, bytes);
  auto reader = CaptureReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_TRUE((*reader)->scan_status().ok()) << (*reader)->scan_status();
  EXPECT_EQ((*reader)->Summary().format_major, 1);
  ASSERT_EQ((*reader)->steps().size(), 3u);
  EXPECT_EQ((*reader)->steps()[2], TestStep(2, 0));
}

// A decode step of 256 requests that follows step - 1 as in a real decode:
// the last outputs are the tokens, positions and cache slots move on, the
// outputs are new.
StepRecord DecodeStep(uint64_t step) {
  auto output = [](uint64_t st, uint64_t i) { return static_cast<int64_t>((st * 7919 + i * i * 104729) % 151000); };
  StepRecord r = TestStep(step, 0);
  r.request_ids.clear();
  r.token_ids.clear();
  r.positions.clear();
  r.out_cache_loc.clear();
  r.output_token_ids.clear();
  for (uint64_t i = 0; i < 256; ++i) {
    r.request_ids.push_back("chatcmpl-" + std::to_string(1000000 + i));
    r.token_ids.push_back(step == 0 ? 1 : output(step - 1, i));
    r.positions.push_back(static_cast<int64_t>(500 + i + step));
    r.out_cache_loc.push_back(static_cast<int64_t>(i * 2048 + 501 + step));
    r.output_token_ids.push_back(output(step, i));
  }
  return r;
}

// Format 2.2: step records as parts of one zstd stream. Over a restart of
// the stream (kRestartEvery) and a Restart() call, every step reads back
// exactly, from far fewer bytes than frames compressed one by one.
TEST(CaptureStream, StreamedStepsReadBackExactlyAcrossRestarts) {
  TempDir dir;
  const std::string path = dir.File("s.crcap");
  auto writer = CaptureWriter::Create(path, TestManifest(0));
  ASSERT_TRUE(writer.ok()) << writer.status();
  StepStreamEncoder stream;
  const uint64_t n = StepStreamEncoder::kRestartEvery + 300;
  uint64_t starts = 0, whole_frames = 0, streamed = 0;
  for (uint64_t i = 0; i < n; ++i) {
    if (i == 1100) stream.Restart();
    if (i == 500) {  // another frame between parts
      ASSERT_TRUE((*writer)->Append(TestStep(999, 0)).ok());
    }
    auto f = stream.Encode(DecodeStep(i));
    ASSERT_TRUE(f.ok()) << f.status();
    FrameHeader h;
    ASSERT_TRUE(ParseFrameHeader(f->bytes.data(), &h));
    const bool start = f->bytes[kFrameHeaderSize] == kStreamPartStart;
    // Format 2.4: a part that continues its stream holds its positions and
    // cache slots as differences from the part before (the step frame
    // between parts at 500 does not count).
    ASSERT_EQ(h.flags, kFrameFlagZstdStream | (start ? 0 : kFrameFlagListDeltas)) << "step " << i;
    starts += start;
    streamed += f->bytes.size();
    whole_frames += FrameEncoder::Encode(DecodeStep(i))->bytes.size();
    ASSERT_TRUE((*writer)->Append(*f).ok());
  }
  ASSERT_TRUE((*writer)->Close().ok());
  EXPECT_EQ(starts, 3u);  // step 0, step kRestartEvery, step 1100
  EXPECT_LT(streamed * 2, whole_frames) << "parts of a stream should be far smaller than whole frames";
  auto reader = CaptureReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_TRUE((*reader)->Verify().status.ok()) << (*reader)->Verify().status;
  EXPECT_TRUE((*reader)->Summary().ok);
  ASSERT_EQ((*reader)->steps().size(), n + 1);
  for (uint64_t i = 0, k = 0; i < n; ++i, ++k) {
    if (i == 500) {
      EXPECT_EQ((*reader)->steps()[k++], TestStep(999, 0));
    }
    ASSERT_EQ((*reader)->steps()[k], DecodeStep(i)) << "step " << i;
  }
}

// Format 2.4: the parts of a stream hold positions, sequence lengths and
// cache slots as differences from the part before, where the lists are as
// long. Through batches that grow and shrink (whole lists there), lists
// emptied and refilled, differences that wrap around 2^64, a step frame
// between parts and a restart, every step reads back as written; and the
// stream is smaller than the same steps without the differences.
TEST(CaptureStream, ListDeltasReadBackExactlyThroughBatchChanges) {
  TempDir dir;
  const std::string path = dir.File("d.crcap");
  auto writer = CaptureWriter::Create(path, TestManifest(0));
  ASSERT_TRUE(writer.ok()) << writer.status();
  StepStreamEncoder stream, plain;
  plain.set_list_deltas(false);
  std::vector<StepRecord> written;
  uint64_t flagged = 0, bytes = 0, plain_bytes = 0;
  for (uint64_t i = 0; i < 120; ++i) {
    StepRecord r = DecodeStep(i);
    if (i >= 40 && i < 50) {  // a request finished: every list one shorter
      for (auto list : kStepListDeltas) (r.*list).pop_back();
    }
    if (i == 60) r.seq_lens.clear();
    if (i == 70) r.positions = {std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min(), -1, 0};
    if (i == 71) r.positions = {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), 1, -7};
    if (i == 90) {
      stream.Restart();
      plain.Restart();
    }
    if (i == 100) {
      ASSERT_TRUE((*writer)->Append(TestStep(999, 0)).ok());
      written.push_back(TestStep(999, 0));
    }
    auto f = stream.Encode(r);
    ASSERT_TRUE(f.ok()) << f.status();
    FrameHeader h;
    ASSERT_TRUE(ParseFrameHeader(f->bytes.data(), &h));
    flagged += (h.flags & kFrameFlagListDeltas) != 0;
    bytes += f->bytes.size();
    auto g = plain.Encode(r);
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_TRUE(ParseFrameHeader(g->bytes.data(), &h));
    ASSERT_EQ(h.flags & kFrameFlagListDeltas, 0) << "step " << i;
    plain_bytes += g->bytes.size();
    ASSERT_TRUE((*writer)->Append(*f).ok());
    written.push_back(r);
  }
  EXPECT_LT(bytes * 3, plain_bytes * 2) << bytes << " bytes with the differences, " << plain_bytes << " without";
  ASSERT_TRUE((*writer)->Close().ok());
  // Unflagged: 0 and 90 (stream starts), 40 and 50 (no list as long as the
  // step before's). 70's positions are 4 long against 69's 256 (whole),
  // 71's are differences from 70's.
  EXPECT_EQ(flagged, 116u);
  auto reader = CaptureReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_TRUE((*reader)->Verify().status.ok()) << (*reader)->Verify().status;
  ASSERT_EQ((*reader)->steps().size(), written.size());
  for (size_t k = 0; k < written.size(); ++k) ASSERT_EQ((*reader)->steps()[k], written[k]) << "record " << k;
}

// A part larger than the stream's window (the first whole rows of a long-
// context batch) is followed by a new zstd frame, not a Restart() (the
// recorder would then write whole rows again), and every step reads back
// exactly. (What it saves is in recorder_bench --only-context: 64
// requests' decode deltas after 8 MiB of rows took 345 B a step, 155 now.)
TEST(CaptureStream, APartLargerThanTheWindowIsFollowedByANewFrame) {
  TempDir dir;
  const std::string path = dir.File("big.crcap");
  auto writer = CaptureWriter::Create(path, TestManifest(0));
  ASSERT_TRUE(writer.ok()) << writer.status();
  StepStreamEncoder stream;
  std::vector<StepRecord> written;
  uint64_t starts = 0;
  for (uint64_t i = 0; i < 40; ++i) {
    StepRecord r = DecodeStep(i);
    if (i == 10) {  // 64 rows of 8192 slots: 4 MiB of payload
      for (int64_t row = 0; row < 64; ++row) {
        PageTableRow p;
        p.req_pool_index = row;
        for (int64_t c = 0; c < 8192; ++c) p.token_slots.push_back(row << 20 | c);
        r.page_table.push_back(std::move(p));
      }
    }
    auto f = stream.Encode(r);
    ASSERT_TRUE(f.ok()) << f.status();
    const bool start = f->bytes[kFrameHeaderSize] == kStreamPartStart;
    starts += start;
    EXPECT_EQ(start, i == 0 || i == 11) << "step " << i;
    EXPECT_FALSE(stream.restarted()) << "step " << i;
    ASSERT_TRUE((*writer)->Append(*f).ok());
    written.push_back(std::move(r));
  }
  ASSERT_TRUE((*writer)->Close().ok());
  EXPECT_EQ(starts, 2u);
  auto reader = CaptureReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_TRUE((*reader)->Verify().status.ok()) << (*reader)->Verify().status;
  ASSERT_EQ((*reader)->steps().size(), written.size());
  for (size_t i = 0; i < written.size(); ++i) ASSERT_EQ((*reader)->steps()[i], written[i]) << "step " << i;
}

// The same records give the same bytes, whichever thread encodes them.
TEST(CaptureStream, SameRecordsGiveTheSameBytesOnAnyThread) {
  auto encode_all = [] {
    StepStreamEncoder stream;
    std::vector<unsigned char> out;
    for (uint64_t i = 0; i < 64; ++i) {
      auto f = stream.Encode(DecodeStep(i));
      EXPECT_TRUE(f.ok());
      out.insert(out.end(), f->bytes.begin(), f->bytes.end());
    }
    return out;
  };
  const auto here = encode_all();
  std::vector<unsigned char> a, b;
  std::thread ta([&] { a = encode_all(); });
  std::thread tb([&] { b = encode_all(); });
  ta.join();
  tb.join();
  EXPECT_EQ(a, here);
  EXPECT_EQ(b, here);
}

// A crash may cut the file anywhere: every part before the cut decodes.
TEST(CaptureStream, TornStreamKeepsEveryCompletePart) {
  TempDir dir;
  const std::string path = dir.File("t.crcap");
  auto writer = CaptureWriter::Create(path, TestManifest(0));
  ASSERT_TRUE(writer.ok());
  StepStreamEncoder stream;
  for (uint64_t i = 0; i < 40; ++i) ASSERT_TRUE((*writer)->Append(*stream.Encode(DecodeStep(i))).ok());
  writer->reset();  // no Close: the process died
  auto bytes = ReadFileBytes(path);
  bytes.resize(bytes.size() - 7);  // into the last part
  WriteFileBytes(path, bytes);
  auto reader = CaptureReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_TRUE((*reader)->Summary().truncated);
  ASSERT_EQ((*reader)->steps().size(), 39u);
  EXPECT_EQ((*reader)->steps()[38], DecodeStep(38));
}

// Files of 2.1 and before: step records compressed one frame at a time
// (flag bit 1) still read; the stream flag is refused in them.
TEST(CaptureCompat, Version21FilesAreReadAndRefuseTheStreamFlag) {
  auto file = [](bool stream) {
    std::vector<unsigned char> bytes = OldFileStart(2, 1);
    const auto put = [&](const EncodedFrame& f) { bytes.insert(bytes.end(), f.bytes.begin(), f.bytes.end()); };
    StepStreamEncoder s;
    for (uint64_t i = 0; i < 3; ++i) put(stream ? *s.Encode(DecodeStep(i)) : *FrameEncoder::Encode(DecodeStep(i)));
    return bytes;
  };
  TempDir dir;
  WriteFileBytes(dir.File("old.crcap"), file(false));
  auto reader = CaptureReader::Open(dir.File("old.crcap"));
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_TRUE((*reader)->scan_status().ok()) << (*reader)->scan_status();
  EXPECT_EQ((*reader)->Summary().format_minor, 1);
  ASSERT_EQ((*reader)->steps().size(), 3u);
  EXPECT_EQ((*reader)->steps()[2], DecodeStep(2));
  WriteFileBytes(dir.File("odd.crcap"), file(true));
  reader = CaptureReader::Open(dir.File("odd.crcap"));
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->scan_status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE((*reader)->scan_status().message().find("frame flags 0x0004 set bits format 2.1 does not define"),
            std::string_view::npos)
      << (*reader)->scan_status();
}

TEST(CaptureCompat, NewerMinorVersionIsRead) {
  TempDir dir;
  const std::string path = dir.File("v.crcap");
  WriteSmallCapture(path, 1, true);
  auto bytes = ReadFileBytes(path);
  StoreLE16(bytes.data() + 10, kCaptureMinorVersion + 3);
  StoreLE64(bytes.data() + 24, XXH64Of(bytes.data(), 24));
  WriteFileBytes(path, bytes);
  auto reader = CaptureReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->Summary().format_minor, kCaptureMinorVersion + 3);
  EXPECT_TRUE((*reader)->Summary().ok);
}

TEST(CaptureCompat, SessionDirectoryListsRankFilesInOrder) {
  TempDir dir;
  for (uint32_t rank : {1u, 0u, 10u}) WriteSmallCapture(dir.File(CaptureFileNameForRank(rank)), 1, true);
  WriteFileBytes(dir.File("notes.txt"), {'x'});
  auto files = ListCaptureFiles(dir.path());
  ASSERT_TRUE(files.ok()) << files.status();
  ASSERT_EQ(files->size(), 3u);
  EXPECT_EQ((*files)[0], dir.File("rank-00000.crcap"));
  EXPECT_EQ((*files)[2], dir.File("rank-00010.crcap"));
  TempDir empty;
  EXPECT_EQ(ListCaptureFiles(empty.path()).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace crashreplay

namespace crashreplay {
namespace {

TEST(CapturePreparedFailure, FilledFramesReadBackWithTheirSignalStepAndTime) {
  testing::TempDir dir;
  const std::string path = dir.File("pf.crcap");
  auto writer = CaptureWriter::Create(path, testing::TestManifest(0), {});
  ASSERT_TRUE(writer.ok());
  FailureRecord base;
  base.reason = "fatal signal";
  base.stage = "decode";
  base.rank = 3;
  base.failure_class = FailureClass::kCrash;
  auto prepared = PreparedFailureFrame::Create(base);
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  auto a = prepared->Fill(11, 41, 123456789);
  ASSERT_TRUE((*writer)->AppendEncodedFrame(a.data(), a.size()));
  auto b = prepared->Fill(6, -1, 987654321);
  ASSERT_TRUE((*writer)->AppendEncodedFrame(b.data(), b.size()));
  writer->reset();  // the process "dies": no Close
  auto reader = CaptureReader::Open(path);
  ASSERT_TRUE(reader.ok());
  ASSERT_TRUE((*reader)->scan_status().ok()) << (*reader)->scan_status();
  ASSERT_EQ((*reader)->failures().size(), 2u);
  FailureRecord want = base;
  want.signal = 11;
  want.step = 41;
  want.timestamp_nanos = 123456789;
  EXPECT_EQ((*reader)->failures()[0], want);
  want.signal = 6;
  want.step.reset();
  want.timestamp_nanos = 987654321;
  EXPECT_EQ((*reader)->failures()[1], want);
}

}  // namespace
}  // namespace crashreplay

namespace crashreplay {
namespace {

TEST(CaptureWriterContract, ManifestIndexAndEndCannotBeAppended) {
  testing::TempDir dir;
  auto writer = CaptureWriter::Create(dir.File("x.crcap"), testing::TestManifest(0), {});
  ASSERT_TRUE(writer.ok());
  auto manifest = FrameEncoder::Encode(testing::TestManifest(0));
  ASSERT_TRUE(manifest.ok());
  EXPECT_EQ((*writer)->Append(*manifest).code(), absl::StatusCode::kInvalidArgument);
  auto end = FrameEncoder::Encode(EndRecord{});
  EXPECT_EQ((*writer)->Append(*end).code(), absl::StatusCode::kInvalidArgument);
}

TEST(CaptureWriterContract, ConcurrentAppendsFromSeveralThreadsAllReadBack) {
  testing::TempDir dir;
  const std::string path = dir.File("mt.crcap");
  auto writer = CaptureWriter::Create(path, testing::TestManifest(0), {});
  ASSERT_TRUE(writer.ok());
  constexpr int kThreads = 4, kPerThread = 25;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const uint64_t step = static_cast<uint64_t>(t * kPerThread + i);
        // Encoded outside the writer, as the recorder's background threads do.
        auto frame = FrameEncoder::Encode(testing::TestStep(step, 0));
        ASSERT_TRUE(frame.ok());
        ASSERT_TRUE((*writer)->Append(*frame).ok());
        // Every thread also stores the same shared blob: kept once.
        ASSERT_TRUE((*writer)->AppendBlob(testing::Bf16Normal(512, 1), 2).ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_TRUE((*writer)->Close().ok());
  auto reader = CaptureReader::Open(path);
  ASSERT_TRUE(reader.ok());
  EXPECT_TRUE((*reader)->Verify().status.ok()) << (*reader)->Verify().status;
  std::set<uint64_t> steps;
  for (const StepRecord& s : (*reader)->steps()) steps.insert(s.step);
  EXPECT_EQ(steps.size(), static_cast<size_t>(kThreads * kPerThread));
  EXPECT_EQ((*reader)->Summary().blobs, 1u);
  EXPECT_EQ((*reader)->Summary().duplicate_blobs, 0u);
}

}  // namespace
}  // namespace crashreplay
