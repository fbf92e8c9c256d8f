// gpt-oss's kernel pieces against straightforward double-precision
// formulas: attention sinks and the sliding window in every attention
// variant, the clamped SwiGLU, top-k-then-softmax routing, and an expert
// MLP with biases.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "crashreplay/formats/numeric.h"
#include "crashreplay/replay/kernels/attention.h"
#include "crashreplay/replay/kernels/elementwise.h"
#include "crashreplay/replay/kernels/expert.h"
#include "crashreplay/replay/kernels/router.h"

namespace crashreplay::replay {
namespace {

std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// A bf16 cache of `len` positions, one KV head, its pages in reversed pool
// order; keys/vals hold the stored (rounded) values.
struct Cache {
  std::vector<uint16_t> k, v;
  std::vector<int32_t> table;
  std::vector<std::vector<float>> keys, vals;
  KvPoolView view;
};

Cache Fill(int len, int page_size, int hd) {
  Cache c;
  const int pages = (len + page_size - 1) / page_size + 1;
  c.k.resize(size_t(pages) * page_size * hd);
  c.v.resize(c.k.size());
  c.view = KvPoolView{c.k.data(), c.v.data(), false, pages, page_size, 1, hd};
  for (int p = 0; p * page_size < len; ++p) c.table.push_back(pages - 1 - p);
  KernelStatus st;
  for (int j = 0; j < len; ++j) {
    auto kk = Random(hd, 100 + j), vv = Random(hd, 1000 + j);
    KvWriteToken(c.view, PageTableRow{c.table.data(), int64_t(c.table.size())}, j, kk.data(), vv.data(), j, &st);
    for (auto& x : kk) x = Bf16ToFloat(FloatToBf16(x));
    for (auto& x : vv) x = Bf16ToFloat(FloatToBf16(x));
    c.keys.push_back(kk);
    c.vals.push_back(vv);
  }
  EXPECT_EQ(st.fired, 0u);
  return c;
}

// softmax over [scores of positions begin .. len - 1, sink], the sink's
// probability dropped, times V: transformers' eager_attention_forward for
// gpt-oss, in double.
std::vector<double> Naive(const Cache& c, const std::vector<float>& q, int64_t begin, int64_t len, float scale,
                          double sink) {
  const int hd = c.view.head_dim;
  std::vector<double> s;
  double m = sink;
  for (int64_t j = begin; j < len; ++j) {
    double d = 0;
    for (int i = 0; i < hd; ++i) d += double(q[i]) * c.keys[j][i];
    s.push_back(d * scale);
    m = std::max(m, s.back());
  }
  double sum = std::isinf(sink) ? 0.0 : std::exp(sink - m);
  for (double x : s) sum += std::exp(x - m);
  std::vector<double> out(hd, 0.0);
  for (int64_t j = begin; j < len; ++j)
    for (int i = 0; i < hd; ++i) out[i] += std::exp(s[j - begin] - m) / sum * c.vals[j][i];
  return out;
}

TEST(GptOssAttention, SinkAndWindowInEveryVariantMatchTheNaiveSoftmax) {
  const int hd = 16, len = 150;
  Cache c = Fill(len, 64, hd);
  const PageTableRow row{c.table.data(), int64_t(c.table.size())};
  const auto q = Random(hd, 7);
  const float scale = 0.25f;
  // Windows: none, one starting inside a page (110: the paged kernel's tile
  // holds positions before it), one of a single position; sinks: none,
  // within the scores, far above every score (the sink is the maximum).
  for (int64_t window : {0, 40, 1}) {
    for (float sink : {-INFINITY, 0.5f, 30.0f}) {
      SCOPED_TRACE(testing::Message() << "window " << window << " sink " << sink);
      const int64_t begin = WindowBegin(len, window);
      const auto want = Naive(c, q, begin, len, scale, sink);
      std::vector<float> scratch(FlashScratchFloats(len, hd) + len + kPaged64Tile), o1(hd), o2(hd), o3(hd);
      KernelStatus st;
      AttendReference(c.view, row, q.data(), 0, len, scale, o1.data(), scratch.data(), 0, &st, begin, sink);
      AttendFlashDecode(c.view, row, q.data(), 0, len, scale, o2.data(), scratch.data(), 0, &st, begin, sink);
      AttendPaged64(c.view, row, q.data(), 0, len, scale, o3.data(), scratch.data(), 0, &st, begin, sink);
      ASSERT_EQ(st.fired, 0u);
      for (int d = 0; d < hd; ++d) {
        EXPECT_NEAR(o1[d], want[d], 1e-5 * (1 + std::abs(want[d])));
        EXPECT_NEAR(o2[d], want[d], 1e-5 * (1 + std::abs(want[d])));
        EXPECT_NEAR(o3[d], want[d], 1e-5 * (1 + std::abs(want[d])));
      }
      // The block-cooperative form (the CUDA kernel's) has the body's bits.
      for (int64_t n : {1, 3, 32}) {
        std::vector<float> out(hd, -7.0f), ps(len + 3, -7.0f);
        for (int phase = 0; phase < kAttendPhases; ++phase) {
          for (int64_t i = 0; i < n; ++i) {
            KernelStatus own;
            AttendReferencePhase(phase, i, n, c.view, row, q.data(), 0, len, scale, out.data(), ps.data(), 0, &own,
                                 begin, sink);
            ASSERT_EQ(own.fired, 0u);
          }
        }
        for (int d = 0; d < hd; ++d) EXPECT_EQ(out[d], o1[d]) << "threads " << n << " dim " << d;
      }
    }
  }
}

TEST(GptOssAttention, TheSinkTakesProbabilityAway) {
  // One position: softmax([s, sink]) gives it 1 / (1 + exp(sink - s)) of its value row.
  const int hd = 8;
  Cache c = Fill(1, 16, hd);
  const PageTableRow row{c.table.data(), int64_t(c.table.size())};
  const auto q = Random(hd, 3);
  double s = 0;
  for (int i = 0; i < hd; ++i) s += double(q[i]) * c.keys[0][i];
  std::vector<float> out(hd), scratch(64);
  KernelStatus st;
  AttendReference(c.view, row, q.data(), 0, 1, 1.0f, out.data(), scratch.data(), 0, &st, 0, float(s));
  for (int d = 0; d < hd; ++d) EXPECT_NEAR(out[d], 0.5 * c.vals[0][d], 1e-6);
}

TEST(GptOssAttention, PagesBeforeTheWindowAreNeverRead) {
  // A sliding-window engine (sglang's SWA pool) frees pages that left the
  // window; their table entries may hold anything. Only the window's pages
  // are resolved, so no check fires and the output is the window's.
  const int hd = 16, len = 100, page = 16;
  Cache c = Fill(len, page, hd);
  const auto q = Random(hd, 5);
  const int64_t begin = WindowBegin(len, 20);  // 80: pages 5 and 6
  std::vector<int32_t> freed = c.table;
  for (int p = 0; p < begin / page; ++p) freed[p] = 1 << 20;  // outside the pool
  const PageTableRow row{freed.data(), int64_t(freed.size())};
  const auto want = Naive(c, q, begin, len, 0.3f, 1.0);
  std::vector<float> scratch(FlashScratchFloats(len, hd) + len), o1(hd), o2(hd);
  KernelStatus st;
  AttendReference(c.view, row, q.data(), 0, len, 0.3f, o1.data(), scratch.data(), 0, &st, begin, 1.0f);
  AttendFlashDecode(c.view, row, q.data(), 0, len, 0.3f, o2.data(), scratch.data(), 0, &st, begin, 1.0f);
  EXPECT_EQ(st.fired, 0u);
  for (int d = 0; d < hd; ++d) {
    EXPECT_NEAR(o1[d], want[d], 1e-5);
    EXPECT_NEAR(o2[d], want[d], 1e-5);
  }
  // Without the window the same table is a fault: the freed page is read.
  AttendReference(c.view, row, q.data(), 0, len, 0.3f, o1.data(), scratch.data(), 0, &st, 0, 1.0f);
  EXPECT_NE(st.fired, 0u);
}

TEST(GptOssWindow, BeginFollowsTransformersSlidingMask) {
  // transformers keeps key positions kv > q - window: a query at position
  // len - 1 attends max(0, len - window) .. len - 1.
  EXPECT_EQ(WindowBegin(10, 0), 0);
  EXPECT_EQ(WindowBegin(10, 10), 0);
  EXPECT_EQ(WindowBegin(10, 11), 0);
  EXPECT_EQ(WindowBegin(11, 10), 1);
  EXPECT_EQ(WindowBegin(130, 128), 2);
  EXPECT_EQ(WindowBegin(5, 1), 4);
}

double NaiveSwiglu(double g, double u, double alpha, double limit) {
  g = std::min(g, limit);
  u = std::clamp(u, -limit, limit);
  return (u + 1) * g / (1 + std::exp(-alpha * g));
}

TEST(GptOssSwiglu, ClampedSwigluMatchesTransformersFormula) {
  const float alpha = 1.702f, limit = 7.0f;
  for (float g : {-20.0f, -7.5f, -1.0f, 0.0f, 0.3f, 6.99f, 7.0f, 7.01f, 50.0f}) {
    for (float u : {-30.0f, -7.0f, -0.5f, 0.0f, 2.0f, 7.0f, 9.0f}) {
      const double want = NaiveSwiglu(g, u, alpha, limit);
      EXPECT_NEAR(ClampedSwiglu(g, u, alpha, limit), want, 1e-6 * (1 + std::abs(want))) << g << " " << u;
    }
  }
  // Clamped inputs give the limit's value: gate 50 acts as 7, up -30 as -7.
  EXPECT_EQ(ClampedSwiglu(50.0f, -30.0f, alpha, limit), ClampedSwiglu(7.0f, -7.0f, alpha, limit));
  // torch.clamp keeps NaN, and so does the kernel.
  EXPECT_TRUE(std::isnan(ClampedSwiglu(NAN, 1.0f, alpha, limit)));
  EXPECT_TRUE(std::isnan(ClampedSwiglu(1.0f, NAN, alpha, limit)));
  // limit 0: the row is SiluMulRow's, bit for bit.
  const float g[3] = {-2.0f, 0.5f, 9.0f}, u[3] = {1.0f, -3.0f, 8.0f};
  float a[3], b[3];
  GatedActRow(g, u, 3, 0.0f, 0.0f, a);
  SiluMulRow(g, u, 3, b);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(a[i], b[i]);
}

TEST(GptOssRouter, TopKThenSoftmaxOverTheChosen) {
  const float logits[6] = {0.1f, 2.0f, -1.0f, 1.5f, 3.0f, 0.0f};
  int32_t ids[3];
  float w[3];
  KernelStatus st;
  RouteTopKSoftmax(logits, 6, 3, ids, w, 0, &st);
  ASSERT_EQ(st.fired, 0u);
  EXPECT_EQ(ids[0], 4);
  EXPECT_EQ(ids[1], 1);
  EXPECT_EQ(ids[2], 3);
  const double e0 = std::exp(3.0), e1 = std::exp(2.0), e2 = std::exp(1.5), s = e0 + e1 + e2;
  EXPECT_NEAR(w[0], e0 / s, 1e-7);
  EXPECT_NEAR(w[1], e1 / s, 1e-7);
  EXPECT_NEAR(w[2], e2 / s, 1e-7);
  // A NaN row picks nothing: the expert-id check fires, as for the others.
  const float bad[4] = {NAN, NAN, NAN, NAN};
  RouteTopKSoftmax(bad, 4, 2, ids, w, 5, &st);
  EXPECT_NE(st.fired, 0u);
}

TEST(GptOssExpert, BiasedClampedExpertMatchesNaive) {
  const int H = 24, I = 8;
  auto gw = Random(I * H, 1, 0.8f), uw = Random(I * H, 2, 0.8f), dw = Random(H * I, 3, 0.3f);
  auto gb = Random(I, 4), ub = Random(I, 5), db = Random(H, 6);
  auto x = Random(H, 7, 1.5f);
  ExpertView e;
  e.gate = QWeight{WFormat::kF32, SFormat::kNone, gw.data(), I, H, nullptr, 1, 1, 0, 1.0f};
  e.up = QWeight{WFormat::kF32, SFormat::kNone, uw.data(), I, H, nullptr, 1, 1, 0, 1.0f};
  e.down = QWeight{WFormat::kF32, SFormat::kNone, dw.data(), H, I, nullptr, 1, 1, 0, 1.0f};
  e.gate_bias = gb.data();
  e.up_bias = ub.data();
  e.down_bias = db.data();
  e.glu_alpha = 1.702f;
  e.glu_limit = 7.0f;
  std::vector<double> a(I);
  int clamped = 0;
  for (int i = 0; i < I; ++i) {
    double g = gb[i], u = ub[i];
    for (int h = 0; h < H; ++h) {
      g += double(gw[i * H + h]) * x[h];
      u += double(uw[i * H + h]) * x[h];
    }
    clamped += g > 7.0 || std::abs(u) > 7.0;
    a[i] = NaiveSwiglu(g, u, 1.702, 7.0);
  }
  const float weight = 0.375f;
  std::vector<float> out(H, 0.25f), scratch(ExpertScratchFloats(I));
  KernelStatus st;
  ExpertMlp(DotKind::kDequant, e, x.data(), nullptr, weight, H, scratch.data(), out.data(), 0, &st);
  ASSERT_EQ(st.fired, 0u);
  for (int h = 0; h < H; ++h) {
    double y = db[h];
    for (int i = 0; i < I; ++i) y += double(dw[h * I + i]) * a[i];
    const double want = 0.25 + weight * y;
    EXPECT_NEAR(out[h], want, 2e-5 * (1 + std::abs(want))) << h;
  }
  EXPECT_GT(clamped, 0) << "the inputs should reach the clamp";
}

}  // namespace
}  // namespace crashreplay::replay
