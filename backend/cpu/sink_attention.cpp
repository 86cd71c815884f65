// sink_attention: DeepSeek-V4 attention over chosen K=V rows with a per-head fp32 sink
// logit in the softmax denominator (host reference; backend.h gives the math).
#include <cmath>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/v4_common.h"

namespace deepinfer {

void Backend::sink_attention(const Tensor& q, const Tensor& kv, const Tensor& indices, const Tensor& sinks,
                             float scale, Tensor& out) {
  using v4_ops::check_host;
  DI_CHECK(q.ndim == 3 && kv.ndim == 2 && indices.ndim == 2,
           "sink_attention: q [T, heads, D], kv [S, D], indices [T, N] expected, got ", q.describe(), ", ",
           kv.describe(), ", ", indices.describe());
  const int64_t T = q.size(0), heads = q.size(1), D = q.size(2), S = kv.size(0), N = indices.size(1);
  check_host(q, DType::F32, {T, heads, D}, "sink_attention", "q");
  check_host(kv, DType::F32, {S, D}, "sink_attention", "kv");
  check_host(indices, DType::I32, {T, N}, "sink_attention", "indices");
  check_host(sinks, DType::F32, {heads}, "sink_attention", "sinks");
  check_host(out, DType::F32, {T, heads, D}, "sink_attention", "out");
  std::vector<float> logit(static_cast<size_t>(N));
  std::vector<double> acc(static_cast<size_t>(D));
  for (int64_t t = 0; t < T; ++t) {
    const int32_t* idx = indices.ptr<const int32_t>() + t * N;
    for (int64_t n = 0; n < N; ++n)
      DI_CHECK(idx[n] >= -1 && idx[n] < S, "sink_attention: index ", idx[n], " of query ", t,
               " outside [-1, ", S, ")");
    for (int64_t h = 0; h < heads; ++h) {
      const float* qv = q.ptr<const float>() + (t * heads + h) * D;
      const float sink = sinks.ptr<const float>()[h];
      float m = sink;
      for (int64_t n = 0; n < N; ++n) {
        if (idx[n] < 0) continue;
        const float* k = kv.ptr<const float>() + idx[n] * D;
        double dot = 0.0;
        for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(qv[d]) * k[d];
        logit[n] = static_cast<float>(dot) * scale;
        m = std::fmax(m, logit[n]);
      }
      double denom = std::exp(static_cast<double>(sink - m));
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t n = 0; n < N; ++n) {
        if (idx[n] < 0) continue;
        const double p = std::exp(static_cast<double>(logit[n] - m));
        denom += p;
        const float* v = kv.ptr<const float>() + idx[n] * D;
        for (int64_t d = 0; d < D; ++d) acc[d] += p * v[d];
      }
      float* o = out.ptr<float>() + (t * heads + h) * D;
      for (int64_t d = 0; d < D; ++d) o[d] = static_cast<float>(acc[d] / denom);
    }
  }
}

}  // namespace deepinfer
