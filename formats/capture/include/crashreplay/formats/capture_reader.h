// CaptureReader: reads one capture file, treating every byte as hostile.
//
// Open() maps the file, checks the file header (a newer major version is
// refused with Unimplemented and a message saying so), then scans frames
// from the start. Every frame's checksum is verified during the scan and
// every structured record is decoded under CaptureLimits (Cap'n Proto
// traversal and nesting limits, sizes checked before any allocation). The
// scan stops at the first frame that is torn (the file ends inside it),
// corrupt, or of an unknown type without the skippable bit; everything
// before it stays available, and scan_status() says what stopped it and
// where. So a capture cut at any byte yields exactly its complete records.
// Blob payloads are decoded only on demand (ReadBlob, Verify), with a cap
// per blob and per reader, and always verified against their XXH3-128.
//
// Open() fails only when the file cannot be read or its 32-byte header is
// bad; a damaged body is reported through scan_status(), Summary() and
// Verify(). Nothing here throws; Cap'n Proto exceptions become DataLoss.
//
// Thread safety: immutable after Open(); const methods may be called from
// several threads. Ownership: the reader owns its mapping of the file.
// Memory: structured records are decoded into memory at Open() (the step
// log is small); blob bytes stay in the mapping until asked for.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "crashreplay/formats/capture_format.h"
#include "crashreplay/formats/capture_records.h"

namespace crashreplay {

// One intact frame found by the scan.
struct RecordInfo {
  uint64_t index = 0;         // 0-based position among the file's frames
  uint64_t offset = 0;        // byte offset of the frame header
  uint16_t type = 0;
  uint16_t flags = 0;
  uint64_t payload_size = 0;
};

struct CaptureSummary {
  std::string path;
  uint16_t format_major = 0;
  uint16_t format_minor = 0;
  bool ok = false;            // closed cleanly: end record with ok, nothing bad anywhere
  bool truncated = false;     // a torn tail: the file ends inside a frame
  bool corrupt = false;       // a bad frame (checksum, marker, malformed record)
  std::string problem;        // what stopped the scan, "" if nothing did
  uint64_t problem_offset = 0;
  uint64_t records = 0;       // intact frames
  uint64_t steps = 0;         // step records
  uint64_t step_stored_bytes = 0;  // their payload bytes in the file
  uint64_t step_raw_bytes = 0;     // the same, decoded (compressed frames, format 2.0)
  std::vector<uint32_t> ranks;  // distinct ranks in step records and the manifest, sorted
  uint64_t first_step = 0, last_step = 0;
  uint64_t blobs = 0;         // distinct blob hashes
  uint64_t duplicate_blobs = 0;
  uint64_t blob_raw_bytes = 0;     // decoded size of the distinct blobs
  uint64_t blob_stored_bytes = 0;  // their payload bytes in the file
  uint64_t bytes = 0;         // file size
  uint64_t snapshots = 0;
  uint64_t failures = 0;
  uint64_t weight_checks = 0;
  uint64_t fingerprint_records = 0;  // format 2.1
  uint64_t corrupt_weight_slices = 0;
  uint64_t snapshots_dropped = 0;
  uint64_t bytes_dropped = 0;
  // The recorder's disk-error counters (docs/capture.md, "Disk full and
  // slow disks"): step records and other records never written, failed writes.
  uint64_t steps_dropped = 0;
  uint64_t records_dropped = 0;
  uint64_t write_errors = 0;
  uint64_t skipped_unknown = 0;    // skippable records of types this version does not know
};

struct VerifyResult {
  absl::Status status;              // OK when every checksum and blob hash holds
  std::optional<uint64_t> bad_record;  // index of the first bad record (== records() size for the tail)
  uint64_t bad_offset = 0;          // its byte offset
  uint64_t records_checked = 0;
  uint64_t blobs_checked = 0;
};

class CaptureReader {
 public:
  static absl::StatusOr<std::unique_ptr<CaptureReader>> Open(const std::string& path, const CaptureLimits& limits = {});
  // Reads a capture from memory (copied); `name` appears in messages.
  static absl::StatusOr<std::unique_ptr<CaptureReader>> FromBytes(std::span<const unsigned char> bytes,
                                                                  const CaptureLimits& limits = {},
                                                                  const std::string& name = "<memory>");
  ~CaptureReader();
  CaptureReader(const CaptureReader&) = delete;
  CaptureReader& operator=(const CaptureReader&) = delete;

  const std::string& path() const { return path_; }
  // OK if the scan reached the end of the file; else what stopped it.
  const absl::Status& scan_status() const { return scan_status_; }
  uint64_t scan_stop_offset() const { return scan_stop_offset_; }
  bool truncated() const { return truncated_; }

  const std::vector<RecordInfo>& records() const { return records_; }
  std::span<const unsigned char> Payload(const RecordInfo& r) const;

  const std::optional<SessionManifest>& manifest() const { return manifest_; }
  const std::vector<StepRecord>& steps() const { return steps_; }
  const std::vector<SnapshotRecord>& snapshots() const { return snapshots_; }
  const std::vector<FailureRecord>& failures() const { return failures_; }
  const std::vector<WeightCheckRecord>& weight_checks() const { return weight_checks_; }
  const std::vector<WeightHashesRecord>& weight_hashes() const { return weight_hashes_; }
  // Fingerprint records (format 2.1), in file order; a step may have a
  // complete record and, written by a failure path, an incomplete one.
  const std::vector<FingerprintRecord>& fingerprints() const { return fingerprints_; }
  const std::optional<DroppedSnapshotsRecord>& dropped() const { return dropped_; }
  const std::optional<IndexRecord>& index() const { return index_; }
  const std::optional<EndRecord>& end() const { return end_; }

  bool HasBlob(const Hash128& hash) const { return blobs_.contains(hash); }
  // Decodes and verifies one blob. NotFound if absent, DataLoss if corrupt,
  // ResourceExhausted past the per-blob or per-reader decoded-bytes cap.
  absl::StatusOr<std::vector<std::byte>> ReadBlob(const Hash128& hash) const;

  CaptureSummary Summary() const;

  // Checks the whole file: every frame checksum (done by the scan), every
  // blob (decoded and hashed), that stored tensors name blobs written before
  // them, and that index and end record agree with the frames. Returns the
  // first problem in file order.
  VerifyResult Verify() const;

 private:
  CaptureReader(std::string path, const CaptureLimits& limits);
  absl::Status ReadHeaderAndScan();
  absl::Status AcceptRecord(const RecordInfo& info, std::span<const unsigned char> payload);
  absl::Status ResolvePageRows(bool marked, StepRecord* r);
  absl::StatusOr<std::vector<std::byte>> DecodeBlobAt(const RecordInfo& r, bool charge_total) const;

  const std::string path_;
  const CaptureLimits limits_;
  // The bytes: either an mmap of the file or an owned copy.
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
  void* mapping_ = nullptr;
  std::vector<unsigned char> owned_;

  uint16_t major_ = 0, minor_ = 0;
  uint64_t step_stored_bytes_ = 0, step_raw_bytes_ = 0;
  absl::Status scan_status_;
  uint64_t scan_stop_offset_ = 0;
  bool truncated_ = false;
  uint64_t skipped_unknown_ = 0;
  uint64_t duplicate_blobs_ = 0;
  std::vector<RecordInfo> records_;
  std::optional<SessionManifest> manifest_;
  std::vector<StepRecord> steps_;
  std::vector<SnapshotRecord> snapshots_;
  std::vector<FailureRecord> failures_;
  std::vector<WeightCheckRecord> weight_checks_;
  std::vector<WeightHashesRecord> weight_hashes_;
  std::vector<FingerprintRecord> fingerprints_;
  std::optional<DroppedSnapshotsRecord> dropped_;
  std::optional<IndexRecord> index_;
  std::optional<EndRecord> end_;
  uint64_t index_record_ = 0;  // record index of the IndexRecord, if any
  absl::flat_hash_map<Hash128, uint64_t, Hash128Hasher> blobs_;  // hash -> record index (first)
  // Page-table deltas: the last row of each (rank, req_pool_index) so far,
  // its columns from `start` on.
  struct KnownRow {
    int64_t start = 0;
    std::vector<int64_t> slots;
  };
  absl::flat_hash_map<std::pair<uint32_t, int64_t>, KnownRow> page_rows_;
  // steps_'s index of the last step record read from a zstd stream part
  // (-1: none): the record a part with list deltas (frame flag bit 4) is
  // added to. Other step frames may come between the parts of a stream.
  int64_t last_part_step_ = -1;
  mutable std::atomic<uint64_t> decoded_total_{0};
};

// The capture files a path names: the file itself, or for a session
// directory its rank-NNNNN.crcap files in rank order. NotFound if none.
absl::StatusOr<std::vector<std::string>> ListCaptureFiles(const std::string& path);

}  // namespace crashreplay
