#include "crashreplay/formats/capture_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "capture_schema_codec.h"
#include "crashreplay/base/status.h"
#include "crashreplay/formats/blob_codec.h"
#include "mapped_file.h"

namespace crashreplay {
namespace {

bool AllZero(const unsigned char* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

// Prefixes a record-level error with where it is.
absl::Status At(const absl::Status& s, const RecordInfo& r) {
  return absl::Status(s.code(), absl::StrFormat("record %d (%s) at byte offset %d: %s", r.index, RecordTypeName(r.type),
                                                r.offset, s.message()));
}

// A compressed structured payload (frame flag kFrameFlagZstd): one zstd
// frame that states its decoded size, at most the structured-payload limit,
// and decodes to exactly that many bytes. Checked before allocating.
using DCtxPtr = std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)>;

absl::Status Inflate(uint16_t type, std::span<const unsigned char> z, uint64_t limit, DCtxPtr* dctx,
                     std::vector<unsigned char>* out) {
  if (type == static_cast<uint16_t>(RecordType::kBlob)) {
    return absl::DataLossError("a blob frame with the zstd flag (a blob names its codec in its own header)");
  }
  const unsigned long long content = ZSTD_getFrameContentSize(z.data(), z.size());
  if (content == ZSTD_CONTENTSIZE_ERROR || content == ZSTD_CONTENTSIZE_UNKNOWN) {
    return absl::DataLossError(
        "compressed payload: the zstd frame header is invalid or does not state its decoded size");
  }
  if (content > limit) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "compressed record payload states %d decoded bytes, over the %d-byte limit for structured records", content,
        limit));
  }
  if (*dctx == nullptr) {
    dctx->reset(ZSTD_createDCtx());
    if (*dctx == nullptr) return absl::ResourceExhaustedError("cannot allocate a zstd decompression context");
    ZSTD_DCtx_setParameter(dctx->get(), ZSTD_d_windowLogMax, 27);
  }
  out->resize(static_cast<size_t>(content));
  const size_t got = ZSTD_decompressDCtx(dctx->get(), out->data(), out->size(), z.data(), z.size());
  if (ZSTD_isError(got)) {
    return absl::DataLossError(
        absl::StrFormat("compressed payload: zstd cannot decode it (%s)", ZSTD_getErrorName(got)));
  }
  if (got != content) {
    return absl::DataLossError(
        absl::StrFormat("compressed payload: decoded %d bytes, its zstd header states %d", got, content));
  }
  return absl::OkStatus();
}

// A part of a zstd stream of step records (frame flag kFrameFlagZstdStream,
// format 2.2): its 8-byte part header, then zstd bytes that decode, after
// the parts of the same zstd frame before it, to exactly the declared size
// (at most the structured-payload limit). `open` says whether a zstd frame
// has been started by an earlier part; it is closed again by any error.
absl::Status InflateStreamPart(const FrameHeader& h, std::span<const unsigned char> p, uint64_t limit, DCtxPtr* dctx,
                               bool* open, std::vector<unsigned char>* out) {
  if (h.type != static_cast<uint16_t>(RecordType::kStep)) {
    return absl::DataLossError("the zstd-stream flag on a record that is not a step record");
  }
  if ((h.flags & kFrameFlagZstd) != 0) return absl::DataLossError("both the zstd and the zstd-stream flags are set");
  if (p.size() < kStreamPartHeaderSize) {
    return absl::DataLossError(absl::StrFormat("zstd stream part of %d bytes, shorter than its %d-byte header",
                                               p.size(), kStreamPartHeaderSize));
  }
  if (p[0] > kStreamPartStart || p[1] != 0 || p[2] != 0 || p[3] != 0) {
    return absl::DataLossError(
        absl::StrFormat("zstd stream part header has unknown bits set (%02x %02x %02x %02x)", p[0], p[1], p[2], p[3]));
  }
  const uint32_t size = LoadLE32(p.data() + 4);
  if (size > limit) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "zstd stream part states %d decoded bytes, over the %d-byte limit for structured records", size, limit));
  }
  if (p[0] == kStreamPartStart) {
    if (*dctx == nullptr) {
      dctx->reset(ZSTD_createDCtx());
      if (*dctx == nullptr) return absl::ResourceExhaustedError("cannot allocate a zstd decompression context");
    }
    ZSTD_DCtx_reset(dctx->get(), ZSTD_reset_session_and_parameters);
    ZSTD_DCtx_setParameter(dctx->get(), ZSTD_d_windowLogMax, 27);
    *open = true;
  } else if (!*open) {
    return absl::DataLossError("zstd stream part continues a zstd frame whose first part is not before it in the file");
  }
  *open = false;  // until this part has decoded cleanly
  // One byte of room more than declared: a part that decodes to more is
  // caught rather than left pending in the decoder.
  out->resize(static_cast<size_t>(size) + 1);
  ZSTD_inBuffer in{p.data() + kStreamPartHeaderSize, p.size() - kStreamPartHeaderSize, 0};
  ZSTD_outBuffer o{out->data(), out->size(), 0};
  for (;;) {
    const size_t in_before = in.pos, out_before = o.pos;
    const size_t r = ZSTD_decompressStream(dctx->get(), &o, &in);
    if (ZSTD_isError(r)) {
      return absl::DataLossError(absl::StrFormat("zstd stream part: zstd cannot decode it (%s)", ZSTD_getErrorName(r)));
    }
    if (o.pos == o.size) break;
    if (in.pos == in.size && in.pos == in_before && o.pos == out_before) break;
  }
  if (o.pos != size || in.pos != in.size) {
    return absl::DataLossError(absl::StrFormat("zstd stream part decodes to %s bytes, its header states %d",
                                               o.pos > size ? "more" : absl::StrFormat("%d", o.pos), size));
  }
  out->resize(size);
  *open = true;
  return absl::OkStatus();
}

}  // namespace

CaptureReader::CaptureReader(std::string path, const CaptureLimits& limits) : path_(std::move(path)), limits_(limits) {}

CaptureReader::~CaptureReader() {
  if (mapping_ != nullptr) ::munmap(mapping_, size_);
}

absl::StatusOr<std::unique_ptr<CaptureReader>> CaptureReader::Open(const std::string& path,
                                                                   const CaptureLimits& limits) {
  // Never blocks and never reads a FIFO or a device: a capture is a regular
  // file (mapped_file.h).
  uint64_t size = 0;
  absl::StatusOr<int> opened = OpenRegularFile(path, &size);
  if (!opened.ok()) {
    return absl::Status(opened.status().code(), absl::StrFormat("cannot open capture: %s", opened.status().message()));
  }
  const int fd = *opened;
  std::unique_ptr<CaptureReader> reader(new CaptureReader(path, limits));
  reader->size_ = static_cast<size_t>(size);
  if (reader->size_ > 0) {
    void* m = ::mmap(nullptr, reader->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      return absl::ErrnoToStatus(e, absl::StrFormat("cannot map capture %s", path));
    }
    reader->mapping_ = m;
    reader->data_ = static_cast<const unsigned char*>(m);
  }
  ::close(fd);
  CR_RETURN_IF_ERROR(reader->ReadHeaderAndScan());
  return reader;
}

absl::StatusOr<std::unique_ptr<CaptureReader>> CaptureReader::FromBytes(std::span<const unsigned char> bytes,
                                                                        const CaptureLimits& limits,
                                                                        const std::string& name) {
  std::unique_ptr<CaptureReader> reader(new CaptureReader(name, limits));
  reader->owned_.assign(bytes.begin(), bytes.end());
  reader->data_ = reader->owned_.data();
  reader->size_ = reader->owned_.size();
  CR_RETURN_IF_ERROR(reader->ReadHeaderAndScan());
  return reader;
}

std::span<const unsigned char> CaptureReader::Payload(const RecordInfo& r) const {
  return {data_ + r.offset + kFrameHeaderSize, static_cast<size_t>(r.payload_size)};
}

absl::Status CaptureReader::ReadHeaderAndScan() {
  if (absl::Status s = CheckFileHeader(data_, size_, &major_, &minor_); !s.ok()) {
    return absl::Status(s.code(), absl::StrFormat("%s: %s", path_, s.message()));
  }
  uint64_t pos = kFileHeaderSize;
  auto stop = [&](absl::Status s, bool torn) {
    scan_status_ = absl::Status(s.code(), absl::StrFormat("%s: %s", path_, s.message()));
    scan_stop_offset_ = pos;
    truncated_ = torn;
  };
  DCtxPtr dctx(nullptr, ZSTD_freeDCtx);
  DCtxPtr stream_dctx(nullptr, ZSTD_freeDCtx);  // the zstd stream of step records (2.2)
  bool stream_open = false;
  std::vector<unsigned char> inflated;  // a compressed record's payload, reused
  while (pos < size_) {
    const uint64_t remaining = size_ - pos;
    const uint64_t index = records_.size();
    if (index >= limits_.max_records) {
      stop(absl::ResourceExhaustedError(absl::StrFormat(
               "more than %d records at byte offset %d; raise CaptureLimits.max_records if the file is trusted",
               limits_.max_records, pos)),
           false);
      return absl::OkStatus();
    }
    // A tail of zeros is what some filesystems leave after a crash that
    // extended the file without writing it: a torn tail, not corruption.
    if (AllZero(data_ + pos, static_cast<size_t>(remaining))) {
      stop(
          absl::DataLossError(absl::StrFormat(
              "torn tail: the last %d bytes from offset %d are zeros (the writer stopped mid-record)", remaining, pos)),
          true);
      return absl::OkStatus();
    }
    if (remaining < kFrameHeaderSize) {
      stop(absl::DataLossError(absl::StrFormat(
               "torn tail: %d bytes at offset %d, fewer than a %d-byte frame header (record %d was cut off)", remaining,
               pos, kFrameHeaderSize, index)),
           true);
      return absl::OkStatus();
    }
    FrameHeader h;
    if (!ParseFrameHeader(data_ + pos, &h)) {
      stop(absl::DataLossError(
               absl::StrFormat("record %d at byte offset %d: no frame marker: the file is corrupt here", index, pos)),
           false);
      return absl::OkStatus();
    }
    if (h.payload_size > remaining - kFrameHeaderSize) {
      stop(absl::DataLossError(absl::StrFormat(
               "torn tail: record %d (%s) at byte offset %d declares %d payload bytes but only %d remain", index,
               RecordTypeName(h.type), pos, h.payload_size, remaining - kFrameHeaderSize)),
           true);
      return absl::OkStatus();
    }
    const unsigned char* payload = data_ + pos + kFrameHeaderSize;
    if (FrameChecksum(data_ + pos, payload, static_cast<size_t>(h.payload_size)) != h.checksum) {
      stop(absl::DataLossError(absl::StrFormat("record %d (%s) at byte offset %d: checksum mismatch", index,
                                               RecordTypeName(h.type), pos)),
           false);
      return absl::OkStatus();
    }
    const RecordInfo info{index, pos, h.type, h.flags, h.payload_size};
    if ((h.flags & ~FrameFlagsKnown(major_, minor_)) != 0) {
      stop(At(absl::UnimplementedError(
                  absl::StrFormat("frame flags 0x%04x set bits format %d.%d does not define; use a newer crashreplay",
                                  h.flags, major_, minor_)),
              info),
           false);
      return absl::OkStatus();
    }
    if ((h.flags & kFrameFlagPageDeltas) != 0 && h.type != static_cast<uint16_t>(RecordType::kStep)) {
      stop(At(absl::DataLossError("the page-table-deltas flag on a record that is not a step record"), info), false);
      return absl::OkStatus();
    }
    if ((h.flags & kFrameFlagListDeltas) != 0 &&
        ((h.flags & kFrameFlagZstdStream) == 0 || h.payload_size == 0 || payload[0] == kStreamPartStart)) {
      stop(At(absl::DataLossError(
                  "the list-deltas flag on a record that is not a step record continuing a zstd stream (format 2.4 "
                  "sets it only there: the record it adds to is the one before it in that stream)"),
              info),
           false);
      return absl::OkStatus();
    }
    std::span<const unsigned char> body(payload, static_cast<size_t>(h.payload_size));
    if ((h.flags & kFrameFlagZstdStream) != 0) {
      if (absl::Status s =
              InflateStreamPart(h, body, limits_.max_structured_payload, &stream_dctx, &stream_open, &inflated);
          !s.ok()) {
        stop(At(s, info), false);
        return absl::OkStatus();
      }
      body = inflated;
    } else if ((h.flags & kFrameFlagZstd) != 0) {
      if (absl::Status s = Inflate(h.type, body, limits_.max_structured_payload, &dctx, &inflated); !s.ok()) {
        stop(At(s, info), false);
        return absl::OkStatus();
      }
      body = inflated;
    }
    if (absl::Status s = AcceptRecord(info, body); !s.ok()) {
      stop(At(s, info), false);
      return absl::OkStatus();
    }
    records_.push_back(info);
    if (h.type == static_cast<uint16_t>(RecordType::kStep)) {
      step_stored_bytes_ += h.payload_size;
      step_raw_bytes_ += body.size();
    }
    pos += kFrameHeaderSize + h.payload_size;
  }
  scan_stop_offset_ = pos;
  return absl::OkStatus();
}

// Page-table deltas (format 2.3): each row becomes the row as far as the
// file knows it, from the last row of the same (rank, req_pool_index).
absl::Status CaptureReader::ResolvePageRows(bool marked, StepRecord* r) {
  for (PageTableRow& row : r->page_table) {
    const std::pair<uint32_t, int64_t> key{r->rank, row.req_pool_index};
    if (row.complete()) {
      page_rows_[key] = KnownRow{0, row.token_slots};
      continue;
    }
    if (!marked) {
      return absl::DataLossError(absl::StrFormat(
          "step %d: the page-table row of req_pool_index %d starts at column %d, but its frame is not marked as "
          "holding page-table deltas (frame flag bit 3)",
          r->step, row.req_pool_index, row.start));
    }
    if (row.start < 0) {
      return absl::DataLossError(absl::StrFormat("step %d: the page-table row of req_pool_index %d starts at column %d",
                                                 r->step, row.req_pool_index, row.start));
    }
    auto it = page_rows_.find(key);
    if (row.from_previous && it == page_rows_.end()) {
      return absl::DataLossError(absl::StrFormat(
          "step %d rank %d: the page-table row of req_pool_index %d continues a previous row from column %d, but "
          "no earlier step record holds that row",
          r->step, r->rank, row.req_pool_index, row.start));
    }
    if (it == page_rows_.end()) it = page_rows_.emplace(key, KnownRow{}).first;
    KnownRow& known = it->second;
    if (!row.from_previous || row.start <= known.start) {
      // Whatever came before is unknown to the file (or replaced whole).
      known.start = row.start;
      known.slots = row.token_slots;
    } else {
      const int64_t have = known.start + static_cast<int64_t>(known.slots.size());
      if (row.start > have) {
        return absl::DataLossError(absl::StrFormat(
            "step %d rank %d: the page-table row of req_pool_index %d continues a previous row from column %d, but "
            "the previous row holds columns %d..%d only",
            r->step, r->rank, row.req_pool_index, row.start, known.start, have - 1));
      }
      known.slots.resize(static_cast<size_t>(row.start - known.start));
      known.slots.insert(known.slots.end(), row.token_slots.begin(), row.token_slots.end());
    }
    row.start = known.start;
    row.from_previous = false;
    row.token_slots = known.slots;
  }
  return absl::OkStatus();
}

absl::Status CaptureReader::AcceptRecord(const RecordInfo& info, std::span<const unsigned char> payload) {
  if (end_.has_value()) return absl::DataLossError("a record follows the end record");
  const auto type = static_cast<RecordType>(info.type);
  const bool known = info.type >= 1 && info.type <= kMaxKnownRecordType;
  if (known && type != RecordType::kManifest && !manifest_.has_value()) {
    return absl::DataLossError("the first record is not the session manifest");
  }
  const unsigned char* p = payload.data();
  const size_t n = payload.size();
  switch (type) {
    case RecordType::kManifest: {
      if (manifest_.has_value()) {
        // Two captures spliced into one file: say whose records follow.
        SessionManifest second;
        if (!internal::FromPayload(p, n, limits_, &second).ok()) {
          return absl::DataLossError("a second session manifest");
        }
        if (second.session_id != manifest_->session_id) {
          return absl::DataLossError(absl::StrFormat(
              "a second session manifest, of session '%s' (rank %d), after that of session '%s' (rank %d): the file "
              "holds records of two sessions spliced together",
              second.session_id, second.parallel.rank, manifest_->session_id, manifest_->parallel.rank));
        }
        return absl::DataLossError(absl::StrFormat(
            "a second session manifest, of the same session '%s' (rank %d after rank %d): two captures spliced "
            "together",
            second.session_id, second.parallel.rank, manifest_->parallel.rank));
      }
      SessionManifest m;
      CR_RETURN_IF_ERROR(internal::FromPayload(p, n, limits_, &m));
      manifest_ = std::move(m);
      return absl::OkStatus();
    }
    case RecordType::kStep: {
      StepRecord r;
      CR_RETURN_IF_ERROR(internal::FromPayload(p, n, limits_, &r));
      CR_RETURN_IF_ERROR(ResolvePageRows((info.flags & kFrameFlagPageDeltas) != 0, &r));
      if ((info.flags & kFrameFlagListDeltas) != 0) {
        // The scan checked that this part continues its zstd stream, and
        // InflateStreamPart that the part before it decoded: its record is
        // the last one read from a part.
        if (last_part_step_ < 0) {
          return absl::DataLossError(
              "step record with list deltas (frame flag bit 4) but no zstd stream part before it");
        }
        internal::AddListDeltas(steps_[static_cast<size_t>(last_part_step_)], &r);
      }
      if ((info.flags & kFrameFlagZstdStream) != 0) last_part_step_ = static_cast<int64_t>(steps_.size());
      steps_.push_back(std::move(r));
      return absl::OkStatus();
    }
    case RecordType::kBlob: {
      BlobHeader bh;
      CR_RETURN_IF_ERROR(ParseBlobHeader(p, n, &bh));
      if (!blobs_.emplace(bh.hash, info.index).second) ++duplicate_blobs_;
      return absl::OkStatus();
    }
    case RecordType::kSnapshot: {
      SnapshotRecord r;
      CR_RETURN_IF_ERROR(internal::FromPayload(p, n, limits_, &r));
      snapshots_.push_back(std::move(r));
      return absl::OkStatus();
    }
    case RecordType::kFailure: {
      FailureRecord r;
      CR_RETURN_IF_ERROR(internal::FromPayload(p, n, limits_, &r));
      failures_.push_back(std::move(r));
      return absl::OkStatus();
    }
    case RecordType::kWeightCheck: {
      WeightCheckRecord r;
      CR_RETURN_IF_ERROR(internal::FromPayload(p, n, limits_, &r));
      weight_checks_.push_back(std::move(r));
      return absl::OkStatus();
    }
    case RecordType::kFingerprints: {
      FingerprintRecord r;
      CR_RETURN_IF_ERROR(internal::FromPayload(p, n, limits_, &r));
      fingerprints_.push_back(std::move(r));
      return absl::OkStatus();
    }
    case RecordType::kDropped: {
      DroppedSnapshotsRecord r;
      CR_RETURN_IF_ERROR(internal::FromPayload(p, n, limits_, &r));
      dropped_ = r;
      return absl::OkStatus();
    }
    case RecordType::kWeightHashes: {
      WeightHashesRecord r;
      CR_RETURN_IF_ERROR(internal::FromPayload(p, n, limits_, &r));
      weight_hashes_.push_back(std::move(r));
      return absl::OkStatus();
    }
    case RecordType::kIndex: {
      if (index_.has_value()) return absl::DataLossError("a second index record");
      IndexRecord r;
      CR_RETURN_IF_ERROR(internal::FromPayload(p, n, limits_, &r));
      index_ = std::move(r);
      index_record_ = info.index;
      return absl::OkStatus();
    }
    case RecordType::kEnd: {
      EndRecord r;
      CR_RETURN_IF_ERROR(internal::FromPayload(p, n, limits_, &r));
      end_ = r;
      return absl::OkStatus();
    }
  }
  if ((info.flags & kFrameFlagSkippable) != 0) {
    ++skipped_unknown_;
    return absl::OkStatus();
  }
  return absl::UnimplementedError(absl::StrFormat(
      "record type %d is not known to this version and is not marked skippable; use a newer crashreplay", info.type));
}

absl::StatusOr<std::vector<std::byte>> CaptureReader::DecodeBlobAt(const RecordInfo& r, bool charge_total) const {
  const std::span<const unsigned char> payload = Payload(r);
  BlobHeader h;
  CR_RETURN_IF_ERROR(ParseBlobHeader(payload.data(), payload.size(), &h));
  if (!charge_total) return DecodeBlobPayload(payload.data(), payload.size(), limits_.max_blob_raw_size);
  // Reserve against the per-reader total before allocating anything.
  const uint64_t before = decoded_total_.fetch_add(h.raw_size);
  if (before + h.raw_size > limits_.max_total_decoded || before + h.raw_size < before) {
    decoded_total_.fetch_sub(h.raw_size);
    return absl::ResourceExhaustedError(
        absl::StrFormat("decoding blob %s (%d bytes) would pass this reader's total cap of %d decoded bytes",
                        h.hash.Hex(), h.raw_size, limits_.max_total_decoded));
  }
  return DecodeBlobPayload(payload.data(), payload.size(), limits_.max_blob_raw_size);
}

absl::StatusOr<std::vector<std::byte>> CaptureReader::ReadBlob(const Hash128& hash) const {
  auto it = blobs_.find(hash);
  if (it == blobs_.end()) {
    return absl::NotFoundError(absl::StrFormat("%s: no blob with hash %s", path_, hash.Hex()));
  }
  const RecordInfo& r = records_[it->second];
  absl::StatusOr<std::vector<std::byte>> out = DecodeBlobAt(r, /*charge_total=*/true);
  if (!out.ok()) {
    const absl::Status s = At(out.status(), r);
    return absl::Status(s.code(), absl::StrFormat("%s: %s", path_, s.message()));
  }
  return out;
}

CaptureSummary CaptureReader::Summary() const {
  CaptureSummary s;
  s.path = path_;
  s.format_major = major_;
  s.format_minor = minor_;
  s.truncated = truncated_;
  s.corrupt = !scan_status_.ok() && !truncated_;
  if (!scan_status_.ok()) {
    s.problem = std::string(scan_status_.message());
    s.problem_offset = scan_stop_offset_;
  }
  s.ok = scan_status_.ok() && end_.has_value() && end_->ok;
  s.records = records_.size();
  s.steps = steps_.size();
  s.step_stored_bytes = step_stored_bytes_;
  s.step_raw_bytes = step_raw_bytes_;
  std::set<uint32_t> ranks;
  if (manifest_.has_value()) ranks.insert(manifest_->parallel.rank);
  for (size_t i = 0; i < steps_.size(); ++i) {
    ranks.insert(steps_[i].rank);
    s.first_step = i == 0 ? steps_[i].step : std::min(s.first_step, steps_[i].step);
    s.last_step = std::max(s.last_step, steps_[i].step);
  }
  s.ranks.assign(ranks.begin(), ranks.end());
  s.blobs = blobs_.size();
  s.duplicate_blobs = duplicate_blobs_;
  for (const auto& [hash, index] : blobs_) {
    const RecordInfo& r = records_[index];
    s.blob_stored_bytes += r.payload_size;
    s.blob_raw_bytes += LoadLE64(data_ + r.offset + kFrameHeaderSize + 8);
  }
  s.bytes = size_;
  s.snapshots = snapshots_.size();
  s.failures = failures_.size();
  s.weight_checks = weight_checks_.size();
  s.fingerprint_records = fingerprints_.size();
  for (const WeightCheckRecord& w : weight_checks_) {
    for (const WeightSlice& sl : w.slices) s.corrupt_weight_slices += sl.corrupt ? 1 : 0;
  }
  if (dropped_.has_value()) {
    s.snapshots_dropped = dropped_->snapshots_dropped;
    s.bytes_dropped = dropped_->bytes_dropped;
    s.steps_dropped = dropped_->steps_dropped;
    s.records_dropped = dropped_->records_dropped;
    s.write_errors = dropped_->write_errors;
  }
  if (end_.has_value()) {
    s.snapshots_dropped = std::max(s.snapshots_dropped, end_->snapshots_dropped);
    s.bytes_dropped = std::max(s.bytes_dropped, end_->bytes_dropped);
    s.steps_dropped = std::max(s.steps_dropped, end_->steps_dropped);
    s.records_dropped = std::max(s.records_dropped, end_->records_dropped);
    s.write_errors = std::max(s.write_errors, end_->write_errors);
  }
  s.skipped_unknown = skipped_unknown_;
  return s;
}

VerifyResult CaptureReader::Verify() const {
  VerifyResult v;
  auto fail = [&](const absl::Status& s, uint64_t record, uint64_t offset) {
    v.status = absl::Status(s.code(), absl::StrFormat("%s: %s", path_, s.message()));
    v.bad_record = record;
    v.bad_offset = offset;
    return v;
  };
  absl::flat_hash_set<Hash128, Hash128Hasher> blobs_seen;
  absl::flat_hash_map<uint64_t, uint16_t> type_at_offset;
  // Tensors marked stored must name a blob written earlier: the recorder
  // writes blobs first so that a crash never leaves a dangling reference.
  auto check_tensors = [&](const std::vector<TensorDescriptor>& tensors) -> absl::Status {
    for (const TensorDescriptor& t : tensors) {
      if (t.stored && !blobs_seen.contains(t.content_hash)) {
        return absl::DataLossError(
            absl::StrFormat("tensor '%s' is marked stored but blob %s is not before it", t.name, t.content_hash.Hex()));
      }
    }
    return absl::OkStatus();
  };
  size_t step_i = 0, snap_i = 0;
  for (const RecordInfo& r : records_) {
    v.records_checked = r.index;
    type_at_offset[r.offset] = r.type;
    absl::Status s;
    switch (static_cast<RecordType>(r.type)) {
      case RecordType::kBlob: {
        // One blob at a time, released right away: Verify's memory is
        // bounded by the per-blob cap, so it is not charged to the total.
        absl::StatusOr<std::vector<std::byte>> bytes = DecodeBlobAt(r, /*charge_total=*/false);
        if (!bytes.ok()) {
          s = bytes.status();
        } else {
          ++v.blobs_checked;
          BlobHeader h;
          (void)ParseBlobHeader(Payload(r).data(), Payload(r).size(), &h);
          blobs_seen.insert(h.hash);
        }
        break;
      }
      case RecordType::kStep: s = check_tensors(steps_[step_i++].tensors); break;
      case RecordType::kSnapshot: s = check_tensors(snapshots_[snap_i++].tensors); break;
      case RecordType::kIndex:
        for (const IndexEntry& e : index_->entries) {
          auto it = type_at_offset.find(e.offset);
          if (it == type_at_offset.end() || it->second != e.type) {
            s = absl::DataLossError(absl::StrFormat("index lists a %s record at offset %d that is not there",
                                                    RecordTypeName(e.type), e.offset));
            break;
          }
        }
        for (const BlobIndexEntry& b : index_->blobs) {
          if (!s.ok()) break;
          auto it = blobs_.find(b.hash);
          if (it == blobs_.end() || records_[it->second].offset != b.offset) {
            s = absl::DataLossError(
                absl::StrFormat("index lists blob %s at offset %d that is not there", b.hash.Hex(), b.offset));
          }
        }
        break;
      case RecordType::kEnd:
        if (const uint64_t before = index_.has_value() ? index_record_ : r.index; end_->records != before) {
          s = absl::DataLossError(
              absl::StrFormat("end record counts %d records before the index, the file has %d", end_->records, before));
        } else if (index_.has_value() && end_->index_offset != records_[index_record_].offset) {
          s = absl::DataLossError(absl::StrFormat("end record says the index is at offset %d, it is at %d",
                                                  end_->index_offset, records_[index_record_].offset));
        } else if (index_.has_value()) {
          // Steps and blobs count what the index lists (frames appended on
          // the signal path are in the file but not in the index).
          uint64_t indexed_steps = 0;
          for (const IndexEntry& e : index_->entries) {
            indexed_steps += e.type == static_cast<uint16_t>(RecordType::kStep);
          }
          if (end_->steps != indexed_steps || end_->blobs != index_->blobs.size()) {
            s = absl::DataLossError(
                absl::StrFormat("end record counts %d steps and %d blobs, the index lists %d and %d", end_->steps,
                                end_->blobs, indexed_steps, index_->blobs.size()));
          }
        }
        break;
      default: break;
    }
    if (!s.ok()) return fail(At(s, r), r.index, r.offset);
  }
  v.records_checked = records_.size();
  if (!scan_status_.ok()) {
    // scan_status_ already names the path.
    v.status = scan_status_;
    v.bad_record = records_.size();
    v.bad_offset = scan_stop_offset_;
  }
  return v;
}

absl::StatusOr<std::vector<std::string>> ListCaptureFiles(const std::string& path) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(st)) {
    return absl::NotFoundError(absl::StrFormat("%s does not exist", path));
  }
  if (!std::filesystem::is_directory(st)) return std::vector<std::string>{path};
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(path, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("rank-") && name.ends_with(kCaptureFileSuffix)) files.push_back(entry.path().string());
  }
  if (ec) return absl::ErrnoToStatus(ec.value(), absl::StrFormat("cannot list session directory %s", path));
  if (files.empty()) {
    return absl::NotFoundError(absl::StrFormat("%s holds no rank-*.crcap capture files", path));
  }
  std::sort(files.begin(), files.end());  // zero-padded ranks sort numerically
  return files;
}

}  // namespace crashreplay
