// SnapshotRing: the bounded in-memory ring of tensor snapshots (internal).
//
// Two stages, each bounded by the byte budget:
//   staging  a preallocated arena the calling thread memcpys into (FIFO
//            regions, one per snapshot); the encoder thread takes the
//            oldest staged snapshot, hashes and compresses it, and frees
//            its region;
//   encoded  the ready-to-append frames (blob frames, then the
//            SnapshotRecord frame) of the most recent snapshots.
// Submit() never waits: when staging lacks room it evicts the oldest staged
// snapshots; when the oldest is being encoded (or filled), it evicts the
// newest staged ones behind it instead, so the newest snapshot is kept
// unless it does not fit beside the one being encoded (or the newest staged
// one is still being filled by another caller): then it is dropped. Encode()
// evicts the oldest encoded snapshots beyond the budget or the entry count.
// Every eviction is a drop, counted.
//
// The buffers of evicted frames are kept for the next encode, which writes
// its blobs into them where one fits (a fresh buffer costs a page fault and
// a page clearing per 4 KiB written: docs/capture.md, "Writer and snapshot
// encoder against zstd"). Memory: an encoded snapshot counts the bytes its
// buffers ever held (a reused buffer keeps the pages an earlier, larger
// blob wrote; one that would keep more than twice its blob's size is
// traded for a fitting copy), and between encodes the spare buffers hold at most what the
// last eviction freed; the next encode takes them or frees them before it
// starts, and the encoder frees them when it has been idle for a second
// (ReleaseSpares). The peak is as before: the budget plus the snapshot
// being encoded.
//
// Threads: Submit from the caller threads, EncodeNext from the encoder
// thread, WriteForSignal from a signal handler (lock-free: per-slot atomic
// states, CAS ready -> writing), Drain/WriteAll from the failure path.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "crashreplay/capture/recorder.h"
#include "crashreplay/formats/capture_encoder.h"
#include "crashreplay/formats/capture_writer.h"

namespace crashreplay::capture::internal {

class SnapshotRing {
 public:
  SnapshotRing(uint64_t budget_bytes, uint32_t max_entries, uint32_t rank, const BlobEncodeOptions& blob);
  ~SnapshotRing();

  // Caller thread. OK also when dropped; InvalidArgument for bad views.
  absl::Status Submit(uint64_t step, std::span<const TensorView> tensors);

  // Encoder thread: encodes the oldest staged snapshot. False if none.
  bool EncodeNext();
  // EncodeNext in its two halves (encoder thread; tests hold a snapshot
  // "being encoded" between them): TakeOldest marks the oldest staged
  // snapshot as being encoded (false if none, or one is already taken);
  // EncodeTaken encodes it into the store.
  bool TakeOldest();
  void EncodeTaken();
  // Whether a staged snapshot waits for EncodeNext.
  bool HasStaged();
  // Whether a snapshot is still on its way into the encoded store: being
  // copied in, staged, or taken by EncodeNext and not yet in a slot (a
  // failure path that writes the store must wait for it, or that snapshot
  // is missed).
  bool Pending() { return PendingNoLock() || HasStaged(); }
  // The same without the lock (signal handlers), blind only to a staged
  // snapshot of zero bytes.
  bool PendingNoLock() const { return encoding_.load(std::memory_order_acquire) > 0 || staged_bytes() > 0; }

  // Failure path (ordinary context): appends every encoded snapshot not
  // written by an earlier call, oldest first, through writer->Append
  // (indexed, blob-deduplicated). Returns the number of snapshots written.
  absl::StatusOr<uint64_t> WriteAll(CaptureWriter* writer);

  // Signal handler: appends every encoded snapshot with write(2) only.
  void WriteForSignal(CaptureWriter* writer) noexcept;

  uint64_t accepted() const { return accepted_.load(std::memory_order_relaxed); }
  uint64_t encoded() const { return encoded_count_.load(std::memory_order_relaxed); }
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  uint64_t bytes_dropped() const { return bytes_dropped_.load(std::memory_order_relaxed); }
  uint64_t staged_bytes() const { return staged_bytes_.load(std::memory_order_relaxed); }
  uint64_t encoded_bytes() const { return encoded_bytes_.load(std::memory_order_relaxed); }
  // Blobs encoded into the buffer of an evicted frame.
  uint64_t reused() const { return reused_.load(std::memory_order_relaxed); }
  // Encoder thread: the bytes the spare buffers ever held, and freeing them.
  uint64_t spare_bytes() const;
  void ReleaseSpares() { spare_.clear(); }

 private:
  struct StagedTensor {
    std::string name;
    DType dtype = DType::kU8;
    std::vector<int64_t> shape;
    uint64_t offset = 0;  // in the arena
    uint64_t size = 0;
  };
  enum class StageState : uint8_t { kFilling, kStaged, kEncoding };
  struct Staged {
    StageState state = StageState::kFilling;
    uint64_t step = 0;
    uint64_t begin = 0, size = 0;  // arena region
    std::vector<StagedTensor> tensors;
    size_t num_tensors = 0;  // tensors[0..num_tensors) are live (capacity reused)
  };
  enum SlotState : int { kFree = 0, kReady = 1, kWriting = 2 };
  struct EncodedSlot {
    std::atomic<int> state{kFree};
    uint64_t seq = 0;
    uint64_t step = 0;
    uint64_t bytes = 0;  // the sum of `resident`
    std::vector<EncodedFrame> frames;
    std::vector<uint64_t> resident;  // per frame: the bytes its buffer ever held
  };
  // A buffer an evicted frame no longer needs, and the bytes it ever held.
  struct Spare {
    std::vector<unsigned char> bytes;
    uint64_t resident = 0;
  };

  bool AllocLocked(uint64_t n, uint64_t* offset);
  std::vector<Spare> TakeSpares(const Staged& entry);
  void CountDrop(uint64_t bytes);
  Staged& StagedAt(size_t i) { return staged_[(staged_first_ + i) % staged_.size()]; }

  const uint64_t budget_;
  const uint32_t rank_;
  const BlobEncodeOptions blob_;
  std::unique_ptr<std::byte[]> arena_;

  std::mutex mu_;  // guards the staging FIFO (never held during memcpy or encoding)
  std::vector<Staged> staged_;
  size_t staged_first_ = 0, staged_count_ = 0;

  std::vector<EncodedSlot> slots_;
  uint64_t next_seq_ = 1;  // encoder thread only
  Staged* taken_ = nullptr;  // TakeOldest's entry until EncodeTaken (encoder thread only)
  std::vector<Spare> spare_;  // encoder thread only

  std::atomic<uint64_t> accepted_{0}, encoded_count_{0}, dropped_{0}, bytes_dropped_{0};
  std::atomic<uint64_t> staged_bytes_{0}, encoded_bytes_{0}, reused_{0};
  std::atomic<int> encoding_{0};  // snapshots EncodeNext has taken and not yet stored or dropped
  std::atomic<uint64_t> written_seq_{0};  // highest seq WriteAll put in the file
};

}  // namespace crashreplay::capture::internal
