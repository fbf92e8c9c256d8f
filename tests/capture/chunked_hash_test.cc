// The chunked hash of device weights: the host build of the shared XXH3-64
// body against libxxhash, and the combination rule. (The CUDA launcher runs
// the same body; it cannot run on machines without a GPU.)
#include <xxhash.h>

#include <gtest/gtest.h>

#include "crashreplay/capture/chunked_hash.h"
#include "recorder_test_util.h"
#include "xxh3_default_secret.h"
#include "xxh3_long.h"

namespace crashreplay::testing {
namespace {

using namespace crashreplay::capture;

TEST(Xxh3Long, SharedBodyMatchesLibxxhashAtBlockAndStripeBoundaries) {
  const std::vector<std::byte> data = RandomBytes(200000, 3);
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  for (size_t len :
       {241ul, 255ul, 256ul, 1023ul, 1024ul, 1025ul, 1087ul, 1088ul, 4109ul, 65536ul, 131072ul, 200000ul}) {
    EXPECT_EQ(xxh3::HashLong64(p, len, Xxh3DefaultSecret()), XXH3_64bits(p, len)) << "length " << len;
    EXPECT_EQ(xxh3::HashLong64(p + 3, len - 3 > 240 ? len - 3 : len, Xxh3DefaultSecret()),
              XXH3_64bits(p + 3, len - 3 > 240 ? len - 3 : len))
        << "unaligned, length " << len;
  }
}

TEST(ChunkedHash, CombinesPerChunkXxh3OfFixedChunks) {
  const std::vector<std::byte> data = RandomBytes(3 * kChunkedHashChunkBytes + 100, 4);
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  const uint64_t h[4] = {XXH3_64bits(p, kChunkedHashChunkBytes),
                         XXH3_64bits(p + kChunkedHashChunkBytes, kChunkedHashChunkBytes),
                         XXH3_64bits(p + 2 * kChunkedHashChunkBytes, kChunkedHashChunkBytes),
                         XXH3_64bits(p + 3 * kChunkedHashChunkBytes, 100)};
  std::vector<unsigned char> buf;
  auto put = [&](uint64_t v) {
    for (int i = 0; i < 8; ++i) buf.push_back(static_cast<unsigned char>(v >> (8 * i)));
  };
  put(data.size());
  put(kChunkedHashChunkBytes);
  for (uint64_t v : h) put(v);
  EXPECT_EQ(ChunkedHashHost(data.data(), data.size()), XXH128Of(buf.data(), buf.size()));
  EXPECT_NE(ChunkedHashHost(data.data(), data.size()), XXH128Of(data)) << "a different definition, on purpose";
}

TEST(ChunkedHash, DeviceHashNeedsCudaHere) {
  if (DeviceHashAvailable()) GTEST_SKIP() << "a GPU is present; the device path is tests/gpu/device_hash_test.cc";
  const std::vector<std::byte> data = RandomBytes(1000, 5);
  auto h = ChunkedHashDevice(data.data(), data.size());
  EXPECT_FALSE(h.ok());
}

}  // namespace
}  // namespace crashreplay::testing
