// DeepSeek-V3.2's lightning indexer on the CPU (the reference): scores of every causal
// position against the paged key cache, then the top-k positions of each token.
//  - indexer_scores: per (token, position) the heads are summed in ascending order; each
//    head's q . k is dot8 (fixed lanes), so a score depends only on its token's q/weights
//    and the key, never on the batch or chunking.
//  - indexer_topk: an exact selection with a total order (score descending, then position
//    ascending; a NaN score ranks below every number), written back in ascending position
//    order so sparse attention reduces in the same order as the dense ops.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace deepinfer::cpu {

void CpuBackend::indexer_scores(const Tensor& q, const Tensor& weights, const PagedKV& kv,
                                float scale, Tensor& scores) {
  const char* op = "indexer_scores";
  const Heads3 qv = heads3(q, "indexer_scores q");
  const PagedView pv = check_paged(kv, qv.T, op);
  DI_CHECK(pv.row_dim == qv.D, op, ": key cache ", kv.cache.describe(), " rows must have q's head dim ",
           qv.D);
  const Rows w = as_rows(weights, "indexer_scores weights");
  DI_CHECK(w.dtype == DType::F32 && w.rows == qv.T && w.cols == qv.H, op, ": weights ",
           weights.describe(), " must be F32 [", qv.T, ", ", qv.H, "]");
  const Rows out = as_rows(scores, "indexer_scores scores");
  int64_t max_ctx = 0;
  for (int64_t t = 0; t < qv.T; ++t) max_ctx = std::max(max_ctx, pv.ctx(t));
  DI_CHECK(out.dtype == DType::F32 && out.rows == qv.T && out.cols >= max_ctx, op, ": scores ",
           scores.describe(), " must be F32 [", qv.T, ", >= ", max_ctx, "] (the longest context)");
  const bool bf16 = kv.cache.dtype == DType::BF16;
  const int64_t D = qv.D, H = qv.H;
  pool_->parallel_for(qv.T, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      float* keybuf = scratch_floats(4, static_cast<size_t>(D));
      const float* wt = w.f32(t);
      float* o = out.f32(t);
      const int64_t ctx = pv.ctx(t);
      for (int64_t j = 0; j < ctx; ++j) {
        const int64_t slot = pv.slot(t, j);
        const float* key = kv.cache.ptr<float>() + slot * D;
        if (bf16) {
          row_to_float(kv.cache.ptr<uint16_t>() + slot * D, DType::BF16, D, keybuf);
          key = keybuf;
        }
        float s = 0.0f;
        for (int64_t h = 0; h < H; ++h) {
          const float d = dot8(qv.at(t, h), key, D);
          if (d > 0.0f) s += (wt[h] * scale) * d;  // ReLU
        }
        o[j] = s;
      }
      std::fill(o + ctx, o + out.cols, -std::numeric_limits<float>::infinity());
    }
  });
}

void CpuBackend::indexer_topk(const Tensor& scores, const PagedKV& kv, Tensor& indices) {
  const char* op = "indexer_topk";
  const Rows sc = as_rows(scores, "indexer_topk scores");
  check_cpu(indices, DType::I32, "indexer_topk indices");
  DI_CHECK(sc.dtype == DType::F32 && indices.ndim == 2 && indices.size(0) == sc.rows &&
               indices.is_contiguous() && indices.size(1) > 0,
           op, ": scores ", scores.describe(), " (F32 [T, N]) and indices ", indices.describe(),
           " (contiguous I32 [T, k], k > 0) do not fit");
  const std::vector<int32_t> seq_of = token_seqs(kv.query_start, kv.num_seqs, sc.rows, op);
  check_cpu(kv.seq_lens, DType::I32, "indexer_topk seq_lens");
  DI_CHECK(kv.seq_lens.numel() == kv.num_seqs, op, ": seq_lens ", kv.seq_lens.describe(),
           " must have one entry per sequence (", kv.num_seqs, ")");
  const int32_t* qs = kv.query_start.ptr<int32_t>();
  const int32_t* lens = kv.seq_lens.ptr<int32_t>();
  const int64_t k = indices.size(1);
  for (int s = 0; s < kv.num_seqs; ++s) {
    DI_CHECK(lens[s] >= qs[s + 1] - qs[s] && lens[s] <= sc.cols, op, ": seq_len ", lens[s],
             " of sequence ", s, " must cover its new tokens and fit the ", sc.cols, " score columns");
  }
  int32_t* out = indices.ptr<int32_t>();
  pool_->parallel_for(sc.rows, 1, [&](int64_t b, int64_t e) {
    std::vector<int32_t> order;
    for (int64_t t = b; t < e; ++t) {
      const int s = seq_of[t];
      const int64_t ctx = lens[s] - (qs[s + 1] - qs[s]) + (t - qs[s]) + 1;
      int32_t* row = out + t * k;
      order.resize(static_cast<size_t>(ctx));
      for (int64_t j = 0; j < ctx; ++j) order[j] = static_cast<int32_t>(j);
      if (ctx > k) {
        const float* v = sc.f32(t);
        auto key = [&](int32_t j) {
          return std::isnan(v[j]) ? -std::numeric_limits<float>::infinity() : v[j];
        };
        // Better first: higher score, then lower position (a strict total order).
        auto better = [&](int32_t a, int32_t c) {
          const float ka = key(a), kc = key(c);
          return ka != kc ? ka > kc : a < c;
        };
        std::nth_element(order.begin(), order.begin() + (k - 1), order.end(), better);
        order.resize(static_cast<size_t>(k));
        std::sort(order.begin(), order.end());
      }
      const int64_t n = static_cast<int64_t>(order.size());
      std::copy(order.begin(), order.end(), row);
      std::fill(row + n, row + k, -1);
    }
  });
}

}  // namespace deepinfer::cpu
