// MLA and DSA kernel bodies (kernels/mla.h, kernels/indexer.h) against naive
// double-precision formulas, FlashMLA's byte layout, and their checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "crashreplay/replay/kernels/elementwise.h"
#include "crashreplay/replay/kernels/indexer.h"
#include "crashreplay/replay/kernels/mla.h"

namespace crashreplay::replay {
namespace {

std::vector<float> RandomVec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// A latent pool of `pages` pages with an identity page table.
struct Pool {
  Pool(bool fp8, int32_t kv_lora, int32_t rope, int32_t page_size, int64_t pages) {
    v.fp8 = fp8;
    v.kv_lora = kv_lora;
    v.rope = rope;
    v.page_size = page_size;
    v.pages = pages;
    v.token_bytes = LatentTokenBytes(fp8, kv_lora, rope);
    bytes.assign(static_cast<size_t>(pages * page_size * v.token_bytes), 0);
    v.data = bytes.data();
    table.resize(pages);
    std::iota(table.begin(), table.end(), 0);
  }
  PageTableRow row() const { return PageTableRow{table.data(), static_cast<int64_t>(table.size())}; }
  // Writes latents [n, kv_lora + rope] at positions 0..n-1; returns what a
  // read gives back (the stored values).
  std::vector<float> Fill(const std::vector<float>& lat, int64_t n) {
    const int64_t w = v.kv_lora + v.rope;
    KernelStatus st;
    std::vector<float> back(n * w);
    for (int64_t j = 0; j < n; ++j) {
      LatentWriteToken(v, row(), j, lat.data() + j * w, lat.data() + j * w + v.kv_lora, j, &st);
      LatentLoad(v, LatentSlot(v, j / v.page_size, j % v.page_size), back.data() + j * w);
    }
    EXPECT_FALSE(st.fired);
    return back;
  }
  LatentPoolView v;
  std::vector<uint8_t> bytes;
  std::vector<int32_t> table;
};

float Bf16(float x) { return Bf16ToFloat(FloatToBf16(x)); }

TEST(LatentCache, Fp8LayoutIsFlashMlas656BytesAToken) {
  EXPECT_EQ(LatentTokenBytes(true, 512, 64), 656);  // 512 e4m3 + 4 fp32 scales + 64 bf16
  EXPECT_EQ(LatentTokenBytes(false, 512, 64), 1152);
  Pool p(true, 512, 64, 64, 1);
  std::vector<float> lat = RandomVec(576, 3);
  lat[5] = 7.0f;  // tile 0's amax
  p.Fill(lat, 1);
  const uint8_t* t = p.bytes.data();
  float s0;
  std::memcpy(&s0, t + 512, 4);  // the scales follow the 512 fp8 values
  EXPECT_EQ(s0, 7.0f / 448.0f);  // sglang's quantize_k_cache: amax / 448, not rounded
  EXPECT_EQ(t[5], FloatToE4m3(7.0f * (1.0f / s0)));
  uint16_t r0;
  std::memcpy(&r0, t + 528, 2);  // then the rope part, bf16
  EXPECT_EQ(r0, FloatToBf16(lat[512]));
}

TEST(LatentCache, Fp8ReadsBackWithinOneE4m3StepOfEachTile) {
  Pool p(true, 512, 64, 64, 2);
  const int64_t n = 70;
  std::vector<float> lat = RandomVec(n * 576, 4);
  std::vector<float> back = p.Fill(lat, n);
  for (int64_t j = 0; j < n; ++j) {
    for (int t = 0; t < 4; ++t) {
      float amax = 0;
      for (int i = t * 128; i < t * 128 + 128; ++i) amax = std::max(amax, std::abs(lat[j * 576 + i]));
      for (int i = t * 128; i < t * 128 + 128; ++i) {
        // e4m3 has 3 mantissa bits: half a step is 2^-4 relative, at least
        // the subnormal step of the tile's scale; then one bf16 rounding.
        const float x = lat[j * 576 + i], y = back[j * 576 + i];
        EXPECT_NEAR(y, x, std::max(std::abs(x) * 0.0625f, amax / 448.0f * 0.001953125f) * 1.01f + std::abs(x) / 256)
            << j << " " << i;
      }
    }
    for (int i = 512; i < 576; ++i) EXPECT_EQ(back[j * 576 + i], Bf16(lat[j * 576 + i]));
  }
}

TEST(LatentCache, AnAllZeroTileReadsBackNanAsOnTheGpu) {
  // scale = 0, values * (1 / 0) = 0 * inf: the fp8 quantizer's own NaN.
  Pool p(true, 512, 64, 64, 1);
  std::vector<float> lat = RandomVec(576, 5);
  for (int i = 128; i < 256; ++i) lat[i] = 0.0f;
  std::vector<float> back = p.Fill(lat, 1);
  EXPECT_TRUE(std::isnan(back[130]));
  EXPECT_FALSE(std::isnan(back[10]));
}

TEST(LatentCache, WriteChecksThePageTableAndPool) {
  Pool p(false, 32, 16, 4, 2);
  std::vector<float> lat(48, 1.0f);
  KernelStatus st;
  LatentWriteToken(p.v, p.row(), 9, lat.data(), lat.data() + 32, 3, &st);  // logical page 2 of 2
  EXPECT_EQ(st.check, Check::kPositionInTable);
  p.table[1] = 5;
  KernelStatus st2;
  LatentWriteToken(p.v, p.row(), 4, lat.data(), lat.data() + 32, 3, &st2);
  EXPECT_EQ(st2.check, Check::kPageInPool);
  EXPECT_EQ(st2.index, 5);
}

// The MLA attention of one head in double: expand the (stored) latents with
// kv_b, softmax over `ids` (all positions when empty).
std::vector<double> ExpandedRef(const std::vector<float>& q, const std::vector<float>& lat, const std::vector<float>& w,
                                int64_t h, int64_t nope, int64_t rope, int64_t vd, int64_t lora,
                                const std::vector<int>& ids, double scale) {
  const int64_t kw = lora + rope;
  std::vector<double> s, out(vd, 0.0);
  for (int j : ids) {
    double acc = 0;
    for (int64_t d = 0; d < nope; ++d) {
      double k = 0;
      for (int64_t c = 0; c < lora; ++c) k += double(w[(h * (nope + vd) + d) * lora + c]) * lat[j * kw + c];
      acc += double(q[d]) * k;
    }
    for (int64_t d = 0; d < rope; ++d) acc += double(q[nope + d]) * lat[j * kw + lora + d];
    s.push_back(acc * scale);
  }
  const double m = *std::max_element(s.begin(), s.end());
  double sum = 0;
  for (double& x : s) sum += (x = std::exp(x - m));
  for (size_t i = 0; i < ids.size(); ++i) {
    for (int64_t e = 0; e < vd; ++e) {
      double v = 0;
      for (int64_t c = 0; c < lora; ++c) v += double(w[(h * (nope + vd) + nope + e) * lora + c]) * lat[ids[i] * kw + c];
      out[e] += s[i] / sum * v;
    }
  }
  return out;
}

// A small MLA head, in every form: expanded (dense and sparse), absorbed
// reference, and the FlashMLA tiles.
struct MlaCase {
  int64_t heads = 2, nope = 16, rope = 64, vd = 24, lora = 512, n = 100;
  std::vector<float> q, w_f, lat;
  std::vector<uint16_t> w_b;
  QWeight w;
  double scale = 0.07;
  MlaCase() {
    q = RandomVec(nope + rope, 11);
    w_f = RandomVec(heads * (nope + vd) * lora, 12, 1.0f / 16);
    for (float& x : w_f) x = Bf16(x);
    w_b.resize(w_f.size());
    for (size_t i = 0; i < w_f.size(); ++i) w_b[i] = FloatToBf16(w_f[i]);
    w = QWeight{WFormat::kBF16, SFormat::kNone, w_b.data(), heads * (nope + vd), lora, nullptr, 1, 1, 0, 1.0f};
    lat = RandomVec(n * (lora + rope), 13);
  }
  // kv_b expansion of the stored latents, per position (what kv_b_proj writes).
  void Expand(const std::vector<float>& stored, std::vector<float>* kv, std::vector<float>* rot) const {
    kv->assign(n * heads * (nope + vd), 0.0f);
    rot->assign(n * rope, 0.0f);
    KernelStatus st;
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t r = 0; r < heads * (nope + vd); ++r) {
        (*kv)[j * heads * (nope + vd) + r] =
            LinearElement(DotKind::kDequant, w, stored.data() + j * (lora + rope), r, 0, &st);
      }
      for (int64_t d = 0; d < rope; ++d) (*rot)[j * rope + d] = stored[j * (lora + rope) + lora + d];
    }
  }
};

TEST(MlaAttention, ExpandedMatchesTheDoubleFormulaDenseAndSparse) {
  MlaCase c;
  Pool p(false, 512, 64, 64, 2);
  const std::vector<float> stored = p.Fill(c.lat, c.n);
  std::vector<float> kv, rot;
  c.Expand(stored, &kv, &rot);
  std::vector<float> out(c.vd), scratch(c.n);
  KernelStatus st;
  const int64_t h = 1, len = 90;
  MlaAttendExpanded(c.q.data(), kv.data(), rot.data(), c.heads * (c.nope + c.vd), h, c.nope, c.rope, c.vd, len, nullptr,
                    0, static_cast<float>(c.scale), out.data(), scratch.data(), 0, &st);
  ASSERT_FALSE(st.fired);
  std::vector<int> all(len);
  std::iota(all.begin(), all.end(), 0);
  auto ref = ExpandedRef(c.q, stored, c.w_f, h, c.nope, c.rope, c.vd, c.lora, all, c.scale);
  for (int64_t e = 0; e < c.vd; ++e) EXPECT_NEAR(out[e], ref[e], 1e-5 * (1 + std::abs(ref[e])));
  // Sparse: a top-k list in score order with -1 padding.
  const std::vector<int32_t> ids = {7, 88, 3, 40, -1, -1};
  MlaAttendExpanded(c.q.data(), kv.data(), rot.data(), c.heads * (c.nope + c.vd), h, c.nope, c.rope, c.vd, len,
                    ids.data(), 6, static_cast<float>(c.scale), out.data(), scratch.data(), 0, &st);
  ASSERT_FALSE(st.fired);
  ref = ExpandedRef(c.q, stored, c.w_f, h, c.nope, c.rope, c.vd, c.lora, {7, 88, 3, 40}, c.scale);
  for (int64_t e = 0; e < c.vd; ++e) EXPECT_NEAR(out[e], ref[e], 1e-5 * (1 + std::abs(ref[e])));
}

TEST(MlaAttention, ATopKIndexOutsideTheSequenceFires) {
  MlaCase c;
  std::vector<float> kv(c.n * c.heads * (c.nope + c.vd)), rot(c.n * c.rope), out(c.vd), scratch(8);
  const std::vector<int32_t> ids = {2, 90, -1};  // 90 >= len 90
  KernelStatus st;
  MlaAttendExpanded(c.q.data(), kv.data(), rot.data(), c.heads * (c.nope + c.vd), 0, c.nope, c.rope, c.vd, 90,
                    ids.data(), 3, 1.0f, out.data(), scratch.data(), 17, &st);
  EXPECT_EQ(st.check, Check::kTopkIndexInSequence);
  EXPECT_EQ(st.index, 90);
  EXPECT_EQ(st.value, 90.0);
  EXPECT_EQ(st.item, 17);
  EXPECT_STREQ(CheckName(st.check), "topk_index_in_sequence");
}

// q_absorb + latent attention + v_up, as the absorbed decode runs it.
std::vector<float> Absorbed(const MlaCase& c, const Pool& p, LatentAttention variant, int64_t h, int64_t len,
                            const std::vector<int32_t>& ids, KernelStatus* st, int64_t heads = 2) {
  std::vector<float> q576(c.lora + c.rope), o(c.lora), out(c.vd);
  MlaQAbsorb(c.w, c.q.data(), h, c.nope, c.rope, c.vd, q576.data());
  std::vector<float> scratch(LatentScratchFloats(c.lora, c.rope, std::max<int64_t>(len, ids.size())));
  MlaAttendLatent(variant, p.v, p.row(), q576.data(), len, ids.empty() ? nullptr : ids.data(),
                  static_cast<int64_t>(ids.size()), heads, static_cast<float>(c.scale), o.data(), scratch.data(), 0,
                  st);
  for (int64_t e = 0; e < c.vd; ++e) {
    out[e] = LinearElement(DotKind::kDequant, c.w, o.data(), h * (c.nope + c.vd) + c.nope + e, 0, st);
  }
  return out;
}

TEST(MlaAttention, AbsorbedAgreesWithExpandedWithinToleranceAndDiffersInBits) {
  MlaCase c;
  Pool p(false, 512, 64, 64, 2);
  const std::vector<float> stored = p.Fill(c.lat, c.n);
  const int64_t h = 0, len = c.n;
  std::vector<int> all(len);
  std::iota(all.begin(), all.end(), 0);
  const auto ref = ExpandedRef(c.q, stored, c.w_f, h, c.nope, c.rope, c.vd, c.lora, all, c.scale);
  std::vector<float> kv, rot, naive(c.vd), scratch(c.n);
  c.Expand(stored, &kv, &rot);
  KernelStatus st;
  MlaAttendExpanded(c.q.data(), kv.data(), rot.data(), c.heads * (c.nope + c.vd), h, c.nope, c.rope, c.vd, len, nullptr,
                    0, static_cast<float>(c.scale), naive.data(), scratch.data(), 0, &st);
  std::vector<int32_t> ids(len);
  std::iota(ids.begin(), ids.end(), 0);
  const auto sparse_ref = Absorbed(c, p, LatentAttention::kSparseReference, h, len, ids, &st);
  const auto paged = Absorbed(c, p, LatentAttention::kPaged64, h, len, {}, &st);
  ids.resize(128, -1);  // FlashMLA's top-k width: whole tiles, padded
  const auto tiled = Absorbed(c, p, LatentAttention::kSparseTiled64, h, len, ids, &st);
  ASSERT_FALSE(st.fired) << CheckName(st.check);
  double worst_ref = 0, worst_paged = 0, worst_tiled = 0, scale = 0;
  bool differs = false;
  for (int64_t e = 0; e < c.vd; ++e) {
    scale = std::max(scale, std::abs(ref[e]));
    worst_ref = std::max(worst_ref, std::abs(sparse_ref[e] - ref[e]));
    worst_paged = std::max(worst_paged, std::abs(paged[e] - ref[e]));
    worst_tiled = std::max(worst_tiled, std::abs(tiled[e] - ref[e]));
    differs |= sparse_ref[e] != naive[e] || paged[e] != naive[e];
    EXPECT_EQ(tiled[e], paged[e]);  // same tiles over the same positions
  }
  // fp32 absorbed vs double: reassociated sums only. The FlashMLA tiles
  // round q, P and the output to bf16 (2^-8 relative each).
  EXPECT_LT(worst_ref, 1e-5 * scale);
  EXPECT_LT(worst_paged, 1.5e-2 * scale);
  EXPECT_GT(worst_paged, worst_ref);
  EXPECT_TRUE(differs);
}

TEST(MlaAttention, FlashMlaPreconditionsAreChecks) {
  MlaCase c;
  {
    Pool p(false, 512, 64, 16, 8);  // pages of 16
    p.Fill(c.lat, 20);
    KernelStatus st;
    Absorbed(c, p, LatentAttention::kPaged64, 0, 20, {}, &st);
    EXPECT_EQ(st.check, Check::kPageSizeIs64);
    EXPECT_EQ(st.index, 16);
  }
  {
    MlaCase s;
    s.lora = 256;  // 256 + 64 = 320 wide
    s.w.cols = 256;
    Pool p(false, 256, 64, 64, 1);
    KernelStatus st;
    std::vector<float> q576(320), o(256), scratch(LatentScratchFloats(256, 64, 64));
    MlaAttendLatent(LatentAttention::kPaged64, p.v, p.row(), q576.data(), 10, nullptr, 0, 2, 1.0f, o.data(),
                    scratch.data(), 0, &st);
    EXPECT_EQ(st.check, Check::kMlaHeadDim576);
    EXPECT_EQ(st.index, 320);
    Pool p2(false, 256, 320, 64, 1);  // 576 wide, but v 256
    KernelStatus st2;
    MlaAttendLatent(LatentAttention::kSparseTiled64, p2.v, p2.row(), q576.data(), 10, nullptr, 64, 2, 1.0f, o.data(),
                    scratch.data(), 0, &st2);
    EXPECT_EQ(st2.check, Check::kMlaVHeadDim512);
  }
  {
    Pool p(true, 512, 64, 64, 2);
    p.Fill(c.lat, 40);
    std::vector<int32_t> ids(48, -1);
    ids[0] = 3;
    KernelStatus st;
    Absorbed(c, p, LatentAttention::kSparseTiled64, 0, 40, ids, &st);
    EXPECT_EQ(st.check, Check::kTopkMultipleOf64);
    EXPECT_EQ(st.index, 48);
    ids.resize(64, -1);
    KernelStatus st2;
    Absorbed(c, p, LatentAttention::kSparseTiled64, 0, 40, ids, &st2, /*heads=*/160);
    EXPECT_EQ(st2.check, Check::kSparseMlaHeads);
    EXPECT_EQ(st2.index, 160);
    KernelStatus st3;
    ids[5] = 40;  // position 40 of a 40-token sequence
    Absorbed(c, p, LatentAttention::kSparseTiled64, 0, 40, ids, &st3);
    EXPECT_EQ(st3.check, Check::kTopkIndexInSequence);
  }
}

TEST(MlaAttention, Fp8LatentAttentionStaysCloseToBf16) {
  MlaCase c;
  Pool pb(false, 512, 64, 64, 2), pf(true, 512, 64, 64, 2);
  pb.Fill(c.lat, c.n);
  pf.Fill(c.lat, c.n);
  std::vector<int32_t> ids(128, -1);
  std::iota(ids.begin(), ids.begin() + c.n, 0);
  KernelStatus st;
  const auto b = Absorbed(c, pb, LatentAttention::kSparseTiled64, 1, c.n, ids, &st);
  const auto f = Absorbed(c, pf, LatentAttention::kSparseTiled64, 1, c.n, ids, &st);
  ASSERT_FALSE(st.fired);
  double diff = 0, norm = 0;
  for (int64_t e = 0; e < c.vd; ++e) {
    diff += (b[e] - f[e]) * (b[e] - f[e]);
    norm += b[e] * b[e];
  }
  EXPECT_GT(diff, 0.0);
  EXPECT_LT(std::sqrt(diff / norm), 0.1);  // e4m3 latents: ~2^-5 relative noise
}

TEST(Rope, InterleavedPairsRotateAdjacentValues) {
  std::vector<float> x = RandomVec(8, 21), inv = {1.0f, 0.1f, 0.01f, 0.001f};
  const std::vector<float> x0 = x;
  RopeHeadInterleaved(x.data(), 8, 5, inv.data(), 1.0f);
  for (int i = 0; i < 4; ++i) {
    const double a = 5.0 * inv[i];
    EXPECT_NEAR(x[2 * i], x0[2 * i] * std::cos(a) - x0[2 * i + 1] * std::sin(a), 1e-6);
    EXPECT_NEAR(x[2 * i + 1], x0[2 * i + 1] * std::cos(a) + x0[2 * i] * std::sin(a), 1e-6);
  }
}

TEST(Indexer, LayerNormMatchesTheDoubleFormula) {
  const auto x = RandomVec(37, 31, 3.0f), w = RandomVec(37, 32), b = RandomVec(37, 33);
  std::vector<float> out(37);
  LayerNormRow(x.data(), w.data(), b.data(), 37, 1e-6f, out.data());
  double mean = 0, var = 0;
  for (float v : x) mean += v;
  mean /= 37;
  for (float v : x) var += (v - mean) * (v - mean);
  var /= 37;
  for (int i = 0; i < 37; ++i) EXPECT_NEAR(out[i], (x[i] - mean) / std::sqrt(var + 1e-6) * w[i] + b[i], 1e-5);
}

TEST(Indexer, HadamardIsOrthogonalSoDotProductsSurvive) {
  auto a = RandomVec(64, 41), b = RandomVec(64, 42);
  double dot = 0;
  for (int i = 0; i < 64; ++i) dot += double(a[i]) * b[i];
  HadamardBf16(a.data(), 64);
  HadamardBf16(b.data(), 64);
  double rot = 0;
  for (int i = 0; i < 64; ++i) rot += double(a[i]) * b[i];
  EXPECT_NEAR(rot, dot, 0.02 * (1 + std::abs(dot)));  // bf16 rounding of the rotated values only
  std::vector<float> e(8, 0.0f);
  e[0] = 1.0f;
  HadamardBf16(e.data(), 8);  // first column of H8 / sqrt(8)
  for (float v : e) EXPECT_EQ(v, Bf16(1.0f / std::sqrt(8.0f)));
}

struct IndexPool {
  IndexPool(bool fp8, int32_t dim, int32_t page_size, int64_t pages) {
    v.fp8 = fp8;
    v.dim = dim;
    v.page_size = page_size;
    v.pages = pages;
    bytes.assign(static_cast<size_t>(pages * IndexPageBytes(fp8, page_size, dim)), 0);
    v.data = bytes.data();
    table.resize(pages);
    std::iota(table.begin(), table.end(), 0);
  }
  PageTableRow row() const { return PageTableRow{table.data(), static_cast<int64_t>(table.size())}; }
  IndexPoolView v;
  std::vector<uint8_t> bytes;
  std::vector<int32_t> table;
};

TEST(Indexer, Bf16ScoresAndTopKMatchTheDoubleFormula) {
  const int32_t dim = 32, heads = 4, n = 40, topk = 8;
  IndexPool p(false, dim, 16, 3);
  const auto keys = RandomVec(n * dim, 51), q = RandomVec(heads * dim, 52), w = RandomVec(heads, 53);
  std::vector<float> tmp(dim);
  KernelStatus st;
  for (int j = 0; j < n; ++j) IndexKWriteToken(p.v, p.row(), j, keys.data() + j * dim, tmp.data(), j, &st);
  std::vector<int32_t> ids(topk + 4);
  std::vector<float> scratch(IndexerScratchFloats(n, heads, dim, topk + 4));
  const int64_t pos = n - 1;
  IndexerTopK(p.v, p.row(), pos, q.data(), w.data(), heads, topk + 4, ids.data(), scratch.data(), 0, &st);
  ASSERT_FALSE(st.fired);
  std::vector<std::pair<double, int>> ref;
  for (int j = 0; j <= pos; ++j) {
    double s = 0;
    for (int h = 0; h < heads; ++h) {
      double d = 0;
      for (int i = 0; i < dim; ++i) d += double(q[h * dim + i]) * Bf16(keys[j * dim + i]);
      s += w[h] / std::sqrt(double(heads)) * std::max(0.0, d / std::sqrt(double(dim)));
    }
    ref.push_back({s, j});
  }
  std::sort(ref.begin(), ref.end(), [](auto a, auto b) { return a.first > b.first; });
  for (int i = 0; i < topk + 4; ++i) EXPECT_EQ(ids[i], ref[i].second) << i;
  // A shorter sequence pads with -1.
  IndexerTopK(p.v, p.row(), 2, q.data(), w.data(), heads, topk, ids.data(), scratch.data(), 0, &st);
  EXPECT_EQ(ids[3], -1);
  EXPECT_EQ(ids[7], -1);
  EXPECT_NE(ids[2], -1);
}

TEST(Indexer, TiesGoToTheLowerPositionAndNanRanksFirst) {
  EXPECT_TRUE(IndexBetter(1.0f, 5, 1.0f, 7));
  EXPECT_FALSE(IndexBetter(1.0f, 7, 1.0f, 5));
  EXPECT_TRUE(IndexBetter(NAN, 9, INFINITY, 0));
  EXPECT_TRUE(IndexBetter(2.0f, 9, 1.0f, 0));
  // All-zero keys: every score is 0, so the top-k is the first k positions.
  const int32_t dim = 16, heads = 2;
  IndexPool p(false, dim, 8, 2);
  std::vector<float> zero(dim, 0.0f), tmp(dim), q = RandomVec(heads * dim, 61), w(heads, 1.0f);
  KernelStatus st;
  for (int j = 0; j < 12; ++j) IndexKWriteToken(p.v, p.row(), j, zero.data(), tmp.data(), j, &st);
  std::vector<int32_t> ids(4);
  std::vector<float> scratch(IndexerScratchFloats(12, heads, dim, 4));
  IndexerTopK(p.v, p.row(), 11, q.data(), w.data(), heads, 4, ids.data(), scratch.data(), 0, &st);
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST(Indexer, Fp8KeysAreHadamardRotatedE4m3WithPowerOfTwoScales) {
  const int32_t dim = 64, heads = 3, n = 20;
  IndexPool p(true, dim, 8, 3);
  EXPECT_EQ(IndexPageBytes(true, 64, 128), 64 * 132);  // sglang's page: values, then fp32 scales
  const auto keys = RandomVec(n * dim, 71), q = RandomVec(heads * dim, 72), w = RandomVec(heads, 73);
  std::vector<float> tmp(dim);
  KernelStatus st;
  for (int j = 0; j < n; ++j) IndexKWriteToken(p.v, p.row(), j, keys.data() + j * dim, tmp.data(), j, &st);
  ASSERT_FALSE(st.fired);
  // The stored key: H k / 8 rounded to bf16, amax -> ue8m0 scale, e4m3.
  std::vector<float> hk(keys.begin() + 3 * dim, keys.begin() + 4 * dim), k8(dim);
  HadamardBf16(hk.data(), dim);
  float amax = 0;
  for (float v : hk) amax = std::max(amax, std::abs(v));
  const float s = std::exp2(std::ceil(std::log2(amax / 448.0f)));
  const float got = IndexKLoad(p.v, 0, 3, k8.data());
  EXPECT_EQ(got, s);
  for (int i = 0; i < dim; ++i) EXPECT_EQ(k8[i], E4m3ToFloat(FloatToE4m3(hk[i] / s)));
  // Scores: k_s * sum_h relu(q8 . k8) * w_h * q_s / sqrt(heads * dim), in double
  // over the same quantized values.
  std::vector<int32_t> ids(n);
  std::vector<float> scratch(IndexerScratchFloats(n, heads, dim, n));
  IndexerTopK(p.v, p.row(), n - 1, q.data(), w.data(), heads, n, ids.data(), scratch.data(), 0, &st);
  std::vector<std::pair<double, int>> ref;
  for (int j = 0; j < n; ++j) {
    std::vector<float> kj(dim);
    const double ks = IndexKLoad(p.v, j / 8, j % 8, kj.data());
    double sum = 0;
    for (int h = 0; h < heads; ++h) {
      std::vector<float> qh(q.begin() + h * dim, q.begin() + (h + 1) * dim), q8(dim);
      HadamardBf16(qh.data(), dim);
      const double qs = IndexActQuant(qh.data(), dim, q8.data());
      double d = 0;
      for (int i = 0; i < dim; ++i) d += double(q8[i]) * kj[i];
      sum += std::max(0.0, d) * w[h] * qs / std::sqrt(double(heads) * dim);
    }
    ref.push_back({sum * ks, j});
  }
  std::stable_sort(ref.begin(), ref.end(), [](auto a, auto b) { return a.first > b.first; });
  for (int i = 0; i < n; ++i) EXPECT_EQ(ids[i], ref[i].second) << i;
}

TEST(Indexer, Fp8NeedsAPowerOfTwoHeadDimOfAtMost128) {
  IndexPool p(true, 48, 8, 1);
  std::vector<float> k(48, 1.0f), tmp(48);
  KernelStatus st;
  IndexKWriteToken(p.v, p.row(), 0, k.data(), tmp.data(), 0, &st);
  EXPECT_EQ(st.check, Check::kIndexHeadDim);
  EXPECT_EQ(st.index, 48);
  EXPECT_STREQ(CheckName(st.check), "index_head_dim_supported");
}

}  // namespace
}  // namespace crashreplay::replay
