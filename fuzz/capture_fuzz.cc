// libFuzzer target for the capture container reader: any bytes must give a
// Status, never a crash, hang, leak or unbounded allocation. Exercises the
// whole read path: header, frame scan, Cap'n Proto decoding, summary,
// Verify (every blob decoded and hashed) and blob lookup.
//
// Checksums stop almost every random mutation at the frame scan, so each
// input runs twice: as given, and with the header and frame checksums
// recomputed ("repaired"), which lets the fuzzer reach the Cap'n Proto
// decoder and the blob decoder behind them.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "crashreplay/formats/capture_format.h"
#include "crashreplay/formats/capture_reader.h"
#include "crashreplay/formats/hash.h"

namespace {

void ReadEverything(const std::vector<unsigned char>& bytes) {
  crashreplay::CaptureLimits limits;
  // Small caps keep each run fast and inside libFuzzer's -rss_limit_mb.
  limits.max_structured_payload = 1 << 20;
  limits.max_blob_raw_size = 16 << 20;
  limits.max_total_decoded = 64 << 20;
  limits.max_records = 1 << 16;
  auto reader = crashreplay::CaptureReader::FromBytes(bytes, limits, "fuzz-input");
  if (!reader.ok()) return;
  const crashreplay::CaptureReader& r = **reader;
  (void)r.Summary();
  (void)r.Verify();
  for (const crashreplay::SnapshotRecord& s : r.snapshots()) {
    for (const crashreplay::TensorDescriptor& t : s.tensors) (void)r.ReadBlob(t.content_hash);
  }
}

// Recomputes the file header checksum and every frame checksum reachable
// by following declared lengths.
void RepairChecksums(std::vector<unsigned char>& b) {
  using namespace crashreplay;
  if (b.size() < kFileHeaderSize) return;
  StoreLE64(b.data() + 24, XXH64Of(b.data(), 24));
  size_t pos = kFileHeaderSize;
  FrameHeader h;
  while (b.size() - pos >= kFrameHeaderSize && ParseFrameHeader(b.data() + pos, &h) &&
         h.payload_size <= b.size() - pos - kFrameHeaderSize) {
    const unsigned char* payload = b.data() + pos + kFrameHeaderSize;
    StoreLE64(b.data() + pos + 16, FrameChecksum(b.data() + pos, payload, h.payload_size));
    pos += kFrameHeaderSize + h.payload_size;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<unsigned char> bytes(data, data + size);
  ReadEverything(bytes);
  RepairChecksums(bytes);
  ReadEverything(bytes);
  return 0;
}
