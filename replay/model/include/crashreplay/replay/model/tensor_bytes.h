// The bytes of a host tensor: either a read-only view into memory that an
// owner keeps alive (a tensor read from a mapped safetensors file: the
// owner holds the mapping), or a buffer of its own (a tensor made in
// memory: the random checkpoint generator, tests, conversions).
//
// Loading a checkpoint used to copy every tensor out of the mapping, so a
// replay held the checkpoint twice; a view costs nothing until its pages
// are read, and the kernel can drop clean file pages under pressure.
//
// A third kind, deferred, stands for bytes still on disk (a checkpoint
// opened for layer streaming: checkpoint_io.h): it knows its size and where
// to read from, and Resolve() maps it into a view of its own, released when
// the last copy of that view goes. data() of a deferred tensor is a
// programming error (it aborts with a message); readers of a checkpoint that
// may be deferred call Resolve() first.
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

#include "absl/status/statusor.h"

namespace crashreplay::replay {

class TensorBytes;

// Where a deferred tensor's bytes come from.
class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // The bytes, as a view holding their mapping (or an error naming the
  // tensor and file).
  virtual absl::StatusOr<TensorBytes> Read() const = 0;
};

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

  // Bytes of `size` still on disk, read by `source` on Resolve().
  static TensorBytes Deferred(size_t size, std::shared_ptr<const TensorSource> source) {
    TensorBytes t;
    t.deferred_size_ = size;
    t.source_ = std::move(source);
    return t;
  }
  bool deferred() const { return source_ != nullptr; }
  // This (a copy sharing a view's owner) when the bytes are here; the
  // source's read otherwise.
  absl::StatusOr<TensorBytes> Resolve() const {
    if (!deferred()) return *this;
    return source_->Read();
  }

  const uint8_t* data() const {
    if (deferred()) ReadOfDeferred();
    return is_view() ? view_.data() : owned_.data();
  }
  size_t size() const { return deferred() ? deferred_size_ : is_view() ? view_.size() : owned_.size(); }
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

  // Compares contents (reading deferred ones; unequal when one cannot be read).
  friend bool operator==(const TensorBytes& a, const TensorBytes& b) {
    if (a.size() != b.size()) return false;
    if (a.deferred() || b.deferred()) {
      auto ra = a.Resolve();
      auto rb = b.Resolve();
      return ra.ok() && rb.ok() && *ra == *rb;
    }
    return a.size() == 0 || std::memcmp(a.data(), b.data(), a.size()) == 0;
  }

 private:
  [[noreturn]] static void ReadOfDeferred();
  void Own() {
    if (deferred()) ReadOfDeferred();
    if (!is_view()) return;
    owned_.assign(view_.begin(), view_.end());
    view_ = {};
    owner_.reset();
  }

  std::vector<uint8_t> owned_;
  std::span<const uint8_t> view_;
  std::shared_ptr<const void> owner_;
  size_t deferred_size_ = 0;
  std::shared_ptr<const TensorSource> source_;
};

}  // namespace crashreplay::replay
