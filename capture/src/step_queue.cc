#include "step_queue.h"

#include <sys/mman.h>

#include <algorithm>
#include <cassert>
#include <cstring>
#include <new>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "stream_copy.h"

namespace crashreplay::capture::internal {
namespace {

static_assert(std::is_trivially_copyable_v<SamplingParams>, "sampling parameters are copied with memcpy");
static_assert(std::is_trivially_copyable_v<Hash128>);

constexpr size_t kLine = 64;
constexpr uint64_t kMinArena = 64 << 10;

enum Field {
  kTokens,
  kPositions,
  kSeqLens,
  kExtendLens,
  kPool,
  kPtOffsets,
  kPtSlots,
  kPtStarts,
  kOutLoc,
  kOutputs,
  kFields
};

// The record layout, in this order, each part 8-byte aligned:
//   Header
//   int64  ints[sum of len]            the kFields lists, concatenated
//   SamplingParams sampling[num_sampling]
//   PackedDigest   digests[num_digests]
//   uint32 id_ends[num_ids]            request id i ends at id_ends[i]
//   char   id_chars[id_chars], digest_chars[digest_chars]
// and the whole record is padded to a cache line.
struct Header {
  uint64_t step;
  int64_t timestamp_nanos;
  uint64_t rng_seed, rng_offset;
  uint32_t mode;
  uint32_t num_ids, num_sampling, num_digests;
  uint64_t id_chars, digest_chars;
  uint64_t len[kFields];
};

struct PackedDigest {
  Hash128 value128;
  uint64_t value64;
  uint32_t is_128;
  uint32_t name_end;  // in digest_chars
};

constexpr size_t Align8(size_t n) { return (n + 7) & ~size_t{7}; }
constexpr uint64_t RoundUp(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

struct Layout {
  size_t ints, sampling, digests, id_ends, id_chars, digest_chars, total;
};

Layout LayoutOf(size_t num_ints, size_t num_sampling, size_t num_digests, size_t num_ids, size_t id_chars,
                size_t digest_chars) {
  Layout l;
  l.ints = Align8(sizeof(Header));
  l.sampling = l.ints + num_ints * sizeof(int64_t);
  l.digests = Align8(l.sampling + num_sampling * sizeof(SamplingParams));
  l.id_ends = Align8(l.digests + num_digests * sizeof(PackedDigest));
  l.id_chars = l.id_ends + num_ids * sizeof(uint32_t);
  l.digest_chars = l.id_chars + id_chars;
  l.total = RoundUp(l.digest_chars + digest_chars, kLine);
  return l;
}

std::span<const int64_t> FieldOf(const StepView& v, int f) {
  switch (f) {
    case kTokens: return v.token_ids;
    case kPositions: return v.positions;
    case kSeqLens: return v.seq_lens;
    case kExtendLens: return v.extend_lens;
    case kPool: return v.req_pool_indices;
    case kPtOffsets: return v.page_table_offsets;
    case kPtSlots: return v.page_table_slots;
    case kPtStarts: return v.page_table_starts;
    case kOutLoc: return v.out_cache_loc;
    default: return v.output_token_ids;
  }
}

size_t SumIds(const StepView& v) {
  size_t n = 0;
  for (std::string_view id : v.request_ids) n += id.size();
  return n;
}

size_t SumDigestNames(const StepView& v) {
  size_t n = 0;
  for (const DigestView& d : v.digests) n += d.name.size();
  return n;
}

Layout LayoutOf(const StepView& v) {
  size_t ints = 0;
  for (int f = 0; f < kFields; ++f) ints += FieldOf(v, f).size();
  return LayoutOf(ints, v.sampling.size(), v.digests.size(), v.request_ids.size(), SumIds(v), SumDigestNames(v));
}

std::byte* NewArena(uint64_t bytes) {
  // Page-aligned, and touched now so that the serving thread never takes a
  // page fault on it (MAP_POPULATE; a plain memset where that is refused).
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<std::byte*>(p);
}

}  // namespace

StepQueue::StepQueue(uint32_t slots, uint64_t arena_bytes) : entries_(std::max<uint32_t>(slots, 2)) {
  const uint64_t size = RoundUp(std::max(arena_bytes, kMinArena), 4096);
  arena_ = NewArena(size);
  arena_size_.store(arena_ != nullptr ? size : 0, std::memory_order_relaxed);
}

StepQueue::~StepQueue() {
  if (arena_ != nullptr) ::munmap(arena_, arena_size_.load(std::memory_order_relaxed));
}

absl::Status StepQueue::Validate(const StepView& v) {
  if (!v.page_table_offsets.empty()) {
    int64_t prev = 0;
    for (int64_t o : v.page_table_offsets) {
      if (o < prev || static_cast<uint64_t>(o) > v.page_table_slots.size()) {
        return absl::InvalidArgumentError(absl::StrCat("step ", v.step,
                                                       ": page_table_offsets must be non-decreasing offsets into the ",
                                                       v.page_table_slots.size(), " page-table slots"));
      }
      prev = o;
    }
  } else if (!v.page_table_slots.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("step ", v.step, ": page_table_slots without page_table_offsets"));
  }
  if (!v.page_table_starts.empty()) {
    const size_t rows = v.page_table_offsets.empty() ? 0 : v.page_table_offsets.size() - 1;
    if (v.page_table_starts.size() != rows) {
      return absl::InvalidArgumentError(absl::StrCat("step ", v.step, ": ", v.page_table_starts.size(),
                                                     " page_table_starts for ", rows, " page-table rows"));
    }
    if (v.req_pool_indices.size() < rows) {
      return absl::InvalidArgumentError(absl::StrCat("step ", v.step,
                                                     ": page_table_starts need a req_pool_index for "
                                                     "each of the ",
                                                     rows, " rows (", v.req_pool_indices.size(), " given)"));
    }
    for (size_t i = 0; i < rows; ++i) {
      if (v.page_table_starts[i] < 0) {
        return absl::InvalidArgumentError(absl::StrCat("step ", v.step, ": page_table_starts[", i, "] is ",
                                                       v.page_table_starts[i], "; a row starts at column 0 or later"));
      }
    }
  }
  return absl::OkStatus();
}

size_t StepQueue::PackedBytes(const StepView& v) { return LayoutOf(v).total; }

// Producer. Arena positions are virtual (monotonic); a record never wraps:
// one that would cross the end starts at the next lap. The live part of the
// arena is [mark of the oldest queued entry, write_pos_). Place() judges
// that from tail_seen_, which may lag the writer (a smaller live part is
// never mistaken for a larger one); only when it finds no room is the
// writer's tail read again.
std::byte* StepQueue::Allocate(size_t bytes, Entry* e) {
  // Place() reads the entry at tail_seen_, which must not have been reused
  // yet (Full() keeps head - tail_seen_ below the slots; this covers a
  // caller that did not ask).
  if (head_.load(std::memory_order_relaxed) - tail_seen_ >= entries_.size()) {
    tail_seen_ = tail_.load(std::memory_order_acquire);
  }
  if (arena_ != nullptr) {
    if (std::byte* p = Place(bytes, e); p != nullptr) return p;
    tail_seen_ = tail_.load(std::memory_order_acquire);
    if (std::byte* p = Place(bytes, e); p != nullptr) return p;
  }
  e->mark = write_pos_;
  spilled_.fetch_add(1, std::memory_order_relaxed);
  e->spill.reset(new std::byte[bytes]);  // not zero-filled
  return e->spill.get();
}

std::byte* StepQueue::Place(size_t bytes, Entry* e) {
  const uint64_t h = head_.load(std::memory_order_relaxed);
  const uint64_t t = tail_seen_;
  uint64_t size = arena_size_.load(std::memory_order_relaxed);
  if (t == h && bytes > size) {
    // Empty, so the writer reads nothing until the next head store: an
    // oversized record may replace the arena (a new mapping that fails
    // leaves the old one, and the record spills).
    const uint64_t grown = RoundUp(std::max<uint64_t>(size * 2, bytes * 2), 4096);
    if (std::byte* bigger = NewArena(grown); bigger != nullptr) {
      ::munmap(arena_, size);
      arena_ = bigger;
      size = grown;
      arena_size_.store(size, std::memory_order_relaxed);
      write_pos_ = 0;
    }
  }
  // Nothing queued: the whole arena is free. The position is not rewound
  // to the start (see docs/capture.md, "The step queue"), but a record that
  // does not fit before the end starts the next lap at no cost.
  if (t == h && write_pos_ % size + bytes > size) write_pos_ = RoundUp(write_pos_, size);
  const uint64_t live_from = t == h ? write_pos_ : entries_[t % entries_.size()].mark;
  const uint64_t at = write_pos_ % size;
  const uint64_t skip = at + bytes > size ? size - at : 0;
  if (write_pos_ + skip + bytes - live_from > size) return nullptr;
  e->mark = write_pos_;
  write_pos_ += skip;
  std::byte* p = arena_ + write_pos_ % size;
  write_pos_ += bytes;
  return p;
}

void StepQueue::GrowIdChars(size_t need, size_t keep) {
  const size_t capacity = std::max(need, 2 * id_chars_capacity_);
  std::unique_ptr<char[]> bigger(new char[capacity]);
  if (keep > 0) std::memcpy(bigger.get(), id_chars_.get(), keep);
  id_chars_ = std::move(bigger);
  id_chars_capacity_ = capacity;
}

void StepQueue::Push(const StepView& v, int64_t timestamp_nanos) {
  const uint64_t h = head_.load(std::memory_order_relaxed);
  Entry& e = entries_[h % entries_.size()];
  size_t num_ints = 0;
  std::span<const int64_t> fields[kFields];
  for (int f = 0; f < kFields; ++f) {
    fields[f] = FieldOf(v, f);
    num_ints += fields[f].size();
  }
  const size_t num_ids = v.request_ids.size();
  if (num_ids > id_ends_capacity_) {
    id_ends_capacity_ = std::max<size_t>(num_ids, 2 * id_ends_capacity_);
    id_ends_.reset(new uint32_t[id_ends_capacity_]);
  }
  size_t id_chars = 0;
  for (size_t i = 0; i < num_ids; ++i) {
    const std::string_view id = v.request_ids[i];
    if (id_chars + id.size() > id_chars_capacity_) GrowIdChars(id_chars + id.size(), id_chars);
    CopyShort(id_chars_.get() + id_chars, id.data(), id.size());
    id_chars += id.size();
    id_ends_[i] = static_cast<uint32_t>(id_chars);
  }
  const size_t digest_chars = SumDigestNames(v);
  const Layout l =
      LayoutOf(num_ints, v.sampling.size(), v.digests.size(), v.request_ids.size(), id_chars, digest_chars);
  std::byte* const rec = Allocate(l.total, &e);
  e.data = rec;

  Header hd;
  hd.step = v.step;
  hd.timestamp_nanos = timestamp_nanos;
  hd.rng_seed = v.rng_seed;
  hd.rng_offset = v.rng_offset;
  hd.mode = static_cast<uint32_t>(v.mode);
  hd.num_ids = static_cast<uint32_t>(v.request_ids.size());
  hd.num_sampling = static_cast<uint32_t>(v.sampling.size());
  hd.num_digests = static_cast<uint32_t>(v.digests.size());
  hd.id_chars = id_chars;
  hd.digest_chars = digest_chars;
  for (int f = 0; f < kFields; ++f) hd.len[f] = fields[f].size();

  // The record goes out in layout order as whole streamed lines: the writer
  // reads it on another core, and a line written whole needs no
  // read-for-ownership (stream_copy.h). Only the padding between the parts
  // is put explicitly.
  LineStream out(rec);
  out.Put(&hd, sizeof hd);
  out.Zero(l.ints - sizeof hd);
  for (int f = 0; f < kFields; ++f) {
    if (!fields[f].empty()) out.Put(fields[f].data(), fields[f].size_bytes());
  }
  if (!v.sampling.empty()) out.Put(v.sampling.data(), v.sampling.size_bytes());
  out.Zero(l.digests - out.offset());
  uint32_t dend = 0;
  for (const DigestView& d : v.digests) {
    dend += static_cast<uint32_t>(d.name.size());
    const PackedDigest pd{d.value128, d.value64, d.is_128 ? 1u : 0u, dend};
    out.Put(&pd, sizeof pd);
  }
  out.Zero(l.id_ends - out.offset());
  if (num_ids > 0) out.Put(id_ends_.get(), num_ids * sizeof(uint32_t));
  out.Put(id_chars_.get(), id_chars);
  for (const DigestView& d : v.digests) out.Put(d.name.data(), d.name.size());
  assert(out.offset() == l.digest_chars + digest_chars);
  out.Finish();
  StreamFence();  // the streamed bytes are visible before the head publishes them
  head_.store(h + 1, std::memory_order_release);
}

void StepQueue::Unpack(uint64_t seq, uint32_t rank, StepRecord* r) const {
  const std::byte* rec = entries_[seq % entries_.size()].data;
  Header hd;
  std::memcpy(&hd, rec, sizeof hd);
  size_t num_ints = 0;
  size_t begin[kFields + 1];
  for (int f = 0; f < kFields; ++f) {
    begin[f] = num_ints;
    num_ints += hd.len[f];
  }
  begin[kFields] = num_ints;
  const Layout l = LayoutOf(num_ints, hd.num_sampling, hd.num_digests, hd.num_ids, hd.id_chars, hd.digest_chars);
  const int64_t* ints = reinterpret_cast<const int64_t*>(rec + l.ints);
  // assign() keeps the record's capacity from step to step: the writer
  // thread allocates only when a step is larger than any before it.
  auto field = [&](int f, std::vector<int64_t>* out) { out->assign(ints + begin[f], ints + begin[f + 1]); };

  r->step = hd.step;
  r->rank = rank;
  r->mode = static_cast<ForwardMode>(hd.mode);
  r->timestamp_nanos = hd.timestamp_nanos;
  const uint32_t* ends = reinterpret_cast<const uint32_t*>(rec + l.id_ends);
  const char* chars = reinterpret_cast<const char*>(rec + l.id_chars);
  r->request_ids.resize(hd.num_ids);
  uint32_t at = 0;
  for (uint32_t i = 0; i < hd.num_ids; ++i) {
    r->request_ids[i].assign(chars + at, ends[i] - at);
    at = ends[i];
  }
  field(kTokens, &r->token_ids);
  field(kPositions, &r->positions);
  field(kSeqLens, &r->seq_lens);
  field(kExtendLens, &r->extend_lens);
  field(kPool, &r->req_pool_indices);
  const size_t rows = hd.len[kPtOffsets] > 0 ? hd.len[kPtOffsets] - 1 : 0;
  r->page_table.resize(rows);
  for (size_t i = 0; i < rows; ++i) {
    PageTableRow& row = r->page_table[i];
    row.req_pool_index = i < hd.len[kPool] ? ints[begin[kPool] + i] : -1;
    const int64_t* slots = ints + begin[kPtSlots];
    row.token_slots.assign(slots + ints[begin[kPtOffsets] + i], slots + ints[begin[kPtOffsets] + i + 1]);
    // Start codes (StepQueue::Push): c >= 0 continues the previous row from
    // column c (0: the whole row); c < 0 is a row whose columns before
    // -c - 1 are unknown.
    const int64_t code = i < hd.len[kPtStarts] ? ints[begin[kPtStarts] + i] : 0;
    row.start = code >= 0 ? code : -code - 1;
    row.from_previous = code > 0;
  }
  field(kOutLoc, &r->out_cache_loc);
  r->sampling.resize(hd.num_sampling);
  if (hd.num_sampling > 0) std::memcpy(r->sampling.data(), rec + l.sampling, hd.num_sampling * sizeof(SamplingParams));
  r->rng_seed = hd.rng_seed;
  r->rng_offset = hd.rng_offset;
  field(kOutputs, &r->output_token_ids);
  r->digests.resize(hd.num_digests);
  const char* dchars = reinterpret_cast<const char*>(rec + l.digest_chars);
  at = 0;
  for (uint32_t i = 0; i < hd.num_digests; ++i) {
    PackedDigest pd;
    std::memcpy(&pd, rec + l.digests + i * sizeof(PackedDigest), sizeof pd);
    Digest& d = r->digests[i];
    d.name.assign(dchars + at, pd.name_end - at);
    at = pd.name_end;
    if (pd.is_128 != 0) {
      d.value = pd.value128;
    } else {
      d.value = pd.value64;
    }
  }
  r->tensors.clear();
}

void StepQueue::Release(uint64_t seq) {
  // Only a spilled entry is written here: the entries are the producer's
  // lines, and a store from this thread would take them away from it.
  Entry& e = entries_[seq % entries_.size()];
  if (e.spill != nullptr) e.spill.reset();
  tail_.store(seq + 1, std::memory_order_release);
}

}  // namespace crashreplay::capture::internal
