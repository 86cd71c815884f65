// compressor_pool and indexer_topk: DeepSeek-V4's KV compressors (CSA with overlapping
// windows, HCA without) and the lightning indexer's top-k (host reference; backend.h).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/v4_common.h"

namespace deepinfer {

namespace {

// Softmax over slots of logits lg, weighted sum of val (double accumulation, slot order); 0
// without slots.
float pool_slots(const float* lg, const float* val, int64_t slots) {
  if (slots == 0) return 0.0f;
  float m = -INFINITY;
  for (int64_t s = 0; s < slots; ++s) m = std::fmax(m, lg[s]);
  double denom = 0.0, acc = 0.0;
  for (int64_t s = 0; s < slots; ++s) {
    const double e = std::exp(static_cast<double>(lg[s] - m));
    denom += e;
    acc += e * val[s];
  }
  return static_cast<float>(acc / denom);
}

struct PoolShape {
  int64_t rows, C, D;
};

// kv and gate host rows [rows, C] (row-strided views), ape [ratio, C]: their shape, D = C / 2
// with overlap (C otherwise).
PoolShape check_pool_inputs(const Tensor& kv, const Tensor& gate, const Tensor& ape, int ratio, bool overlap,
                            const char* op) {
  DI_CHECK(ratio > 0, op, ": ratio must be > 0, got ", ratio);
  DI_CHECK(kv.ndim == 2, op, ": kv must be [rows, C], got ", kv.describe());
  const int64_t rows = kv.size(0), C = kv.size(1);
  DI_CHECK(!overlap || C % 2 == 0, op, ": overlapping kv needs an even width, got ", kv.describe());
  v4_ops::check_host_rows(kv, DType::F32, {rows, C}, op, "kv");
  v4_ops::check_host_rows(gate, DType::F32, {rows, C}, op, "gate");
  v4_ops::check_host(ape, DType::F32, {ratio, C}, op, "ape");
  return {rows, C, overlap ? C / 2 : C};
}

}  // namespace

void Backend::compressor_pool(const Tensor& kv, const Tensor& gate, const Tensor& ape, int ratio, bool overlap,
                              const Tensor& prior_kv, const Tensor& prior_gate, Tensor& out) {
  using v4_ops::check_host;
  const PoolShape ps = check_pool_inputs(kv, gate, ape, ratio, overlap, "compressor_pool");
  const int64_t T = ps.rows, C = ps.C, D = ps.D, r = ratio, n = T / r;
  check_host(out, DType::F32, {n, D}, "compressor_pool", "out");
  const bool prior = prior_kv.defined();
  DI_CHECK(!prior || overlap, "compressor_pool: prior rows are only for overlapping windows");
  if (prior) {
    check_host(prior_kv, DType::F32, {r, D}, "compressor_pool", "prior_kv");
    check_host(prior_gate, DType::F32, {r, D}, "compressor_pool", "prior_gate");
  }
  const float* K = kv.ptr<const float>();
  const float* G = gate.ptr<const float>();
  const float* A = ape.ptr<const float>();
  const int64_t ldk = T > 1 ? kv.stride[0] : C, ldg = T > 1 ? gate.stride[0] : C;
  std::vector<float> lg(static_cast<size_t>(2 * r)), val(static_cast<size_t>(2 * r));
  for (int64_t w = 0; w < n; ++w) {
    for (int64_t c = 0; c < D; ++c) {
      int64_t slots = 0;
      if (overlap) {
        for (int64_t j = 0; j < r; ++j) {  // previous window's first halves
          if (w > 0) {
            const int64_t src = (w - 1) * r + j;
            lg[slots] = G[src * ldg + c] + A[j * C + c];
            val[slots++] = K[src * ldk + c];
          } else if (prior) {
            lg[slots] = prior_gate.ptr<const float>()[j * D + c];
            val[slots++] = prior_kv.ptr<const float>()[j * D + c];
          }
        }
      }
      const int64_t off = overlap ? D : 0;
      for (int64_t j = 0; j < r; ++j) {
        const int64_t src = w * r + j;
        lg[slots] = G[src * ldg + off + c] + A[j * C + off + c];
        val[slots++] = K[src * ldk + off + c];
      }
      out.ptr<float>()[w * D + c] = pool_slots(lg.data(), val.data(), slots);
    }
  }
}

void Backend::compressor_pool_rows(const Tensor& kv, const Tensor& gate, const Tensor& ape, const Tensor& row_ids,
                                   int ratio, bool overlap, Tensor& out) {
  using v4_ops::check_host;
  const PoolShape ps = check_pool_inputs(kv, gate, ape, ratio, overlap, "compressor_pool_rows");
  DI_CHECK(row_ids.ndim == 2, "compressor_pool_rows: row_ids must be [n, slots], got ", row_ids.describe());
  const int64_t R = ps.rows, C = ps.C, D = ps.D, r = ratio, n = row_ids.size(0), slots = overlap ? 2 * r : r;
  check_host(row_ids, DType::I32, {n, slots}, "compressor_pool_rows", "row_ids");
  check_host(out, DType::F32, {n, D}, "compressor_pool_rows", "out");
  const int32_t* ids = row_ids.ptr<const int32_t>();
  for (int64_t i = 0; i < n * slots; ++i)
    DI_CHECK(ids[i] >= -1 && ids[i] < R, "compressor_pool_rows: row id ", ids[i], " at ", i, " outside [-1, ", R, ")");
  const float* K = kv.ptr<const float>();
  const float* G = gate.ptr<const float>();
  const float* A = ape.ptr<const float>();
  const int64_t ldk = R > 1 ? kv.stride[0] : C, ldg = R > 1 ? gate.stride[0] : C;
  std::vector<float> lg(static_cast<size_t>(slots)), val(static_cast<size_t>(slots));
  for (int64_t w = 0; w < n; ++w) {
    for (int64_t c = 0; c < D; ++c) {
      int64_t used = 0;
      for (int64_t s = 0; s < slots; ++s) {
        const int64_t src = ids[w * slots + s];
        if (src < 0) continue;
        const int64_t j = s % r, col = overlap && s >= r ? D + c : c;
        lg[used] = G[src * ldg + col] + A[j * C + col];
        val[used++] = K[src * ldk + col];
      }
      out.ptr<float>()[w * D + c] = pool_slots(lg.data(), val.data(), used);
    }
  }
}

namespace {

// Row t of the lightning indexer's scores: score[s] for the keys s < visible (returned).
int64_t indexer_score_row(const Tensor& q, const Tensor& keys, const Tensor& weights, const Tensor& positions,
                          int64_t t, int ratio, float softmax_scale, float weights_scale, float* score) {
  const int64_t heads = q.size(1), d = q.size(2), S = keys.size(keys.ndim - 2);
  const float* key_rows = keys.ptr<const float>() + (keys.ndim == 3 ? t * S * d : 0);  // [T, S, d]: query t's own
  const int64_t visible = std::max<int64_t>(0, std::min<int64_t>(S, (positions.ptr<const int32_t>()[t] + 1) / ratio));
  for (int64_t s = 0; s < visible; ++s) {
    double total = 0.0;
    for (int64_t h = 0; h < heads; ++h) {
      const float* qv = q.ptr<const float>() + (t * heads + h) * d;
      const float* kv = key_rows + s * d;
      double dot = 0.0;
      for (int64_t i = 0; i < d; ++i) dot += static_cast<double>(qv[i]) * kv[i];
      const float relu = std::fmax(static_cast<float>(dot), 0.0f) * softmax_scale;
      total += static_cast<double>(relu) * (weights.ptr<const float>()[t * heads + h] * weights_scale);
    }
    score[s] = static_cast<float>(total);
  }
  return visible;
}

void check_indexer_args(const Tensor& q, const Tensor& keys, const Tensor& weights, const Tensor& positions,
                        int ratio, const char* op) {
  using v4_ops::check_host;
  DI_CHECK(q.ndim == 3 && (keys.ndim == 2 || keys.ndim == 3), op,
           ": q [T, heads, d], keys [S, d] or [T, S, d] expected, got ", q.describe(), ", ", keys.describe());
  const int64_t T = q.size(0), heads = q.size(1), d = q.size(2), S = keys.size(keys.ndim - 2);
  DI_CHECK(ratio > 0, op, ": ratio must be > 0, got ", ratio);
  check_host(q, DType::F32, {T, heads, d}, op, "q");
  if (keys.ndim == 3)
    check_host(keys, DType::F32, {T, S, d}, op, "keys");
  else
    check_host(keys, DType::F32, {S, d}, op, "keys");
  check_host(weights, DType::F32, {T, heads}, op, "weights");
  check_host(positions, DType::I32, {T}, op, "positions");
}

// The (up to) k entries of highest score among score[0, n) into out[0, k) (ties: lowest index;
// -1 past the last), skipping -inf.
void top_of_row(const float* score, int64_t n, int64_t k, std::vector<int32_t>& order, int32_t* out) {
  order.clear();
  for (int64_t s = 0; s < n; ++s)
    if (score[s] > -INFINITY) order.push_back(static_cast<int32_t>(s));
  const int64_t keep = std::min<int64_t>(k, static_cast<int64_t>(order.size()));
  std::partial_sort(order.begin(), order.begin() + keep, order.end(), [&](int32_t a, int32_t b) {
    return score[a] != score[b] ? score[a] > score[b] : a < b;
  });
  for (int64_t j = 0; j < k; ++j) out[j] = j < keep ? order[static_cast<size_t>(j)] : -1;
}

}  // namespace

void Backend::indexer_topk(const Tensor& q, const Tensor& keys, const Tensor& weights, const Tensor& positions,
                           int ratio, float softmax_scale, float weights_scale, Tensor& out) {
  check_indexer_args(q, keys, weights, positions, ratio, "indexer_topk");
  DI_CHECK(out.ndim == 2, "indexer_topk: out must be [T, top_k], got ", out.describe());
  const int64_t T = q.size(0), S = keys.size(keys.ndim - 2), k = out.size(1);
  v4_ops::check_host(out, DType::I32, {T, k}, "indexer_topk", "out");
  std::vector<float> score(static_cast<size_t>(S));
  std::vector<int32_t> order;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t visible =
        indexer_score_row(q, keys, weights, positions, t, ratio, softmax_scale, weights_scale, score.data());
    top_of_row(score.data(), visible, k, order, out.ptr<int32_t>() + t * k);
  }
}

void Backend::indexer_scores_visible(const Tensor& q, const Tensor& keys, const Tensor& weights,
                                     const Tensor& positions, int ratio, float softmax_scale, float weights_scale,
                                     Tensor& scores) {
  check_indexer_args(q, keys, weights, positions, ratio, "indexer_scores_visible");
  const int64_t T = q.size(0), S = keys.size(keys.ndim - 2);
  v4_ops::check_host(scores, DType::F32, {T, S}, "indexer_scores_visible", "scores");
  for (int64_t t = 0; t < T; ++t) {
    float* row = scores.ptr<float>() + t * S;
    const int64_t visible = indexer_score_row(q, keys, weights, positions, t, ratio, softmax_scale, weights_scale, row);
    std::fill(row + visible, row + S, -INFINITY);
  }
}

void Backend::candidate_blocks(const Tensor& scores, const Tensor& positions, int ratio, int64_t topk_blocks,
                               int64_t block_size, Tensor& bias) {
  using v4_ops::check_host;
  DI_CHECK(scores.ndim == 2 && ratio > 0 && topk_blocks > 0 && block_size > 0,
           "candidate_blocks: scores [T, S], ratio, topk_blocks and block_size > 0 expected, got ", scores.describe(),
           ", ", ratio, ", ", topk_blocks, ", ", block_size);
  const int64_t T = scores.size(0), S = scores.size(1), nb = (S + block_size - 1) / block_size;
  check_host(scores, DType::F32, {T, S}, "candidate_blocks", "scores");
  check_host(positions, DType::I32, {T}, "candidate_blocks", "positions");
  check_host(bias, DType::F32, {T, S}, "candidate_blocks", "bias");
  std::vector<float> block(static_cast<size_t>(nb));
  std::vector<int32_t> order, top(static_cast<size_t>(std::min(topk_blocks, nb)));
  for (int64_t t = 0; t < T; ++t) {
    const float* row = scores.ptr<const float>() + t * S;
    std::fill(block.begin(), block.end(), -INFINITY);
    for (int64_t s = 0; s < S; ++s) block[s / block_size] = std::fmax(block[s / block_size], row[s]);
    const int64_t visible = (positions.ptr<const int32_t>()[t] + 1) / ratio;
    if (visible > 0 && (visible - 1) / block_size < nb) block[(visible - 1) / block_size] = INFINITY;
    top_of_row(block.data(), nb, static_cast<int64_t>(top.size()), order, top.data());
    float* out = bias.ptr<float>() + t * S;
    std::fill(out, out + S, -INFINITY);
    for (int32_t b : top)
      if (b >= 0)
        for (int64_t s = b * block_size; s < std::min(S, (b + 1) * block_size); ++s) out[s] = 0.0f;
  }
}

void Backend::topk_finite(const Tensor& scores, Tensor& out) {
  DI_CHECK(scores.ndim == 2 && out.ndim == 2, "topk_finite: scores [T, S], out [T, k] expected, got ",
           scores.describe(), ", ", out.describe());
  const int64_t T = scores.size(0), S = scores.size(1), k = out.size(1);
  v4_ops::check_host(scores, DType::F32, {T, S}, "topk_finite", "scores");
  v4_ops::check_host(out, DType::I32, {T, k}, "topk_finite", "out");
  std::vector<int32_t> order;
  for (int64_t t = 0; t < T; ++t) top_of_row(scores.ptr<const float>() + t * S, S, k, order, out.ptr<int32_t>() + t * k);
}

}  // namespace deepinfer
