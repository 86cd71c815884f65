// Parity of DeepSeek-V3.2's sparse attention ops (backend.h: layer_norm, indexer_scores,
// indexer_topk, mla_attention_{paged,prefill}_sparse), CUDA against the CPU reference, in the
// default and the batch-invariant configuration. The cases mix sequences of different lengths
// in one step (decode tokens, chunks of several tokens over cached context, a fresh sequence),
// contexts shorter than, equal to and longer than top-k, block sizes that divide nothing (so a
// context crosses block-table entries mid-block) over scattered blocks, and, for top-k, scores
// with many exact ties, NaN, -0 / +0 and -inf, where only the documented order (higher score,
// then lower position; written ascending) gives the CPU's indices.
#include <cstring>
#include <numeric>

#include "tests/ops/parity.h"

namespace deepinfer::ops_test {
namespace {

// A step over a paged cache: sequence s computes q_lens[s] new tokens at the end of its
// seq_lens[s] positions.
struct StepCase {
  std::vector<int32_t> q_lens, seq_lens;
  int64_t block_size;
};

class SparseAttention : public Parity {
 protected:
  using StepData = PagedLayout;
  StepData make_step(const StepCase& c) { return paged_layout(c.q_lens, c.seq_lens, c.block_size); }
  PagedKV paged(Backend* b, const StepData& d, const StepCase&, Tensor cache) {
    return paged_addressing(b, d, cache);
  }
  // Ascending top-k style lists: per token min(ctx, k) distinct causal positions (a random
  // subset when ctx > k), ascending, then -1; with `holes`, some entries are -1 in between.
  std::vector<int32_t> random_indices(const StepData& d, int64_t k, bool holes) {
    std::vector<int32_t> out(static_cast<size_t>(d.T * k), -1);
    for (int64_t t = 0; t < d.T; ++t) {
      std::vector<int32_t> pos(static_cast<size_t>(d.ctx[t]));
      std::iota(pos.begin(), pos.end(), 0);
      if (static_cast<int64_t>(pos.size()) > k) {
        std::shuffle(pos.begin(), pos.end(), rng_);
        pos.resize(static_cast<size_t>(k));
        std::sort(pos.begin(), pos.end());
      }
      for (size_t j = 0; j < pos.size(); ++j) out[t * k + j] = pos[j];
      if (holes)
        for (int64_t j = 0; j < k; ++j)
          if (randint(0, 4) == 0) out[t * k + j] = -1;
    }
    return out;
  }
  // Scores compared as the model reads them: -inf at exactly the same places, the finite
  // entries by normalised error.
  void expect_scores_close(const std::vector<float>& got, const std::vector<float>& want,
                           const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    std::vector<float> g, w;
    for (size_t i = 0; i < got.size(); ++i) {
      const bool want_inf = std::isinf(want[i]) && want[i] < 0;
      ASSERT_EQ(std::isinf(got[i]) && got[i] < 0, want_inf)
          << what << ": element " << i << " is " << got[i] << ", the CPU's " << want[i] << ", seed " << seed_;
      if (!want_inf) {
        g.push_back(got[i]);
        w.push_back(want[i]);
      }
    }
    expect_close(g, w, kTolBF16, what);
  }
};

TEST_F(SparseAttention, LayerNorm) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 32}, {37, 128}, {5, 7168}}) {
    std::vector<float> x = randn(rows * cols, 2.0f);
    for (float& v : x) v = bf16_to_float(float_to_bf16(v + 3.0f));  // a mean to remove
    const std::vector<float> w = randn(cols), b = randn(cols);
    Tensor oc = cpu_f32(std::vector<float>(rows * cols), {rows, cols});
    cpu_->layer_norm(cpu_f32(x, {rows, cols}), cpu_f32(w, {cols}), cpu_f32(b, {cols}), 1e-6f, oc);
    for (Backend* g : {gpu_.get(), gpu_inv_.get()}) {
      // In place, as the indexer runs it (wk(x) normed where it lies), BF16 weights.
      Tensor xg = gpu_float(*g, x, {rows, cols}, DType::BF16);
      g->layer_norm(xg, gpu_float(*g, w, {cols}, DType::BF16), gpu_float(*g, b, {cols}, DType::F32), 1e-6f, xg);
      expect_close(download(*g, xg), values(oc), kTolBF16,
                   "layer_norm [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
    }
  }
}

TEST_F(SparseAttention, IndexerScores) {
  struct Case {
    StepCase step;
    int64_t heads, dim;
    int64_t extra_cols;  // score columns past the longest context (must be -inf)
  };
  const std::vector<Case> cases = {
      {{{1}, {1}, 16}, 16, 32, 3},                        // one position
      {{{24, 10}, {24, 10}, 16}, 16, 32, 0},              // v32_tiny prefill, two sequences
      {{{1, 3, 5}, {77, 150, 5}, 5}, 16, 32, 9},          // decode, chunk over context, fresh
      {{{1, 1, 2}, {640, 129, 65}, 64}, 64, 128, 64},     // V3.2 shapes, block boundaries
      {{{70}, {200}, 7}, 64, 128, 1},
  };
  for (const Case& c : cases) {
    const StepData d = make_step(c.step);
    const int64_t H = c.heads, D = c.dim, N = d.max_seq_len + c.extra_cols;
    const std::vector<float> q = randn(d.T * H * D);
    const std::vector<float> keys = randn(d.num_blocks * c.step.block_size * D);
    const std::vector<float> w = randn(d.T * H, 1.0f, false);  // negative weights too
    const float scale = 1.0f / std::sqrt(float(H)) / std::sqrt(float(D));
    PagedKV kc = paged(nullptr, d, c.step, cpu_f32(keys, {d.num_blocks, c.step.block_size, D}));
    Tensor sc = cpu_f32(std::vector<float>(d.T * N), {d.T, N});
    cpu_->indexer_scores(cpu_f32(q, {d.T, H, D}), cpu_f32(w, {d.T, H}), kc, scale, sc);
    const std::string what = "indexer_scores T " + std::to_string(d.T) + " heads " + std::to_string(H) +
                             " dim " + std::to_string(D) + " block " + std::to_string(c.step.block_size);
    std::vector<float> first;
    for (Backend* g : {gpu_.get(), gpu_inv_.get()}) {
      PagedKV kg = paged(g, d, c.step, gpu_float(*g, keys, {d.num_blocks, c.step.block_size, D}, DType::BF16));
      Tensor sg = gpu_poisoned(*g, DType::F32, {d.T, N});
      g->indexer_scores(gpu_float(*g, q, {d.T, H, D}, DType::BF16), gpu_float(*g, w, {d.T, H}, DType::F32), kg,
                        scale, sg);
      const std::vector<float> got = download(*g, sg);
      expect_scores_close(got, values(sc), what + (g->batch_invariant() ? " (batch-invariant)" : ""));
      // One kernel in both configurations: the same bits.
      if (first.empty()) {
        first = got;
      } else {
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_EQ(std::memcmp(&got[i], &first[i], 4), 0) << what << ": element " << i << " differs between configurations";
      }
    }
  }
}

TEST_F(SparseAttention, IndexerTopk) {
  struct Case {
    StepCase step;
    int64_t k;
    int kind;  // 0: continuous, 1: few distinct values (ties everywhere), 2: ties + NaN, -0, -inf
  };
  const std::vector<Case> cases = {
      {{{1, 1, 1}, {5, 8, 9}, 4}, 8, 1},         // ctx < k, == k, k + 1
      {{{24}, {24}, 16}, 8, 1},                  // v32_tiny prefill: ctx 1 .. 24 over k 8
      {{{20, 1}, {20, 90}, 16}, 12, 2},
      {{{3, 1, 5}, {700, 2049, 3000}, 64}, 2048, 1},  // V3.2's k: ties at the cut
      {{{1, 2}, {5000, 4100}, 64}, 2048, 0},
      {{{2, 1}, {1500, 2100}, 5}, 1024, 2},
      // Few long rows: the top-k spreads each row over slices (backend/cuda/indexer.cu
      // topk_split), slices shorter than k and past the context included.
      {{{1}, {40000}, 64}, 256, 2},
      {{{2, 1}, {9000, 12000}, 16}, 300, 1},
      {{{1}, {131072}, 64}, 2048, 0},            // V3.2 decode at batch 1, 128k context
      {{{1}, {131072}, 64}, 2048, 1},
      {{{1, 1, 1}, {3000, 100, 2600}, 16}, 512, 2},
  };
  for (const Case& c : cases) {
    const StepData d = make_step(c.step);
    const int64_t N = d.max_seq_len + 3, k = c.k;
    std::vector<float> scores(static_cast<size_t>(d.T * N));
    for (int64_t t = 0; t < d.T; ++t) {
      for (int64_t j = 0; j < N; ++j) {
        float& v = scores[t * N + j];
        if (j >= d.ctx[t]) {
          v = -INFINITY;  // as indexer_scores leaves them (never chosen)
        } else if (c.kind == 0) {
          v = std::normal_distribution<float>(0.0f, 1.0f)(rng_);
        } else {
          v = static_cast<float>(randint(-3, 3)) * 0.25f;
          if (c.kind == 2) {
            const int r = randint(0, 40);
            if (r == 0) v = std::nanf("");
            if (r == 1) v = -0.0f;
            if (r == 2) v = -INFINITY;
          }
        }
      }
    }
    PagedKV kc = paged(nullptr, d, c.step, Tensor{});
    Tensor ic = cpu_i32(std::vector<int32_t>(d.T * k), {d.T, k});
    cpu_->indexer_topk(cpu_f32(scores, {d.T, N}), kc, ic);
    const std::string what = "indexer_topk T " + std::to_string(d.T) + " k " + std::to_string(k) +
                             " max ctx " + std::to_string(d.max_seq_len) + " kind " + std::to_string(c.kind);
    for (Backend* g : {gpu_.get(), gpu_inv_.get()}) {
      PagedKV kg = paged(g, d, c.step, Tensor{});
      Tensor ig = gpu_poisoned(*g, DType::I32, {d.T, k});
      g->indexer_topk(gpu_float(*g, scores, {d.T, N}, DType::F32), kg, ig);
      const std::vector<float> got = download(*g, ig);
      for (int64_t t = 0; t < d.T; ++t)
        for (int64_t j = 0; j < k; ++j)
          ASSERT_EQ(static_cast<int32_t>(got[t * k + j]), ic.ptr<int32_t>()[t * k + j])
              << what << ": token " << t << " (context " << d.ctx[t] << ") slot " << j << ", seed " << seed_;
    }
  }
}

TEST_F(SparseAttention, PagedSparse) {
  struct Case {
    StepCase step;
    int64_t heads, row_dim, v_dim, k;
    bool holes;
  };
  const std::vector<Case> cases = {
      {{{1}, {1}, 16}, 4, 80, 64, 8, false},                          // v32_tiny decode, one position
      {{{1, 7, 1}, {30, 20, 5}, 16}, 4, 80, 64, 8, true},             // chunk over context, -1 holes
      {{{1, 1, 2}, {2100, 129, 65}, 64}, 16, 576, 512, 2048, false},  // V3.2 rows and k
      {{{3, 1}, {300, 1000}, 5}, 20, 576, 512, 256, true},
  };
  for (const Case& c : cases) {
    const StepData d = make_step(c.step);
    const int64_t H = c.heads, R = c.row_dim, k = c.k;
    const std::vector<float> q = randn(d.T * H * R);
    const std::vector<float> cache = randn(d.num_blocks * c.step.block_size * R);
    const std::vector<int32_t> idx = random_indices(d, k, c.holes);
    const float scale = 1.0f / std::sqrt(192.0f);
    PagedKV kc = paged(nullptr, d, c.step, cpu_f32(cache, {d.num_blocks, c.step.block_size, R}));
    Tensor oc = cpu_f32(std::vector<float>(d.T * H * c.v_dim), {d.T, H, c.v_dim});
    cpu_->mla_attention_paged_sparse(cpu_f32(q, {d.T, H, R}), kc, cpu_i32(idx, {d.T, k}), scale,
                                     static_cast<int>(c.v_dim), oc);
    const std::string what = "mla_attention_paged_sparse T " + std::to_string(d.T) + " heads " +
                             std::to_string(H) + " k " + std::to_string(k) + (c.holes ? " with holes" : "");
    for (Backend* g : {gpu_.get(), gpu_inv_.get()}) {
      PagedKV kg = paged(g, d, c.step, gpu_float(*g, cache, {d.num_blocks, c.step.block_size, R}, DType::BF16));
      Tensor qg = gpu_float(*g, q, {d.T, H, R}, DType::BF16);
      Tensor og = gpu_poisoned(*g, DType::BF16, {d.T, H, c.v_dim});
      g->mla_attention_paged_sparse(qg, kg, gpu_copy(*g, cpu_i32(idx, {d.T, k})), scale,
                                    static_cast<int>(c.v_dim), og);
      expect_close(download(*g, og), values(oc), kTolAttention, what + (g->batch_invariant() ? " (batch-invariant)" : ""));
    }
  }
}

// Every causal position listed in order (a context no longer than k, as indexer_topk writes
// it) is the dense op: the same chunks in the same order, so the same bits; a token whose list
// is all -1 gets 0 (as the CPU reference).
TEST_F(SparseAttention, PagedSparseOverEveryPositionIsTheDenseOp) {
  const StepCase step{{1, 3, 1}, {100, 40, 7}, 16};
  const StepData d = make_step(step);
  const int64_t H = 16, R = 576, V = 512, k = 128;
  const std::vector<float> q = randn(d.T * H * R);
  const std::vector<float> cache = randn(d.num_blocks * step.block_size * R);
  std::vector<int32_t> idx(static_cast<size_t>(d.T * k), -1);
  for (int64_t t = 0; t < d.T; ++t)
    for (int32_t j = 0; j < d.ctx[t]; ++j) idx[t * k + j] = j;
  const float scale = 1.0f / std::sqrt(192.0f);
  for (Backend* g : {gpu_.get(), gpu_inv_.get()}) {
    PagedKV kg = paged(g, d, step, gpu_float(*g, cache, {d.num_blocks, step.block_size, R}, DType::BF16));
    Tensor qg = gpu_float(*g, q, {d.T, H, R}, DType::BF16);
    Tensor dense = gpu_poisoned(*g, DType::BF16, {d.T, H, V});
    Tensor sparse = gpu_poisoned(*g, DType::BF16, {d.T, H, V});
    g->mla_attention_paged(qg, kg, scale, static_cast<int>(V), dense);
    g->mla_attention_paged_sparse(qg, kg, gpu_copy(*g, cpu_i32(idx, {d.T, k})), scale, static_cast<int>(V), sparse);
    const std::vector<float> a = download(*g, dense), b = download(*g, sparse);
    for (size_t i = 0; i < a.size(); ++i)
      ASSERT_EQ(a[i], b[i]) << "element " << i << (g->batch_invariant() ? " (batch-invariant)" : "");
    // No position at all: zeros.
    std::vector<int32_t> none(static_cast<size_t>(d.T * k), -1);
    g->mla_attention_paged_sparse(qg, kg, gpu_copy(*g, cpu_i32(none, {d.T, k})), scale, static_cast<int>(V), sparse);
    for (float v : download(*g, sparse)) ASSERT_EQ(v, 0.0f) << "a token with no position must get 0";
  }
}

// Batch-invariant configuration: a token's sparse attention alone equals the same token in a
// larger step, bit for bit.
TEST_F(SparseAttention, PagedSparseBatchInvariantAloneAndInBatch) {
  const StepCase step{{1, 1, 1, 1}, {3000, 700, 64, 2049}, 64};
  const StepData d = make_step(step);
  const int64_t H = 16, R = 576, V = 512, k = 2048;
  const std::vector<float> q = randn(d.T * H * R);
  const std::vector<float> cache = randn(d.num_blocks * step.block_size * R);
  const std::vector<int32_t> idx = random_indices(d, k, false);
  const float scale = 1.0f / std::sqrt(192.0f);
  Backend& g = *gpu_inv_;
  Tensor cg = gpu_float(g, cache, {d.num_blocks, step.block_size, R}, DType::BF16);
  PagedKV all = paged(&g, d, step, cg);
  Tensor oall = gpu_poisoned(g, DType::BF16, {d.T, H, V});
  g.mla_attention_paged_sparse(gpu_float(g, q, {d.T, H, R}, DType::BF16), all, gpu_copy(g, cpu_i32(idx, {d.T, k})),
                               scale, static_cast<int>(V), oall);
  const std::vector<float> want = download(g, oall);
  for (int s = 0; s < 4; ++s) {  // sequence s alone (its one decode token)
    StepCase one{{1}, {step.seq_lens[s]}, step.block_size};
    StepData d1 = d;
    d1.tables.assign(d.tables.begin() + s * d.max_blocks, d.tables.begin() + (s + 1) * d.max_blocks);
    d1.seq_lens = {step.seq_lens[s]};
    d1.query_start = {0, 1};
    d1.T = 1;
    d1.max_seq_len = step.seq_lens[s];
    d1.max_q = 1;
    PagedKV kv1 = paged(&g, d1, one, cg);
    std::vector<float> q1(q.begin() + s * H * R, q.begin() + (s + 1) * H * R);
    std::vector<int32_t> i1(idx.begin() + s * k, idx.begin() + (s + 1) * k);
    Tensor o1 = gpu_poisoned(g, DType::BF16, {1, H, V});
    g.mla_attention_paged_sparse(gpu_float(g, q1, {1, H, R}, DType::BF16), kv1, gpu_copy(g, cpu_i32(i1, {1, k})),
                                 scale, static_cast<int>(V), o1);
    const std::vector<float> got = download(g, o1);
    for (int64_t i = 0; i < H * V; ++i)
      ASSERT_EQ(got[i], want[s * H * V + i]) << "sequence " << s << " element " << i;
  }
}

TEST_F(SparseAttention, PrefillSparse) {
  struct Case {
    std::vector<int32_t> lens;
    int64_t heads, dq, dv, k;
    bool holes;
  };
  const std::vector<Case> cases = {
      {{24, 10}, 4, 48, 32, 8, false},    // v32_tiny shapes (qk 32 + 16, v 32), two sequences
      {{1, 70, 13}, 3, 40, 24, 16, true},
      {{300}, 16, 192, 128, 256, false},  // V3.2 head dims
  };
  for (const Case& c : cases) {
    StepCase step{c.lens, c.lens, 16};  // fresh sequences: ctx(t) = its index + 1
    const StepData d = make_step(step);
    const int64_t T = d.T, H = c.heads, S = static_cast<int64_t>(c.lens.size());
    const std::vector<float> q = randn(T * H * c.dq), kk = randn(T * H * c.dq), v = randn(T * H * c.dv);
    const std::vector<int32_t> idx = random_indices(d, c.k, c.holes);
    const float scale = 1.0f / std::sqrt(float(c.dq));
    Tensor oc = cpu_f32(std::vector<float>(T * H * c.dv), {T, H, c.dv});
    cpu_->mla_attention_prefill_sparse(cpu_f32(q, {T, H, c.dq}), cpu_f32(kk, {T, H, c.dq}), cpu_f32(v, {T, H, c.dv}),
                                       cpu_i32(d.query_start, {S + 1}), static_cast<int>(S),
                                       cpu_i32(idx, {T, c.k}), scale, oc);
    const std::string what = "mla_attention_prefill_sparse T " + std::to_string(T) + " heads " +
                             std::to_string(H) + " k " + std::to_string(c.k) + (c.holes ? " with holes" : "");
    for (Backend* g : {gpu_.get(), gpu_inv_.get()}) {
      Tensor og = gpu_poisoned(*g, DType::BF16, {T, H, c.dv});
      g->mla_attention_prefill_sparse(gpu_float(*g, q, {T, H, c.dq}, DType::BF16),
                                      gpu_float(*g, kk, {T, H, c.dq}, DType::BF16),
                                      gpu_float(*g, v, {T, H, c.dv}, DType::BF16),
                                      gpu_copy(*g, cpu_i32(d.query_start, {S + 1})), static_cast<int>(S),
                                      gpu_copy(*g, cpu_i32(idx, {T, c.k})), scale, og);
      expect_close(download(*g, og), values(oc), kTolAttention, what + (g->batch_invariant() ? " (batch-invariant)" : ""));
    }
  }
}

}  // namespace
}  // namespace deepinfer::ops_test
