// The CPU fast attention launchers (cpu_attention.cc) give the bits of the
// AttentionOp work items (AttendReference) and of the MlaAttentionOp ones
// (MlaAttendExpanded, dense and over top-k ids) for every ISA this CPU runs, bf16
// and fp8 pools, GQA groups, page sizes, head widths, several ranks and
// requests, 1 to 3 threads and non-finite queries; it leaves to the work
// items what it does not cover, a page outside the pool among it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "crashreplay/formats/numeric.h"
#include "crashreplay/replay/cpu/cpu_kernels.h"
#include "crashreplay/replay/cpu/cpu_pool.h"
#include "crashreplay/replay/kernels/ops.h"

namespace crashreplay::replay {
namespace {

std::vector<CpuIsa> Isas() {
  std::vector<CpuIsa> v{CpuIsa::kGeneric};
  if (CpuIsaSupported(CpuIsa::kAvx2)) v.push_back(CpuIsa::kAvx2);
  if (CpuIsaSupported(CpuIsa::kAvx512)) v.push_back(CpuIsa::kAvx512);
  return v;
}

// The work items of `op` one by one (what the executor runs without a fast
// path), `out` reset to -7 first; `first`: the first fault in item order.
template <class Op>
std::vector<float> WorkItems(const Op& op, std::vector<float>& out, KernelStatus* first) {
  std::fill(out.begin(), out.end(), -7.0f);
  std::vector<float> scratch(static_cast<size_t>(ScratchFloats(op)) + 1);
  *first = KernelStatus{};
  for (int64_t i = 0; i < Items(op); ++i) {
    KernelStatus st;
    RunItem(op, i, scratch.data(), &st);
    if (st.fired && !first->fired) *first = st;
  }
  return out;
}

// `launch(op, pool, isa, status)` on `threads` threads, `out` reset to -7
// first; *ran: whether it covered the op. It never fires a check.
template <class Op, class Launch>
std::vector<float> Launched(const Op& op, std::vector<float>& out, CpuIsa isa, int threads, bool* ran, Launch launch) {
  std::fill(out.begin(), out.end(), -7.0f);
  CpuPool pool(threads);
  KernelStatus st;
  *ran = launch(op, pool, isa, &st);
  EXPECT_FALSE(st.fired);
  return out;
}

struct Shape {
  int ranks = 1, heads = 4, group = 2, hd = 64, page_size = 16;
  bool fp8 = false;
  std::vector<int> prompt;  // tokens of each request, all attended causally (prefill)
};

// A prefill step's attention: request r's tokens at positions 0 .. len - 1,
// KV written for all of them, pages of each request spread over the pool.
struct Case {
  Shape s;
  std::vector<std::vector<uint8_t>> k, v;  // [rank] pool bytes
  std::vector<KvPoolView> views;
  std::vector<int32_t> positions, token_row, tables;
  std::vector<int64_t> table_offset;
  std::vector<float> q, out;
  AttentionOp op;

  explicit Case(Shape sh, uint32_t seed) : s(std::move(sh)) {
    std::mt19937 g(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int kvh = s.heads / s.group;
    int64_t pages = 0;
    table_offset.push_back(0);
    for (size_t r = 0; r < s.prompt.size(); ++r) {
      const int need = (s.prompt[r] + s.page_size - 1) / s.page_size;
      for (int p = 0; p < need; ++p) tables.push_back(static_cast<int32_t>(pages + need - 1 - p));  // reversed
      pages += need;
      table_offset.push_back(static_cast<int64_t>(tables.size()));
      for (int j = 0; j < s.prompt[r]; ++j) {
        positions.push_back(j);
        token_row.push_back(static_cast<int32_t>(r));
      }
    }
    const int64_t T = static_cast<int64_t>(positions.size());
    const size_t elems = static_cast<size_t>(pages) * s.page_size * kvh * s.hd;
    for (int r = 0; r < s.ranks; ++r) {
      k.emplace_back(elems * (s.fp8 ? 1 : 2));
      v.emplace_back(elems * (s.fp8 ? 1 : 2));
      views.push_back(KvPoolView{k.back().data(), v.back().data(), s.fp8, pages, s.page_size, kvh, s.hd});
    }
    op.batch.positions = positions.data();
    op.batch.token_row = token_row.data();
    op.batch.page_tables = tables.data();
    op.batch.table_offset = table_offset.data();
    op.batch.tokens = T;
    for (int r = 0; r < s.ranks; ++r) {
      for (int64_t t = 0; t < T; ++t) {
        std::vector<float> kk(kvh * s.hd), vv(kvh * s.hd);
        for (auto& x : kk) x = 2.0f * nd(g);
        for (auto& x : vv) x = nd(g);
        KernelStatus st;
        KvWriteToken(views[r], RowTable(op.batch, t), positions[t], kk.data(), vv.data(), t, &st);
        EXPECT_FALSE(st.fired);
      }
    }
    q.resize(static_cast<size_t>(s.ranks * T * s.heads * s.hd));
    for (auto& x : q) x = nd(g);
    out.assign(q.size(), -7.0f);
    int max_len = 0;
    for (int p : s.prompt) max_len = std::max(max_len, p);
    op.views = views.data();
    op.q = q.data();
    op.out = out.data();
    op.backend = 0;
    op.ranks = s.ranks;
    op.heads = s.heads;
    op.group = s.group;
    op.head_dim = s.hd;
    op.max_len = max_len;
    op.scale = 1.0f / std::sqrt(static_cast<float>(s.hd));
  }

  // The work items, one by one (what the executor runs without a fast path).
  std::vector<float> Reference(KernelStatus* first) { return WorkItems(op, out, first); }
  std::vector<float> Fast(CpuIsa isa, int threads, bool* ran) {
    return Launched(op, out, isa, threads, ran, LaunchAttentionFast);
  }
};

std::string Describe(const Shape& s) {
  std::string p;
  for (int n : s.prompt) p += std::to_string(n) + ",";
  return "ranks " + std::to_string(s.ranks) + " heads " + std::to_string(s.heads) + " group " +
         std::to_string(s.group) + " hd " + std::to_string(s.hd) + " page " + std::to_string(s.page_size) +
         (s.fp8 ? " fp8" : " bf16") + " prompts " + p;
}

// Bit for bit, except that a NaN matches any NaN: where two NaNs meet, x86
// returns the first operand's and the compiler may commute a * b or a + b,
// so the sign and payload are not fixed by the source (cpu_kernels_test's
// FirstDiff, same reason). -0 and infinities must match.
void ExpectBitsEqual(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  int64_t bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i) {
    if (std::isnan(got[i]) && std::isnan(want[i])) continue;
    if (std::memcmp(&got[i], &want[i], 4) != 0) {
      ADD_FAILURE() << what << " element " << i << ": " << got[i] << " != " << want[i];
      ++bad;
    }
  }
}

TEST(CpuAttention, MatchesTheWorkItemsBitForBit) {
  std::vector<Shape> shapes;
  auto add = [&](int ranks, int heads, int group, int hd, int ps, bool fp8, std::vector<int> prompt) {
    Shape s;
    s.ranks = ranks, s.heads = heads, s.group = group, s.hd = hd, s.page_size = ps, s.fp8 = fp8;
    s.prompt = std::move(prompt);
    shapes.push_back(s);
  };
  add(1, 4, 2, 64, 16, false, {37});
  add(1, 4, 2, 64, 16, true, {37});
  add(2, 6, 3, 8, 1, false, {1, 9, 20});  // page size 1, the narrowest head
  add(1, 2, 1, 136, 64, false, {70, 3});  // 17 lane groups: a partial block of output vectors
  add(2, 8, 8, 24, 5, true, {130});       // one KV head for all (MQA), odd pages
  for (const Shape& s : shapes) {
    Case c(s, 7);
    KernelStatus first;
    const std::vector<float> want = c.Reference(&first);
    ASSERT_FALSE(first.fired) << Describe(s);
    for (CpuIsa isa : Isas()) {
      for (int threads : {1, 2, 3}) {
        bool ran = false;
        const std::vector<float> got = c.Fast(isa, threads, &ran);
        ASSERT_TRUE(ran) << Describe(s);
        ExpectBitsEqual(got, want, Describe(s) + " isa " + CpuIsaName(isa) + " threads " + std::to_string(threads));
      }
    }
  }
}

TEST(CpuAttention, GptOssWindowAndSinksMatchTheWorkItemsBitForBit) {
  // gpt_oss's sliding window (windows starting mid-page, of one position, and
  // wider than every prompt) and per-head sinks (none, small, dominant), on
  // two ranks so that each rank reads its own heads' sinks.
  Shape s;
  s.ranks = 2, s.heads = 4, s.group = 2, s.hd = 16, s.page_size = 5;
  s.prompt = {1, 9, 37};
  for (int64_t window : {0, 1, 7, 100}) {
    for (float scale_sinks : {0.0f, 1.0f, 40.0f}) {
      Case c(s, 11);
      std::vector<float> sinks(s.ranks * s.heads);
      for (size_t i = 0; i < sinks.size(); ++i) sinks[i] = scale_sinks * (0.3f * float(i) - 1.0f);
      c.op.window = window;
      c.op.sinks = scale_sinks == 0.0f ? nullptr : sinks.data();
      const std::string what =
          Describe(s) + " window " + std::to_string(window) + " sinks x" + std::to_string(scale_sinks);
      KernelStatus first;
      const std::vector<float> want = c.Reference(&first);
      ASSERT_FALSE(first.fired) << what;
      for (CpuIsa isa : Isas()) {
        for (int threads : {1, 3}) {
          bool ran = false;
          const std::vector<float> got = c.Fast(isa, threads, &ran);
          ASSERT_TRUE(ran) << what;
          ExpectBitsEqual(got, want, what + " isa " + CpuIsaName(isa) + " threads " + std::to_string(threads));
        }
      }
    }
  }
}

TEST(CpuAttention, NonFiniteQueriesGiveTheWorkItemsNaNsAndInfinities) {
  Shape s;
  s.prompt = {12, 30};
  Case c(s, 3);
  c.q[5] = NAN;                             // token 0, head 0
  c.q[2 * s.heads * s.hd + 70] = INFINITY;  // token 2, head 1: scores +-inf
  c.q[20 * s.heads * s.hd + 3] = -INFINITY;
  c.q[31 * s.heads * s.hd] = 1e30f;         // large but finite: exp underflows to 0 but for the maximum
  KernelStatus first;
  const std::vector<float> want = c.Reference(&first);
  ASSERT_FALSE(first.fired);
  int64_t nonfinite = 0;
  for (float x : want) nonfinite += !std::isfinite(x);
  EXPECT_GT(nonfinite, 0);
  for (CpuIsa isa : Isas()) {
    bool ran = false;
    ExpectBitsEqual(c.Fast(isa, 2, &ran), want, CpuIsaName(isa));
    EXPECT_TRUE(ran);
  }
}

TEST(CpuAttention, LeavesWhatItDoesNotCoverToTheWorkItems) {
  for (CpuIsa isa : Isas()) {
    {  // head_dim not a multiple of 8
      Shape s;
      s.hd = 12;
      s.prompt = {10};
      Case c(s, 1);
      bool ran = true;
      const std::vector<float> got = c.Fast(isa, 2, &ran);
      EXPECT_FALSE(ran);
      for (float x : got) ASSERT_EQ(x, -7.0f) << "wrote output it did not cover";
    }
    {  // another backend
      Shape s;
      s.prompt = {10};
      Case c(s, 1);
      c.op.backend = 1;
      bool ran = true;
      c.Fast(isa, 1, &ran);
      EXPECT_FALSE(ran);
    }
    {  // the second request's second page is outside the pool: the work
       // items report it; the launcher writes nothing
      Shape s;
      s.prompt = {5, 40};
      Case c(s, 1);
      c.tables[c.table_offset[1] + 1] = 99;
      KernelStatus first;
      c.Reference(&first);
      ASSERT_TRUE(first.fired);
      EXPECT_EQ(first.check, Check::kPageInPool);
      EXPECT_EQ(first.index, 99);
      bool ran = true;
      const std::vector<float> got = c.Fast(isa, 2, &ran);
      EXPECT_FALSE(ran);
      for (float x : got) ASSERT_EQ(x, -7.0f);
    }
    {  // a position past the row's table
      Shape s;
      s.prompt = {20};
      Case c(s, 1);
      c.positions[19] = 40;
      KernelStatus first;
      c.Reference(&first);
      ASSERT_TRUE(first.fired);
      EXPECT_EQ(first.check, Check::kPositionInTable);
      bool ran = true;
      c.Fast(isa, 1, &ran);
      EXPECT_FALSE(ran);
    }
  }
}

// An expanded MLA attention over two requests (row_begin), `ranks` ranks,
// dense (causal) or over top-k ids with padding.
struct MlaCase {
  int64_t ranks = 2, heads = 3, nope = 16, rope = 8, v_dim = 24, topk_width = 0;
  std::vector<int32_t> positions, token_row, row_begin, topk;
  std::vector<float> q, kv, rot, out;
  MlaAttentionOp op;

  MlaCase(std::vector<int> prompt, int64_t nope_, int64_t topk_width_, uint32_t seed)
      : nope(nope_), topk_width(topk_width_) {
    std::mt19937 g(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    int64_t n = 0;
    for (size_t r = 0; r < prompt.size(); ++r) {
      row_begin.push_back(static_cast<int32_t>(n));
      for (int j = 0; j < prompt[r]; ++j) {
        positions.push_back(j);
        token_row.push_back(static_cast<int32_t>(r));
      }
      n += prompt[r];
    }
    const int64_t T = static_cast<int64_t>(positions.size());
    q.resize(ranks * T * heads * (nope + rope));
    kv.resize(ranks * n * heads * (nope + v_dim));
    rot.resize(ranks * n * rope);
    for (auto* v : {&q, &kv, &rot}) {
      for (auto& x : *v) x = nd(g);
    }
    if (topk_width > 0) {
      for (int64_t rt = 0; rt < ranks * T; ++rt) {
        const int64_t len = positions[rt % T] + 1;
        for (int64_t i = 0; i < topk_width; ++i) {
          // Descending positions, padding (-1) once the sequence runs out, one
          // repeated position.
          const int64_t j = len - 1 - i;
          topk.push_back(j >= 0 ? static_cast<int32_t>(i == 3 ? len - 1 : j) : -1);
        }
      }
    }
    out.assign(ranks * T * heads * v_dim, -7.0f);
    op.q = q.data();
    op.kv = kv.data();
    op.rot = rot.data();
    op.row_begin = row_begin.data();
    op.topk = topk_width > 0 ? topk.data() : nullptr;
    op.out = out.data();
    op.batch.positions = positions.data();
    op.batch.token_row = token_row.data();
    op.batch.tokens = T;
    op.ranks = ranks;
    op.n = n;
    op.heads = heads;
    op.nope = nope;
    op.rope = rope;
    op.v_dim = v_dim;
    op.topk_width = topk_width;
    int max_len = 0;
    for (int p : prompt) max_len = std::max(max_len, p);
    op.max_len = max_len;
    op.scale = 0.125f;
  }

  std::vector<float> Reference(KernelStatus* first) { return WorkItems(op, out, first); }
  std::vector<float> Fast(CpuIsa isa, int threads, bool* ran) {
    return Launched(op, out, isa, threads, ran, LaunchMlaAttentionFast);
  }
};

TEST(CpuAttention, ExpandedMlaMatchesTheWorkItemsDenseAndOverTopK) {
  for (int64_t width : {0, 5, 16}) {
    for (int64_t nope : {16, 0}) {
      MlaCase c({9, 20}, nope, width, 4);
      c.q[3] = NAN;  // one head of token 0 of rank 0
      KernelStatus first;
      const std::vector<float> want = c.Reference(&first);
      ASSERT_FALSE(first.fired);
      for (CpuIsa isa : Isas()) {
        for (int threads : {1, 3}) {
          bool ran = false;
          const std::vector<float> got = c.Fast(isa, threads, &ran);
          ASSERT_TRUE(ran);
          ExpectBitsEqual(got, want,
                          "width " + std::to_string(width) + " nope " + std::to_string(nope) + " " + CpuIsaName(isa) +
                              " threads " + std::to_string(threads));
        }
      }
    }
  }
}

TEST(CpuAttention, ExpandedMlaLeavesBadIndicesAndOddWidthsToTheWorkItems) {
  for (CpuIsa isa : Isas()) {
    {  // a top-k index past its token's sequence
      MlaCase c({9, 20}, 16, 8, 4);
      c.topk[5 * 8 + 2] = 7;  // token 5 sees positions 0..5
      KernelStatus first;
      c.Reference(&first);
      ASSERT_TRUE(first.fired);
      EXPECT_EQ(first.check, Check::kTopkIndexInSequence);
      EXPECT_EQ(first.index, 7);
      bool ran = true;
      const std::vector<float> got = c.Fast(isa, 2, &ran);
      EXPECT_FALSE(ran);
      for (float x : got) ASSERT_EQ(x, -7.0f);
    }
    {  // nope not a multiple of 8
      MlaCase c({9}, 12, 0, 4);
      bool ran = true;
      c.Fast(isa, 1, &ran);
      EXPECT_FALSE(ran);
    }
  }
}

// kv_b_proj of one rank in a storage format, with its bytes.
struct KvB {
  std::vector<uint8_t> data, scales;
  LinearShardView view;
};

KvB MakeKvB(WFormat f, SFormat sf, int64_t rows, int64_t cols, int block_rows, int block_cols, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  KvB k;
  const int64_t elem = f == WFormat::kF32 ? 4 : f == WFormat::kBF16 || f == WFormat::kF16 ? 2 : 1;
  k.data.resize(f == WFormat::kE2m1 ? rows * cols / 2 : rows * cols * elem);
  if (f == WFormat::kBF16) {
    for (int64_t i = 0; i < rows * cols; ++i) {
      const uint16_t b = FloatToBf16(nd(g));
      std::memcpy(k.data.data() + 2 * i, &b, 2);
    }
  } else {
    for (auto& b : k.data) b = static_cast<uint8_t>(byte(g));  // every code, NaNs among them
  }
  QWeight& w = k.view.w;
  w.format = f;
  w.scale_format = sf;
  w.rows = rows;
  w.cols = cols;
  if (sf != SFormat::kNone) {
    w.block_rows = block_rows;
    w.block_cols = block_cols;
    w.scale_cols = (cols + block_cols - 1) / block_cols;
    const int64_t n = (rows + block_rows - 1) / block_rows * w.scale_cols;
    if (sf == SFormat::kF32) {
      k.scales.resize(n * 4);
      for (int64_t i = 0; i < n; ++i) {
        const float v = std::ldexp(1.0f + 0.25f * (i % 3), static_cast<int>(i % 5) - 2);
        std::memcpy(k.scales.data() + 4 * i, &v, 4);
      }
    } else {
      k.scales.resize(n);
      for (int64_t i = 0; i < n; ++i) k.scales[i] = static_cast<uint8_t>(0x30 + (i * 7) % 0x30);  // e4m3, finite
    }
    w.global_scale = sf == SFormat::kE4m3 ? 0.37f : 1.0f;
  }
  w.data = k.data.data();
  w.scales = k.scales.empty() ? nullptr : k.scales.data();
  return k;
}

TEST(CpuAttention, AbsorbedQueryMatchesTheWorkItemsForEveryKvBFormat) {
  const int64_t ranks = 2, tokens = 3, heads = 4, nope = 12, rope = 8, v_dim = 8, kv_lora = 48;
  struct Fmt {
    WFormat f;
    SFormat sf;
    int br, bc;
  };
  const Fmt fmts[] = {{WFormat::kBF16, SFormat::kNone, 1, 1},
                      {WFormat::kF32, SFormat::kNone, 1, 1},
                      {WFormat::kE4m3, SFormat::kF32, 4, 16},
                      {WFormat::kE2m1, SFormat::kE4m3, 1, 16},
                      {WFormat::kE4m3, SFormat::kF32, 2, 4}};  // blocks narrower than 8 columns: not covered
  for (const Fmt& fm : fmts) {
    std::vector<KvB> kvb;
    std::vector<LinearShardView> views;
    for (int64_t r = 0; r < ranks; ++r) {
      kvb.push_back(MakeKvB(fm.f, fm.sf, heads * (nope + v_dim), kv_lora, fm.br, fm.bc, 11 + r));
    }
    for (auto& k : kvb) views.push_back(k.view);
    std::mt19937 g(2);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> q(ranks * tokens * heads * (nope + rope));
    for (auto& x : q) x = nd(g);
    q[5] = INFINITY;
    MlaQAbsorbOp op;
    op.kv_b = views.data();
    op.q = q.data();
    op.ranks = ranks;
    op.tokens = tokens;
    op.heads = heads;
    op.nope = nope;
    op.rope = rope;
    op.v_dim = v_dim;
    op.kv_lora = kv_lora;
    std::vector<float> want(ranks * tokens * heads * (kv_lora + rope), -7.0f), got(want.size(), -7.0f);
    op.q576 = want.data();
    for (int64_t i = 0; i < Items(op); ++i) {
      KernelStatus st;
      RunItem(op, i, nullptr, &st);
    }
    const bool covered = fm.sf == SFormat::kNone || fm.bc % 8 == 0;
    for (CpuIsa isa : Isas()) {
      std::fill(got.begin(), got.end(), -7.0f);
      op.q576 = got.data();
      CpuPool pool(2);
      KernelStatus st;
      const bool ran = LaunchMlaQAbsorbFast(op, pool, isa, &st);
      EXPECT_EQ(ran, covered) << static_cast<int>(fm.f);
      EXPECT_FALSE(st.fired);
      if (covered) {
        ExpectBitsEqual(got, want,
                        std::string("format ") + std::to_string(static_cast<int>(fm.f)) + " " + CpuIsaName(isa));
      } else {
        for (float x : got) ASSERT_EQ(x, -7.0f);
      }
    }
  }
}

// DSA decode's sparse latent attention: `ranks` latent pools holding two
// requests' tokens, one query token per request, top-k ids with padding and
// a repeat.
struct LatentCase {
  int64_t ranks = 2, heads = 3, kv_lora = 24, rope = 8, width = 12;
  int32_t page_size = 4;
  std::vector<std::vector<uint8_t>> pools;
  std::vector<LatentPoolView> views;
  std::vector<int32_t> positions, token_row, tables, topk;
  std::vector<int64_t> table_offset;
  std::vector<float> q576, out;
  LatentAttentionOp op;

  LatentCase(bool fp8, uint32_t seed) {
    std::mt19937 g(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const std::vector<int> lens = {7, 19};
    int64_t pages = 0;
    table_offset.push_back(0);
    for (size_t r = 0; r < lens.size(); ++r) {
      const int need = (lens[r] + page_size - 1) / page_size;
      for (int p = 0; p < need; ++p) tables.push_back(static_cast<int32_t>(pages + need - 1 - p));
      pages += need;
      table_offset.push_back(static_cast<int64_t>(tables.size()));
      positions.push_back(lens[r] - 1);  // the decode token
      token_row.push_back(static_cast<int32_t>(r));
    }
    op.batch.positions = positions.data();
    op.batch.token_row = token_row.data();
    op.batch.page_tables = tables.data();
    op.batch.table_offset = table_offset.data();
    op.batch.tokens = static_cast<int64_t>(positions.size());
    const int32_t tb = LatentTokenBytes(fp8, static_cast<int32_t>(kv_lora), static_cast<int32_t>(rope));
    for (int64_t r = 0; r < ranks; ++r) {
      pools.emplace_back(static_cast<size_t>(pages * page_size * tb));
      LatentPoolView v;
      v.data = pools.back().data();
      v.fp8 = fp8;
      v.pages = pages;
      v.page_size = page_size;
      v.kv_lora = static_cast<int32_t>(kv_lora);
      v.rope = static_cast<int32_t>(rope);
      v.token_bytes = tb;
      views.push_back(v);
      for (size_t req = 0; req < lens.size(); ++req) {
        for (int j = 0; j < lens[req]; ++j) {
          std::vector<float> c(kv_lora), rot(rope);
          for (auto& x : c) x = nd(g);
          for (auto& x : rot) x = nd(g);
          KernelStatus st;
          LatentWriteToken(views.back(), RowTableOf(op.batch, static_cast<int64_t>(req)), j, c.data(), rot.data(), 0,
                           &st);
          EXPECT_FALSE(st.fired);
        }
      }
    }
    const int64_t T = op.batch.tokens;
    for (int64_t rt = 0; rt < ranks * T; ++rt) {
      const int32_t len = positions[rt % T] + 1;
      for (int64_t i = 0; i < width; ++i) {
        const int32_t j = len - 1 - static_cast<int32_t>(i);
        topk.push_back(j >= 0 ? (i == 2 ? len - 1 : j) : -1);
      }
    }
    q576.resize(ranks * T * heads * (kv_lora + rope));
    for (auto& x : q576) x = nd(g);
    out.assign(ranks * T * heads * kv_lora, -7.0f);
    op.views = views.data();
    op.q576 = q576.data();
    op.topk = topk.data();
    op.out = out.data();
    op.variant = static_cast<int32_t>(LatentAttention::kSparseReference);
    op.ranks = ranks;
    op.heads = heads;
    op.kv_lora = kv_lora;
    op.rope = rope;
    op.topk_width = width;
    op.max_len = 19;
    op.scale = 0.3f;
  }

  std::vector<float> Reference(KernelStatus* first) { return WorkItems(op, out, first); }
  std::vector<float> Fast(CpuIsa isa, int threads, bool* ran) {
    return Launched(op, out, isa, threads, ran, LaunchLatentAttentionFast);
  }
};

TEST(CpuAttention, SparseLatentAttentionMatchesTheWorkItems) {
  for (bool fp8 : {false, true}) {
    LatentCase c(fp8, 5);
    c.q576[4] = NAN;
    KernelStatus first;
    const std::vector<float> want = c.Reference(&first);
    ASSERT_FALSE(first.fired);
    for (CpuIsa isa : Isas()) {
      for (int threads : {1, 2, 3}) {
        bool ran = false;
        const std::vector<float> got = c.Fast(isa, threads, &ran);
        ASSERT_TRUE(ran);
        ExpectBitsEqual(got, want,
                        std::string(fp8 ? "fp8 " : "bf16 ") + CpuIsaName(isa) + " threads " + std::to_string(threads));
      }
    }
  }
}

TEST(CpuAttention, SparseLatentAttentionLeavesBadIndicesAndOtherVariantsToTheWorkItems) {
  for (CpuIsa isa : Isas()) {
    {  // an index past the first request's sequence (length 7)
      LatentCase c(false, 5);
      c.topk[1] = 7;
      KernelStatus first;
      c.Reference(&first);
      ASSERT_TRUE(first.fired);
      EXPECT_EQ(first.check, Check::kTopkIndexInSequence);
      bool ran = true;
      const std::vector<float> got = c.Fast(isa, 2, &ran);
      EXPECT_FALSE(ran);
      for (float x : got) ASSERT_EQ(x, -7.0f);
    }
    {  // a page outside the pool
      LatentCase c(false, 5);
      c.tables[0] = 99;
      KernelStatus first;
      c.Reference(&first);
      ASSERT_TRUE(first.fired);
      EXPECT_EQ(first.check, Check::kPageInPool);
      bool ran = true;
      c.Fast(isa, 1, &ran);
      EXPECT_FALSE(ran);
    }
    {  // the tiled (FlashMLA) variant
      LatentCase c(false, 5);
      c.op.variant = static_cast<int32_t>(LatentAttention::kSparseTiled64);
      bool ran = true;
      c.Fast(isa, 1, &ran);
      EXPECT_FALSE(ran);
    }
  }
}

TEST(CpuAttention, ReferenceIsaRunsNothing) {
  Shape s;
  s.prompt = {10};
  Case c(s, 1);
  bool ran = true;
  c.Fast(CpuIsa::kReference, 1, &ran);
  EXPECT_FALSE(ran);
}

}  // namespace
}  // namespace crashreplay::replay
