// moe_experts: out[t] = sum_j topk_weights[t, j] * expert_{topk_ids[t, j]}(x[t]),
// expert(x) = down(silu(gate(x)) * up(x)).
// Tokens are grouped by expert (permute), each expert runs its three GEMMs on its
// rows (the GEMM is batch-invariant per row), the outputs land in a [T*k, H] buffer
// and are combined per token in ascending k slot, so a token's result never depends
// on which other tokens share the step.
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace deepinfer::cpu {

void CpuBackend::moe_experts(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                             const std::vector<ExpertWeights>& experts, Tensor& out) {
  const Rows xr = as_rows(x, "moe_experts x");
  const Rows o = as_rows(out, "moe_experts out");
  DI_CHECK(xr.dtype == DType::F32 && o.dtype == DType::F32 && o.rows == xr.rows &&
               o.cols == xr.cols,
           "moe_experts: x ", x.describe(), " and out ", out.describe(), " must be F32 [T, H]");
  check_cpu(topk_ids, DType::I32, "moe_experts topk_ids");
  check_cpu(topk_weights, DType::F32, "moe_experts topk_weights");
  const int64_t T = xr.rows, H = xr.cols;
  DI_CHECK(topk_ids.ndim == 2 && topk_ids.size(0) == T && topk_ids.is_contiguous() &&
               topk_weights.dims() == topk_ids.dims() && topk_weights.is_contiguous(),
           "moe_experts: topk_ids ", topk_ids.describe(), " and topk_weights ",
           topk_weights.describe(), " must both be [", T, ", k]");
  const int64_t K = topk_ids.size(1);
  const int64_t E = static_cast<int64_t>(experts.size());
  const int32_t* ids = topk_ids.ptr<int32_t>();
  const float* weights = topk_weights.ptr<float>();

  // Permute: rows of each expert in (token, slot) order. lists[e] holds t * K + j.
  std::vector<std::vector<int64_t>> lists(static_cast<size_t>(E));
  for (int64_t p = 0; p < T * K; ++p) {
    DI_CHECK(ids[p] >= 0 && ids[p] < E, "moe_experts: expert id ", ids[p], " of token ", p / K,
             " slot ", p % K, " outside [0, ", E, ")");
    lists[ids[p]].push_back(p);
  }
  std::vector<float> y(static_cast<size_t>(T * K * H), 0.0f);  // [T*K, H] expert outputs
  std::vector<float> xe, g, u, act, ye;
  for (int64_t e = 0; e < E; ++e) {
    const std::vector<int64_t>& rows = lists[e];
    if (rows.empty()) continue;
    const ExpertWeights& ew = experts[e];
    check_weight(ew.gate, H, "moe_experts gate_proj");
    check_weight(ew.up, H, "moe_experts up_proj");
    const int64_t I = ew.gate.out_features();
    DI_CHECK(ew.up.out_features() == I, "moe_experts: expert ", e, " gate/up sizes differ");
    check_weight(ew.down, I, "moe_experts down_proj");
    DI_CHECK(ew.down.out_features() == H, "moe_experts: expert ", e, " down_proj must output ", H);
    const int64_t n = static_cast<int64_t>(rows.size());
    xe.resize(n * H);
    g.resize(n * I);
    u.resize(n * I);
    act.resize(n * I);
    ye.resize(n * H);
    for (int64_t r = 0; r < n; ++r) {
      std::memcpy(xe.data() + r * H, xr.f32(rows[r] / K), static_cast<size_t>(H) * 4);
    }
    const Rows xe_rows{reinterpret_cast<char*>(xe.data()), DType::F32, n, H, H};
    gemm_threaded(*pool_, xe_rows, ew.gate, {reinterpret_cast<char*>(g.data()), DType::F32, n, I, I});
    gemm_threaded(*pool_, xe_rows, ew.up, {reinterpret_cast<char*>(u.data()), DType::F32, n, I, I});
    for (int64_t i = 0; i < n * I; ++i) act[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    gemm_threaded(*pool_, {reinterpret_cast<char*>(act.data()), DType::F32, n, I, I}, ew.down,
                  {reinterpret_cast<char*>(ye.data()), DType::F32, n, H, H});
    for (int64_t r = 0; r < n; ++r) {
      std::memcpy(y.data() + rows[r] * H, ye.data() + r * H, static_cast<size_t>(H) * 4);
    }
  }
  // Combine in ascending slot order.
  pool_->parallel_for(T, 4, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      float* dst = o.f32(t);
      std::fill(dst, dst + H, 0.0f);
      for (int64_t j = 0; j < K; ++j) axpy(weights[t * K + j], y.data() + (t * K + j) * H, dst, H);
    }
  });
}

}  // namespace deepinfer::cpu
