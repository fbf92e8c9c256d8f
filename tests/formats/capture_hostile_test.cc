// Hostile captures, kept as named files under tests/formats/data/capture/
// (and in fuzz/corpus/capture/ as seeds): each must give a clear error and
// keep everything before the bad record readable.
//
// The files are made by the builders below. To regenerate them after a
// deliberate format change:
//   export CRASHREPLAY_SOURCE_DIR=$PWD CRASHREPLAY_REGENERATE_CAPTURES=1
//   build/tests/formats_test --gtest_filter='CaptureHostile.NamedFiles*'
// (and copy them into fuzz/corpus/capture/).
#include <capnp/any.h>
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>
#include <zstd.h>

#include <cstdlib>
#include <functional>

#include "capture_test_util.h"
#include "crashreplay/formats/capture_encoder.h"

namespace crashreplay {
namespace {

using testing::ReadFileBytes;
using testing::TempDir;
using testing::TestManifest;
using testing::TestStep;
using testing::WriteFileBytes;

using Bytes = std::vector<unsigned char>;

void Put(Bytes& out, const Bytes& more) { out.insert(out.end(), more.begin(), more.end()); }

Bytes Frame(RecordType type, const Bytes& payload, uint16_t flags = 0) {
  return FrameEncoder::EncodeRaw(static_cast<uint16_t>(type), flags, payload).bytes;
}

// A record's Cap'n Proto payload, uncompressed whatever the encoder chose.
Bytes RawPayload(const EncodedFrame& f) {
  Bytes payload(f.bytes.begin() + kFrameHeaderSize, f.bytes.end());
  FrameHeader h;
  ParseFrameHeader(f.bytes.data(), &h);
  if ((h.flags & kFrameFlagZstd) == 0) return payload;
  Bytes raw(ZSTD_getFrameContentSize(payload.data(), payload.size()));
  ZSTD_decompress(raw.data(), raw.size(), payload.data(), payload.size());
  return raw;
}

// File header + manifest + one valid step, uncompressed (so the prefix
// reads under a 1.x header too): the prefix every case keeps.
Bytes ValidPrefix() {
  Bytes out(kFileHeaderSize);
  EncodeFileHeader(out.data());
  Put(out, FrameEncoder::Encode(TestManifest(0))->bytes);
  Put(out, Frame(RecordType::kStep, RawPayload(*FrameEncoder::Encode(TestStep(0, 0)))));
  return out;
}

// A step of 256 requests: large enough that the encoder compresses it.
StepRecord BigStep(uint64_t step) {
  StepRecord s = TestStep(step, 0);
  s.request_ids.clear();
  s.token_ids.clear();
  for (int i = 0; i < 256; ++i) {
    s.request_ids.push_back("req-" + std::to_string(i));
    s.token_ids.push_back(i * 7);
  }
  return s;
}

Bytes BlobPayload(const BlobHeader& h, const Bytes& body) {
  Bytes out(kBlobHeaderSize);
  EncodeBlobHeader(h, out.data());
  Put(out, body);
  return out;
}

Bytes Zstd(const Bytes& raw, bool with_content_size) {
  Bytes out(ZSTD_compressBound(raw.size()));
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, 3);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, with_content_size ? 1 : 0);
  ZSTD_outBuffer o{out.data(), out.size(), 0};
  ZSTD_inBuffer i{raw.data(), raw.size(), 0};
  // Streaming without a pledged size: the frame then omits the content size
  // when asked to.
  if (with_content_size) ZSTD_CCtx_setPledgedSrcSize(cctx, raw.size());
  ZSTD_compressStream2(cctx, &o, &i, ZSTD_e_end);
  ZSTD_freeCCtx(cctx);
  out.resize(o.pos);
  return out;
}

// A step record whose root struct has a 300-deep chain of structs behind
// every pointer slot.
Bytes DeepNesting() {
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<capnp::AnyPointer>().initAsAnyStruct(4, 18);
  auto slots = root.getPointerSection();
  for (unsigned s = 0; s < slots.size(); ++s) {
    capnp::AnyStruct::Builder cur = slots[s].initAsAnyStruct(1, 1);
    for (int depth = 0; depth < 300; ++depth) cur = cur.getPointerSection()[0].initAsAnyStruct(1, 1);
  }
  auto words = capnp::messageToFlatArray(message);
  Bytes payload(words.asBytes().begin(), words.asBytes().end());
  Bytes out = ValidPrefix();
  Put(out, Frame(RecordType::kStep, payload));
  return out;
}

// A frame header declaring a 2^63-byte payload.
Bytes HugeFrameLength() {
  Bytes out = ValidPrefix();
  Bytes frame = Frame(RecordType::kStep, Bytes(8, 0));
  StoreLE64(frame.data() + 8, uint64_t{1} << 63);
  Put(out, frame);
  return out;
}

// A Cap'n Proto segment table declaring 2^32-1 words in a 16-byte message.
Bytes HugeSegmentSize() {
  Bytes payload(16, 0);
  StoreLE32(payload.data(), 0);  // one segment
  StoreLE32(payload.data() + 4, 0xffffffffu);
  Bytes out = ValidPrefix();
  Put(out, Frame(RecordType::kStep, payload));
  return out;
}

// 64 MiB of zeros in a 2 KiB zstd frame, honestly declared: over a reader's
// cap it must be refused before allocating.
Bytes DecompressionBomb() {
  const Bytes zeros(64 << 20, 0);
  BlobHeader h;
  h.codec = BlobCodec::kZstd;
  h.raw_size = zeros.size();
  h.hash = XXH128Of(zeros.data(), zeros.size());
  Bytes out = ValidPrefix();
  Put(out, Frame(RecordType::kBlob, BlobPayload(h, Zstd(zeros, true))));
  return out;
}

// The same frame under a blob header that declares 16 bytes.
Bytes BombUnderDeclared() {
  const Bytes zeros(64 << 20, 0);
  BlobHeader h;
  h.codec = BlobCodec::kZstd;
  h.raw_size = 16;
  h.hash = XXH128Of(zeros.data(), 16);
  Bytes out = ValidPrefix();
  Put(out, Frame(RecordType::kBlob, BlobPayload(h, Zstd(zeros, true))));
  return out;
}

// A zstd frame that does not state its content size.
Bytes BombNoContentSize() {
  const Bytes zeros(1 << 20, 0);
  BlobHeader h;
  h.codec = BlobCodec::kZstd;
  h.raw_size = zeros.size();
  h.hash = XXH128Of(zeros.data(), zeros.size());
  Bytes out = ValidPrefix();
  Put(out, Frame(RecordType::kBlob, BlobPayload(h, Zstd(zeros, false))));
  return out;
}

// A well-formed blob whose declared hash is not its content's.
Bytes WrongHash() {
  Bytes raw(4096);
  for (size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<unsigned char>(i % 13);
  BlobHeader h;
  h.codec = BlobCodec::kZstd;
  h.raw_size = raw.size();
  h.hash = XXH128Of(raw.data(), raw.size());
  h.hash.low ^= 1;
  Bytes out = ValidPrefix();
  Put(out, Frame(RecordType::kBlob, BlobPayload(h, Zstd(raw, true))));
  return out;
}

// The zstd frame flag in a 1.x file, where bit 1 was reserved.
Bytes ZstdInVersion1() {
  Bytes out = ValidPrefix();
  StoreLE16(out.data() + 8, 1);
  StoreLE16(out.data() + 10, 0);  // a 1.0 file
  StoreLE64(out.data() + 24, XXH64Of(out.data(), 24));
  Put(out, FrameEncoder::Encode(BigStep(1))->bytes);
  return out;
}

Bytes ZstdRecordNoContentSize() {
  Bytes out = ValidPrefix();
  Put(out, Frame(RecordType::kStep, Zstd(RawPayload(*FrameEncoder::Encode(BigStep(1))), false), kFrameFlagZstd));
  return out;
}

// 65 MiB of zeros in a few KB: over the structured-record limit.
Bytes ZstdRecordOverLimit() {
  Bytes out = ValidPrefix();
  Put(out, Frame(RecordType::kStep, Zstd(Bytes(65 << 20, 0), true), kFrameFlagZstd));
  return out;
}

Bytes ZstdRecordTruncated() {
  Bytes z = Zstd(RawPayload(*FrameEncoder::Encode(BigStep(1))), true);
  z.resize(z.size() - 5);
  Bytes out = ValidPrefix();
  Put(out, Frame(RecordType::kStep, z, kFrameFlagZstd));
  return out;
}

Bytes ZstdFlagOnBlob() {
  const Bytes raw(4096, 7);
  BlobHeader h;
  h.codec = BlobCodec::kNone;
  h.raw_size = raw.size();
  h.hash = XXH128Of(raw.data(), raw.size());
  Bytes out = ValidPrefix();
  Put(out, Frame(RecordType::kBlob, BlobPayload(h, raw), kFrameFlagZstd));
  return out;
}

// Format 2.2: parts of a zstd stream of step records.
Bytes StreamPart(uint64_t step, int which) {
  StepStreamEncoder stream;
  EncodedFrame f;
  for (int i = 0; i <= which; ++i) f = *stream.Encode(BigStep(step + static_cast<uint64_t>(i)));
  return Bytes(f.bytes.begin() + kFrameHeaderSize, f.bytes.end());
}

Bytes StreamPartWithoutStart() {
  Bytes out = ValidPrefix();
  Put(out, Frame(RecordType::kStep, StreamPart(1, 1), kFrameFlagZstdStream));
  return out;
}

Bytes StreamPartWrongSize() {
  Bytes part = StreamPart(1, 0);
  StoreLE32(part.data() + 4, LoadLE32(part.data() + 4) + 8);
  Bytes out = ValidPrefix();
  Put(out, Frame(RecordType::kStep, part, kFrameFlagZstdStream));
  return out;
}

Bytes StreamPartOverLimit() {
  Bytes part = StreamPart(1, 0);
  StoreLE32(part.data() + 4, 65u << 20);
  Bytes out = ValidPrefix();
  Put(out, Frame(RecordType::kStep, part, kFrameFlagZstdStream));
  return out;
}

Bytes StreamFlagOnBlob() {
  Bytes out = ValidPrefix();
  Put(out, Frame(RecordType::kBlob, StreamPart(1, 0), kFrameFlagZstdStream));
  return out;
}

// Page-table deltas (2.3): a step whose row 1 continues a previous row.
Bytes DeltaStep(uint64_t step, int64_t pool) {
  StepRecord s = TestStep(step, 0);
  s.page_table = {{pool, {40, 41}, 3, true}};
  return RawPayload(*FrameEncoder::Encode(s, /*compress=*/false));
}

Bytes PageDeltaWithoutFlag() {
  Bytes out = ValidPrefix();
  Put(out, Frame(RecordType::kStep, DeltaStep(1, 1)));
  return out;
}

Bytes PageDeltaWithoutPreviousRow() {
  Bytes out = ValidPrefix();
  Put(out, Frame(RecordType::kStep, DeltaStep(1, 7), kFrameFlagPageDeltas));  // the prefix holds rows 0 and 1 only
  return out;
}

Bytes PageDeltaPastPreviousRow() {
  Bytes out = ValidPrefix();
  StepRecord s = TestStep(1, 0);
  s.page_table = {{1, {40}, 5, true}};  // row 1 holds columns 0..1
  Put(out, Frame(RecordType::kStep, RawPayload(*FrameEncoder::Encode(s, false)), kFrameFlagPageDeltas));
  return out;
}

Bytes PageDeltaFlagIn2_2() {
  Bytes out = ValidPrefix();
  StoreLE16(out.data() + 10, 2);  // a 2.2 file: no deltas there
  StoreLE64(out.data() + 24, XXH64Of(out.data(), 24));
  Put(out, Frame(RecordType::kStep, DeltaStep(1, 1), kFrameFlagPageDeltas));
  return out;
}

Bytes PageDeltaFlagOnBlob() {
  Bytes out = ValidPrefix();
  Put(out, Frame(RecordType::kBlob, Bytes(64, 0), kFrameFlagPageDeltas));
  return out;
}

// List deltas (2.4): frame flag bit 4 only on a streamed step record that
// continues its zstd stream.
Bytes ListDeltaFlagIn2_3() {
  Bytes out = ValidPrefix();
  StoreLE16(out.data() + 10, 3);  // a 2.3 file: no list deltas there
  StoreLE64(out.data() + 24, XXH64Of(out.data(), 24));
  Put(out, Frame(RecordType::kStep, StreamPart(1, 0), kFrameFlagZstdStream | kFrameFlagListDeltas));
  return out;
}

Bytes ListDeltaFlagOnStreamStart() {
  Bytes out = ValidPrefix();
  Put(out, Frame(RecordType::kStep, StreamPart(1, 0), kFrameFlagZstdStream | kFrameFlagListDeltas));
  return out;
}

Bytes ListDeltaFlagOnWholeStep() {
  Bytes out = ValidPrefix();
  Put(out, Frame(RecordType::kStep, RawPayload(*FrameEncoder::Encode(TestStep(1, 0), false)), kFrameFlagListDeltas));
  return out;
}

Bytes TooNewVersion() {
  Bytes out = ValidPrefix();
  StoreLE16(out.data() + 8, kCaptureMajorVersion + 1);
  StoreLE64(out.data() + 24, XXH64Of(out.data(), 24));
  return out;
}

Bytes UnknownRequiredRecord() {
  Bytes out = ValidPrefix();
  Put(out, FrameEncoder::EncodeRaw(4242, 0, Bytes{1, 2, 3}).bytes);
  return out;
}

Bytes DanglingBlobReference() {
  Bytes out = ValidPrefix();
  SnapshotRecord snap;
  snap.step = 0;
  TensorDescriptor t;
  t.name = "kv_pages";
  t.dtype = "BF16";
  t.content_hash = Hash128{0x1234, 0x5678};
  t.stored = true;
  snap.tensors = {t};
  Put(out, FrameEncoder::Encode(snap)->bytes);
  return out;
}

// A step record whose segment-count field is 0xffffffff: Cap'n Proto 0.9
// wraps the count to 0 and reads the message as one segment, so with its
// checksum recomputed (as here) the file passed `verify` (issue 50).
Bytes WrappedSegmentCount() {
  Bytes payload = RawPayload(*FrameEncoder::Encode(TestStep(1, 0), /*compress=*/false));
  StoreLE32(payload.data(), 0xffffffffu);
  Bytes out = ValidPrefix();
  Put(out, Frame(RecordType::kStep, payload));
  return out;
}

// Another session's manifest and step appended after the prefix: two
// captures spliced into one file.
Bytes SplicedSessions() {
  SessionManifest other = TestManifest(1);
  other.session_id = "other-session";
  Bytes out = ValidPrefix();
  Put(out, FrameEncoder::Encode(other)->bytes);
  Put(out, Frame(RecordType::kStep, RawPayload(*FrameEncoder::Encode(TestStep(0, 1)))));
  return out;
}

struct HostileCase {
  const char* name;
  std::function<Bytes()> build;
  CaptureLimits limits;
  // What must happen: the Open() status code when the header is refused,
  // else the status code Verify() reports (OK never).
  absl::StatusCode open_code;
  absl::StatusCode verify_code;
  const char* message;  // a substring of the error
};

CaptureLimits SmallBlobCap() {
  CaptureLimits l;
  l.max_blob_raw_size = 1 << 20;
  return l;
}

std::vector<HostileCase> Cases() {
  using C = absl::StatusCode;
  // clang-format off: a table, one case a line as written
  return {
      {"deep_nesting", DeepNesting, {}, C::kOk, C::kDataLoss, "malformed Cap'n Proto record"},
      {"huge_frame_length", HugeFrameLength, {}, C::kOk, C::kDataLoss, "declares 9223372036854775808 payload bytes"},
      {"huge_segment_size", HugeSegmentSize, {}, C::kOk, C::kDataLoss, "malformed Cap'n Proto record"},
      {"decompression_bomb", DecompressionBomb, SmallBlobCap(), C::kOk, C::kResourceExhausted,
       "over the reader's cap"},
      {"bomb_under_declared", BombUnderDeclared, {}, C::kOk, C::kDataLoss, "zstd frame says 67108864 decoded bytes"},
      {"bomb_no_content_size", BombNoContentSize, {}, C::kOk, C::kDataLoss, "zstd frame header is invalid"},
      {"wrong_hash", WrongHash, {}, C::kOk, C::kDataLoss, "decoded bytes hash to"},
      {"too_new_version", TooNewVersion, {}, C::kUnimplemented, C::kOk, "is newer than this crashreplay reads"},
      {"unknown_required_record", UnknownRequiredRecord, {}, C::kOk, C::kUnimplemented,
       "record type 4242 is not known"},
      {"dangling_blob_reference", DanglingBlobReference, {}, C::kOk, C::kDataLoss, "is marked stored but blob"},
      {"zstd_in_version_1", ZstdInVersion1, {}, C::kOk, C::kUnimplemented,
       "frame flags 0x0002 set bits format 1.0 does not define"},
      {"zstd_record_no_content_size", ZstdRecordNoContentSize, {}, C::kOk, C::kDataLoss,
       "does not state its decoded size"},
      {"zstd_record_over_limit", ZstdRecordOverLimit, {}, C::kOk, C::kResourceExhausted,
       "states 68157440 decoded bytes, over the 67108864-byte limit"},
      {"zstd_record_truncated", ZstdRecordTruncated, {}, C::kOk, C::kDataLoss, "zstd cannot decode it"},
      {"zstd_flag_on_blob", ZstdFlagOnBlob, {}, C::kOk, C::kDataLoss, "a blob frame with the zstd flag"},
      {"stream_part_without_start", StreamPartWithoutStart, {}, C::kOk, C::kDataLoss,
       "continues a zstd frame whose first part is not before it"},
      {"stream_part_wrong_size", StreamPartWrongSize, {}, C::kOk, C::kDataLoss, "zstd stream part decodes to"},
      {"stream_part_over_limit", StreamPartOverLimit, {}, C::kOk, C::kResourceExhausted,
       "states 68157440 decoded bytes, over the 67108864-byte limit"},
      {"stream_flag_on_blob", StreamFlagOnBlob, {}, C::kOk, C::kDataLoss,
       "the zstd-stream flag on a record that is not a step record"},
      {"page_delta_without_flag", PageDeltaWithoutFlag, {}, C::kOk, C::kDataLoss,
       "starts at column 3, but its frame is not marked as holding page-table deltas"},
      {"page_delta_without_previous_row", PageDeltaWithoutPreviousRow, {}, C::kOk, C::kDataLoss,
       "req_pool_index 7 continues a previous row from column 3, but no earlier step record holds that row"},
      {"page_delta_past_previous_row", PageDeltaPastPreviousRow, {}, C::kOk, C::kDataLoss,
       "continues a previous row from column 5, but the previous row holds columns 0..1 only"},
      {"page_delta_flag_in_2_2", PageDeltaFlagIn2_2, {}, C::kOk, C::kUnimplemented,
       "frame flags 0x0008 set bits format 2.2 does not define; use a newer crashreplay"},
      {"page_delta_flag_on_blob", PageDeltaFlagOnBlob, {}, C::kOk, C::kDataLoss,
       "the page-table-deltas flag on a record that is not a step record"},
      {"list_delta_flag_in_2_3", ListDeltaFlagIn2_3, {}, C::kOk, C::kUnimplemented,
       "frame flags 0x0014 set bits format 2.3 does not define; use a newer crashreplay"},
      {"list_delta_flag_on_stream_start", ListDeltaFlagOnStreamStart, {}, C::kOk, C::kDataLoss,
       "the list-deltas flag on a record that is not a step record continuing a zstd stream"},
      {"list_delta_flag_on_whole_step", ListDeltaFlagOnWholeStep, {}, C::kOk, C::kDataLoss,
       "the list-deltas flag on a record that is not a step record continuing a zstd stream"},
      {"wrapped_segment_count", WrappedSegmentCount, {}, C::kOk, C::kDataLoss,
       "its segment table declares 2^32 segments (the count field 0xffffffff wraps to 0)"},
      {"spliced_sessions", SplicedSessions, {}, C::kOk, C::kDataLoss,
       "a second session manifest, of session 'other-session' (rank 1), after that of session 'test-session' "
       "(rank 0): the file holds records of two sessions spliced together"},
  };
  // clang-format on
}

std::string DataDir() {
  const char* src = std::getenv("CRASHREPLAY_SOURCE_DIR");
  return std::string(src != nullptr ? src : ".") + "/tests/formats/data/capture";
}

TEST(CaptureHostile, EveryNamedFileGivesItsClearErrorAndKeepsThePrefix) {
  for (const HostileCase& c : Cases()) {
    SCOPED_TRACE(c.name);
    const std::string path = DataDir() + "/" + c.name + ".crcap";
    ASSERT_TRUE(std::filesystem::exists(path)) << path << " is missing; see the top of this file";
    auto reader = CaptureReader::Open(path, c.limits);
    if (c.open_code != absl::StatusCode::kOk) {
      ASSERT_FALSE(reader.ok());
      EXPECT_EQ(reader.status().code(), c.open_code) << reader.status();
      EXPECT_NE(reader.status().message().find(c.message), std::string_view::npos) << reader.status();
      continue;
    }
    ASSERT_TRUE(reader.ok()) << reader.status();
    const VerifyResult v = (*reader)->Verify();
    EXPECT_EQ(v.status.code(), c.verify_code) << v.status;
    EXPECT_NE(v.status.message().find(c.message), std::string_view::npos) << v.status;
    EXPECT_FALSE((*reader)->Summary().ok);
    ASSERT_TRUE((*reader)->manifest().has_value());
    EXPECT_EQ((*reader)->steps().size(), 1u);
    EXPECT_GE(v.bad_offset, kFileHeaderSize);
  }
}

TEST(CaptureHostile, NamedFilesMatchTheirBuilders) {
  // A file that drifted from its builder would test something unnamed.
  const bool regenerate = std::getenv("CRASHREPLAY_REGENERATE_CAPTURES") != nullptr;
  if (regenerate) std::filesystem::create_directories(DataDir());
  for (const HostileCase& c : Cases()) {
    const std::string path = DataDir() + "/" + c.name + ".crcap";
    if (regenerate) WriteFileBytes(path, c.build());
    EXPECT_EQ(ReadFileBytes(path), c.build()) << c.name << ": regenerate as the top of this file says";
  }
}

TEST(CaptureHostile, NestingLimitIsEnforced) {
  TempDir dir;
  const std::string path = dir.File("n.crcap");
  testing::WriteSmallCapture(path, 1, true);
  CaptureLimits tight;
  tight.nesting_limit = 2;  // the manifest's weight hashes sit 4 deep
  auto reader = CaptureReader::Open(path, tight);
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->scan_status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE((*reader)->scan_status().message().find("nesting"), std::string_view::npos) << (*reader)->scan_status();
}

TEST(CaptureHostile, StructuredRecordSizeLimitIsEnforcedBeforeCopying) {
  TempDir dir;
  const std::string path = dir.File("s.crcap");
  testing::WriteSmallCapture(path, 1, true);
  CaptureLimits tight;
  tight.max_structured_payload = 64;
  auto reader = CaptureReader::Open(path, tight);
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->scan_status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE((*reader)->records().empty());
}

TEST(CaptureHostile, TotalDecodedBytesAreCapped) {
  TempDir dir;
  const std::string path = dir.File("t.crcap");
  testing::WriteSmallCapture(path, 3, true, 4096);
  CaptureLimits tight;
  tight.max_total_decoded = 3 * 8192;  // three of the four 8 KiB blobs
  auto reader = CaptureReader::Open(path, tight);
  ASSERT_TRUE(reader.ok());
  int ok = 0, refused = 0;
  for (const SnapshotRecord& s : (*reader)->snapshots()) {
    for (const TensorDescriptor& t : s.tensors) {
      auto b = (*reader)->ReadBlob(t.content_hash);
      if (b.ok())
        ++ok;
      else if (b.status().code() == absl::StatusCode::kResourceExhausted)
        ++refused;
    }
  }
  EXPECT_EQ(ok, 3);
  EXPECT_EQ(refused, 3);
}

}  // namespace
}  // namespace crashreplay
