// Kernel bodies against naive formulas, and their checks.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "crashreplay/replay/cpu/cpu_pool.h"
#include "crashreplay/replay/kernels/attention.h"
#include "crashreplay/replay/kernels/elementwise.h"
#include "crashreplay/replay/kernels/linear.h"
#include "crashreplay/replay/kernels/router.h"
#include "crashreplay/replay/kernels/sampling.h"

namespace crashreplay::replay {
namespace {

std::vector<float> RandomVec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

TEST(Numerics, E4m3RoundTripsEveryFiniteCode) {
  for (int b = 0; b < 256; ++b) {
    const float f = E4m3ToFloat(static_cast<uint8_t>(b));
    if (std::isnan(f)) continue;
    if (f == 0.0f) continue;  // -0 and +0
    EXPECT_EQ(FloatToE4m3(f), b) << "code " << b << " value " << f;
  }
  EXPECT_EQ(E4m3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(FloatToE4m3(1000.0f), 0x7e);  // saturates
  EXPECT_EQ(E4m3ToFloat(FloatToE4m3(1.0625f)), 1.0f);  // tie to even
}

TEST(Numerics, Bf16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.00390625f)), 1.0f);      // tie, even kept
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.01171875f)), 1.015625f);  // tie, rounds up to even
  for (int c = 0; c < 16; ++c) EXPECT_EQ(FloatToE2m1(E2m1ToFloat(c)) & (c == 8 ? 7 : 15), c & (c == 8 ? 7 : 15));
}

TEST(Linear, Bf16DotMatchesNaiveSum) {
  const int rows = 7, cols = 53;
  auto wf = RandomVec(rows * cols, 1);
  auto x = RandomVec(cols, 2);
  std::vector<uint16_t> wb(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) wb[i] = FloatToBf16(wf[i]);
  QWeight w{WFormat::kBF16, SFormat::kNone, wb.data(), rows, cols, nullptr, 1, 1, 0, 1.0f};
  for (int r = 0; r < rows; ++r) {
    double ref = 0;
    for (int c = 0; c < cols; ++c) ref += double(Bf16ToFloat(wb[r * cols + c])) * x[c];
    EXPECT_NEAR(DotDequant(w, x.data(), r), ref, 1e-4 * (1 + std::abs(ref)));
    EXPECT_EQ(DotDequant(w, x.data(), r), DotFused(w, x.data(), r));  // no scales: one path
  }
}

struct Fp8Block {
  std::vector<uint8_t> q;
  std::vector<float> scale;
  QWeight w;
};

Fp8Block MakeFp8(int rows, int cols, bool pow2_scales) {
  Fp8Block b;
  auto wf = RandomVec(rows * cols, 3, 0.05f);
  const int sr = (rows + 127) / 128, sc = (cols + 127) / 128;
  b.scale.resize(sr * sc);
  for (int i = 0; i < sr * sc; ++i) b.scale[i] = pow2_scales ? std::ldexp(1.0f, -8 - i) : 0.0003f * (i + 1.37f);
  b.q.resize(rows * cols);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      b.q[r * cols + c] = FloatToE4m3(wf[r * cols + c] / b.scale[(r / 128) * sc + c / 128]);
  b.w = QWeight{WFormat::kE4m3, SFormat::kF32, b.q.data(), rows, cols, b.scale.data(), 128, 128, sc, 1.0f};
  return b;
}

TEST(Linear, Fp8BlockPathsAgreeWithinToleranceAndDifferInBits) {
  Fp8Block b = MakeFp8(130, 300, false);
  auto x = RandomVec(300, 4);
  int differ = 0;
  for (int r = 0; r < 130; ++r) {
    double ref = 0, mag = 0;
    for (int c = 0; c < 300; ++c) {
      ref += double(RawAt(b.w, r, c)) * ScaleAt(b.w, r, c) * x[c];
      mag += std::abs(double(RawAt(b.w, r, c)) * ScaleAt(b.w, r, c) * x[c]);
    }
    const float d = DotDequant(b.w, x.data(), r), f = DotFused(b.w, x.data(), r);
    EXPECT_NEAR(f, ref, 1e-6 * mag + 1e-6);
    EXPECT_NEAR(d, ref, std::ldexp(mag, -8) + 1e-6);  // bf16 rounding of each weight: 2^-9 relative
    differ += d != f;
  }
  EXPECT_GT(differ, 0);
}

TEST(Linear, Ue8m0KernelAcceptsPowerOfTwoScalesBitExactly) {
  Fp8Block b = MakeFp8(130, 300, true);
  auto x = RandomVec(300, 5);
  KernelStatus st;
  for (int r = 0; r < 130; ++r) EXPECT_EQ(DotUe8m0(b.w, x.data(), r, r, &st), DotFused(b.w, x.data(), r));
  EXPECT_EQ(st.fired, 0u);
}

TEST(Linear, Ue8m0KernelRejectsScaleWithMantissaBits) {
  Fp8Block b = MakeFp8(130, 300, false);
  auto x = RandomVec(300, 6);
  KernelStatus st;
  DotUe8m0(b.w, x.data(), 129, 129, &st);
  ASSERT_EQ(st.fired, 1u);
  EXPECT_EQ(st.check, Check::kUe8m0ScaleLayout);
  EXPECT_EQ(st.index, 3);  // scale block (1, 0) of a 2x3 grid
  EXPECT_FLOAT_EQ(static_cast<float>(st.value), b.scale[3]);
}

TEST(Linear, Nvfp4DecodesPackedNibblesWithBothScales) {
  // One row of 32 values: two blocks of 16, e4m3 scales 0.5 and 1.5, global 2.
  std::vector<uint8_t> packed(16);
  for (int c = 0; c < 32; c += 2) packed[c / 2] = static_cast<uint8_t>((c % 16) / 2 | ((15 - (c % 16) / 2) << 4));
  uint8_t scales[2] = {FloatToE4m3(0.5f), FloatToE4m3(1.5f)};
  QWeight w{WFormat::kE2m1, SFormat::kE4m3, packed.data(), 1, 32, scales, 1, 16, 2, 2.0f};
  std::vector<float> x(32, 1.0f);
  double ref = 0;
  for (int c = 0; c < 32; ++c) {
    const uint8_t nib = (c & 1) ? packed[c / 2] >> 4 : packed[c / 2] & 15;
    ref += E2m1ToFloat(nib) * (c < 16 ? 0.5 : 1.5) * 2.0;
  }
  EXPECT_FLOAT_EQ(DotFused(w, x.data(), 0), static_cast<float>(ref));
  KernelStatus st;
  DotUe8m0(w, x.data(), 0, 0, &st);  // 1.5 * 2 = 3 is not a power of two
  EXPECT_EQ(st.check, Check::kUe8m0ScaleLayout);
  EXPECT_EQ(st.index, 1);
}

TEST(Elementwise, EmbeddingChecksTokenAgainstVocab) {
  std::vector<float> table = RandomVec(10 * 4, 7);
  QWeight w{WFormat::kF32, SFormat::kNone, table.data(), 10, 4, nullptr, 1, 1, 0, 1.0f};
  float out[4];
  KernelStatus st;
  EmbeddingRow(w, 9, out, 0, &st);
  EXPECT_EQ(st.fired, 0u);
  EXPECT_EQ(out[2], table[9 * 4 + 2]);
  EmbeddingRow(w, 10, out, 3, &st);
  EXPECT_EQ(st.check, Check::kTokenInVocab);
  EXPECT_EQ(st.index, 10);
  EXPECT_EQ(st.item, 3);
}

TEST(Elementwise, RmsNormAndRopeMatchFormulas) {
  auto x = RandomVec(64, 8);
  auto w = RandomVec(64, 9);
  std::vector<float> out(64);
  RmsNormRow(x.data(), w.data(), 64, 1e-6f, out.data());
  double ss = 0;
  for (float v : x) ss += double(v) * v;
  const double inv = 1.0 / std::sqrt(ss / 64 + 1e-6);
  for (int i = 0; i < 64; ++i) EXPECT_NEAR(out[i], x[i] * inv * w[i], 1e-5);
  std::vector<float> inv_freq(8);
  for (int i = 0; i < 8; ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * i / 16);
  auto h = RandomVec(16, 10);
  auto r = h;
  RopeHead(r.data(), 16, 5, inv_freq.data(), 1.0f);
  for (int i = 0; i < 8; ++i) {
    const double a = 5.0 * inv_freq[i];
    EXPECT_NEAR(r[i], h[i] * std::cos(a) - h[i + 8] * std::sin(a), 1e-5);
    EXPECT_NEAR(r[i + 8], h[i + 8] * std::cos(a) + h[i] * std::sin(a), 1e-5);
  }
}

struct Cache {
  std::vector<uint16_t> k, v;
  std::vector<int32_t> table;
  KvPoolView view;
  std::vector<std::vector<float>> keys, vals;
};

Cache FillCache(int len, int page_size, int pages, int kv_heads, int hd) {
  Cache c;
  c.k.resize(size_t(pages) * page_size * kv_heads * hd);
  c.v.resize(c.k.size());
  c.view = KvPoolView{c.k.data(), c.v.data(), false, pages, page_size, kv_heads, hd};
  const int need = (len + page_size - 1) / page_size;
  for (int p = 0; p < need; ++p) c.table.push_back(pages - 1 - p);  // reversed pool order
  KernelStatus st;
  for (int j = 0; j < len; ++j) {
    auto kk = RandomVec(kv_heads * hd, 100 + j), vv = RandomVec(kv_heads * hd, 1000 + j);
    KvWriteToken(c.view, PageTableRow{c.table.data(), int64_t(c.table.size())}, j, kk.data(), vv.data(), j, &st);
    for (auto& x : kk) x = Bf16ToFloat(FloatToBf16(x));
    for (auto& x : vv) x = Bf16ToFloat(FloatToBf16(x));
    c.keys.push_back(kk);
    c.vals.push_back(vv);
  }
  EXPECT_EQ(st.fired, 0u);
  return c;
}

TEST(Attention, ThreeBackendsMatchNaiveSoftmax) {
  const int len = 150, hd = 16, kvh = 2;
  Cache c = FillCache(len, 64, 4, kvh, hd);
  PageTableRow row{c.table.data(), int64_t(c.table.size())};
  auto q = RandomVec(hd, 11);
  const float scale = 0.25f;
  std::vector<double> s(len), ref(hd, 0.0);
  double m = -1e30, sum = 0;
  for (int j = 0; j < len; ++j) {
    s[j] = 0;
    for (int d = 0; d < hd; ++d) s[j] += double(q[d]) * c.keys[j][1 * hd + d];
    s[j] *= scale;
    m = std::max(m, s[j]);
  }
  for (int j = 0; j < len; ++j) sum += std::exp(s[j] - m);
  for (int j = 0; j < len; ++j)
    for (int d = 0; d < hd; ++d) ref[d] += std::exp(s[j] - m) / sum * c.vals[j][1 * hd + d];
  std::vector<float> scratch(FlashScratchFloats(len, hd) + len), o1(hd), o2(hd), o3(hd);
  KernelStatus st;
  AttendReference(c.view, row, q.data(), 1, len, scale, o1.data(), scratch.data(), 0, &st);
  AttendFlashDecode(c.view, row, q.data(), 1, len, scale, o2.data(), scratch.data(), 0, &st);
  AttendPaged64(c.view, row, q.data(), 1, len, scale, o3.data(), scratch.data(), 0, &st);
  ASSERT_EQ(st.fired, 0u);
  int differ = 0;
  for (int d = 0; d < hd; ++d) {
    EXPECT_NEAR(o1[d], ref[d], 1e-5);
    EXPECT_NEAR(o2[d], ref[d], 1e-5);
    EXPECT_NEAR(o3[d], ref[d], 1e-5);
    differ += o1[d] != o2[d];
  }
  EXPECT_GT(differ, 0) << "split-KV should sum in a different order";
}

// The reference body spread over n cooperating threads (the CUDA kernel's
// block), each phase run on every thread before the next: AttendReference's
// bits, and on a bad page its fault and zeroed output.
std::vector<float> AttendOnThreads(const KvPoolView& kv, PageTableRow row, const float* q, int64_t kv_head, int64_t len,
                                   float scale, int64_t n, KernelStatus* st) {
  std::vector<float> out(kv.head_dim, -7.0f), scratch(len + 3, -7.0f);
  for (int phase = 0; phase < kAttendPhases; ++phase) {
    bool go = true;
    for (int64_t i = 0; i < n; ++i) {
      KernelStatus own;
      const bool g = AttendReferencePhase(phase, i, n, kv, row, q, kv_head, len, scale, out.data(), scratch.data(), 9,
                                          i == 0 ? st : &own);
      EXPECT_FALSE(own.fired) << "only thread 0 checks";
      if (i == 0) go = g;
      EXPECT_EQ(g, go) << "threads disagree in phase " << phase;
    }
    if (!go) break;
  }
  return out;
}

TEST(Attention, ReferenceOnCooperatingThreadsHasTheBodysBits) {
  const int hd = 16, kvh = 2;
  for (int len : {1, 17, 150}) {
    Cache c = FillCache(len, 16, 12, kvh, hd);
    PageTableRow row{c.table.data(), int64_t(c.table.size())};
    auto q = RandomVec(hd, 21);
    std::vector<float> want(hd), scratch(FlashScratchFloats(len, hd) + len);
    KernelStatus ws;
    AttendReference(c.view, row, q.data(), 1, len, 0.25f, want.data(), scratch.data(), 9, &ws);
    ASSERT_FALSE(ws.fired);
    for (int64_t n : {1, 3, 16, 128}) {
      KernelStatus st;
      const std::vector<float> got = AttendOnThreads(c.view, row, q.data(), 1, len, 0.25f, n, &st);
      EXPECT_FALSE(st.fired);
      for (int d = 0; d < hd; ++d) {
        EXPECT_EQ(std::memcmp(&got[d], &want[d], 4), 0) << "len " << len << " n " << n << " d " << d;
      }
    }
  }
  // A page outside the pool (the second of three): the body's fault, and zeros.
  Cache c = FillCache(40, 16, 4, 1, 8);
  c.table[1] = 4;
  PageTableRow row{c.table.data(), int64_t(c.table.size())};
  auto q = RandomVec(8, 13);
  std::vector<float> want(8, -7.0f), scratch(64);
  KernelStatus ws;
  AttendReference(c.view, row, q.data(), 0, 40, 1.0f, want.data(), scratch.data(), 9, &ws);
  ASSERT_TRUE(ws.fired);
  for (int64_t n : {1, 4}) {
    KernelStatus st;
    const std::vector<float> got = AttendOnThreads(c.view, row, q.data(), 0, 40, 1.0f, n, &st);
    EXPECT_TRUE(st.fired);
    EXPECT_EQ(st.check, ws.check);
    EXPECT_EQ(st.item, ws.item);
    EXPECT_EQ(st.index, ws.index);
    EXPECT_EQ(st.value, ws.value);
    EXPECT_EQ(got, want);
  }
}

TEST(Attention, Paged64RejectsOtherPageSizes) {
  Cache c = FillCache(40, 16, 8, 1, 8);
  PageTableRow row{c.table.data(), int64_t(c.table.size())};
  auto q = RandomVec(8, 12);
  std::vector<float> scratch(64), out(8);
  KernelStatus st;
  AttendPaged64(c.view, row, q.data(), 0, 40, 1.0f, out.data(), scratch.data(), 5, &st);
  EXPECT_EQ(st.check, Check::kPageSizeIs64);
  EXPECT_EQ(st.index, 16);
  KernelStatus ok;
  AttendReference(c.view, row, q.data(), 0, 40, 1.0f, out.data(), scratch.data(), 5, &ok);
  EXPECT_EQ(ok.fired, 0u);
}

TEST(Attention, PageIdOutsidePoolIsReported) {
  Cache c = FillCache(20, 16, 4, 1, 8);
  c.table[1] = 4;  // the pool has pages 0..3
  PageTableRow row{c.table.data(), int64_t(c.table.size())};
  auto q = RandomVec(8, 13);
  std::vector<float> scratch(64), out(8);
  KernelStatus st;
  AttendReference(c.view, row, q.data(), 0, 20, 1.0f, out.data(), scratch.data(), 2, &st);
  EXPECT_EQ(st.check, Check::kPageInPool);
  EXPECT_EQ(st.index, 4);
  KernelStatus st2;
  float kv[8] = {};
  KvWriteToken(c.view, row, 40, kv, kv, 0, &st2);  // position 40 needs a third table entry
  EXPECT_EQ(st2.check, Check::kPositionInTable);
}

TEST(Router, SoftmaxTopKPicksLargestAndRenormalises) {
  float logits[6] = {0.1f, 2.0f, -1.0f, 2.0f, 0.5f, 1.0f};
  int32_t ids[2];
  float w[2], scratch[6];
  KernelStatus st;
  RouteSoftmaxTopK(logits, 6, 2, true, ids, w, scratch, 0, &st);
  EXPECT_EQ(ids[0], 1);  // tie with 3: lower index first
  EXPECT_EQ(ids[1], 3);
  EXPECT_FLOAT_EQ(w[0], 0.5f);
  EXPECT_FLOAT_EQ(w[0] + w[1], 1.0f);
}

TEST(Router, GroupedSigmoidRestrictsToBestGroupsAndUsesBiasOnlyForChoice) {
  // 8 experts in 4 groups of 2; topk_group 2; k 2.
  float logits[8] = {3, 3, -2, -2, 0, 0.5f, 1, -3};
  float bias[8] = {0, 0, 0, 0, 0, 0, 0, 5};  // lifts expert 7's group
  int32_t ids[2];
  float w[2], scratch[16];
  uint8_t mask[8];
  KernelStatus st;
  RouteSigmoidGrouped(logits, bias, 8, 2, 4, 2, true, 2.5f, ids, w, scratch, mask, 0, &st);
  ASSERT_EQ(st.fired, 0u);
  EXPECT_EQ(ids[0], 7);  // biased choice score 5.05
  EXPECT_EQ(ids[1], 0);
  const double s7 = 1 / (1 + std::exp(3.0)), s0 = 1 / (1 + std::exp(-3.0));
  EXPECT_NEAR(w[0], s7 / (s7 + s0) * 2.5, 1e-6);
  EXPECT_NEAR(w[1], s0 / (s7 + s0) * 2.5, 1e-6);
}

TEST(Router, NanLogitsLeaveNoExpertAndTheIdCheckFires) {
  float logits[4] = {NAN, NAN, NAN, NAN};
  int32_t ids[2];
  float w[2], scratch[4];
  KernelStatus st;
  RouteSoftmaxTopK(logits, 4, 2, false, ids, w, scratch, 9, &st);
  EXPECT_EQ(st.check, Check::kExpertInRange);
  EXPECT_EQ(st.index, -1);
  EXPECT_EQ(st.item, 9);
}

TEST(Sampling, SortedAndThresholdKeepTheSameTokens) {
  auto logits = RandomVec(300, 14, 3.0f);
  SamplingParams sp{0.8f, 20, 0.9f, 0.01f, 7};
  std::vector<float> a(300), b(300);
  std::vector<int32_t> ids(300);
  ProcessLogits(logits.data(), 300, sp, true, a.data(), ids.data());
  ProcessLogits(logits.data(), 300, sp, false, b.data(), ids.data());
  int kept = 0;
  for (int i = 0; i < 300; ++i) {
    EXPECT_EQ(a[i] > 0, b[i] > 0) << i;
    EXPECT_NEAR(a[i], b[i], 1e-6);
    kept += a[i] > 0;
  }
  EXPECT_GT(kept, 0);
  EXPECT_LE(kept, 20);
}

TEST(Sampling, DrawsAreCounterBasedAndChecked) {
  EXPECT_EQ(CounterUniform(1, 2, 3), CounterUniform(1, 2, 3));
  EXPECT_NE(CounterUniform(1, 2, 3), CounterUniform(1, 2, 4));
  float p[4] = {0.1f, 0.2f, 0.3f, 0.4f};
  KernelStatus st;
  EXPECT_EQ(SampleRow(p, 4, 0.05f, 0, &st), 0);
  EXPECT_EQ(SampleRow(p, 4, 0.95f, 0, &st), 3);
  float bad[3] = {0.5f, NAN, 0.5f};
  SampleRow(bad, 3, 0.5f, 4, &st);
  EXPECT_EQ(st.check, Check::kProbFinite);
  EXPECT_EQ(st.index, 1);
  KernelStatus st2;
  float zero[3] = {0, 0, 0};
  SampleRow(zero, 3, 0.5f, 0, &st2);
  EXPECT_EQ(st2.check, Check::kProbSumPositive);
}

TEST(CpuPool, OneAndTwoThreadsGiveSameBitsAndSameFirstFault) {
  auto x = RandomVec(4096, 15);
  Fp8Block b = MakeFp8(256, 512, false);
  auto run = [&](int threads, std::vector<float>* out) {
    CpuPool pool(threads);
    out->assign(256, 0);
    pool.Launch(256, [&](int64_t r, KernelStatus*) { (*out)[r] = DotFused(b.w, x.data(), r); });
    return pool.Launch(256, [&](int64_t r, KernelStatus* st) { DotUe8m0(b.w, x.data(), r, r, st); });
  };
  std::vector<float> o1, o2;
  KernelStatus s1 = run(1, &o1), s2 = run(2, &o2);
  EXPECT_EQ(0, std::memcmp(o1.data(), o2.data(), o1.size() * 4));
  EXPECT_EQ(s1.fired, 1u);
  EXPECT_EQ(s1.item, s2.item);
  EXPECT_EQ(s1.index, s2.index);
}

// Back-to-back launches of every size around the thread count, with
// launches that end while workers are still polling and ones that follow a
// pause long enough for them to block: every item runs exactly once per
// launch, and a launch returns the lowest failing item.
TEST(CpuPool, BackToBackLaunchesRunEveryItemOnceAndReportTheFirstFault) {
  for (int threads : {2, 3, 8}) {
    SCOPED_TRACE("threads=" + std::to_string(threads));
    CpuPool pool(threads);
    std::vector<std::atomic<int>> hits(64);
    for (int round = 0; round < 400; ++round) {
      const int64_t n = round % 20;
      for (auto& h : hits) h.store(0);
      const int64_t fail_at = round % 3 == 0 ? n / 2 : -1;
      const KernelStatus st = pool.Launch(n, [&](int64_t i, KernelStatus* s) {
        hits[i].fetch_add(1);
        if (fail_at >= 0 && i >= fail_at) Fail(s, Check::kProbFinite, i, 0, 0.0);
      });
      for (int64_t i = 0; i < n; ++i) {
        // A worker stops at its first failing item: items after it in its range may not run.
        if (fail_at < 0 || i <= fail_at) {
          ASSERT_EQ(hits[i].load(), 1) << "round " << round << " item " << i;
        }
      }
      for (int64_t i = n; i < 64; ++i) ASSERT_EQ(hits[i].load(), 0);
      if (fail_at >= 0 && n > 0) {
        ASSERT_TRUE(st.fired) << "round " << round;
        EXPECT_EQ(st.item, fail_at);
      } else {
        EXPECT_FALSE(st.fired);
      }
      if (round % 50 == 49) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // workers block
    }
  }
}

TEST(CpuPool, DynamicLaunchesRunEveryItemAtMostOnceAndReportTheLowestFault) {
  std::mt19937 g(9);
  for (int threads : {1, 2, 3, 8}) {
    SCOPED_TRACE("threads=" + std::to_string(threads));
    CpuPool pool(threads);
    std::vector<std::atomic<int>> hits(64);
    for (int round = 0; round < 400; ++round) {
      const int64_t n = round % 40;
      for (auto& h : hits) h.store(0);
      // Failing items anywhere (several, out of the threads' order), items of
      // uneven cost, or none failing.
      std::vector<char> fails(64, 0);
      int64_t lowest = -1;
      if (round % 3 != 0 && n > 0) {
        for (int k = 0; k < 3; ++k) fails[std::uniform_int_distribution<int64_t>(0, n - 1)(g)] = 1;
        for (int64_t i = 0; i < n && lowest < 0; ++i) lowest = fails[i] ? i : -1;
      }
      const KernelStatus st = pool.LaunchDynamic(n, [&](int64_t i, KernelStatus* s) {
        hits[i].fetch_add(1);
        if (i % 7 == 0) std::this_thread::sleep_for(std::chrono::microseconds(20));
        if (fails[i]) Fail(s, Check::kProbFinite, i, i * 10, 0.0);
      });
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_LE(hits[i].load(), 1) << "round " << round << " item " << i;
        // Every item up to the first failure runs; later ones may be skipped.
        if (lowest < 0 || i <= lowest) {
          ASSERT_EQ(hits[i].load(), 1) << "round " << round << " item " << i;
        }
      }
      for (int64_t i = n; i < 64; ++i) ASSERT_EQ(hits[i].load(), 0);
      if (lowest >= 0) {
        ASSERT_TRUE(st.fired) << "round " << round;
        EXPECT_EQ(st.item, lowest);
        EXPECT_EQ(st.index, lowest * 10);
      } else {
        EXPECT_FALSE(st.fired);
      }
      if (round % 50 == 49) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
}

}  // namespace
}  // namespace crashreplay::replay
