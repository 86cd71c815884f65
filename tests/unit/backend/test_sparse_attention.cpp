// DeepSeek sparse attention ops of the CPU reference (backend.h: layer_norm, indexer_scores,
// indexer_topk, mla_attention_{paged,prefill}_sparse) against naive double-precision
// references written here: the lightning-indexer formula, a full sort with the documented
// tie-break, and softmax attention over exactly the selected positions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

#include "op_test_util.h"

namespace deepinfer {
namespace {

using test::naive_attention;

// Three sequences over a scattered paged cache (as test_attention's check_paged): 3 new
// tokens after 6 cached (a chunk), 1 token with no context, a decode token after 13 cached.
struct PagedSetup {
  static constexpr int64_t kBlockSize = 4, kNumBlocks = 16, kMaxBlocks = 4, T = 5;
  std::vector<int32_t> qs = {0, 3, 4, 5};
  std::vector<int32_t> lens = {9, 1, 14};
  std::vector<int32_t> tables = {11, 2, 7, 0, 5, 0, 0, 0, 14, 3, 9, 12};
  HostBuffer qsb = test::i32_buffer(qs), lb = test::i32_buffer(lens);
  HostBuffer tb{DType::I32, {3, kMaxBlocks}};
  HostBuffer cache;
  PagedKV kv;
  explicit PagedSetup(int64_t row_dim, uint64_t seed)
      : cache(test::random_f32({kNumBlocks, kBlockSize, row_dim}, seed)) {
    std::copy(tables.begin(), tables.end(), tb.ptr<int32_t>());
    kv = test::paged_kv(cache.tensor(), tb.tensor(), lb.tensor(), qsb.tensor(), 3, 3, 14);
  }
  int seq(int64_t t) const { return t < 3 ? 0 : t < 4 ? 1 : 2; }
  int64_t ctx(int64_t t) const {
    const int s = seq(t);
    return lens[s] - (qs[s + 1] - qs[s]) + (t - qs[s]) + 1;
  }
  const float* row(int64_t t, int64_t pos) const {
    const int s = seq(t);
    const int64_t slot = tables[s * kMaxBlocks + pos / kBlockSize] * kBlockSize + pos % kBlockSize;
    return cache.ptr<float>() + slot * cache.tensor().size(2);
  }
};

TEST(CpuSparseAttention, LayerNormMatchesTorchFormula) {
  auto backend = make_cpu_backend();
  const int64_t R = 5, C = 32;
  HostBuffer x = test::random_f32({R, C}, 1, 2.0f);
  for (int64_t i = 0; i < R * C; ++i) x.ptr<float>()[i] += 3.0f;  // a mean to remove
  HostBuffer w = test::random_f32({C}, 2), b = test::random_f32({C}, 3);
  HostBuffer out = test::f32_buffer({R, C}, NAN);
  const float eps = 1e-6f;
  backend->layer_norm(x.tensor(), w.tensor(), b.tensor(), eps, out.tensor());
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = x.ptr<float>() + r * C;
    double mean = 0, var = 0;
    for (int64_t i = 0; i < C; ++i) mean += xr[i];
    mean /= C;
    for (int64_t i = 0; i < C; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    var /= C;  // biased, as torch.nn.LayerNorm
    std::vector<double> ref(C);
    for (int64_t i = 0; i < C; ++i) {
      ref[i] = (xr[i] - mean) / std::sqrt(var + eps) * w.ptr<float>()[i] + b.ptr<float>()[i];
    }
    EXPECT_LE(test::max_abs_diff(out.ptr<float>() + r * C, ref.data(), C), 1e-5) << "row " << r;
  }
  // In place (the indexer normalizes its keys in their buffer) gives the same.
  HostBuffer y = test::f32_buffer({R, C});
  std::copy(x.ptr<float>(), x.ptr<float>() + R * C, y.ptr<float>());
  backend->layer_norm(y.tensor(), w.tensor(), b.tensor(), eps, y.tensor());
  EXPECT_TRUE(std::equal(y.ptr<float>(), y.ptr<float>() + R * C, out.ptr<float>()));
  HostBuffer short_bias = test::random_f32({C - 1}, 4);
  EXPECT_THROW(backend->layer_norm(x.tensor(), w.tensor(), short_bias.tensor(), eps, out.tensor()),
               Error);
}

TEST(CpuSparseAttention, IndexerScoresAreWeightedReluDotsOverThePagedKeys) {
  auto backend = make_cpu_backend();
  const int64_t H = 6, D = 16, N = 16;
  PagedSetup p(D, 5);
  HostBuffer q = test::random_f32({p.T, H, D}, 6);
  HostBuffer w = test::random_f32({p.T, H}, 7);  // some weights negative
  HostBuffer scores = test::f32_buffer({p.T, N}, NAN);
  const double scale = 0.125;
  backend->indexer_scores(q.tensor(), w.tensor(), p.kv, float(scale), scores.tensor());
  int positive_relu_skipped = 0;
  for (int64_t t = 0; t < p.T; ++t) {
    for (int64_t j = 0; j < N; ++j) {
      const float got = scores.ptr<float>()[t * N + j];
      if (j >= p.ctx(t)) {
        EXPECT_TRUE(std::isinf(got) && got < 0) << "t=" << t << " j=" << j << " beyond the context";
        continue;
      }
      double ref = 0;
      for (int64_t h = 0; h < H; ++h) {
        double d = 0;
        for (int64_t i = 0; i < D; ++i) d += double(q.ptr<float>()[(t * H + h) * D + i]) * p.row(t, j)[i];
        if (d > 0) {
          ref += w.ptr<float>()[t * H + h] * scale * d;
        } else {
          ++positive_relu_skipped;
        }
      }
      EXPECT_NEAR(got, ref, 1e-5 * (1 + std::fabs(ref))) << "t=" << t << " j=" << j;
    }
  }
  EXPECT_GT(positive_relu_skipped, 0);  // the ReLU was exercised
  HostBuffer narrow = test::f32_buffer({p.T, 13});  // the longest context is 14
  EXPECT_THROW(backend->indexer_scores(q.tensor(), w.tensor(), p.kv, 0.1f, narrow.tensor()), Error);
}

// The documented order: higher score first, equal scores to the lower position, NaN last.
std::vector<int32_t> naive_topk(const float* row, int64_t ctx, int64_t k) {
  std::vector<int32_t> order(static_cast<size_t>(ctx));
  std::iota(order.begin(), order.end(), 0);
  auto key = [&](int32_t j) { return std::isnan(row[j]) ? -INFINITY : double(row[j]); };
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return key(a) > key(b); });
  if (static_cast<int64_t>(order.size()) > k) order.resize(static_cast<size_t>(k));
  std::sort(order.begin(), order.end());
  order.resize(static_cast<size_t>(k), -1);
  return order;
}

TEST(CpuSparseAttention, IndexerTopkKeepsTheBestWithLowerPositionOnTiesAscending) {
  auto backend = make_cpu_backend();
  const int64_t N = 16, k = 4;
  PagedSetup p(8, 8);
  HostBuffer scores = test::random_f32({p.T, N}, 9);
  float* sc = scores.ptr<float>();
  // Token 0 (context 7): positions 1, 3, 5 tie at the top; 0 and 6 tie just below the cut
  // at the 4th place, so exactly one of them (0, the lower) is kept.
  for (int64_t j = 0; j < N; ++j) sc[j] = -1.0f;
  sc[1] = sc[3] = sc[5] = 2.0f;
  sc[0] = sc[6] = 1.0f;
  sc[2 * N + 4] = NAN;  // token 2 (context 9): a NaN ranks below every number
  HostBuffer idx(DType::I32, {p.T, k});
  backend->indexer_topk(scores.tensor(), p.kv, idx.tensor());
  EXPECT_EQ(std::vector<int32_t>(idx.ptr<int32_t>(), idx.ptr<int32_t>() + k),
            (std::vector<int32_t>{0, 1, 3, 5}));
  for (int64_t t = 0; t < p.T; ++t) {
    const std::vector<int32_t> want = naive_topk(sc + t * N, p.ctx(t), k);
    EXPECT_EQ(std::vector<int32_t>(idx.ptr<int32_t>() + t * k, idx.ptr<int32_t>() + (t + 1) * k), want)
        << "token " << t << " (context " << p.ctx(t) << ")";
  }
  // Token 3 has context 1 < k: every causal position, then -1.
  EXPECT_EQ(std::vector<int32_t>(idx.ptr<int32_t>() + 3 * k, idx.ptr<int32_t>() + 4 * k),
            (std::vector<int32_t>{0, -1, -1, -1}));
  HostBuffer wrong(DType::I32, {p.T - 1, k});
  EXPECT_THROW(backend->indexer_topk(scores.tensor(), p.kv, wrong.tensor()), Error);
}

// Random selections: up to 5 causal positions per token, ascending, -1 padded to k = 6.
HostBuffer random_selection(int64_t T, int64_t k, const std::function<int64_t(int64_t)>& ctx,
                            uint64_t seed) {
  HostBuffer idx(DType::I32, {T, k});
  std::mt19937_64 rng(seed);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> all(static_cast<size_t>(ctx(t)));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(std::min<size_t>(all.size(), 5));
    std::sort(all.begin(), all.end());
    all.resize(static_cast<size_t>(k), -1);
    std::copy(all.begin(), all.end(), idx.ptr<int32_t>() + t * k);
  }
  return idx;
}

HostBuffer all_positions(int64_t T, int64_t k, const std::function<int64_t(int64_t)>& ctx) {
  HostBuffer idx(DType::I32, {T, k});
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < k; ++j) idx.ptr<int32_t>()[t * k + j] = j < ctx(t) ? int32_t(j) : -1;
  }
  return idx;
}

TEST(CpuSparseAttention, PagedSparseAttendsExactlyTheSelectedPositions) {
  auto backend = make_cpu_backend();
  const int64_t row_dim = 20, v_dim = 12, H = 5, k = 6;
  PagedSetup p(row_dim, 10);
  auto ctx = [&](int64_t t) { return p.ctx(t); };
  HostBuffer q = test::random_f32({p.T, H, row_dim}, 11);
  HostBuffer idx = random_selection(p.T, k, ctx, 12);
  HostBuffer out = test::f32_buffer({p.T, H, v_dim}, NAN);
  const double scale = 0.25;
  backend->mla_attention_paged_sparse(q.tensor(), p.kv, idx.tensor(), float(scale), int(v_dim),
                                      out.tensor());
  for (int64_t t = 0; t < p.T; ++t) {
    std::vector<const float*> rows;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t pos = idx.ptr<int32_t>()[t * k + j];
      if (pos >= 0) rows.push_back(p.row(t, pos));
    }
    for (int64_t h = 0; h < H; ++h) {
      auto ref = naive_attention(q.ptr<float>() + (t * H + h) * row_dim, rows, rows, row_dim, v_dim, scale);
      EXPECT_LE(test::max_abs_diff(out.ptr<float>() + (t * H + h) * v_dim, ref.data(), v_dim), 1e-5)
          << "t=" << t << " h=" << h;
    }
  }
  // Every causal position, ascending: bit-identical to the dense op.
  HostBuffer every = all_positions(p.T, 16, ctx);
  HostBuffer dense = test::f32_buffer({p.T, H, v_dim}, NAN);
  backend->mla_attention_paged(q.tensor(), p.kv, float(scale), int(v_dim), dense.tensor());
  backend->mla_attention_paged_sparse(q.tensor(), p.kv, every.tensor(), float(scale), int(v_dim),
                                      out.tensor());
  EXPECT_TRUE(std::equal(dense.ptr<float>(), dense.ptr<float>() + p.T * H * v_dim, out.ptr<float>()));
  // A future position (token 3 has context 1) is an Error naming the entry.
  idx.ptr<int32_t>()[3 * k] = 1;
  try {
    backend->mla_attention_paged_sparse(q.tensor(), p.kv, idx.tensor(), 0.25f, int(v_dim), out.tensor());
    ADD_FAILURE() << "a non-causal index was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("indices[3, 0] = 1"), std::string::npos) << e.what();
  }
}

TEST(CpuSparseAttention, PrefillSparseAttendsExactlyTheSelectedPositions) {
  auto backend = make_cpu_backend();
  const std::vector<int32_t> qs = {0, 3, 4, 12};  // lengths 3, 1, 8
  const int64_t T = 12, H = 3, DK = 20, DV = 12, k = 6;
  HostBuffer q = test::random_f32({T, H, DK}, 13), kk = test::random_f32({T, H, DK}, 14);
  HostBuffer v = test::random_f32({T, H, DV}, 15);
  HostBuffer qsb = test::i32_buffer(qs);
  auto first = [&](int64_t t) { return t < 3 ? 0 : t < 4 ? 3 : 4; };
  auto ctx = [&](int64_t t) { return t - first(t) + 1; };
  HostBuffer idx = random_selection(T, k, ctx, 16);
  HostBuffer out = test::f32_buffer({T, H, DV}, NAN);
  const double scale = 0.3;
  backend->mla_attention_prefill_sparse(q.tensor(), kk.tensor(), v.tensor(), qsb.tensor(), 3,
                                        idx.tensor(), float(scale), out.tensor());
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      std::vector<const float*> keys, values;
      for (int64_t j = 0; j < k; ++j) {
        const int32_t pos = idx.ptr<int32_t>()[t * k + j];
        if (pos < 0) continue;
        keys.push_back(kk.ptr<float>() + ((first(t) + pos) * H + h) * DK);
        values.push_back(v.ptr<float>() + ((first(t) + pos) * H + h) * DV);
      }
      auto ref = naive_attention(q.ptr<float>() + (t * H + h) * DK, keys, values, DK, DV, scale);
      EXPECT_LE(test::max_abs_diff(out.ptr<float>() + (t * H + h) * DV, ref.data(), DV), 1e-5)
          << "t=" << t << " h=" << h;
    }
  }
  HostBuffer every = all_positions(T, 8, ctx);
  HostBuffer dense = test::f32_buffer({T, H, DV}, NAN);
  backend->mla_attention_prefill(q.tensor(), kk.tensor(), v.tensor(), qsb.tensor(), 3, float(scale),
                                 dense.tensor());
  backend->mla_attention_prefill_sparse(q.tensor(), kk.tensor(), v.tensor(), qsb.tensor(), 3,
                                        every.tensor(), float(scale), out.tensor());
  EXPECT_TRUE(std::equal(dense.ptr<float>(), dense.ptr<float>() + T * H * DV, out.ptr<float>()));
  idx.ptr<int32_t>()[0] = -2;
  EXPECT_THROW(backend->mla_attention_prefill_sparse(q.tensor(), kk.tensor(), v.tensor(), qsb.tensor(),
                                                     3, idx.tensor(), 0.3f, out.tensor()),
               Error);
}

}  // namespace
}  // namespace deepinfer
