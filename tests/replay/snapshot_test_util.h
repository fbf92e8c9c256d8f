// Test helper: damages one snapshot tensor's blob in a capture file while
// keeping its frame checksum valid, so the file still scans cleanly and the
// damage is found only when the blob is decoded and hashed (what a bit flip
// in memory before the checksum was computed would look like).
#pragma once

#include <xxhash.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "crashreplay/formats/capture_reader.h"

namespace crashreplay::testing {

// Flips one byte in the body of the blob holding tensor `name` of the
// snapshot of `step`; false if there is no such tensor.
inline bool CorruptSnapshotBlob(const std::string& path, uint64_t step, const std::string& name) {
  uint64_t frame = 0, payload_size = 0;
  bool found = false;
  {
    auto reader = CaptureReader::Open(path);
    if (!reader.ok()) return false;
    Hash128 want;
    for (const SnapshotRecord& s : (*reader)->snapshots()) {
      for (const TensorDescriptor& t : s.tensors) {
        if (s.step == step && t.name == name) {
          want = t.content_hash;
          found = true;
        }
      }
    }
    if (!found) return false;
    found = false;
    for (const RecordInfo& r : (*reader)->records()) {
      if (r.type != 3 || r.payload_size <= 32) continue;
      const auto p = (*reader)->Payload(r);
      uint64_t high = 0, low = 0;
      std::memcpy(&high, p.data() + 16, 8);
      std::memcpy(&low, p.data() + 24, 8);
      if (Hash128{high, low} == want) {
        frame = r.offset;
        payload_size = r.payload_size;
        found = true;
      }
    }
  }
  if (!found) return false;
  std::vector<unsigned char> bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  bytes[frame + 24 + 32 + (payload_size - 32) / 2] ^= 0x5a;
  // Frame checksum: XXH3-64 of header bytes 4..15 then the payload.
  std::vector<unsigned char> covered(bytes.begin() + frame + 4, bytes.begin() + frame + 16);
  covered.insert(covered.end(), bytes.begin() + frame + 24, bytes.begin() + frame + 24 + payload_size);
  const uint64_t sum = XXH3_64bits(covered.data(), covered.size());
  std::memcpy(bytes.data() + frame + 16, &sum, 8);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  return true;
}

}  // namespace crashreplay::testing
