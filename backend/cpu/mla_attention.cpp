// MLA attention, two forms (fp32, two-pass softmax: scores, max, exp, sum, weighted V).
//  - mla_attention_paged: absorbed form. Every head of a token reads the same cached
//    latent rows [c_kv | k_rope] (MQA with K dim = row_dim, V = first v_dim values).
//  - mla_attention_prefill: direct form, per-head K and V of the step's own tokens.
// Both are causal and reduce over context positions in ascending order, one (token,
// head) at a time, so a token's output never depends on the rest of the batch.
// The *_sparse variants (DeepSeek-V3.2) run the same kernels over the positions a token's
// row of `indices` lists (ascending, as indexer_topk writes them) instead of all of them.
#include <algorithm>
#include <cstring>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace deepinfer::cpu {

Heads3 heads3(const Tensor& x, const char* what) {
  check_cpu(x, DType::F32, what);
  DI_CHECK(x.ndim == 3 && x.stride[2] == 1, what, ": expected F32 [tokens, heads, dim] with a "
           "contiguous last dimension, got ", x.describe());
  return {x.ptr<float>(), x.shape[0], x.shape[1], x.shape[2], x.stride[0], x.stride[1]};
}

std::vector<int32_t> token_seqs(const Tensor& query_start, int num_seqs, int64_t num_tokens,
                                const char* op) {
  check_cpu(query_start, DType::I32, op);
  DI_CHECK(query_start.numel() == num_seqs + 1, op, ": query_start ", query_start.describe(),
           " must have num_seqs + 1 = ", num_seqs + 1, " entries");
  const int32_t* qs = query_start.ptr<int32_t>();
  DI_CHECK(qs[0] == 0 && qs[num_seqs] == num_tokens, op, ": query_start must run from 0 to ",
           num_tokens, ", got ", qs[0], " .. ", qs[num_seqs]);
  std::vector<int32_t> seq(static_cast<size_t>(num_tokens));
  for (int s = 0; s < num_seqs; ++s) {
    DI_CHECK(qs[s] <= qs[s + 1], op, ": query_start decreases at sequence ", s);
    for (int32_t t = qs[s]; t < qs[s + 1]; ++t) seq[t] = s;
  }
  return seq;
}

PagedView check_paged(const PagedKV& kv, int64_t num_tokens, const char* op) {
  check_cpu(kv.cache, op);
  check_cpu(kv.block_tables, DType::I32, op);
  check_cpu(kv.seq_lens, DType::I32, op);
  DI_CHECK(kv.cache.ndim == 3 && kv.cache.is_contiguous() &&
               (kv.cache.dtype == DType::F32 || kv.cache.dtype == DType::BF16),
           op, ": cache must be contiguous F32/BF16 [blocks, block_size, row], got ",
           kv.cache.describe());
  PagedView v;
  v.row_dim = kv.cache.size(2);
  v.block_size = kv.cache.size(1);
  const int64_t num_blocks = kv.cache.size(0);
  const int S = kv.num_seqs;
  v.seq_of = token_seqs(kv.query_start, S, num_tokens, op);
  DI_CHECK(kv.seq_lens.numel() == S && kv.block_tables.ndim == 2 && kv.block_tables.size(0) == S &&
               kv.block_tables.is_contiguous(),
           op, ": seq_lens ", kv.seq_lens.describe(), " / block_tables ",
           kv.block_tables.describe(), " must have one entry/row per sequence (", S, ")");
  v.qs = kv.query_start.ptr<int32_t>();
  v.lens = kv.seq_lens.ptr<int32_t>();
  v.max_blocks = kv.block_tables.size(1);
  v.tables = kv.block_tables.ptr<int32_t>();
  for (int s = 0; s < S; ++s) {
    const int64_t q_len = v.qs[s + 1] - v.qs[s];
    DI_CHECK(v.lens[s] >= q_len && v.lens[s] <= v.max_blocks * v.block_size, op, ": seq_len ",
             v.lens[s], " of sequence ", s, " must cover its ", q_len, " new tokens and fit ",
             v.max_blocks, " blocks of ", v.block_size);
    for (int64_t b = 0; b < (v.lens[s] + v.block_size - 1) / v.block_size; ++b) {
      const int32_t id = v.tables[s * v.max_blocks + b];
      DI_CHECK(id >= 0 && id < num_blocks, op, ": block id ", id, " of sequence ", s,
               " outside the cache's ", num_blocks, " blocks");
    }
  }
  return v;
}

namespace {

// Heads of one token that share each cached row load (one task). Fewer tokens than threads
// (decode) split a token's heads over the threads instead, so every thread works: each
// (token, head) is computed alone in the same order either way, so the grouping never
// changes a result.
constexpr int64_t kHeadsPerTask = 8;

int64_t heads_per_task(int64_t tokens, int64_t heads, int threads) {
  const int64_t per = std::max<int64_t>(1, std::min(kHeadsPerTask, heads));
  if (tokens * ((heads + per - 1) / per) >= threads) return per;
  const int64_t groups = std::min(heads, (threads + tokens - 1) / tokens);  // per token
  return (heads + groups - 1) / groups;
}

// softmax over scores[0, n) in place: exp(s - max), returns the sum (ascending order).
float softmax_unnormalized(float* scores, int64_t n) {
  float m = -INFINITY;
  for (int64_t j = 0; j < n; ++j) m = std::max(m, scores[j]);
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    scores[j] = std::exp(scores[j] - m);
    sum += scores[j];
  }
  return sum;
}

// A sparse op's indices I32 [T, k]: every entry -1 or a position in [0, ctx(t)).
struct Selection {
  const int32_t* data = nullptr;  // nullptr: every causal position (the dense ops)
  int64_t k = 0;
};

template <typename Ctx>
Selection check_indices(const Tensor& indices, int64_t T, Ctx ctx, const char* op) {
  check_cpu(indices, DType::I32, op);
  DI_CHECK(indices.ndim == 2 && indices.size(0) == T && indices.is_contiguous(), op,
           ": indices ", indices.describe(), " must be contiguous I32 [", T, ", k]");
  Selection sel{indices.ptr<int32_t>(), indices.size(1)};
  for (int64_t t = 0; t < T; ++t) {
    const int64_t c = ctx(t);
    for (int64_t j = 0; j < sel.k; ++j) {
      const int32_t p = sel.data[t * sel.k + j];
      DI_CHECK(p == -1 || (p >= 0 && p < c), op, ": indices[", t, ", ", j, "] = ", p,
               " is not -1 or a causal position of token ", t, " (context ", c, ")");
    }
  }
  return sel;
}

// Positions token t attends: 0 .. ctx - 1, or its selected ones (-1 dropped) into `out`.
int64_t positions_of(const Selection& sel, int64_t t, int64_t ctx, std::vector<int32_t>& out) {
  out.clear();
  if (sel.data == nullptr) {
    for (int64_t j = 0; j < ctx; ++j) out.push_back(static_cast<int32_t>(j));
  } else {
    for (int64_t j = 0; j < sel.k; ++j) {
      if (sel.data[t * sel.k + j] >= 0) out.push_back(sel.data[t * sel.k + j]);
    }
  }
  return static_cast<int64_t>(out.size());
}

void paged_attention(ThreadPool& pool, const Tensor& q, const PagedKV& kv, const Tensor* indices,
                     float softmax_scale, int v_dim, Tensor& out, const char* op) {
  const Heads3 qv = heads3(q, op);
  const Heads3 ov = heads3(out, op);
  const PagedView pv = check_paged(kv, qv.T, op);
  const int64_t row_dim = pv.row_dim;
  DI_CHECK(qv.D == row_dim, op, ": q ", q.describe(), " must have the cache row dim ", row_dim);
  DI_CHECK(v_dim > 0 && v_dim <= row_dim && ov.T == qv.T && ov.H == qv.H && ov.D == v_dim, op,
           ": out ", out.describe(), " must be [", qv.T, ", ", qv.H, ", ", v_dim, "]");
  const Selection sel = indices == nullptr
                            ? Selection{}
                            : check_indices(*indices, qv.T, [&](int64_t t) { return pv.ctx(t); }, op);
  const bool bf16 = kv.cache.dtype == DType::BF16;
  const bool avx512 = cpu_has_avx512();  // 16-lane forms, the same bits
  const int64_t per_task = heads_per_task(qv.T, qv.H, pool.num_threads());
  const int64_t head_tasks = (qv.H + per_task - 1) / per_task;
  pool.parallel_for(qv.T * head_tasks, 1, [&](int64_t b, int64_t e) {
    std::vector<int32_t> pos;
    for (int64_t task = b; task < e; ++task) {
      const int64_t t = task / head_tasks;
      const int64_t h0 = (task % head_tasks) * per_task;
      const int64_t h1 = std::min(qv.H, h0 + per_task);
      const int64_t n = positions_of(sel, t, pv.ctx(t), pos);
      float* scores = scratch_floats(3, static_cast<size_t>((h1 - h0) * std::max<int64_t>(n, 1)));
      float* rowbuf = scratch_floats(4, static_cast<size_t>(4 * row_dim));
      // Cached row j (BF16 caches converted into buffer `buf` of 4).
      auto row = [&](int64_t j, int buf) -> const float* {
        const int64_t slot = pv.slot(t, pos[j]);
        if (!bf16) return kv.cache.ptr<float>() + slot * row_dim;
        row_to_float(kv.cache.ptr<uint16_t>() + slot * row_dim, DType::BF16, row_dim,
                     rowbuf + buf * row_dim);
        return rowbuf + buf * row_dim;
      };
      // Scores: four keys per pass, three heads sharing each key load (dot8x4x3_rows) or one
      // (dot8x4_rows): every score is still dot8(q_h, key) * scale, the one-at-a-time bits.
      int64_t j = 0;
      if (row_dim % 8 == 0) {
        for (; j + 4 <= n; j += 4) {
          const float* ks[4] = {row(j, 0), row(j + 1, 1), row(j + 2, 2), row(j + 3, 3)};
          int64_t h = h0;
          for (; h + 3 <= h1; h += 3) {
            const float* qs3[3] = {qv.at(t, h), qv.at(t, h + 1), qv.at(t, h + 2)};
            float* out3[3] = {scores + (h - h0) * n + j, scores + (h + 1 - h0) * n + j,
                              scores + (h + 2 - h0) * n + j};
            if (avx512) dot8x4x3_rows_avx512(qs3, ks, row_dim, out3);
            else dot8x4x3_rows(qs3, ks, row_dim, out3);
          }
          for (; h < h1; ++h)
            dot8x4_rows(qv.at(t, h), ks[0], ks[1], ks[2], ks[3], row_dim,
                        scores + (h - h0) * n + j);
          for (h = h0; h < h1; ++h)
            for (int i = 0; i < 4; ++i) scores[(h - h0) * n + j + i] *= softmax_scale;
        }
      }
      for (; j < n; ++j) {
        const float* r = row(j, 0);  // [row_dim] = [c_kv | k_rope]
        for (int64_t h = h0; h < h1; ++h) {
          scores[(h - h0) * n + j] = dot8(qv.at(t, h), r, row_dim) * softmax_scale;
        }
      }
      std::vector<float> inv_sum(static_cast<size_t>(h1 - h0));
      for (int64_t h = h0; h < h1; ++h) {
        inv_sum[h - h0] = n > 0 ? 1.0f / softmax_unnormalized(scores + (h - h0) * n, n) : 0.0f;
        std::fill(ov.at(t, h), ov.at(t, h) + v_dim, 0.0f);
      }
      // Values (V = r[0, v_dim)): four keys per axpy4, the bits of one axpy per key in order.
      for (j = 0; j + 4 <= n; j += 4) {
        const float* vs[4] = {row(j, 0), row(j + 1, 1), row(j + 2, 2), row(j + 3, 3)};
        for (int64_t h = h0; h < h1; ++h) {
          if (avx512) axpy4_avx512(scores + (h - h0) * n + j, vs[0], vs[1], vs[2], vs[3], ov.at(t, h), v_dim);
          else axpy4(scores + (h - h0) * n + j, vs[0], vs[1], vs[2], vs[3], ov.at(t, h), v_dim);
        }
      }
      for (; j < n; ++j) {
        const float* r = row(j, 0);
        for (int64_t h = h0; h < h1; ++h) axpy(scores[(h - h0) * n + j], r, ov.at(t, h), v_dim);
      }
      for (int64_t h = h0; h < h1; ++h) {
        float* o = ov.at(t, h);
        for (int64_t i = 0; i < v_dim; ++i) o[i] *= inv_sum[h - h0];
      }
    }
  });
}

// ctx_lens (I32 [num_seqs], or nullptr: each sequence's own tokens): the context of each
// sequence, k/v holding all of it (mla_attention_prefill_context's layout).
void prefill_attention(ThreadPool& pool, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& query_start, int num_seqs, const Tensor* indices,
                       float softmax_scale, Tensor& out, const char* op, const Tensor* ctx_lens = nullptr) {
  const Heads3 qv = heads3(q, op);
  const Heads3 kv = heads3(k, op);
  const Heads3 vv = heads3(v, op);
  const Heads3 ov = heads3(out, op);
  const std::vector<int32_t> seq_of = token_seqs(query_start, num_seqs, qv.T, op);
  const int32_t* qs = query_start.ptr<int32_t>();
  // Per sequence: first k/v row and the position of its first query.
  std::vector<int64_t> kv_first(static_cast<size_t>(num_seqs)), q_pos0(static_cast<size_t>(num_seqs));
  int64_t N = 0;
  if (ctx_lens != nullptr) check_cpu(*ctx_lens, DType::I32, op);
  DI_CHECK(ctx_lens == nullptr || ctx_lens->numel() == num_seqs, op, ": seq_lens ",
           ctx_lens == nullptr ? std::string() : ctx_lens->describe(), " must have ", num_seqs, " entries");
  for (int s = 0; s < num_seqs; ++s) {
    const int64_t q_len = qs[s + 1] - qs[s];
    const int64_t len = ctx_lens == nullptr ? q_len : ctx_lens->ptr<int32_t>()[s];
    DI_CHECK(len >= q_len, op, ": seq_len ", len, " of sequence ", s, " is below its ", q_len, " new tokens");
    kv_first[s] = N;
    q_pos0[s] = len - q_len;
    N += len;
  }
  DI_CHECK(kv.T == N && kv.H == qv.H && kv.D == qv.D && vv.T == N && vv.H == qv.H &&
               ov.T == qv.T && ov.H == qv.H && ov.D == vv.D,
           op, ": q ", q.describe(), ", k ", k.describe(), ", v ", v.describe(), ", out ",
           out.describe(), " must agree in heads and dims, k and v with ", N, " context rows");
  // Causal: query t sees its sequence's positions up to its own.
  auto ctx = [&](int64_t t) { return q_pos0[seq_of[t]] + t - qs[seq_of[t]] + 1; };
  const Selection sel = indices == nullptr ? Selection{} : check_indices(*indices, qv.T, ctx, op);
  const int64_t v_dim = vv.D;
  const bool avx512 = cpu_has_avx512();  // 16-lane forms, the same bits
  // finish normalizes one query's scores and sums the values: axpy4 / axpy, the same products
  // and sums in the same order as one axpy per key. finish_from sums from key j on, with o
  // already holding keys [0, j) in those blocks (softmax and zeroing done).
  auto finish_from = [&](int64_t t, int64_t h, float* scores, int64_t n, auto value, int64_t j,
                         float inv_sum) {
    float* o = ov.at(t, h);
    for (; j + 4 <= n; j += 4) {
      if (avx512) axpy4_avx512(scores + j, value(j), value(j + 1), value(j + 2), value(j + 3), o, v_dim);
      else axpy4(scores + j, value(j), value(j + 1), value(j + 2), value(j + 3), o, v_dim);
    }
    for (; j < n; ++j) axpy(scores[j], value(j), o, v_dim);
    for (int64_t i = 0; i < v_dim; ++i) o[i] *= inv_sum;
  };
  auto finish = [&](int64_t t, int64_t h, float* scores, int64_t n, auto value) {
    const float inv_sum = n > 0 ? 1.0f / softmax_unnormalized(scores, n) : 0.0f;
    std::fill(ov.at(t, h), ov.at(t, h) + v_dim, 0.0f);
    finish_from(t, h, scores, n, value, 0, inv_sum);
  };
  if (sel.data == nullptr && qv.D % 8 == 0) {
    // Dense causal: a group of consecutive queries of one sequence shares each key load (six
    // on AVX-512, pair-interleaved: dot8x4_qpairs_avx512; else three: dot8x4x3_rows) and each
    // value load (axpy4_rows_avx512); every score is still dot8(q, k) * scale and every output
    // the blocks of `finish`, so the bits are the one-query-at-a-time bits. Query t sees keys
    // first .. t: the group's first query's keys are common, the later ones add one key each.
    const int64_t gq = avx512 ? 6 : 3;
    std::vector<int64_t> groups;  // first token of each group
    for (int s = 0; s < num_seqs; ++s)
      for (int64_t t = qs[s]; t < qs[s + 1]; t += gq) groups.push_back(t);
    const int64_t G = static_cast<int64_t>(groups.size());
    const int64_t D = qv.D;
    pool.parallel_for(G * qv.H, 1, [&](int64_t b, int64_t e) {
      for (int64_t task = b; task < e; ++task) {
        const int64_t t0 = groups[task / qv.H], h = task % qv.H;
        const int64_t end = qs[seq_of[t0] + 1], cnt = std::min<int64_t>(gq, end - t0);
        const int64_t first = kv_first[seq_of[t0]], n0 = ctx(t0), stride = n0 + gq - 1;
        float* sc = scratch_floats(3, static_cast<size_t>(gq * stride));
        float* srow[6];
        const float* qr[6];
        for (int64_t r = 0; r < gq; ++r) {
          srow[r] = sc + r * stride;
          qr[r] = qv.at(t0 + std::min<int64_t>(r, cnt - 1), h);  // pad: repeat the last
        }
        auto key = [&](int64_t j) { return kv.at(first + j, h); };
        int64_t j = 0;
        if (avx512) {
          float* qp = scratch_floats(6, static_cast<size_t>(6 * D));  // [3][D / 8][16]
          for (int p = 0; p < 3; ++p)
            for (int64_t c = 0; c < D; c += 8) {
              std::memcpy(qp + p * 2 * D + 2 * c, qr[2 * p] + c, 32);
              std::memcpy(qp + p * 2 * D + 2 * c + 8, qr[2 * p + 1] + c, 32);
            }
          for (; j + 4 <= n0; j += 4) {
            const float* ks[4] = {key(j), key(j + 1), key(j + 2), key(j + 3)};
            float* out6[6];
            for (int r = 0; r < 6; ++r) out6[r] = srow[r] + j;
            dot8x4_qpairs_avx512(qp, ks, D, out6);
          }
        } else {
          for (; j + 4 <= n0; j += 4) {
            const float* ks[4] = {key(j), key(j + 1), key(j + 2), key(j + 3)};
            float* out3[3] = {srow[0] + j, srow[1] + j, srow[2] + j};
            dot8x4x3_rows(qr, ks, D, out3);
          }
        }
        auto value = [&](int64_t i) { return vv.at(first + i, h); };
        float inv_sum[6];
        for (int64_t r = 0; r < cnt; ++r) {
          const int64_t n = n0 + r;
          for (int64_t i = 0; i < j; ++i) srow[r][i] *= softmax_scale;
          for (int64_t i = j; i < n; ++i) srow[r][i] = dot8(qr[r], key(i), D) * softmax_scale;
          inv_sum[r] = n > 0 ? 1.0f / softmax_unnormalized(srow[r], n) : 0.0f;
          std::fill(ov.at(t0 + r, h), ov.at(t0 + r, h) + v_dim, 0.0f);
        }
        // Values: the common keys [0, n0) in blocks of four, each value row loaded once per
        // three queries, then each query's own blocks and keys on from there.
        int64_t common = 0;
        if (avx512 && cnt > 1) {
          float* ys[6];
          for (int64_t r = 0; r < cnt; ++r) ys[r] = ov.at(t0 + r, h);
          for (; common + 4 <= n0; common += 4) {
            const float* al[6];
            for (int64_t r = 0; r < cnt; ++r) al[r] = srow[r] + common;
            for (int64_t r0 = 0; r0 < cnt; r0 += 3)
              axpy4_rows_avx512(al + r0, static_cast<int>(std::min<int64_t>(3, cnt - r0)), value(common),
                                value(common + 1), value(common + 2), value(common + 3), ys + r0, v_dim);
          }
        }
        for (int64_t r = 0; r < cnt; ++r)
          finish_from(t0 + r, h, srow[r], n0 + r, value, common, inv_sum[r]);
      }
    });
    return;
  }
  pool.parallel_for(qv.T * qv.H, 1, [&](int64_t b, int64_t e) {
    std::vector<int32_t> pos;
    for (int64_t task = b; task < e; ++task) {
      const int64_t t = task / qv.H, h = task % qv.H;
      const int64_t first = kv_first[seq_of[t]];
      const int64_t n = positions_of(sel, t, ctx(t), pos);
      float* scores = scratch_floats(3, static_cast<size_t>(std::max<int64_t>(n, 1)));
      // Four keys per pass (dot8x4_rows, axpy4): the same products and sums, in the same
      // order, as one dot8 / axpy per key.
      const float* qrow = qv.at(t, h);
      auto key = [&](int64_t j) { return kv.at(first + pos[j], h); };
      auto value = [&](int64_t j) { return vv.at(first + pos[j], h); };
      int64_t j = 0;
      if (qv.D % 8 == 0) {
        for (; j + 4 <= n; j += 4) {
          dot8x4_rows(qrow, key(j), key(j + 1), key(j + 2), key(j + 3), qv.D, scores + j);
          for (int i = 0; i < 4; ++i) scores[j + i] *= softmax_scale;
        }
      }
      for (; j < n; ++j) scores[j] = dot8(qrow, key(j), qv.D) * softmax_scale;
      finish(t, h, scores, n, value);
    }
  });
}

}  // namespace

void CpuBackend::mla_attention_paged(const Tensor& q, const PagedKV& kv, float softmax_scale,
                                     int v_dim, Tensor& out) {
  paged_attention(*pool_, q, kv, nullptr, softmax_scale, v_dim, out, "mla_attention_paged");
}

void CpuBackend::mla_attention_paged_sparse(const Tensor& q, const PagedKV& kv,
                                            const Tensor& indices, float softmax_scale, int v_dim,
                                            Tensor& out) {
  paged_attention(*pool_, q, kv, &indices, softmax_scale, v_dim, out, "mla_attention_paged_sparse");
}

void CpuBackend::mla_attention_prefill(const Tensor& q, const Tensor& k, const Tensor& v,
                                       const Tensor& query_start, int num_seqs,
                                       float softmax_scale, Tensor& out) {
  prefill_attention(*pool_, q, k, v, query_start, num_seqs, nullptr, softmax_scale, out,
                    "mla_attention_prefill");
}

void CpuBackend::mla_attention_prefill_context(const Tensor& q, const Tensor& k, const Tensor& v,
                                               const PagedKV& kv, float softmax_scale, Tensor& out) {
  prefill_attention(*pool_, q, k, v, kv.query_start, kv.num_seqs, nullptr, softmax_scale, out,
                    "mla_attention_prefill_context", &kv.seq_lens);
}

void CpuBackend::kv_gather(const PagedKV& kv, Tensor& rows) {
  const char* op = "kv_gather";
  check_cpu(kv.query_start, DType::I32, op);
  DI_CHECK(kv.query_start.numel() == kv.num_seqs + 1, op, ": query_start ", kv.query_start.describe(),
           " for ", kv.num_seqs, " sequences");
  const PagedView pv = check_paged(kv, kv.query_start.ptr<int32_t>()[kv.num_seqs], op);
  check_cpu(rows, DType::F32, op);
  int64_t N = 0;
  for (int s = 0; s < kv.num_seqs; ++s) N += pv.lens[s];
  DI_CHECK(rows.ndim == 2 && rows.size(0) == N && rows.size(1) == pv.row_dim && rows.stride[1] == 1, op,
           ": rows ", rows.describe(), " must be [", N, " context rows, ", pv.row_dim, "]");
  const bool bf16 = kv.cache.dtype == DType::BF16;
  int64_t r = 0;
  for (int s = 0; s < kv.num_seqs; ++s) {
    for (int64_t p = 0; p < pv.lens[s]; ++p, ++r) {
      const int64_t slot = int64_t{pv.tables[s * pv.max_blocks + p / pv.block_size]} * pv.block_size + p % pv.block_size;
      float* dst = rows.ptr<float>() + r * rows.stride[0];
      for (int64_t c = 0; c < pv.row_dim; ++c)
        dst[c] = bf16 ? bf16_to_float(kv.cache.ptr<uint16_t>()[slot * pv.row_dim + c])
                      : kv.cache.ptr<float>()[slot * pv.row_dim + c];
    }
  }
}

void CpuBackend::mla_attention_prefill_sparse(const Tensor& q, const Tensor& k, const Tensor& v,
                                              const Tensor& query_start, int num_seqs,
                                              const Tensor& indices, float softmax_scale,
                                              Tensor& out) {
  prefill_attention(*pool_, q, k, v, query_start, num_seqs, &indices, softmax_scale, out,
                    "mla_attention_prefill_sparse");
}

}  // namespace deepinfer::cpu
