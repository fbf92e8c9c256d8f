// libFuzzer target for the capture container reader: any bytes must give a
// Status, never a crash, hang, leak or unbounded allocation. Exercises the
// whole read path: header, frame scan, Cap'n Proto decoding, summary,
// Verify (every blob decoded and hashed) and blob lookup.
#include <cstddef>
#include <cstdint>

#include "crashreplay/formats/capture_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  crashreplay::CaptureLimits limits;
  // Small caps keep each run fast and inside libFuzzer's -rss_limit_mb.
  limits.max_structured_payload = 1 << 20;
  limits.max_blob_raw_size = 16 << 20;
  limits.max_total_decoded = 64 << 20;
  limits.max_records = 1 << 16;
  auto reader = crashreplay::CaptureReader::FromBytes({data, size}, limits, "fuzz-input");
  if (!reader.ok()) return 0;
  const crashreplay::CaptureReader& r = **reader;
  (void)r.Summary();
  (void)r.Verify();
  for (const crashreplay::SnapshotRecord& s : r.snapshots()) {
    for (const crashreplay::TensorDescriptor& t : s.tensors) (void)r.ReadBlob(t.content_hash);
  }
  return 0;
}
