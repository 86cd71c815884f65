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
namespace {

// out[t] = sum over slots j (ascending) of w[t * K + j] * row(t, j), from 0; row(t, j) nullptr
// skips the slot. moe_experts and moe_combine both end here, so their bits agree.
template <typename RowOf>
void combine_slots(ThreadPool& pool, int64_t T, int64_t K, int64_t H, const float* w, RowOf row, const Rows& o) {
  pool.parallel_for(T, 4, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      float* dst = o.f32(t);
      std::fill(dst, dst + H, 0.0f);
      for (int64_t j = 0; j < K; ++j)
        if (const float* y = row(t, j)) axpy(w[t * K + j], y, dst, H);
    }
  });
}

}  // namespace

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
    if (ids[p] == -1) continue;  // another rank's expert: its row of y stays 0
    DI_CHECK(ids[p] >= 0 && ids[p] < E, "moe_experts: expert id ", ids[p], " of token ", p / K,
             " slot ", p % K, " outside [0, ", E, ")");
    lists[ids[p]].push_back(p);
  }
  // Experts in groups of at most kGroupRows rows (decode: usually all of them in one group):
  // a group's gate/up GEMMs run in one threaded loop, then its activations, then its down
  // GEMMs in a second loop. Each expert's GEMMs are the ones gemm_threaded would run, so the
  // bits do not depend on the grouping; grouping cuts the fork/joins of small steps (3 per
  // expert before), and a large step's experts stay one at a time (their rows stay in cache).
  constexpr int64_t kGroupRows = 64;
  struct Slot {
    int64_t e, n, I;               // expert, rows, intermediate size
    int64_t x_off = 0, i_off = 0;  // offsets into its group's xe / ye and g / u
  };
  std::vector<Slot> slots;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = static_cast<int64_t>(lists[e].size());
    if (n == 0) continue;
    const ExpertWeights& ew = experts[e];
    check_weight(ew.gate, H, "moe_experts gate_proj");
    check_weight(ew.up, H, "moe_experts up_proj");
    const int64_t I = ew.gate.out_features();
    DI_CHECK(ew.up.out_features() == I, "moe_experts: expert ", e, " gate/up sizes differ");
    check_weight(ew.down, I, "moe_experts down_proj");
    DI_CHECK(ew.down.out_features() == H, "moe_experts: expert ", e, " down_proj must output ", H);
    slots.push_back({e, n, I});
  }
  std::vector<float> xe, g, u, ye;  // one group's rows, reused by the next group
  auto rows_of = [](std::vector<float>& buf, int64_t off, int64_t n, int64_t cols) {
    return Rows{reinterpret_cast<char*>(buf.data() + off), DType::F32, n, cols, cols};
  };
  std::vector<float> y(static_cast<size_t>(T * K * H), 0.0f);  // [T*K, H] expert outputs
  std::vector<GemmJob> jobs;
  for (size_t s0 = 0; s0 < slots.size();) {
    size_t s1 = s0 + 1;  // group [s0, s1)
    int64_t rows = slots[s0].n;
    while (s1 < slots.size() && rows + slots[s1].n <= kGroupRows) rows += slots[s1++].n;
    int64_t x_size = 0, i_size = 0;
    for (size_t i = s0; i < s1; ++i) {
      slots[i].x_off = x_size;
      slots[i].i_off = i_size;
      x_size += slots[i].n * H;
      i_size += slots[i].n * slots[i].I;
    }
    xe.resize(static_cast<size_t>(x_size));
    ye.resize(static_cast<size_t>(x_size));
    g.resize(static_cast<size_t>(i_size));
    u.resize(static_cast<size_t>(i_size));
    jobs.clear();
    for (size_t i = s0; i < s1; ++i) {
      const Slot& s = slots[i];
      for (int64_t r = 0; r < s.n; ++r)
        std::memcpy(xe.data() + s.x_off + r * H, xr.f32(lists[s.e][r] / K),
                    static_cast<size_t>(H) * 4);
      jobs.push_back(
          {rows_of(xe, s.x_off, s.n, H), &experts[s.e].gate, rows_of(g, s.i_off, s.n, s.I)});
      jobs.push_back(
          {rows_of(xe, s.x_off, s.n, H), &experts[s.e].up, rows_of(u, s.i_off, s.n, s.I)});
    }
    gemm_threaded_many(*pool_, jobs);
    jobs.clear();
    for (size_t i = s0; i < s1; ++i) {
      const Slot& s = slots[i];
      float* a = g.data() + s.i_off;  // act = silu(gate) * up, in place
      const float* up = u.data() + s.i_off;
      for (int64_t j = 0; j < s.n * s.I; ++j) a[j] = a[j] / (1.0f + std::exp(-a[j])) * up[j];
      jobs.push_back(
          {rows_of(g, s.i_off, s.n, s.I), &experts[s.e].down, rows_of(ye, s.x_off, s.n, H)});
    }
    gemm_threaded_many(*pool_, jobs);
    for (size_t i = s0; i < s1; ++i)
      for (int64_t r = 0; r < slots[i].n; ++r)
        std::memcpy(y.data() + lists[slots[i].e][r] * H, ye.data() + slots[i].x_off + r * H,
                    static_cast<size_t>(H) * 4);
    s0 = s1;
  }
  // Combine in ascending slot order.
  combine_slots(*pool_, T, K, H, weights, [&](int64_t t, int64_t j) -> const float* {
    return ids[t * K + j] == -1 ? nullptr : y.data() + (t * K + j) * H;
  }, o);
}

void CpuBackend::moe_combine(const Tensor& y, const Tensor& pos, const Tensor& topk_weights, Tensor& out) {
  const Rows yr = as_rows(y, "moe_combine y");
  const Rows o = as_rows(out, "moe_combine out");
  check_cpu(pos, DType::I32, "moe_combine pos");
  check_cpu(topk_weights, DType::F32, "moe_combine topk_weights");
  const int64_t T = o.rows, H = o.cols;
  DI_CHECK(yr.dtype == DType::F32 && o.dtype == DType::F32 && yr.cols == H && pos.ndim == 2 && pos.size(0) == T &&
               pos.is_contiguous() && topk_weights.dims() == pos.dims() && topk_weights.is_contiguous(),
           "moe_combine: y ", y.describe(), " (F32 [P, H]), pos ", pos.describe(), " and topk_weights ",
           topk_weights.describe(), " ([T, k]) do not match out ", out.describe(), " (F32 [T, H])");
  const int64_t K = pos.size(1);
  const int32_t* p = pos.ptr<int32_t>();
  for (int64_t i = 0; i < T * K; ++i)
    DI_CHECK(p[i] >= -1 && p[i] < yr.rows, "moe_combine: pos ", p[i], " of token ", i / K, " slot ", i % K,
             " outside the ", yr.rows, " rows of y");
  combine_slots(*pool_, T, K, H, topk_weights.ptr<float>(), [&](int64_t t, int64_t j) -> const float* {
    return p[t * K + j] == -1 ? nullptr : yr.f32(p[t * K + j]);
  }, o);
}

}  // namespace deepinfer::cpu
