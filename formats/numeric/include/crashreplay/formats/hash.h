// Content hashes: XXH3-128 for tensors and blobs, XXH3-64 for record checksums.
//
// Hash128 prints in XXH128's canonical form (32 hex digits, high half first,
// as `xxhsum -H2` prints it), so any hash crashreplay shows can be checked
// with standard tools. Thread-safe; the streaming hasher is not shared.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace crashreplay {

struct Hash128 {
  uint64_t high = 0;
  uint64_t low = 0;

  friend bool operator==(const Hash128&, const Hash128&) = default;
  friend auto operator<=>(const Hash128&, const Hash128&) = default;

  // 32 lowercase hex digits, canonical (big-endian) order.
  std::string Hex() const;
  static std::optional<Hash128> FromHex(std::string_view hex);
};

Hash128 XXH128Of(const void* data, size_t size);
inline Hash128 XXH128Of(std::span<const std::byte> bytes) { return XXH128Of(bytes.data(), bytes.size()); }
uint64_t XXH64Of(const void* data, size_t size);  // XXH3-64, seed 0

// Incremental XXH3-128 over several pieces; equals XXH128Of of their concatenation.
class Hasher128 {
 public:
  Hasher128();
  ~Hasher128();
  Hasher128(const Hasher128&) = delete;
  Hasher128& operator=(const Hasher128&) = delete;
  void Update(const void* data, size_t size);
  Hash128 Digest() const;

 private:
  void* state_;
};

struct Hash128Hasher {
  size_t operator()(const Hash128& h) const { return static_cast<size_t>(h.low ^ (h.high * 0x9E3779B97F4A7C15ull)); }
};

}  // namespace crashreplay
