// compressor_pool and indexer_topk: DeepSeek-V4's KV compressors (CSA with overlapping
// windows, HCA without) and the lightning indexer's top-k (host reference; backend.h).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/v4_common.h"

namespace deepinfer {

void Backend::compressor_pool(const Tensor& kv, const Tensor& gate, const Tensor& ape, int ratio, bool overlap,
                              const Tensor& prior_kv, const Tensor& prior_gate, Tensor& out) {
  using v4_ops::check_host;
  DI_CHECK(ratio > 0, "compressor_pool: ratio must be > 0, got ", ratio);
  DI_CHECK(kv.ndim == 2, "compressor_pool: kv must be [T, C], got ", kv.describe());
  const int64_t T = kv.size(0), C = kv.size(1), r = ratio, n = T / r;
  DI_CHECK(!overlap || C % 2 == 0, "compressor_pool: overlapping kv needs an even width, got ", kv.describe());
  const int64_t D = overlap ? C / 2 : C;
  v4_ops::check_host_rows(kv, DType::F32, {T, C}, "compressor_pool", "kv");
  v4_ops::check_host_rows(gate, DType::F32, {T, C}, "compressor_pool", "gate");
  check_host(ape, DType::F32, {r, C}, "compressor_pool", "ape");
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
      float m = -INFINITY;
      for (int64_t s = 0; s < slots; ++s) m = std::fmax(m, lg[s]);
      double denom = 0.0, acc = 0.0;
      for (int64_t s = 0; s < slots; ++s) {
        const double e = std::exp(static_cast<double>(lg[s] - m));
        denom += e;
        acc += e * val[s];
      }
      out.ptr<float>()[w * D + c] = static_cast<float>(acc / denom);
    }
  }
}

void Backend::indexer_topk(const Tensor& q, const Tensor& keys, const Tensor& weights, const Tensor& positions,
                           int ratio, float softmax_scale, float weights_scale, Tensor& out) {
  using v4_ops::check_host;
  DI_CHECK(q.ndim == 3 && keys.ndim == 2 && out.ndim == 2,
           "indexer_topk: q [T, heads, d], keys [S, d], out [T, top_k] expected, got ", q.describe(), ", ",
           keys.describe(), ", ", out.describe());
  const int64_t T = q.size(0), heads = q.size(1), d = q.size(2), S = keys.size(0), k = out.size(1);
  DI_CHECK(ratio > 0, "indexer_topk: ratio must be > 0, got ", ratio);
  check_host(q, DType::F32, {T, heads, d}, "indexer_topk", "q");
  check_host(keys, DType::F32, {S, d}, "indexer_topk", "keys");
  check_host(weights, DType::F32, {T, heads}, "indexer_topk", "weights");
  check_host(positions, DType::I32, {T}, "indexer_topk", "positions");
  check_host(out, DType::I32, {T, k}, "indexer_topk", "out");
  std::vector<float> score(static_cast<size_t>(S));
  std::vector<int32_t> order;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t visible = std::min<int64_t>(S, (positions.ptr<const int32_t>()[t] + 1) / ratio);
    for (int64_t s = 0; s < visible; ++s) {
      double total = 0.0;
      for (int64_t h = 0; h < heads; ++h) {
        const float* qv = q.ptr<const float>() + (t * heads + h) * d;
        const float* kv = keys.ptr<const float>() + s * d;
        double dot = 0.0;
        for (int64_t i = 0; i < d; ++i) dot += static_cast<double>(qv[i]) * kv[i];
        const float relu = std::fmax(static_cast<float>(dot), 0.0f) * softmax_scale;
        total += static_cast<double>(relu) * (weights.ptr<const float>()[t * heads + h] * weights_scale);
      }
      score[s] = static_cast<float>(total);
    }
    order.resize(static_cast<size_t>(visible));
    std::iota(order.begin(), order.end(), 0);
    const int64_t keep = std::min(k, visible);
    std::partial_sort(order.begin(), order.begin() + keep, order.end(), [&](int32_t a, int32_t b) {
      return score[a] != score[b] ? score[a] > score[b] : a < b;
    });
    int32_t* o = out.ptr<int32_t>() + t * k;
    for (int64_t j = 0; j < k; ++j) o[j] = j < keep ? order[j] : -1;
  }
}

}  // namespace deepinfer
