// The bytes of a host tensor: either a read-only view into memory that an
// owner keeps alive (a tensor read from a mapped safetensors file: the
// owner holds the mapping), or a buffer of its own (a tensor made in
// memory: the random checkpoint generator, tests, conversions).
//
// Loading a checkpoint used to copy every tensor out of the mapping, so a
// replay held the checkpoint twice; a view costs nothing until its pages
// are read, and the kernel can drop clean file pages under pressure.
//
// Reading is the same for both (data(), size(), iteration, ==, which
// compares contents). Only the explicit writers (mutable_data(), resize())
// modify, and on a view they first copy it into a buffer of its own: the
// mapping is never written, and writing is never a silent side effect of
// reading through a non-const object. Copying a view shares the owner;
// copying an owned buffer copies the bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <utility>
#include <vector>

namespace crashreplay::replay {

class TensorBytes {
 public:
  TensorBytes() = default;
  // An owned buffer (implicit, so HostTensor{dtype, shape, std::vector...}
  // reads as before).
  TensorBytes(std::vector<uint8_t> owned) : owned_(std::move(owned)) {}  // NOLINT(google-explicit-constructor)

  // A view of `bytes`, valid while `owner` (which must hold the memory) lives.
  static TensorBytes View(std::span<const uint8_t> bytes, std::shared_ptr<const void> owner) {
    TensorBytes t;
    t.view_ = bytes;
    t.owner_ = std::move(owner);
    return t;
  }

  const uint8_t* data() const { return is_view() ? view_.data() : owned_.data(); }
  size_t size() const { return is_view() ? view_.size() : owned_.size(); }
  bool empty() const { return size() == 0; }
  const uint8_t* begin() const { return data(); }
  const uint8_t* end() const { return data() + size(); }
  uint8_t operator[](size_t i) const { return data()[i]; }
  std::span<const uint8_t> span() const { return {data(), size()}; }

  // True when the bytes live in someone else's memory (the mapping).
  bool is_view() const { return owner_ != nullptr; }
  // What keeps a view's memory alive (null for an owned buffer): holders of
  // pointers into data() keep a copy of it.
  const std::shared_ptr<const void>& owner() const { return owner_; }

  // Writers. A view is first copied into a buffer of its own.
  uint8_t* mutable_data() {
    Own();
    return owned_.data();
  }
  void resize(size_t n) {
    Own();
    owned_.resize(n);
  }

  friend bool operator==(const TensorBytes& a, const TensorBytes& b) {
    return a.size() == b.size() && (a.size() == 0 || std::memcmp(a.data(), b.data(), a.size()) == 0);
  }

 private:
  void Own() {
    if (!is_view()) return;
    owned_.assign(view_.begin(), view_.end());
    view_ = {};
    owner_.reset();
  }

  std::vector<uint8_t> owned_;
  std::span<const uint8_t> view_;
  std::shared_ptr<const void> owner_;
};

}  // namespace crashreplay::replay
