// The CUDA chunked-hash kernel (capture/chunked_hash.h) against the host
// definition, at and around the chunk and tail boundaries. Skips without a
// CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <random>
#include <vector>

#include "crashreplay/capture/chunked_hash.h"

namespace crashreplay::capture {
namespace {

TEST(DeviceHash, KernelMatchesTheHostDefinitionAtChunkBoundaries) {
  if (!DeviceHashAvailable()) GTEST_SKIP() << "no CUDA device, GPU test skipped";
  std::mt19937_64 rng(7);
  const size_t chunk = kChunkedHashChunkBytes;
  for (size_t size : {size_t{1}, size_t{240}, size_t{241}, chunk - 1, chunk, chunk + 240, chunk + 241, 3 * chunk + 17,
                      size_t{8} << 20}) {
    std::vector<unsigned char> host(size);
    for (auto& b : host) b = static_cast<unsigned char>(rng());
    void* dev = nullptr;
    ASSERT_EQ(cudaMalloc(&dev, size), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dev, host.data(), size, cudaMemcpyHostToDevice), cudaSuccess);
    auto h = ChunkedHashDevice(dev, size);
    ASSERT_TRUE(h.ok()) << size << ": " << h.status();
    EXPECT_EQ(*h, ChunkedHashHost(host.data(), size)) << "size " << size;
    // One flipped bit anywhere changes it.
    host[size / 2] ^= 0x10;
    ASSERT_EQ(cudaMemcpy(dev, host.data(), size, cudaMemcpyHostToDevice), cudaSuccess);
    auto flipped = ChunkedHashDevice(dev, size);
    ASSERT_TRUE(flipped.ok());
    EXPECT_NE(*flipped, *h) << "size " << size;
    EXPECT_EQ(cudaFree(dev), cudaSuccess);
  }
}

TEST(DeviceHash, HostMemoryIsRefusedNotRead) {
  if (!DeviceHashAvailable()) GTEST_SKIP() << "no CUDA device, GPU test skipped";
  std::vector<unsigned char> host(1 << 20, 1);
  auto h = ChunkedHashDevice(host.data(), host.size());
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), absl::StatusCode::kFailedPrecondition) << h.status();
}

}  // namespace
}  // namespace crashreplay::capture
