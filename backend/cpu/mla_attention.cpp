// MLA attention, two forms (fp32, two-pass softmax: scores, max, exp, sum, weighted V).
//  - mla_attention_paged: absorbed form. Every head of a token reads the same cached
//    latent rows [c_kv | k_rope] (MQA with K dim = row_dim, V = first v_dim values).
//  - mla_attention_prefill: direct form, per-head K and V of the step's own tokens.
// Both are causal and reduce over context positions in ascending order, one (token,
// head) at a time, so a token's output never depends on the rest of the batch.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace deepinfer::cpu {
namespace {

constexpr int64_t kHeadsPerTask = 8;

// A [T, H, D] view with a contiguous last dimension and any other strides.
struct Heads3 {
  float* base = nullptr;
  int64_t T = 0, H = 0, D = 0, st = 0, sh = 0;
  float* at(int64_t t, int64_t h) const { return base + t * st + h * sh; }
};

Heads3 heads3(const Tensor& x, const char* what) {
  check_cpu(x, DType::F32, what);
  DI_CHECK(x.ndim == 3 && x.stride[2] == 1, what, ": expected F32 [tokens, heads, dim] with a "
           "contiguous last dimension, got ", x.describe());
  return {x.ptr<float>(), x.shape[0], x.shape[1], x.shape[2], x.stride[0], x.stride[1]};
}

// Checks query_start [num_seqs + 1] (monotone, from 0 to num_tokens) and returns the
// sequence of every token.
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

}  // namespace

void CpuBackend::mla_attention_paged(const Tensor& q, const PagedKV& kv, float softmax_scale,
                                     int v_dim, Tensor& out) {
  const Heads3 qv = heads3(q, "mla_attention_paged q");
  const Heads3 ov = heads3(out, "mla_attention_paged out");
  check_cpu(kv.cache, "mla_attention_paged cache");
  check_cpu(kv.block_tables, DType::I32, "mla_attention_paged block_tables");
  check_cpu(kv.seq_lens, DType::I32, "mla_attention_paged seq_lens");
  DI_CHECK(kv.cache.ndim == 3 && kv.cache.is_contiguous() &&
               (kv.cache.dtype == DType::F32 || kv.cache.dtype == DType::BF16),
           "mla_attention_paged: cache must be contiguous F32/BF16 [blocks, block_size, row], got ",
           kv.cache.describe());
  const int64_t row_dim = kv.cache.size(2), block_size = kv.cache.size(1);
  const int64_t num_blocks = kv.cache.size(0);
  DI_CHECK(qv.D == row_dim, "mla_attention_paged: q ", q.describe(), " must have the cache row dim ",
           row_dim);
  DI_CHECK(v_dim > 0 && v_dim <= row_dim && ov.T == qv.T && ov.H == qv.H && ov.D == v_dim,
           "mla_attention_paged: out ", out.describe(), " must be [", qv.T, ", ", qv.H, ", ", v_dim,
           "]");
  const int S = kv.num_seqs;
  const std::vector<int32_t> seq_of = token_seqs(kv.query_start, S, qv.T, "mla_attention_paged");
  DI_CHECK(kv.seq_lens.numel() == S && kv.block_tables.ndim == 2 && kv.block_tables.size(0) == S &&
               kv.block_tables.is_contiguous(),
           "mla_attention_paged: seq_lens ", kv.seq_lens.describe(), " / block_tables ",
           kv.block_tables.describe(), " must have one entry/row per sequence (", S, ")");
  const int32_t* qs = kv.query_start.ptr<int32_t>();
  const int32_t* lens = kv.seq_lens.ptr<int32_t>();
  const int64_t max_blocks = kv.block_tables.size(1);
  const int32_t* tables = kv.block_tables.ptr<int32_t>();
  for (int s = 0; s < S; ++s) {
    const int64_t q_len = qs[s + 1] - qs[s];
    DI_CHECK(lens[s] >= q_len && lens[s] <= max_blocks * block_size, "mla_attention_paged: seq_len ",
             lens[s], " of sequence ", s, " must cover its ", q_len, " new tokens and fit ",
             max_blocks, " blocks of ", block_size);
    for (int64_t b = 0; b < (lens[s] + block_size - 1) / block_size; ++b) {
      const int32_t id = tables[s * max_blocks + b];
      DI_CHECK(id >= 0 && id < num_blocks, "mla_attention_paged: block id ", id, " of sequence ",
               s, " outside the cache's ", num_blocks, " blocks");
    }
  }
  const bool bf16 = kv.cache.dtype == DType::BF16;
  const int64_t head_tasks = (qv.H + kHeadsPerTask - 1) / kHeadsPerTask;
  pool_->parallel_for(qv.T * head_tasks, 1, [&](int64_t b, int64_t e) {
    for (int64_t task = b; task < e; ++task) {
      const int64_t t = task / head_tasks;
      const int64_t h0 = (task % head_tasks) * kHeadsPerTask;
      const int64_t h1 = std::min(qv.H, h0 + kHeadsPerTask);
      const int s = seq_of[t];
      // Causal: token t sits at position seq_len - q_len + (t - query_start).
      const int64_t ctx = lens[s] - (qs[s + 1] - qs[s]) + (t - qs[s]) + 1;
      float* scores = scratch_floats(3, static_cast<size_t>((h1 - h0) * ctx));  // [heads, ctx]
      float* rowbuf = scratch_floats(4, static_cast<size_t>(row_dim));
      auto row = [&](int64_t j) -> const float* {
        const int64_t block = tables[s * max_blocks + j / block_size];
        const int64_t slot = block * block_size + j % block_size;
        if (!bf16) return kv.cache.ptr<float>() + slot * row_dim;
        row_to_float(kv.cache.ptr<uint16_t>() + slot * row_dim, DType::BF16, row_dim, rowbuf);
        return rowbuf;
      };
      for (int64_t j = 0; j < ctx; ++j) {
        const float* r = row(j);  // [row_dim] = [c_kv | k_rope]
        for (int64_t h = h0; h < h1; ++h) {
          scores[(h - h0) * ctx + j] = dot8(qv.at(t, h), r, row_dim) * softmax_scale;
        }
      }
      std::vector<float> inv_sum(static_cast<size_t>(h1 - h0));
      for (int64_t h = h0; h < h1; ++h) {
        inv_sum[h - h0] = 1.0f / softmax_unnormalized(scores + (h - h0) * ctx, ctx);
        std::fill(ov.at(t, h), ov.at(t, h) + v_dim, 0.0f);
      }
      for (int64_t j = 0; j < ctx; ++j) {
        const float* r = row(j);  // V = r[0, v_dim)
        for (int64_t h = h0; h < h1; ++h) axpy(scores[(h - h0) * ctx + j], r, ov.at(t, h), v_dim);
      }
      for (int64_t h = h0; h < h1; ++h) {
        float* o = ov.at(t, h);
        for (int64_t i = 0; i < v_dim; ++i) o[i] *= inv_sum[h - h0];
      }
    }
  });
}

void CpuBackend::mla_attention_prefill(const Tensor& q, const Tensor& k, const Tensor& v,
                                       const Tensor& query_start, int num_seqs,
                                       float softmax_scale, Tensor& out) {
  const Heads3 qv = heads3(q, "mla_attention_prefill q");
  const Heads3 kv = heads3(k, "mla_attention_prefill k");
  const Heads3 vv = heads3(v, "mla_attention_prefill v");
  const Heads3 ov = heads3(out, "mla_attention_prefill out");
  DI_CHECK(kv.T == qv.T && kv.H == qv.H && kv.D == qv.D && vv.T == qv.T && vv.H == qv.H &&
               ov.T == qv.T && ov.H == qv.H && ov.D == vv.D,
           "mla_attention_prefill: q ", q.describe(), ", k ", k.describe(), ", v ", v.describe(),
           ", out ", out.describe(), " must agree in tokens, heads and dims");
  const std::vector<int32_t> seq_of =
      token_seqs(query_start, num_seqs, qv.T, "mla_attention_prefill");
  const int32_t* qs = query_start.ptr<int32_t>();
  const int64_t v_dim = vv.D;
  pool_->parallel_for(qv.T * qv.H, 1, [&](int64_t b, int64_t e) {
    for (int64_t task = b; task < e; ++task) {
      const int64_t t = task / qv.H, h = task % qv.H;
      const int64_t first = qs[seq_of[t]];
      const int64_t ctx = t - first + 1;  // causal within the sequence
      float* scores = scratch_floats(3, static_cast<size_t>(ctx));
      for (int64_t j = 0; j < ctx; ++j) {
        scores[j] = dot8(qv.at(t, h), kv.at(first + j, h), qv.D) * softmax_scale;
      }
      const float inv_sum = 1.0f / softmax_unnormalized(scores, ctx);
      float* o = ov.at(t, h);
      std::fill(o, o + v_dim, 0.0f);
      for (int64_t j = 0; j < ctx; ++j) axpy(scores[j], vv.at(first + j, h), o, v_dim);
      for (int64_t i = 0; i < v_dim; ++i) o[i] *= inv_sum;
    }
  });
}

}  // namespace deepinfer::cpu
