// The DSpark drafter's heads (backend.h: markov_argmax, dspark_confidence; DeepSeek-V4.1's drafter,
// model/deepseek_v41/dspark.h).
//  - DsparkHeadsCpu: the host reference against values worked out by hand here (ties, NaN sums, a
//    row with no id, the vocabulary cut, -inf, the confidence's sigmoid).
//  - DsparkOps: CUDA against the CPU reference in the default and the batch-invariant
//    configuration, outputs NaN / poison-filled inside guard sentinels, odd shapes.
//    markov_argmax is compared exactly: both sides make the same float sums, and the inputs hold
//    many exact ties (integer-valued logits), NaN and -inf sums, rows with every sum NaN, a vocab
//    below V; only column `step` of drafts may be written (the others keep their poison).
//    dspark_confidence sums in another order than the CPU (fp32 tree sums against double): within
//    2e-6 of the CPU's probability per row (a logit of magnitude ~1: fp32 rounding of a sum of
//    up to 4,352 products).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "tests/ops/parity.h"

namespace deepinfer::ops_test {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(DsparkHeadsCpu, MarkovArgmaxByHand) {
  std::unique_ptr<Backend> be = make_cpu_backend(BackendOptions{});
  // N 4 blocks, B 2 steps, V 5 ids; step 1 is read.
  const int64_t N = 4, B = 2, V = 5;
  HostBuffer logits(DType::F32, {N, B, V}), bias(DType::F32, {N, V}), drafts(DType::I32, {N, B}),
      next(DType::I32, {N});
  const float rows[4][5] = {{1, 3, 2, 3, 0},            // tie 3 at ids 1 and 3 -> 1; bias below
                            {kNaN, 1, kNaN, 0, 9},      // NaN skipped; 9 at id 4 beyond vocab 4
                            {kNaN, kNaN, kNaN, kNaN, 1},  // no id below vocab 4: -1, next 0
                            {-kInf, -kInf, -kInf, -kInf, 0}};  // all -inf: the lowest id
  const float add[4][5] = {{0, 0, 0, 1, 0}, {0, 0, 0, 0.5f, 0}, {0, 0, 0, 0, 0}, {0, 0, 0, 0, 0}};
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = 0; v < V; ++v) {
      logits.ptr<float>()[(n * B + 0) * V + v] = 100.0f;  // step 0's rows: never read
      logits.ptr<float>()[(n * B + 1) * V + v] = rows[n][v];
      bias.ptr<float>()[n * V + v] = add[n][v];
    }
  for (int64_t i = 0; i < N * B; ++i) drafts.ptr<int32_t>()[i] = 77;
  // Without the bias: ties to the lowest id.
  be->markov_argmax(logits.tensor(), 1, Tensor(), 4, drafts.tensor(), next.tensor());
  EXPECT_EQ(std::vector<int32_t>(drafts.ptr<int32_t>(), drafts.ptr<int32_t>() + N * B),
            (std::vector<int32_t>{77, 1, 77, 1, 77, -1, 77, 0}));
  EXPECT_EQ(std::vector<int32_t>(next.ptr<int32_t>(), next.ptr<int32_t>() + N), (std::vector<int32_t>{1, 1, 0, 0}));
  // With it: row 0's id 3 reaches 4, row 1's id 3 stays below id 1 (0.5 < 1).
  be->markov_argmax(logits.tensor(), 1, bias.tensor(), 4, drafts.tensor(), next.tensor());
  EXPECT_EQ(drafts.ptr<int32_t>()[1], 3);
  EXPECT_EQ(drafts.ptr<int32_t>()[3], 1);
  // The whole vocabulary: row 1's 9 at id 4, row 2's 1 at id 4.
  be->markov_argmax(logits.tensor(), 1, bias.tensor(), 5, drafts.tensor(), next.tensor());
  EXPECT_EQ(drafts.ptr<int32_t>()[3], 4);
  EXPECT_EQ(drafts.ptr<int32_t>()[5], 4);
  EXPECT_EQ(next.ptr<int32_t>()[2], 4);
  // Bad input is named.
  EXPECT_THROW(be->markov_argmax(logits.tensor(), 2, bias.tensor(), 5, drafts.tensor(), next.tensor()), Error);
  EXPECT_THROW(be->markov_argmax(logits.tensor(), 0, bias.tensor(), 6, drafts.tensor(), next.tensor()), Error);
}

TEST(DsparkHeadsCpu, ConfidenceByHand) {
  std::unique_ptr<Backend> be = make_cpu_backend(BackendOptions{});
  HostBuffer h(DType::F32, {2, 3}), e(DType::F32, {2, 2}), w(DType::F32, {5}), out(DType::F32, {2});
  const float hv[] = {1, 2, 3, -1, 0, 0.5f}, ev[] = {4, -2, 0, 1}, wv[] = {0.5f, -0.25f, 0.125f, 0.25f, 1};
  std::copy(hv, hv + 6, h.ptr<float>());
  std::copy(ev, ev + 4, e.ptr<float>());
  std::copy(wv, wv + 5, w.ptr<float>());
  be->dspark_confidence(h.tensor(), e.tensor(), w.tensor(), out.tensor());
  // Row 0: 0.5 - 0.5 + 0.375 + 1 - 2 = -0.625; row 1: -0.5 + 0.0625 + 0 + 1 = 0.5625.
  EXPECT_NEAR(out.ptr<float>()[0], 1.0 / (1.0 + std::exp(0.625)), 1e-6);
  EXPECT_NEAR(out.ptr<float>()[1], 1.0 / (1.0 + std::exp(-0.5625)), 1e-6);
  // Without the Markov embedding the row has H entries only.
  HostBuffer w3(DType::F32, {3});
  std::copy(wv, wv + 3, w3.ptr<float>());
  be->dspark_confidence(h.tensor(), Tensor(), w3.tensor(), out.tensor());
  EXPECT_NEAR(out.ptr<float>()[0], 1.0 / (1.0 + std::exp(-0.375)), 1e-6);
  EXPECT_THROW(be->dspark_confidence(h.tensor(), e.tensor(), w3.tensor(), out.tensor()), Error);
}

class DsparkOps : public Parity {};

std::vector<float> values_i32(const Tensor& host) {
  return std::vector<float>(host.ptr<const int32_t>(), host.ptr<const int32_t>() + host.numel());
}

// Integer-valued logits in [-3, 3] (many exact ties), some NaN and -inf; bias integer-valued too
// (exact sums), a few NaN; rows `dead` all NaN.
std::vector<float> tie_values(int64_t n, std::mt19937_64& rng, double nan_p, double inf_p) {
  std::uniform_int_distribution<int> d(-3, 3);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) {
    const double r = u(rng);
    x = r < nan_p ? kNaN : r < nan_p + inf_p ? -kInf : static_cast<float>(d(rng));
  }
  return v;
}

TEST_F(DsparkOps, MarkovArgmaxExact) {
  struct Case {
    int64_t N, B, V, vocab;
    bool bias;
  };
  for (const Case& c : {Case{1, 1, 1, 1, true}, Case{3, 5, 1000, 999, true}, Case{5, 5, 257, 257, false},
                        Case{2, 3, 37, 20, true}, Case{7, 5, 129280, 129280, true}, Case{4, 2, 3000, 1, true}}) {
    std::vector<float> lg = tie_values(c.N * c.B * c.V, rng_, 0.05, 0.02);
    std::vector<float> bi = tie_values(c.N * c.V, rng_, 0.01, 0.0);
    if (c.N > 1)  // block 1: every sum NaN at every step
      for (int64_t i = c.B * c.V; i < 2 * c.B * c.V; ++i) lg[static_cast<size_t>(i)] = kNaN;
    for (int64_t step = 0; step < c.B; ++step) {
      Tensor dc = cpu_i32(std::vector<int32_t>(static_cast<size_t>(c.N * c.B), -123456789), {c.N, c.B});
      Tensor nc = cpu_i32(std::vector<int32_t>(static_cast<size_t>(c.N), -123456789), {c.N});
      cpu_->markov_argmax(cpu_f32(lg, {c.N, c.B, c.V}), step, c.bias ? cpu_f32(bi, {c.N, c.V}) : Tensor(), c.vocab,
                          dc, nc);
      const std::vector<float> want_d = values_i32(dc), want_n = values_i32(nc);
      if (c.N > 1) {
        ASSERT_EQ(want_d[static_cast<size_t>(c.B + step)], -1.0f) << "the CPU's dead block";
      }
      for (Backend* g : gpus()) {
        const std::string what = "markov_argmax [" + std::to_string(c.N) + ", " + std::to_string(c.B) + ", " +
                                 std::to_string(c.V) + "] step " + std::to_string(step) + " vocab " +
                                 std::to_string(c.vocab) + (c.bias ? " + bias" : "") + tag(*g);
        Tensor dg = gpu_guarded(*g, DType::I32, {c.N, c.B}), ng = gpu_guarded(*g, DType::I32, {c.N});
        g->markov_argmax(gpu_float(*g, lg, {c.N, c.B, c.V}, DType::F32), step,
                         c.bias ? gpu_float(*g, bi, {c.N, c.V}, DType::F32) : Tensor(), c.vocab, dg, ng);
        EXPECT_EQ(download(*g, dg), want_d) << what << ", seed " << seed_;
        EXPECT_EQ(download(*g, ng), want_n) << what << ", seed " << seed_;
        expect_guards_intact(what);
      }
    }
  }
}

TEST_F(DsparkOps, ConfidenceHead) {
  for (const auto& [T, H, R] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 0}, {5, 7, 3}, {12, 4096, 256},
                                {3, 1000, 0}, {9, 64, 1}}) {
    const std::vector<float> h = randn(T * H), e = randn(T * R);
    const std::vector<float> w = randn(H + R, 1.0f / std::sqrt(static_cast<float>(H + R)), false);
    for (DType dt : {DType::F32, DType::BF16}) {
      Tensor oc = cpu_f32(std::vector<float>(static_cast<size_t>(T)), {T});
      cpu_->dspark_confidence(cpu_f32(h, {T, H}), R > 0 ? cpu_f32(e, {T, R}) : Tensor(), cpu_f32(w, {H + R}), oc);
      const std::vector<float> want = values(oc);
      for (Backend* g : gpus()) {
        const std::string what = "dspark_confidence T " + std::to_string(T) + " H " + std::to_string(H) + " R " +
                                 std::to_string(R) + " " + std::string(dtype_name(dt)) + tag(*g);
        Tensor og = gpu_guarded(*g, DType::F32, {T});
        g->dspark_confidence(gpu_float(*g, h, {T, H}, dt), R > 0 ? gpu_float(*g, e, {T, R}, dt) : Tensor(),
                             gpu_float(*g, w, {H + R}, DType::F32), og);
        const std::vector<float> got = download(*g, og);
        for (int64_t t = 0; t < T; ++t) {
          ASSERT_FALSE(std::isnan(got[static_cast<size_t>(t)])) << what << ": row " << t << " not written";
          EXPECT_NEAR(got[static_cast<size_t>(t)], want[static_cast<size_t>(t)], 2e-6)
              << what << ": row " << t << ", seed " << seed_;
        }
        expect_guards_intact(what);
      }
    }
  }
}

}  // namespace
}  // namespace deepinfer::ops_test
