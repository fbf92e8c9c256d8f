// Page-table deltas (docs/capture.md, "Page-table deltas"): whatever the
// recorder writes, and however the caller hands it the rows, the reader
// gives back every step's whole rows exactly; the file stops growing with
// context length; whole rows come back every so often; steps dropped on
// the way or held through a full disk leave no wrong row behind.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "crashreplay/formats/capture_format.h"
#include "page_row_tracker.h"
#include "recorder_test_util.h"

namespace crashreplay::testing {
namespace {

using capture::Recorder;
using capture::RecorderOptions;

// A paged server, as sglang runs one: requests take a req_pool_index, a
// prefill writes their row (sometimes starting with another request's
// slots, as a radix-cache hit does), each decode step appends one slot,
// finished requests free their index for the next one, and now and then
// a request is retracted (its row cut back) and prefilled again.
class PagedServer {
 public:
  explicit PagedServer(uint32_t seed, int pool = 12) : rng_(seed), rows_(static_cast<size_t>(pool)) {}

  // The next step; `deltas`: decode rows as their new slot (page_table_starts).
  struct Step {
    std::vector<int64_t> pool, offsets{0}, slots, starts, seq_lens;
    std::map<int64_t, std::vector<int64_t>> truth;  // pool index -> the whole row
    ForwardMode mode = ForwardMode::kDecode;
  };
  Step Next(bool deltas) {
    Step s;
    std::vector<int64_t> free, live;
    for (size_t p = 0; p < rows_.size(); ++p) (rows_[p].live ? live : free).push_back(static_cast<int64_t>(p));
    const bool prefill = live.empty() || (!free.empty() && Draw(4) == 0) || Draw(40) == 0;
    if (prefill) {
      s.mode = ForwardMode::kExtend;
      // Retract one live request now and then: its row shrinks, then grows again.
      if (!live.empty() && Draw(3) == 0) {
        Row& r = rows_[static_cast<size_t>(live[Draw(live.size())])];
        r.slots.resize(r.slots.size() / 2);
        Add(s, static_cast<int64_t>(&r - rows_.data()), false);
      }
      for (int k = 0; k < 2 && !free.empty(); ++k) {
        const int64_t p = free[Draw(free.size())];
        free.erase(std::find(free.begin(), free.end(), p));
        Row& r = rows_[static_cast<size_t>(p)];
        r = Row{true, {}};
        if (!live.empty() && Draw(2) == 0) {  // a cached prefix: another request's first slots
          const Row& other = rows_[static_cast<size_t>(live[Draw(live.size())])];
          r.slots.assign(other.slots.begin(),
                         other.slots.begin() + static_cast<std::ptrdiff_t>(other.slots.size() / 2));
        }
        const size_t n = 1 + Draw(300);
        for (size_t i = 0; i < n; ++i) r.slots.push_back(next_slot_++);
        Add(s, p, false);
      }
      return s;
    }
    for (int64_t p : live) {
      Row& r = rows_[static_cast<size_t>(p)];
      if (Draw(150) == 0) {  // finished: the index is free (its old row stays in the pool table)
        r.live = false;
        continue;
      }
      r.slots.push_back(next_slot_++);
      Add(s, p, deltas);
    }
    return s;
  }

  static capture::StepView View(const Step& s, uint64_t step, bool with_starts) {
    capture::StepView v;
    v.step = step;
    v.mode = s.mode;
    v.seq_lens = s.seq_lens;
    v.req_pool_indices = s.pool;
    v.page_table_offsets = s.offsets;
    v.page_table_slots = s.slots;
    if (with_starts) v.page_table_starts = s.starts;
    return v;
  }

 private:
  struct Row {
    bool live = false;
    std::vector<int64_t> slots;
  };
  size_t Draw(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }
  void Add(Step& s, int64_t p, bool delta) {
    const std::vector<int64_t>& row = rows_[static_cast<size_t>(p)].slots;
    const size_t from = delta ? row.size() - 1 : 0;
    s.pool.push_back(p);
    s.starts.push_back(static_cast<int64_t>(from));
    s.slots.insert(s.slots.end(), row.begin() + static_cast<std::ptrdiff_t>(from), row.end());
    s.offsets.push_back(static_cast<int64_t>(s.slots.size()));
    s.seq_lens.push_back(static_cast<int64_t>(row.size()));
    s.truth[p] = row;
  }

  std::mt19937 rng_;
  std::vector<Row> rows_;
  int64_t next_slot_ = 1000;
};

RecorderOptions Options(const std::string& path, bool deltas) {
  RecorderOptions o;
  o.path = path;
  o.install_signal_handlers = false;
  o.page_table_deltas = deltas;
  return o;
}

// The rows the reader gives back for each step, against the server's.
void ExpectWholeRows(const CaptureReader& r, const std::map<uint64_t, PagedServer::Step>& sent) {
  for (const StepRecord& s : r.steps()) {
    SCOPED_TRACE(::testing::Message() << "step " << s.step);
    const PagedServer::Step& want = sent.at(s.step);
    ASSERT_EQ(s.page_table.size(), want.pool.size());
    for (const PageTableRow& row : s.page_table) {
      EXPECT_TRUE(row.complete());
      EXPECT_EQ(row.token_slots, want.truth.at(row.req_pool_index)) << "req_pool_index " << row.req_pool_index;
    }
  }
}

struct Written {
  uint64_t bytes = 0, raw_step_bytes = 0;
  std::map<uint64_t, PagedServer::Step> sent;
};

Written Record(const std::string& path, bool deltas_in_file, bool caller_deltas, uint64_t steps) {
  Written w;
  PagedServer server(7);
  auto rec = Recorder::Begin(TestManifest(), Options(path, deltas_in_file));
  EXPECT_TRUE(rec.ok()) << rec.status();
  if (!rec.ok()) return w;
  for (uint64_t i = 0; i < steps; ++i) {
    PagedServer::Step s = server.Next(caller_deltas);
    EXPECT_TRUE((*rec)->RecordStep(PagedServer::View(s, i, caller_deltas)).ok());
    w.sent.emplace(i, std::move(s));
  }
  EXPECT_TRUE((*rec)->Close().ok());
  EXPECT_EQ((*rec)->stats().page_rows_incomplete, 0u);
  w.bytes = std::filesystem::file_size(path);
  if (std::unique_ptr<CaptureReader> r = ReadCapture(path)) w.raw_step_bytes = r->Summary().step_raw_bytes;
  return w;
}

TEST(PageDeltas, EveryWayOfRecordingReadsBackAsTheWholeRows) {
  RecorderTempDir dir;
  constexpr uint64_t kSteps = 2600;  // three zstd frames of the step stream
  const std::string whole = dir.path() + "/whole.crcap", file_deltas = dir.path() + "/file.crcap",
                    caller = dir.path() + "/caller.crcap";
  const Written a = Record(whole, /*deltas_in_file=*/false, /*caller_deltas=*/false, kSteps);
  const Written b = Record(file_deltas, true, false, kSteps);
  const Written c = Record(caller, true, true, kSteps);
  for (const auto& [path, w] : {std::pair{whole, &a}, std::pair{file_deltas, &b}, std::pair{caller, &c}}) {
    SCOPED_TRACE(path);
    std::unique_ptr<CaptureReader> r = ReadCapture(path);
    ASSERT_NE(r, nullptr);
    ASSERT_EQ(r->steps().size(), kSteps);
    EXPECT_TRUE(r->Verify().status.ok()) << r->Verify().status;
    ExpectWholeRows(*r, w->sent);
  }
  // Whole rows cost what the context is; deltas what changed. (zstd's
  // window finds much of a repeated row again, so the file shrinks less
  // than the records: rows here are short, 1 to 450 slots.)
  EXPECT_LT(b.raw_step_bytes * 10, a.raw_step_bytes) << b.raw_step_bytes << " against " << a.raw_step_bytes;
  EXPECT_LT(c.raw_step_bytes * 10, a.raw_step_bytes) << c.raw_step_bytes << " against " << a.raw_step_bytes;
  EXPECT_LT(b.bytes * 2, a.bytes) << b.bytes << " against " << a.bytes;
  EXPECT_LT(c.bytes * 2, a.bytes) << c.bytes << " against " << a.bytes;
  std::printf(
      "%llu steps: whole rows %llu bytes in the file (%llu in the records), deltas %llu (%llu) given whole, "
      "%llu (%llu) given as deltas\n",
      static_cast<unsigned long long>(kSteps), static_cast<unsigned long long>(a.bytes),
      static_cast<unsigned long long>(a.raw_step_bytes), static_cast<unsigned long long>(b.bytes),
      static_cast<unsigned long long>(b.raw_step_bytes), static_cast<unsigned long long>(c.bytes),
      static_cast<unsigned long long>(c.raw_step_bytes));
}

TEST(PageDeltas, WholeRowsReturnOnceTheDeltasOutweighThem) {
  // No chain of deltas is longer than a bounded multiple of the rows
  // themselves: whole rows come back, and cost a bounded share of the file.
  RecorderTempDir dir;
  const std::string path = dir.path() + "/epochs.crcap";
  Record(path, true, true, 2600);
  std::unique_ptr<CaptureReader> r = ReadCapture(path);
  ASSERT_NE(r, nullptr);
  // Decode steps are given as deltas: one whose frame holds none had its
  // rows written whole by the writer.
  std::vector<uint64_t> whole;
  size_t at = 0, decode = 0;
  for (const RecordInfo& info : r->records()) {
    if (info.type != static_cast<uint16_t>(RecordType::kStep)) continue;
    const StepRecord& s = r->steps()[at++];
    if (s.mode != ForwardMode::kDecode || s.page_table.empty()) continue;
    ++decode;
    if ((info.flags & kFrameFlagPageDeltas) == 0) whole.push_back(s.step);
  }
  ASSERT_GE(whole.size(), 2u);
  EXPECT_LT(whole.size() * 20, decode);
  std::printf("whole rows at %zu of %zu decode steps (the first at steps %llu and %llu)\n", whole.size(), decode,
              static_cast<unsigned long long>(whole[0]), static_cast<unsigned long long>(whole[1]));
}

TEST(PageDeltas, AFullDiskLosesNoRowOfTheStepsItHeld) {
  // The file-size limit stops the file part way; the recorder holds the
  // steps after it (each a frame of its own, rows whole), and writes them
  // once the limit is gone. Every step that reaches the file has its rows.
  RecorderTempDir dir;
  const std::string path = dir.path() + "/full.crcap";
  rlimit saved{};
  getrlimit(RLIMIT_FSIZE, &saved);
  const sighandler_t old = signal(SIGXFSZ, SIG_IGN);
  rlimit lim = saved;
  lim.rlim_cur = 96 << 10;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &lim), 0);
  RecorderOptions o = Options(path, true);
  o.disk_retry_interval_s = 3600;  // retried when the test flushes
  auto rec = Recorder::Begin(TestManifest(), o);
  ASSERT_TRUE(rec.ok()) << rec.status();
  PagedServer server(5);
  std::map<uint64_t, PagedServer::Step> sent;
  int reports = 0;
  for (uint64_t i = 0; i < 1500; ++i) {
    PagedServer::Step s = server.Next(true);
    if (!(*rec)->RecordStep(PagedServer::View(s, i, true)).ok()) ++reports;
    sent.emplace(i, std::move(s));
  }
  EXPECT_FALSE((*rec)->Flush().ok());  // still full
  const capture::RecorderStats full = (*rec)->stats();
  EXPECT_GT(full.write_errors, 0u);
  EXPECT_GT(full.steps_held, 0u);
  setrlimit(RLIMIT_FSIZE, &saved);
  signal(SIGXFSZ, old);
  EXPECT_TRUE((*rec)->Close().ok());
  EXPECT_EQ(reports, 1);
  std::unique_ptr<CaptureReader> r = ReadCapture(path);
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(r->Verify().status.ok()) << r->Verify().status;
  EXPECT_EQ(r->steps().size(), 1500u - full.steps_dropped);
  ExpectWholeRows(*r, sent);
}

TEST(PageDeltas, StepsDroppedAtAStalledWriterLeaveNoWrongRow) {
  RecorderTempDir dir;
  const std::string fifo = dir.path() + "/stalled.crcap";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const int rd = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(rd, 0);
  RecorderOptions o = Options(fifo, true);
  o.overwrite = true;
  o.step_queue_slots = 16;
  o.step_queue_wait_s = 0.01;
  auto rec = Recorder::Begin(TestManifest(), o);
  ASSERT_TRUE(rec.ok()) << rec.status();
  PagedServer server(11);
  std::map<uint64_t, PagedServer::Step> sent;
  std::vector<unsigned char> bytes;
  std::thread reader;
  for (uint64_t i = 0; i < 3000; ++i) {
    if (i == 1500) {  // the disk comes back half way: later steps are written again
      reader = std::thread([&] {
        fcntl(rd, F_SETFL, 0);
        unsigned char buf[1 << 16];
        for (ssize_t n; (n = ::read(rd, buf, sizeof buf)) > 0;) bytes.insert(bytes.end(), buf, buf + n);
      });
    }
    PagedServer::Step s = server.Next(/*deltas=*/true);
    (void)(*rec)->RecordStep(PagedServer::View(s, i, true));  // one report, the drops
    sent.emplace(i, std::move(s));
  }
  const capture::RecorderStats st = (*rec)->stats();
  EXPECT_TRUE((*rec)->Close().ok());
  reader.join();
  ::close(rd);
  EXPECT_GT(st.steps_dropped, 0u);
  EXPECT_EQ(st.page_rows_incomplete, 0u);
  auto r = CaptureReader::FromBytes(bytes, {}, fifo);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE((*r)->Verify().status.ok()) << (*r)->Verify().status;
  EXPECT_EQ((*r)->steps().size(), st.steps_accepted);
  EXPECT_GT((*r)->steps().back().step, 2900u);
  ExpectWholeRows(**r, sent);
}

TEST(PageDeltas, ARowContinuingColumnsNeverGivenIsKeptIncompleteAndCounted) {
  // A recorder that began while requests were already decoding: their
  // first deltas continue rows it never had. They are kept as the columns
  // given, marked so (replay names them), until a prefill gives them whole.
  RecorderTempDir dir;
  const std::string path = dir.path() + "/late.crcap";
  auto rec = Recorder::Begin(TestManifest(), Options(path, true));
  ASSERT_TRUE(rec.ok()) << rec.status();
  std::vector<int64_t> pool{3}, offsets{0, 1}, slots{777}, starts{40}, lens{41};
  capture::StepView v;
  v.mode = ForwardMode::kDecode;
  v.req_pool_indices = pool;
  v.seq_lens = lens;
  v.page_table_offsets = offsets;
  v.page_table_slots = slots;
  v.page_table_starts = starts;
  for (uint64_t i = 0; i < 3; ++i) {
    v.step = i;
    slots[0] = 777 + static_cast<int64_t>(i);
    starts[0] = 40 + static_cast<int64_t>(i);
    ASSERT_TRUE((*rec)->RecordStep(v).ok());
  }
  std::vector<int64_t> whole(44);
  for (size_t j = 0; j < whole.size(); ++j) whole[j] = 5000 + static_cast<int64_t>(j);
  std::vector<int64_t> whole_offsets{0, 44}, zero{0};
  v.step = 3;
  v.mode = ForwardMode::kExtend;
  v.page_table_offsets = whole_offsets;
  v.page_table_slots = whole;
  v.page_table_starts = zero;
  ASSERT_TRUE((*rec)->RecordStep(v).ok());
  EXPECT_EQ((*rec)->stats().page_rows_incomplete, 1u);  // the first only: later ones continue it
  ASSERT_TRUE((*rec)->Close().ok());
  std::unique_ptr<CaptureReader> r = ReadCapture(path);
  ASSERT_NE(r, nullptr);
  ASSERT_EQ(r->steps().size(), 4u);
  for (uint64_t i = 0; i < 3; ++i) {
    const PageTableRow& row = r->steps()[i].page_table.at(0);
    EXPECT_EQ(row.start, 40);  // columns 0..39 were never recorded
    EXPECT_FALSE(row.complete());
    std::vector<int64_t> want;
    for (uint64_t k = 0; k <= i; ++k) want.push_back(777 + static_cast<int64_t>(k));
    EXPECT_EQ(row.token_slots, want) << "step " << i;
  }
  EXPECT_TRUE(r->steps()[3].page_table.at(0).complete());
  EXPECT_EQ(r->steps()[3].page_table.at(0).token_slots, whole);
}

TEST(PageDeltas, StartsAreCheckedAgainstTheRows) {
  RecorderTempDir dir;
  auto rec = Recorder::Begin(TestManifest(), Options(dir.path() + "/bad.crcap", true));
  ASSERT_TRUE(rec.ok()) << rec.status();
  std::vector<int64_t> pool{0, 1}, offsets{0, 1, 2}, slots{5, 6}, two{0, 0}, one{0}, negative{0, -2};
  capture::StepView v;
  v.req_pool_indices = pool;
  v.page_table_offsets = offsets;
  v.page_table_slots = slots;
  v.page_table_starts = one;
  absl::Status s = (*rec)->RecordStep(v);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("1 page_table_starts for 2 page-table rows"), std::string_view::npos) << s;
  v.page_table_starts = negative;
  s = (*rec)->RecordStep(v);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("page_table_starts[1] is -2"), std::string_view::npos) << s;
  v.page_table_starts = two;
  v.req_pool_indices = std::span<const int64_t>(pool).first(1);
  s = (*rec)->RecordStep(v);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("need a req_pool_index for each of the 2 rows (1 given)"), std::string_view::npos) << s;
  EXPECT_TRUE((*rec)->Close().ok());
}

TEST(PageRowTracker, PassesOnWhatChangedWithinAnEpochAndWholeRowsAfter) {
  capture::internal::PageRowTracker t;
  const std::vector<int64_t> row{1, 2, 3, 4};
  auto out = t.Apply(0, 0, false, row, /*minimize=*/true);
  EXPECT_EQ(out.start, 0);
  EXPECT_FALSE(out.from_previous);
  EXPECT_EQ(std::vector<int64_t>(out.slots.begin(), out.slots.end()), row);
  // The same row plus a slot, given whole: only the new slot goes on.
  const std::vector<int64_t> longer{1, 2, 3, 4, 9};
  out = t.Apply(0, 0, false, longer, true);
  EXPECT_EQ(out.start, 4);
  EXPECT_TRUE(out.from_previous);
  EXPECT_EQ(std::vector<int64_t>(out.slots.begin(), out.slots.end()), std::vector<int64_t>{9});
  // Cut back (a retraction): an empty delta at the new end.
  const std::vector<int64_t> shorter{1, 2};
  out = t.Apply(0, 0, false, shorter, true);
  EXPECT_EQ(out.start, 2);
  EXPECT_TRUE(out.from_previous);
  EXPECT_TRUE(out.slots.empty());
  // A new epoch: the next row goes whole, built from what the tracker holds.
  t.NewEpoch();
  const std::vector<int64_t> next{7};
  out = t.Apply(0, 2, true, next, true);
  EXPECT_EQ(out.start, 0);
  EXPECT_FALSE(out.from_previous);
  EXPECT_EQ(std::vector<int64_t>(out.slots.begin(), out.slots.end()), (std::vector<int64_t>{1, 2, 7}));
  // A large pool index goes to the map, the same way.
  out = t.Apply(int64_t{1} << 40, 0, false, row, true);
  EXPECT_EQ(out.start, 0);
  out = t.Apply(int64_t{1} << 40, 4, true, next, true);
  EXPECT_EQ(out.start, 4);
  EXPECT_TRUE(out.from_previous);
  EXPECT_EQ(t.incomplete(), 0u);
}

TEST(PageRowTracker, WhatItPassesOnRebuildsEveryRowThroughAppendsRewindsWholeRowsAndEpochs) {
  // A receiver that applies each Out as the writer does holds, after every
  // call, exactly the row given: over runs of one- and two-slot appends
  // (the tracker's tail, flushed every few steps), appends longer than the
  // tail, rewinds into the row, rows given whole (minimized or not),
  // replaced rows and new epochs.
  capture::internal::PageRowTracker t;
  std::mt19937 rng(7);
  auto draw = [&rng](uint32_t n) { return static_cast<uint32_t>(rng() % n); };
  constexpr int kPools = 5;
  std::vector<std::vector<int64_t>> truth(kPools), received(kPools);
  std::vector<int64_t> received_start(kPools, 0);
  std::vector<bool> given(kPools, false);
  int64_t next_slot = 1;
  uint64_t deltas = 0;
  for (int call = 0; call < 20000; ++call) {
    const int pool = static_cast<int>(draw(kPools));
    std::vector<int64_t>& row = truth[static_cast<size_t>(pool)];
    const uint32_t what = draw(100);
    std::vector<int64_t> sent;
    int64_t start = 0;
    bool from_previous = false;
    if (given[static_cast<size_t>(pool)] && what < 85) {
      // A delta: append 1-2 slots (often), up to 9, or rewind first.
      start = static_cast<int64_t>(row.size());
      if (what >= 80 && !row.empty()) start = draw(static_cast<uint32_t>(row.size()) + 1);
      row.resize(static_cast<size_t>(start));
      const uint32_t n = what < 70 ? 1 + draw(2) : draw(10);
      for (uint32_t i = 0; i < n; ++i) row.push_back(next_slot++);
      sent.assign(row.begin() + start, row.end());
      from_previous = start > 0;
    } else {
      // Given whole: the same row grown or cut, or a new one.
      if (what < 93 && !row.empty()) {
        row.resize(draw(static_cast<uint32_t>(row.size()) + 1));
        for (uint32_t i = draw(3); i > 0; --i) row.push_back(next_slot++);
      } else {
        row.assign(1 + draw(40), 0);
        for (int64_t& x : row) x = next_slot++;
      }
      sent = row;
    }
    if (draw(500) == 0) t.NewEpoch();
    const auto out = t.Apply(pool, start, from_previous, sent, /*minimize=*/what % 2 == 0);
    given[static_cast<size_t>(pool)] = true;
    std::vector<int64_t>& r = received[static_cast<size_t>(pool)];
    if (out.from_previous) {
      ++deltas;
      ASSERT_GE(out.start, received_start[static_cast<size_t>(pool)]) << "call " << call;
      ASSERT_LE(out.start - received_start[static_cast<size_t>(pool)], static_cast<int64_t>(r.size()))
          << "call " << call;
      r.resize(static_cast<size_t>(out.start - received_start[static_cast<size_t>(pool)]));
      r.insert(r.end(), out.slots.begin(), out.slots.end());
    } else {
      received_start[static_cast<size_t>(pool)] = out.start;
      r.assign(out.slots.begin(), out.slots.end());
    }
    ASSERT_EQ(received_start[static_cast<size_t>(pool)], 0) << "call " << call;
    ASSERT_EQ(r, row) << "call " << call << ", pool " << pool;
    uint64_t held = 0;
    for (const auto& x : truth) held += x.size();
    ASSERT_EQ(t.held_slots(), held) << "call " << call;
  }
  EXPECT_EQ(t.incomplete(), 0u);
  EXPECT_GT(deltas, 10000u);  // most calls went on as deltas, through the tail
}

// Format 2.4: the recorder writes a decode step's positions, sequence
// lengths and cache slots as differences from the step before (on by
// default), not at all with the option off (a 2.3 reader's file), and
// either way the reader gives back what was recorded, through batches that
// change size.
TEST(StepListDeltas, TheRecorderWritesThemAndTheReaderGivesBackTheValues) {
  RecorderTempDir dir;
  constexpr uint64_t kSteps = 1500;
  std::mt19937_64 rng(11);
  std::vector<StepRecord> sent;
  std::vector<int64_t> len(64), slot(64);
  for (size_t i = 0; i < len.size(); ++i) {
    len[i] = static_cast<int64_t>(100 + rng() % 900);
    slot[i] = static_cast<int64_t>(i << 20);
  }
  for (uint64_t step = 0; step < kSteps; ++step) {
    if (step % 97 == 50) {  // a request finishes, another joins at the end
      len.erase(len.begin());
      slot.erase(slot.begin());
      len.push_back(static_cast<int64_t>(rng() % 2000));
      slot.push_back(static_cast<int64_t>(rng() >> 20));
    }
    StepRecord r;
    r.step = step;
    for (size_t i = 0; i < len.size(); ++i) {
      r.positions.push_back(len[i]++);
      r.seq_lens.push_back(len[i]);
      r.out_cache_loc.push_back(slot[i]++);
      r.token_ids.push_back(static_cast<int64_t>(rng() % 150000));
    }
    sent.push_back(std::move(r));
  }
  auto record = [&](const std::string& path, bool list_deltas) {
    RecorderOptions o = Options(path, true);
    o.step_list_deltas = list_deltas;
    auto rec = Recorder::Begin(TestManifest(), o);
    ASSERT_TRUE(rec.ok()) << rec.status();
    for (const StepRecord& r : sent) {
      capture::StepView v;
      v.step = r.step;
      v.mode = ForwardMode::kDecode;
      v.token_ids = r.token_ids;
      v.positions = r.positions;
      v.seq_lens = r.seq_lens;
      v.out_cache_loc = r.out_cache_loc;
      ASSERT_TRUE((*rec)->RecordStep(v).ok());
    }
    ASSERT_TRUE((*rec)->Close().ok());
  };
  const std::string on = dir.path() + "/on.crcap", off = dir.path() + "/off.crcap";
  record(on, true);
  record(off, false);
  uint64_t sizes[2] = {0, 0};
  int k = 0;
  for (const std::string& path : {on, off}) {
    SCOPED_TRACE(path);
    std::unique_ptr<CaptureReader> r = ReadCapture(path);
    ASSERT_NE(r, nullptr);
    EXPECT_TRUE(r->Verify().status.ok()) << r->Verify().status;
    ASSERT_EQ(r->steps().size(), kSteps);
    for (uint64_t i = 0; i < kSteps; ++i) {
      const StepRecord& got = r->steps()[i];
      ASSERT_EQ(got.positions, sent[i].positions) << "step " << i;
      ASSERT_EQ(got.seq_lens, sent[i].seq_lens) << "step " << i;
      ASSERT_EQ(got.out_cache_loc, sent[i].out_cache_loc) << "step " << i;
      ASSERT_EQ(got.token_ids, sent[i].token_ids) << "step " << i;
    }
    uint64_t flagged = 0;
    for (const RecordInfo& info : r->records()) flagged += (info.flags & kFrameFlagListDeltas) != 0;
    if (path == on) {
      EXPECT_GT(flagged, kSteps * 9 / 10);
    } else {
      EXPECT_EQ(flagged, 0u);
    }
    sizes[k++] = r->Summary().step_stored_bytes;
  }
  std::printf("step log: %llu bytes with the differences, %llu without\n", static_cast<unsigned long long>(sizes[0]),
              static_cast<unsigned long long>(sizes[1]));
  EXPECT_LT(sizes[0] * 3, sizes[1] * 2) << "with the differences " << sizes[0] << " bytes, without " << sizes[1];
}

}  // namespace
}  // namespace crashreplay::testing
