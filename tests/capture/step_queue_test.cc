// The step queue driven directly: every field round-trips, a reused record
// is overwritten exactly, records wrap round the arena, spill and grow it as
// documented, and a producer and a consumer thread agree on every step.
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "recorder_test_util.h"
#include "step_queue.h"
#include "stream_copy.h"

namespace crashreplay::testing {
namespace {

using capture::DigestView;
using capture::StepView;
using capture::internal::StepQueue;

// A step with every field set, sized by `requests` and `slots_per_row`.
struct FullStep {
  std::vector<std::string> id_storage, digest_names;
  std::vector<std::string_view> ids;
  std::vector<int64_t> tokens, positions, seq_lens, extend, pool, offsets, slots, out_loc, outputs;
  std::vector<SamplingParams> sampling;
  std::vector<DigestView> digests;
  uint64_t step;

  FullStep(uint64_t step_, size_t requests, size_t slots_per_row, size_t num_digests = 2) : step(step_) {
    for (size_t i = 0; i < requests; ++i)
      id_storage.push_back("r" + std::to_string(step) + "-" + std::string(i % 7, 'x'));
    for (const std::string& s : id_storage) ids.push_back(s);
    for (size_t i = 0; i < requests; ++i) {
      tokens.push_back(static_cast<int64_t>(step * 1000 + i));
      tokens.push_back(-static_cast<int64_t>(i));  // two tokens per request: an extend step
      positions.push_back(static_cast<int64_t>(i));
      positions.push_back(static_cast<int64_t>(i + 1));
      seq_lens.push_back(static_cast<int64_t>(i + 2));
      extend.push_back(2);
      out_loc.push_back(static_cast<int64_t>(i * 3));
      out_loc.push_back(static_cast<int64_t>(i * 3 + 1));
      outputs.push_back(static_cast<int64_t>(step + i));
      SamplingParams p;
      p.temperature = 0.25f * static_cast<float>(i % 4);
      p.top_k = static_cast<int32_t>(i);
      p.seed = step * 7 + i;
      p.has_seed = i % 2 == 0;
      sampling.push_back(p);
    }
    // One fewer pool index than rows: the last row's index reads back as -1.
    const size_t rows = slots_per_row > 0 ? requests : 0;
    for (size_t i = 0; i + 1 < rows; ++i) pool.push_back(static_cast<int64_t>(100 + i));
    if (rows > 0) {
      offsets.push_back(1);  // a first offset past 0 skips slot 0
      slots.push_back(-5);
      for (size_t i = 0; i < rows; ++i) {
        for (size_t j = 0; j < slots_per_row + i % 3; ++j) slots.push_back(static_cast<int64_t>(i * 4096 + j));
        offsets.push_back(static_cast<int64_t>(slots.size()));
      }
    }
    for (size_t i = 0; i < num_digests; ++i) digest_names.push_back("digest." + std::to_string(i));
    for (size_t i = 0; i < num_digests; ++i) {
      DigestView d;
      d.name = digest_names[i];
      d.is_128 = i % 2 == 1;
      d.value64 = step * 11 + i;
      d.value128 = Hash128{step + i, ~(step + i)};
      digests.push_back(d);
    }
  }

  StepView view() const {
    StepView v;
    v.step = step;
    v.mode = step % 2 ? ForwardMode::kExtend : ForwardMode::kDecode;
    v.timestamp_nanos = static_cast<int64_t>(step) * 1000 + 7;
    v.request_ids = ids;
    v.token_ids = tokens;
    v.positions = positions;
    v.seq_lens = seq_lens;
    v.extend_lens = extend;
    v.req_pool_indices = pool;
    v.page_table_offsets = offsets;
    v.page_table_slots = slots;
    v.out_cache_loc = out_loc;
    v.sampling = sampling;
    v.rng_seed = step ^ 0xabc;
    v.rng_offset = step * 4;
    v.output_token_ids = outputs;
    v.digests = digests;
    return v;
  }

  // What the writer must produce, built field by field from the view.
  StepRecord expected(uint32_t rank) const {
    StepRecord r;
    r.step = step;
    r.rank = rank;
    r.mode = step % 2 ? ForwardMode::kExtend : ForwardMode::kDecode;
    r.timestamp_nanos = static_cast<int64_t>(step) * 1000 + 7;
    r.request_ids = id_storage;
    r.token_ids = tokens;
    r.positions = positions;
    r.seq_lens = seq_lens;
    r.extend_lens = extend;
    r.req_pool_indices = pool;
    for (size_t i = 0; i + 1 < offsets.size(); ++i) {
      PageTableRow row;
      row.req_pool_index = i < pool.size() ? pool[i] : -1;
      row.token_slots.assign(slots.begin() + offsets[i], slots.begin() + offsets[i + 1]);
      r.page_table.push_back(row);
    }
    r.out_cache_loc = out_loc;
    r.sampling = sampling;
    r.rng_seed = step ^ 0xabc;
    r.rng_offset = step * 4;
    r.output_token_ids = outputs;
    for (const DigestView& d : digests) {
      Digest g;
      g.name = std::string(d.name);
      if (d.is_128)
        g.value = d.value128;
      else
        g.value = d.value64;
      r.digests.push_back(g);
    }
    return r;
  }
};

TEST(StepQueue, EveryFieldRoundTrips) {
  StepQueue q(8, 1 << 20);
  const FullStep s(3, 5, 4);
  ASSERT_TRUE(StepQueue::Validate(s.view()).ok());
  q.Push(s.view(), s.view().timestamp_nanos);
  ASSERT_EQ(q.head(), 1u);
  StepRecord r;
  q.Unpack(0, 6, &r);
  EXPECT_EQ(r, s.expected(6));
  EXPECT_EQ(r.page_table.back().req_pool_index, -1);
  EXPECT_EQ(r.page_table.front().token_slots.front(), 0);  // slot 0 (-5) skipped by offset 1
  q.Release(0);
  EXPECT_EQ(q.tail(), 1u);
}

TEST(StepQueue, EmptyStepRoundTrips) {
  StepQueue q(4, 1 << 20);
  StepView v;
  v.step = 9;
  v.mode = ForwardMode::kIdle;
  q.Push(v, 42);
  StepRecord r;
  r.request_ids = {"stale"};
  r.token_ids = {1, 2};
  r.page_table.resize(3);
  r.digests.resize(1);
  q.Unpack(0, 0, &r);
  StepRecord want;
  want.step = 9;
  want.mode = ForwardMode::kIdle;
  want.timestamp_nanos = 42;
  EXPECT_EQ(r, want);
}

TEST(StepQueue, AReusedRecordHoldsExactlyTheNextStep) {
  StepQueue q(8, 1 << 20);
  const FullStep big(1, 40, 9, 3), small(2, 3, 2, 1);
  q.Push(big.view(), big.view().timestamp_nanos);
  q.Push(small.view(), small.view().timestamp_nanos);
  StepRecord r;
  q.Unpack(0, 1, &r);
  EXPECT_EQ(r, big.expected(1));
  q.Release(0);
  q.Unpack(1, 1, &r);  // fewer ids, rows, digests: nothing of step 1 remains
  EXPECT_EQ(r, small.expected(1));
}

TEST(StepQueue, FullAtSlotsUntilTheWriterReleases) {
  StepQueue q(2, 1 << 20);
  const FullStep s(0, 2, 0);
  EXPECT_FALSE(q.Full());
  q.Push(s.view(), 1);
  q.Push(s.view(), 2);
  EXPECT_TRUE(q.Full());
  q.Release(0);
  EXPECT_FALSE(q.Full());
}

TEST(StepQueue, RecordsThatFitTheArenaNeverSpillWhenTheWriterKeepsUp) {
  const FullStep s(5, 64, 60);  // ~45 KiB per record
  const size_t bytes = StepQueue::PackedBytes(s.view());
  StepQueue q(4, 64 << 10);
  ASSERT_GT(bytes * 2, q.arena_bytes());  // two would not fit side by side: every record starts a new lap
  StepRecord r;
  for (uint64_t i = 0; i < 50; ++i) {
    q.Push(s.view(), 1);
    q.Unpack(i, 0, &r);
    q.Release(i);
  }
  EXPECT_EQ(q.spilled(), 0u);
  EXPECT_EQ(r.page_table, s.expected(0).page_table);
}

TEST(StepQueue, AnEmptyQueueHasTheWholeArenaWhereverThePositionIs) {
  const FullStep small(1, 4, 0), big(2, 64, 60);  // ~0.6 KiB and ~39 KiB of a 64 KiB arena
  StepQueue q(4, 64 << 10);
  const size_t s_bytes = StepQueue::PackedBytes(small.view()), b_bytes = StepQueue::PackedBytes(big.view());
  // Enough small steps that the big one no longer fits before the end, but
  // fewer bytes of them than the big one: a new lap is needed, and the
  // space skipped must not count as taken when nothing is queued.
  const size_t n = (q.arena_bytes() - b_bytes) / s_bytes + 1;
  ASSERT_LT(n * s_bytes, b_bytes);
  StepRecord r;
  for (uint64_t seq = 0; seq <= n; ++seq) {
    const FullStep& s = seq < n ? small : big;
    q.Push(s.view(), 5);
    q.Unpack(seq, 0, &r);
    StepRecord want = s.expected(0);
    want.timestamp_nanos = 5;
    EXPECT_EQ(r, want) << "seq " << seq;
    q.Release(seq);
  }
  EXPECT_EQ(q.spilled(), 0u);
}

TEST(StepQueue, RecordsWrapRoundTheArenaAndSpillWhenItIsFull) {
  const FullStep s(7, 20, 8);
  const size_t bytes = StepQueue::PackedBytes(s.view());
  StepQueue q(64, 64 << 10);
  const size_t fit = q.arena_bytes() / bytes;
  ASSERT_GE(fit, 3u);
  for (size_t i = 0; i < fit; ++i) q.Push(s.view(), static_cast<int64_t>(i));
  EXPECT_EQ(q.spilled(), 0u);
  q.Push(s.view(), 100);  // no room left: its own buffer
  EXPECT_EQ(q.spilled(), 1u);
  StepRecord r;
  q.Unpack(0, 0, &r);
  q.Release(0);
  q.Unpack(1, 0, &r);
  q.Release(1);
  q.Push(s.view(), 101);  // wraps into the space the first two left
  EXPECT_EQ(q.spilled(), 1u);
  for (uint64_t seq = 2; seq < q.head(); ++seq) {
    q.Unpack(seq, 0, &r);
    StepRecord want = s.expected(0);
    want.timestamp_nanos = seq < fit ? static_cast<int64_t>(seq) : seq == fit ? 100 : 101;
    EXPECT_EQ(r, want) << "seq " << seq;
    q.Release(seq);
  }
}

TEST(StepQueue, OversizedRecordGrowsTheArenaWhenEmptyAndSpillsOtherwise) {
  StepQueue q(8, 64 << 10);
  const FullStep small(1, 2, 1), huge(2, 200, 64);
  ASSERT_GT(StepQueue::PackedBytes(huge.view()), q.arena_bytes());
  q.Push(small.view(), 1);
  q.Push(huge.view(), 2);  // the queue is not empty: spilled
  EXPECT_EQ(q.spilled(), 1u);
  StepRecord r;
  q.Unpack(0, 0, &r);
  q.Release(0);
  q.Unpack(1, 0, &r);
  StepRecord want = huge.expected(0);
  want.timestamp_nanos = 2;
  EXPECT_EQ(r, want) << "spilled record";
  q.Release(1);
  q.Push(huge.view(), 3);  // empty now: the arena grows to hold it
  EXPECT_EQ(q.spilled(), 1u);
  EXPECT_GE(q.arena_bytes(), StepQueue::PackedBytes(huge.view()));
  q.Unpack(2, 0, &r);
  want.timestamp_nanos = 3;
  EXPECT_EQ(r, want);
}

// Request ids and digest names of every length from 0 to past a cache line
// (each length class of the short copy, and the long path), in records that
// start at different offsets of the arena.
TEST(StepQueue, IdsAndNamesOfEveryLengthRoundTrip) {
  StepQueue q(4, 1 << 20);
  StepRecord r;
  for (uint64_t step = 0; step < 3; ++step) {
    FullStep s(step, 150, step);
    for (size_t i = 0; i < s.id_storage.size(); ++i) {
      s.id_storage[i].clear();
      for (size_t k = 0; k < (i + step) % 150; ++k)
        s.id_storage[i].push_back(static_cast<char>('a' + (i * 7 + k) % 26));
      s.ids[i] = s.id_storage[i];
    }
    s.digest_names.assign(70, "");
    s.digests.clear();
    for (size_t i = 0; i < s.digest_names.size(); ++i) {
      s.digest_names[i] = std::string(i, static_cast<char>('A' + i % 26));
      DigestView d;
      d.name = s.digest_names[i];
      d.value64 = i;
      s.digests.push_back(d);
    }
    q.Push(s.view(), s.view().timestamp_nanos);
    q.Unpack(step, 0, &r);
    EXPECT_EQ(r, s.expected(0)) << "step " << step;
    q.Release(step);
  }
}

// LineStream writes exactly the concatenation of its pieces, in whole lines
// only: the rest of the last line is zero and nothing past it is touched.
TEST(LineStream, WritesTheConcatenationInWholeLines) {
  std::mt19937 rng(7);
  std::vector<char> src(4096);
  for (char& c : src) c = static_cast<char>(rng());
  for (int trial = 0; trial < 200; ++trial) {
    alignas(64) char dst[8192];
    std::memset(dst, 0x5a, sizeof dst);
    std::string want;
    capture::internal::LineStream out(dst);
    while (want.size() < 6000) {
      const size_t n = rng() % 4 == 0 ? rng() % 300 : rng() % 70;
      const size_t at = rng() % (src.size() - n);
      if (rng() % 10 == 0) {
        out.Zero(n);
        want.append(n, '\0');
      } else {
        out.Put(src.data() + at, n);
        want.append(src.data() + at, n);
      }
      ASSERT_EQ(out.offset(), want.size());
    }
    out.Finish();
    capture::internal::StreamFence();
    const size_t lines = (want.size() + 63) / 64 * 64;
    ASSERT_EQ(std::string(dst, want.size()), want) << "trial " << trial;
    EXPECT_EQ(std::string(dst + want.size(), lines - want.size()), std::string(lines - want.size(), '\0'));
    EXPECT_EQ(std::string(dst + lines, sizeof dst - lines), std::string(sizeof dst - lines, '\x5a'));
  }
}

TEST(StepQueue, MalformedPageTablesAreRefusedByName) {
  FullStep s(4, 3, 2);
  StepView v = s.view();
  const std::vector<int64_t> decreasing = {1, 3, 2, 5};
  v.page_table_offsets = decreasing;
  absl::Status st = StepQueue::Validate(v);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("step 4: page_table_offsets must be non-decreasing"), std::string::npos) << st;
  const std::vector<int64_t> past_end = {0, 1000};
  v.page_table_offsets = past_end;
  EXPECT_EQ(StepQueue::Validate(v).code(), absl::StatusCode::kInvalidArgument);
  const std::vector<int64_t> negative = {-1, 0};
  v.page_table_offsets = negative;
  EXPECT_EQ(StepQueue::Validate(v).code(), absl::StatusCode::kInvalidArgument);
  v.page_table_offsets = {};
  st = StepQueue::Validate(v);
  EXPECT_NE(st.message().find("page_table_slots without page_table_offsets"), std::string::npos) << st;
}

// A producer and a consumer thread, steps of random sizes through a small
// arena (rewinds, wraps and spills all happen): every step arrives intact
// and in order.
TEST(StepQueue, ProducerAndWriterThreadsAgreeOnEveryStep) {
  constexpr uint64_t kSteps = 3000;
  StepQueue q(16, 256 << 10);
  auto shape = [](uint64_t step) {
    std::mt19937 rng(static_cast<uint32_t>(step));
    return std::pair<size_t, size_t>{rng() % 80, rng() % 3 == 0 ? rng() % 40 : 0};
  };
  std::thread writer([&] {
    StepRecord r;
    for (uint64_t seq = 0; seq < kSteps; ++seq) {
      while (q.head() <= seq) std::this_thread::yield();
      q.Unpack(seq, 2, &r);
      const auto [requests, slots] = shape(seq);
      const StepRecord want = FullStep(seq, requests, slots, seq % 3).expected(2);
      if (r != want) {
        ADD_FAILURE() << "step " << seq << " differs";
        q.Release(seq);
        continue;
      }
      q.Release(seq);
    }
  });
  for (uint64_t seq = 0; seq < kSteps; ++seq) {
    const auto [requests, slots] = shape(seq);
    const FullStep s(seq, requests, slots, seq % 3);
    while (q.Full()) std::this_thread::yield();
    q.Push(s.view(), s.view().timestamp_nanos);
  }
  writer.join();
  EXPECT_EQ(q.tail(), kSteps);
}

}  // namespace
}  // namespace crashreplay::testing
