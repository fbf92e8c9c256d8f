#include "snapshot_ring.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "crashreplay/formats/hash.h"
#include "stream_copy.h"

namespace crashreplay::capture::internal {
namespace {

// The staging copy. The arena region a snapshot lands in was last read by
// the encoder thread on another core (or not touched for a long time), so
// an ordinary memcpy first pulls every destination line back (a
// read-for-ownership per 64 bytes); streaming stores do not
// (bench/recorder_bench: 16 MiB in 1.2-1.3 ms against 1.8-2.0 ms for memcpy
// under the same conditions). Below 256 KiB the ordinary copy is as fast.
void StageCopy(std::byte* dst, const void* src, size_t n) {
  constexpr size_t kStreamFrom = 256 << 10;
  if (n >= kStreamFrom) {
    StreamCopy(dst, src, n);
    StreamFence();  // visible before the entry is marked staged
    return;
  }
  std::memcpy(dst, src, n);
}

}  // namespace

SnapshotRing::SnapshotRing(uint64_t budget_bytes, uint32_t max_entries, uint32_t rank, const BlobEncodeOptions& blob)
    : budget_(budget_bytes),
      rank_(rank),
      blob_(blob),
      staged_(std::max<uint32_t>(max_entries, 1)),
      slots_(std::max<uint32_t>(max_entries, 1)) {
  if (budget_ > 0) {
    arena_.reset(new std::byte[budget_]);
    // Touch every page now so that the first snapshots do not pay page
    // faults on the serving thread.
    std::memset(arena_.get(), 0, budget_);
  }
}

SnapshotRing::~SnapshotRing() = default;

void SnapshotRing::CountDrop(uint64_t bytes) {
  dropped_.fetch_add(1, std::memory_order_relaxed);
  bytes_dropped_.fetch_add(bytes, std::memory_order_relaxed);
}

// Finds a free arena region of n bytes after the newest live region (FIFO
// ring of regions). Called with mu_ held.
bool SnapshotRing::AllocLocked(uint64_t n, uint64_t* offset) {
  if (n > budget_) return false;
  if (staged_count_ == 0) {
    *offset = 0;
    return true;
  }
  const Staged& oldest = StagedAt(0);
  const Staged& newest = StagedAt(staged_count_ - 1);
  const uint64_t newest_end = newest.begin + newest.size;
  const bool wrapped = newest.begin < oldest.begin || (newest.begin == oldest.begin && staged_count_ > 1);
  if (!wrapped) {
    if (budget_ - newest_end >= n) {
      *offset = newest_end;
      return true;
    }
    if (oldest.begin >= n) {
      *offset = 0;
      return true;
    }
    return false;
  }
  if (oldest.begin - newest_end >= n) {
    *offset = newest_end;
    return true;
  }
  return false;
}

absl::Status SnapshotRing::Submit(uint64_t step, std::span<const TensorView> tensors) {
  uint64_t total = 0;
  for (const TensorView& t : tensors) {
    if (t.data == nullptr && t.byte_size > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("snapshot of step ", step, ": tensor '", std::string(t.name), "' has no data"));
    }
    uint64_t elements = 1;
    for (int64_t d : t.shape) {
      if (d < 0)
        return absl::InvalidArgumentError(absl::StrCat("tensor '", std::string(t.name), "' has a negative dimension"));
      elements *= static_cast<uint64_t>(d);
    }
    if (DTypeBytes(t.dtype, elements) != t.byte_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "snapshot of step ", step, ": tensor '", std::string(t.name), "' is ", t.byte_size,
          " bytes, its shape and dtype ", std::string(DTypeName(t.dtype)), " need ", DTypeBytes(t.dtype, elements)));
    }
    total += t.byte_size;
  }
  accepted_.fetch_add(1, std::memory_order_relaxed);
  Staged* entry = nullptr;
  uint64_t offset = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (;;) {
      const bool room_for_entry = staged_count_ < staged_.size();
      if (room_for_entry && AllocLocked(total, &offset)) break;
      if (total > budget_ || staged_count_ == 0) {
        CountDrop(total);
        return absl::OkStatus();
      }
      // Make room by dropping the oldest staged snapshot.
      if (StagedAt(0).state == StageState::kStaged) {
        Staged& oldest = StagedAt(0);
        CountDrop(oldest.size);
        staged_bytes_.fetch_sub(oldest.size, std::memory_order_relaxed);
        staged_first_ = (staged_first_ + 1) % staged_.size();
        --staged_count_;
        continue;
      }
      // The oldest is being encoded (or filled by another caller) and cannot
      // go. Drop the newest staged one instead, which is still older than
      // this snapshot: the newest step is the one a failure needs, and the
      // step never waits. (Dropping this snapshot here once lost the last
      // steps of a run whenever the encoder thread lagged.)
      Staged& newest = StagedAt(staged_count_ - 1);
      if (staged_count_ == 1 || newest.state != StageState::kStaged) {
        CountDrop(total);
        return absl::OkStatus();
      }
      CountDrop(newest.size);
      staged_bytes_.fetch_sub(newest.size, std::memory_order_relaxed);
      --staged_count_;
    }
    entry = &staged_[(staged_first_ + staged_count_) % staged_.size()];
    ++staged_count_;
    entry->state = StageState::kFilling;
    entry->step = step;
    entry->begin = offset;
    entry->size = total;
    staged_bytes_.fetch_add(total, std::memory_order_relaxed);
  }
  // The entry is ours while kFilling: nobody evicts or encodes it.
  if (entry->tensors.size() < tensors.size()) entry->tensors.resize(tensors.size());
  entry->num_tensors = tensors.size();
  uint64_t at = offset;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorView& t = tensors[i];
    StagedTensor& st = entry->tensors[i];
    st.name.assign(t.name);
    st.dtype = t.dtype;
    st.shape.assign(t.shape.begin(), t.shape.end());
    st.offset = at;
    st.size = t.byte_size;
    if (t.byte_size > 0) StageCopy(arena_.get() + at, t.data, t.byte_size);
    at += t.byte_size;
  }
  std::lock_guard<std::mutex> lock(mu_);
  entry->state = StageState::kStaged;
  return absl::OkStatus();
}

bool SnapshotRing::HasStaged() {
  std::lock_guard<std::mutex> lock(mu_);
  return staged_count_ > 0 && StagedAt(0).state == StageState::kStaged;
}

bool SnapshotRing::EncodeNext() {
  if (!TakeOldest()) return false;
  EncodeTaken();
  return true;
}

bool SnapshotRing::TakeOldest() {
  std::lock_guard<std::mutex> lock(mu_);
  if (taken_ != nullptr || staged_count_ == 0 || StagedAt(0).state != StageState::kStaged) return false;
  taken_ = &StagedAt(0);
  taken_->state = StageState::kEncoding;
  // Counted before the entry leaves the staged list below, and until its
  // frames are in a slot (or dropped), so Pending() never sees a gap.
  encoding_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void SnapshotRing::EncodeTaken() {
  Staged* entry = taken_;
  if (entry == nullptr) return;
  taken_ = nullptr;
  struct Done {
    std::atomic<int>& n;
    ~Done() { n.fetch_sub(1, std::memory_order_release); }
  } done{encoding_};
  // Encoding reads the arena region, which nobody else touches while the
  // entry is kEncoding (Submit evicts only kStaged entries).
  std::vector<Spare> storage = TakeSpares(*entry);
  std::vector<EncodedFrame> frames;
  std::vector<uint64_t> resident;
  SnapshotRecord record;
  record.step = entry->step;
  record.rank = rank_;
  uint64_t bytes = 0;
  for (size_t i = 0; i < entry->num_tensors; ++i) {
    const StagedTensor& st = entry->tensors[i];
    std::span<const std::byte> raw(arena_.get() + st.offset, st.size);
    // Hashed while it is compressed (on a second thread for a large
    // tensor); a tensor identical to an earlier one of this snapshot is
    // thus compressed for nothing, which is rare and costs no more than a
    // distinct tensor would.
    const int bits = DTypeBits(st.dtype);
    const size_t element_size = bits >= 16 ? static_cast<size_t>(bits / 8) : 0;
    EncodedFrame blob = FrameEncoder::EncodeBlob(raw, element_size, blob_, std::move(storage[i].bytes));
    const Hash128 hash = blob.blob_hash;
    TensorDescriptor d;
    d.name = st.name;
    d.dtype = std::string(DTypeName(st.dtype));
    d.shape = st.shape;
    d.content_hash = hash;
    d.byte_size = st.size;
    d.stored = true;
    d.device = "cpu";
    record.tensors.push_back(std::move(d));
    const bool duplicate =
        std::any_of(frames.begin(), frames.end(), [&](const EncodedFrame& f) { return f.blob_hash == hash; });
    if (duplicate) continue;
    if (storage[i].resident > 0) {
      reused_.fetch_add(1, std::memory_order_relaxed);
      // A reused buffer keeps the pages an earlier blob wrote. One that
      // would hold more than twice what this blob needs is traded for a
      // fitting copy (at most half its size to copy).
      if (blob.bytes.size() < storage[i].resident / 2) {
        blob.bytes.shrink_to_fit();
        storage[i].resident = 0;
      }
    }
    resident.push_back(std::max<uint64_t>(blob.bytes.size(), storage[i].resident));
    bytes += resident.back();
    frames.push_back(std::move(blob));
  }
  absl::StatusOr<EncodedFrame> snapshot_frame = FrameEncoder::Encode(record);
  const uint64_t entry_size = entry->size;  // the entry is reused once it leaves the list
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Still the oldest: only kStaged entries are ever removed by Submit.
    staged_bytes_.fetch_sub(entry_size, std::memory_order_relaxed);
    staged_first_ = (staged_first_ + 1) % staged_.size();
    --staged_count_;
  }
  if (!snapshot_frame.ok()) {  // a record Cap'n Proto refuses: count it as dropped
    CountDrop(entry_size);
    return;
  }
  bytes += snapshot_frame->bytes.size();
  resident.push_back(snapshot_frame->bytes.size());
  frames.push_back(*std::move(snapshot_frame));

  // Evict the oldest encoded snapshots until the new one fits the budget
  // and a slot is free.
  for (;;) {
    EncodedSlot* free_slot = nullptr;
    EncodedSlot* oldest = nullptr;
    for (EncodedSlot& s : slots_) {
      const int st = s.state.load(std::memory_order_acquire);
      if (st == kFree && free_slot == nullptr) free_slot = &s;
      if (st == kReady && (oldest == nullptr || s.seq < oldest->seq)) oldest = &s;
    }
    const bool fits = encoded_bytes_.load(std::memory_order_relaxed) + bytes <= budget_;
    if (free_slot != nullptr && (fits || oldest == nullptr)) {
      free_slot->frames = std::move(frames);
      free_slot->resident = std::move(resident);
      free_slot->seq = next_seq_++;
      free_slot->step = record.step;
      free_slot->bytes = bytes;
      encoded_bytes_.fetch_add(bytes, std::memory_order_relaxed);
      free_slot->state.store(kReady, std::memory_order_release);
      encoded_count_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    if (oldest == nullptr) {  // every slot is being written by a failure path
      CountDrop(entry_size);
      return;
    }
    int expected = kReady;
    if (oldest->state.compare_exchange_strong(expected, kFree)) {
      CountDrop(oldest->bytes);
      encoded_bytes_.fetch_sub(oldest->bytes, std::memory_order_relaxed);
      // Its blob buffers go to the next encode (see the header); a buffer
      // under 64 KiB is left to malloc, which reuses those well.
      for (size_t k = 0; k < oldest->frames.size(); ++k) {
        std::vector<unsigned char>& b = oldest->frames[k].bytes;
        if (b.capacity() >= (64u << 10)) spare_.push_back(Spare{std::move(b), oldest->resident[k]});
      }
      std::vector<EncodedFrame>().swap(oldest->frames);
      oldest->resident.clear();
      // A slot being written (failure path) cannot be evicted: try again.
    }
  }
}

// Matches the spare buffers to the entry's tensors, the largest tensor
// first, each to the smallest spare of enough capacity (and not over a
// quarter more: a small blob must not pin a large buffer's pages), and
// frees the spares no tensor takes before anything is encoded.
std::vector<SnapshotRing::Spare> SnapshotRing::TakeSpares(const Staged& entry) {
  std::vector<Spare> storage(entry.num_tensors);
  if (spare_.empty()) return storage;
  std::vector<size_t> order(entry.num_tensors);
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return entry.tensors[a].size > entry.tensors[b].size; });
  for (size_t i : order) {
    const size_t need = FrameEncoder::BlobFrameCapacity(entry.tensors[i].size);
    auto best = spare_.end();
    for (auto it = spare_.begin(); it != spare_.end(); ++it) {
      const size_t cap = it->bytes.capacity();
      if (cap >= need && cap <= need + need / 4 && (best == spare_.end() || cap < best->bytes.capacity())) best = it;
    }
    if (best == spare_.end()) continue;
    storage[i] = std::move(*best);
    spare_.erase(best);
  }
  spare_.clear();
  return storage;
}

uint64_t SnapshotRing::spare_bytes() const {
  uint64_t n = 0;
  for (const Spare& s : spare_) n += s.resident;
  return n;
}

absl::StatusOr<uint64_t> SnapshotRing::WriteAll(CaptureWriter* writer) {
  std::vector<EncodedSlot*> order;
  for (EncodedSlot& s : slots_) {
    int expected = kReady;
    if (s.state.compare_exchange_strong(expected, kWriting)) order.push_back(&s);
  }
  std::sort(order.begin(), order.end(), [](const EncodedSlot* a, const EncodedSlot* b) { return a->seq < b->seq; });
  // Snapshots an earlier WriteAll put in the file (OnFailure, then Close
  // with write_snapshots_on_close) are not written twice.
  const uint64_t written_before = written_seq_.load(std::memory_order_acquire);
  absl::Status status;
  uint64_t written = 0, last = written_before;
  for (EncodedSlot* s : order) {
    if (s->seq > written_before) {
      for (const EncodedFrame& f : s->frames) {
        if (status.ok()) status = writer->Append(f);
      }
      if (status.ok()) {
        written += 1;
        last = std::max(last, s->seq);
      }
    }
    s->state.store(kReady, std::memory_order_release);
  }
  written_seq_.store(last, std::memory_order_release);
  if (!status.ok()) return status;
  return written;
}

void SnapshotRing::WriteForSignal(CaptureWriter* writer) noexcept {
  // Oldest first, without allocating: repeated minimum search (<= 64 slots);
  // what WriteAll already wrote is skipped.
  uint64_t last_seq = written_seq_.load(std::memory_order_acquire);
  for (;;) {
    EncodedSlot* next = nullptr;
    for (EncodedSlot& s : slots_) {
      if (s.state.load(std::memory_order_acquire) == kReady && s.seq > last_seq &&
          (next == nullptr || s.seq < next->seq)) {
        next = &s;
      }
    }
    if (next == nullptr) return;
    last_seq = next->seq;
    int expected = kReady;
    if (!next->state.compare_exchange_strong(expected, kWriting)) continue;
    for (const EncodedFrame& f : next->frames) {
      if (!writer->AppendEncodedFrame(f.bytes.data(), f.bytes.size())) return;
    }
    // Left kWriting: the process is about to die; nobody may free it now.
  }
}

}  // namespace crashreplay::capture::internal
