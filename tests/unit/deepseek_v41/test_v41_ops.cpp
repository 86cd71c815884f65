// DeepSeek-V4.1's host reference ops on hand-worked values: the cache formats' fake quantization
// (e2m1 / e4m3 round-to-nearest-even, power-of-two and e4m3 block scales), the two-level top-k's
// candidate blocks and the finite top-k, the single-pass hyper-connection pieces.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "backend/backend.h"

namespace deepinfer {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> quantized(std::vector<float> v, Backend::FakeQuant kind) {
  auto be = make_cpu_backend();
  const int64_t block = kind == Backend::FakeQuant::Fp4E4m3x16 ? 16 : 32;
  Tensor t(v.data(), DType::F32, {static_cast<int64_t>(v.size()) / block, block});
  be->fake_quant(t, kind);
  return v;
}

TEST(V41FakeQuant, Fp4WithPowerOfTwoScalesRoundsToNearestEven) {
  // amax 6 -> scale 2^ceil(log2(6 / 6)) = 1: the e2m1 grid itself.
  const std::vector<float> in = {6.0f, 0.25f, 0.75f,  1.25f, 1.75f, 2.5f,
                                 3.5f, 5.0f,  -0.75f, 0.26f, 5.1f,  -2.9f};
  const std::vector<float> want = {6.0f, 0.0f, 1.0f,  1.0f, 2.0f, 2.0f,
                                   4.0f, 4.0f, -1.0f, 0.5f, 6.0f, -3.0f};
  std::vector<float> v(32, 0.0f);
  std::copy(in.begin(), in.end(), v.begin());
  const std::vector<float> q = quantized(v, Backend::FakeQuant::Fp4Ue8m0x32);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(q[i], want[i]) << "input " << in[i];
  // amax 7 -> scale 2^ceil(log2(7 / 6)) = 2: 7 / 2 = 3.5 ties up to 4 -> 8; 1.1 / 2 = 0.55 -> 0.5
  // -> 1.
  std::vector<float> w(32, 0.0f);
  w[0] = 7.0f;
  w[1] = 1.1f;
  const std::vector<float> q2 = quantized(w, Backend::FakeQuant::Fp4Ue8m0x32);
  EXPECT_EQ(q2[0], 8.0f);
  EXPECT_EQ(q2[1], 1.0f);
}

TEST(V41FakeQuant, Fp4WithE4m3ScalesPer16) {
  // amax 3 -> scale e4m3(0.5) = 0.5; 0.4 / 0.5 = 0.8 -> 1 -> 0.5.
  std::vector<float> v(16, 0.0f);
  v[0] = 3.0f;
  v[1] = 0.4f;
  // second block: amax 2.7 -> 2.7 / 6 = 0.45 -> e4m3 0.4375 (spacing 2^-5 in [0.25, 0.5)); 2.7 /
  // 0.4375 = 6.17 clamps to 6 -> 2.625; 1.0 / 0.4375 = 2.29 -> 2 -> 0.875.
  std::vector<float> b(16, 0.0f);
  b[0] = 2.7f;
  b[1] = 1.0f;
  v.insert(v.end(), b.begin(), b.end());
  const std::vector<float> q = quantized(v, Backend::FakeQuant::Fp4E4m3x16);
  EXPECT_EQ(q[0], 3.0f);
  EXPECT_EQ(q[1], 0.5f);
  EXPECT_EQ(q[16], 2.625f);
  EXPECT_EQ(q[17], 0.875f);
}

TEST(V41FakeQuant, Fp8WithPowerOfTwoScalesRoundsToNearestEven) {
  // amax 896 -> scale 2^ceil(log2(896 / 448)) = 2; e4m3 has 3 mantissa bits.
  std::vector<float> v(32, 0.0f);
  v[0] = 896.0f;
  v[1] = 3.0f;     // 1.5: exact
  v[2] = 1.0625f;  // 0.53125: halfway between 0.5 and 0.5625 -> 0.5 (even) -> 1.0
  v[3] = 1.1875f;  // 0.59375: halfway between 0.5625 and 0.625 -> 0.625 (even) -> 1.25
  v[4] = -1.1875f;
  const std::vector<float> q = quantized(v, Backend::FakeQuant::Fp8Ue8m0x32);
  EXPECT_EQ(q[0], 896.0f);
  EXPECT_EQ(q[1], 3.0f);
  EXPECT_EQ(q[2], 1.0f);
  EXPECT_EQ(q[3], 1.25f);
  EXPECT_EQ(q[4], -1.25f);
  // An all-zero block stays zero (the amax floor keeps the scale finite).
  for (float x : quantized(std::vector<float>(32, 0.0f), Backend::FakeQuant::Fp8Ue8m0x32))
    EXPECT_EQ(x, 0.0f);
}

TEST(V41FakeQuant, PackedRowsHoldTheFormatsBytesAndReadBackAsFakeQuant) {
  auto be = make_cpu_backend();
  // FP8 x32: amax 896 -> E8M0 scale byte 128 (2^1); 3.0 / 2 = 1.5 = e4m3 0x3c.
  {
    std::vector<float> v(32, 0.0f);
    v[0] = 896.0f;
    v[1] = 3.0f;
    std::vector<uint8_t> cache(2 * 33, 0xaa);
    std::vector<int32_t> slot = {1};
    PagedKV kv;
    kv.cache = Tensor(cache.data(), DType::U8, {1, 2, 33});
    kv.slot_mapping = Tensor(slot.data(), DType::I32, {1});
    be->store_packed_rows(Tensor(v.data(), DType::F32, {1, 32}), Backend::FakeQuant::Fp8Ue8m0x32,
                          kv);
    EXPECT_EQ(cache[0], 0xaa);  // slot 0 untouched
    EXPECT_EQ(cache[33 + 1], 0x3c);
    EXPECT_EQ(cache[33 + 32], 128);
  }
  // FP4 x32: amax 6 -> scale byte 127 (2^0); 1.0 = code 2 (low nibble), -0.5 = code 9 (high).
  {
    std::vector<float> v(32, 0.0f);
    v[0] = 1.0f;
    v[1] = -0.5f;
    v[2] = 6.0f;
    std::vector<uint8_t> cache(17, 0);
    std::vector<int32_t> slot = {0};
    PagedKV kv;
    kv.cache = Tensor(cache.data(), DType::U8, {1, 1, 17});
    kv.slot_mapping = Tensor(slot.data(), DType::I32, {1});
    be->store_packed_rows(Tensor(v.data(), DType::F32, {1, 32}), Backend::FakeQuant::Fp4Ue8m0x32,
                          kv);
    EXPECT_EQ(cache[0], 0x92);
    EXPECT_EQ(cache[1], 0x07);
    EXPECT_EQ(cache[16], 127);
  }
  // Every format: random rows stored then gathered equal fake_quant's values.
  std::mt19937 rng(5);
  std::normal_distribution<float> n;
  for (auto kind : {Backend::FakeQuant::Fp8Ue8m0x32, Backend::FakeQuant::Fp4Ue8m0x32,
                    Backend::FakeQuant::Fp4E4m3x16}) {
    const int64_t R = 3, C = 64, bytes = packed_row_bytes(kind, C);
    std::vector<float> v(R * C), want, got(R * C);
    for (float& x : v) x = 3.0f * n(rng);
    want = v;
    Tensor wt(want.data(), DType::F32, {R, C});
    be->fake_quant(wt, kind);
    std::vector<uint8_t> cache(4 * bytes);
    std::vector<int32_t> slots = {2, 0, 3}, ids = {2, 0, 3};
    PagedKV kv;
    kv.cache = Tensor(cache.data(), DType::U8, {2, 2, bytes});
    kv.slot_mapping = Tensor(slots.data(), DType::I32, {R});
    be->store_packed_rows(Tensor(v.data(), DType::F32, {R, C}), kind, kv);
    Tensor gt(got.data(), DType::F32, {R, C});
    be->gather_packed_rows(Tensor(ids.data(), DType::I32, {R}),
                           Tensor(cache.data(), DType::U8, {4, bytes}), kind, gt);
    EXPECT_EQ(got, want) << static_cast<int>(kind);
  }
}

TEST(V41Indexer, CandidateBlocksKeepTheNewestBlockAndTheBestOthers) {
  auto be = make_cpu_backend();
  // Row 0: position 9, ratio 1 -> 10 visible entries in blocks {0-3, 4-7, 8-9}; block 2 holds the
  // newest entry and is kept whatever its score; of blocks 0 (max 5) and 1 (max 7), top 2 keeps 1.
  // Row 1: position 5 -> 6 visible: block 1 (entries 4, 5) is the newest; block 0 (max 5) is the
  // other. Row 2: position 0, ratio 2 -> nothing visible: every entry dropped.
  std::vector<float> s = {5,     1,     1,     1,     0,     7,     0,     0,     -3,    -4,     //
                          5,     1,     1,     1,     0,     7,     -kInf, -kInf, -kInf, -kInf,  //
                          -kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf};
  std::vector<int32_t> pos = {9, 5, 0};
  std::vector<float> bias(30, 1.0f);
  Tensor st(s.data(), DType::F32, {3, 10}), pt(pos.data(), DType::I32, {3}),
      bt(bias.data(), DType::F32, {3, 10});
  be->candidate_blocks(st, pt, 1, 2, 4, bt);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(bias[i], i >= 4 ? 0.0f : -kInf) << "row 0 entry " << i;
  for (int i = 0; i < 10; ++i) EXPECT_EQ(bias[10 + i], i < 8 ? 0.0f : -kInf) << "row 1 entry " << i;
  Tensor pt2(pos.data() + 2, DType::I32, {1}), st2(s.data() + 20, DType::F32, {1, 10}),
      bt2(bias.data() + 20, DType::F32, {1, 10});
  be->candidate_blocks(st2, pt2, 2, 2, 4, bt2);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(bias[20 + i], -kInf) << "row 2 entry " << i;
}

TEST(V41Indexer, TopKeepsFiniteScoresLowestIndexOnTies) {
  auto be = make_cpu_backend();
  std::vector<float> s = {3, -kInf, 5, 5, 1, -kInf, -kInf, -kInf, -kInf, -kInf};
  std::vector<int32_t> out(6, 7);
  Tensor st(s.data(), DType::F32, {2, 5}), ot(out.data(), DType::I32, {2, 3});
  be->topk_finite(st, ot);
  EXPECT_EQ(out, (std::vector<int32_t>{2, 3, 0, -1, -1, -1}));
}

TEST(V41Indexer, VisibleScoresGiveV4sIndexerChoice) {
  // V4's indexer_topk (checked against transformers in test_deepseek_v4) is these scores' top-k.
  auto be = make_cpu_backend();
  const int64_t T = 6, H = 4, d = 8, S = 7, k = 3;
  std::mt19937 rng(7);
  std::normal_distribution<float> n;
  std::vector<float> q(T * H * d), keys(S * d), w(T * H), scores(T * S);
  for (float& x : q) x = n(rng);
  for (float& x : keys) x = n(rng);
  for (float& x : w) x = n(rng);
  std::vector<int32_t> pos = {3, 5, 8, 10, 12, 13}, a(T * k), b(T * k);
  Tensor qt(q.data(), DType::F32, {T, H, d}), kt(keys.data(), DType::F32, {S, d}),
      wt(w.data(), DType::F32, {T, H});
  Tensor pt(pos.data(), DType::I32, {T}), st(scores.data(), DType::F32, {T, S});
  Tensor at(a.data(), DType::I32, {T, k}), bt(b.data(), DType::I32, {T, k});
  be->indexer_topk(qt, kt, wt, pt, 2, 0.5f, 0.25f, at);
  be->indexer_scores_visible(qt, kt, wt, pt, 2, 0.5f, 0.25f, st);
  be->topk_finite(st, bt);
  EXPECT_EQ(a, b);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t s = 0; s < S; ++s)
      EXPECT_EQ(std::isinf(scores[t * S + s]), s >= (pos[t] + 1) / 2) << t << " " << s;
}

TEST(V41HyperConnections, MixAndCollapseSplitHcPre) {
  auto be = make_cpu_backend();
  const int64_t T = 3, hc = 4, H = 8, mixes = (2 + hc) * hc;
  std::mt19937 rng(3);
  std::normal_distribution<float> n;
  std::vector<float> st(T * hc * H), fn(mixes * hc * H), base(mixes), scale = {1.1f, 0.9f, 1.2f};
  for (float& x : st) x = n(rng);
  for (float& x : fn) x = 0.2f * n(rng);
  for (float& x : base) x = 0.5f * n(rng);
  std::vector<float> collapsed(T * H), post(T * hc), comb(T * hc * hc);
  std::vector<float> pre2(T * hc), post2(T * hc), comb2(T * hc * hc), collapsed2(T * H),
      first(T * H);
  Tensor s(st.data(), DType::F32, {T, hc, H}), f(fn.data(), DType::F32, {mixes, hc * H});
  Tensor b(base.data(), DType::F32, {mixes}), sc(scale.data(), DType::F32, {3});
  Backend::HyperConnectionParams p{4, 20, 1e-6f, 1e-20f};
  Tensor c1(collapsed.data(), DType::F32, {T, H}), p1(post.data(), DType::F32, {T, hc}),
      m1(comb.data(), DType::F32, {T, hc, hc});
  be->hc_pre(s, f, b, sc, p, c1, p1, m1);
  Tensor r2(pre2.data(), DType::F32, {T, hc}), p2(post2.data(), DType::F32, {T, hc}),
      m2(comb2.data(), DType::F32, {T, hc, hc});
  be->hc_mix(s, f, b, sc, p, r2, p2, m2);
  Tensor c2(collapsed2.data(), DType::F32, {T, H});
  be->hc_collapse(s, r2, c2);
  EXPECT_EQ(post, post2);
  EXPECT_EQ(comb, comb2);
  EXPECT_EQ(collapsed, collapsed2);
  // A one-hot pre (V4.1's first site) collapses to stream 0 exactly.
  std::vector<float> one_hot(T * hc, 0.0f);
  for (int64_t t = 0; t < T; ++t) one_hot[t * hc] = 1.0f;
  Tensor oh(one_hot.data(), DType::F32, {T, hc}), ft(first.data(), DType::F32, {T, H});
  be->hc_collapse(s, oh, ft);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = 0; d < H; ++d) EXPECT_EQ(first[t * H + d], st[t * hc * H + d]);
}

}  // namespace
}  // namespace deepinfer
