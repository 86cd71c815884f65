// DeepSeek-V4 MoE pieces (host reference): sqrt(softplus) routing with selection-only
// bias or hash routing, clamped SwiGLU, and routed experts with the clamp.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/v4_common.h"
#include "core/quant.h"

namespace deepinfer {

namespace {

// torch.nn.functional.softplus (beta 1, threshold 20): x above 20 is returned as is.
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

float clamped_swiglu(float g, float u, float limit) {
  g = std::fmin(g, limit);
  u = std::fmin(std::fmax(u, -limit), limit);
  return g / (1.0f + std::exp(-g)) * u;
}

}  // namespace

void Backend::moe_routing_sqrt_softplus(const Tensor& logits, const Tensor& bias, const Tensor& hash_ids,
                                        int top_k, float scaling, Tensor& topk_ids,
                                        Tensor& topk_weights) {
  using v4_ops::check_host;
  DI_CHECK(logits.ndim == 2, "moe_routing_sqrt_softplus: logits must be [T, E], got ", logits.describe());
  const int64_t T = logits.size(0), E = logits.size(1), k = top_k;
  check_host(logits, DType::F32, {T, E}, "moe_routing_sqrt_softplus", "logits");
  DI_CHECK(k > 0 && k <= E, "moe_routing_sqrt_softplus: top_k ", k, " outside [1, ", E, "]");
  if (bias.defined()) check_host(bias, DType::F32, {E}, "moe_routing_sqrt_softplus", "bias");
  if (hash_ids.defined()) check_host(hash_ids, DType::I32, {T, k}, "moe_routing_sqrt_softplus", "hash_ids");
  check_host(topk_ids, DType::I32, {T, k}, "moe_routing_sqrt_softplus", "topk_ids");
  check_host(topk_weights, DType::F32, {T, k}, "moe_routing_sqrt_softplus", "topk_weights");
  std::vector<float> score(static_cast<size_t>(E)), choice(static_cast<size_t>(E));
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* l = logits.ptr<const float>() + t * E;
    for (int64_t e = 0; e < E; ++e) {
      score[e] = std::sqrt(softplus(l[e]));
      choice[e] = score[e] + (bias.defined() ? bias.ptr<const float>()[e] : 0.0f);
    }
    int32_t* ids = topk_ids.ptr<int32_t>() + t * k;
    if (hash_ids.defined()) {
      for (int64_t j = 0; j < k; ++j) {
        const int32_t e = hash_ids.ptr<const int32_t>()[t * k + j];
        DI_CHECK(e >= 0 && e < E, "moe_routing_sqrt_softplus: hash expert id ", e, " of token ", t,
                 " outside [0, ", E, ")");
        ids[j] = e;
      }
    } else {
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
        return choice[a] != choice[b] ? choice[a] > choice[b] : a < b;
      });
      for (int64_t j = 0; j < k; ++j) ids[j] = order[j];
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum += score[ids[j]];
    for (int64_t j = 0; j < k; ++j)
      topk_weights.ptr<float>()[t * k + j] = score[ids[j]] / (sum + 1e-20f) * scaling;
  }
}

void Backend::silu_mul_clamped(const Tensor& gate_up, float limit, Tensor& out) {
  using v4_ops::check_host;
  DI_CHECK(gate_up.ndim == 2 && gate_up.size(1) % 2 == 0,
           "silu_mul_clamped: gate_up must be [T, 2I], got ", gate_up.describe());
  const int64_t T = gate_up.size(0), I = gate_up.size(1) / 2;
  check_host(gate_up, DType::F32, {T, 2 * I}, "silu_mul_clamped", "gate_up");
  check_host(out, DType::F32, {T, I}, "silu_mul_clamped", "out");
  for (int64_t t = 0; t < T; ++t) {
    const float* g = gate_up.ptr<const float>() + t * 2 * I;
    for (int64_t i = 0; i < I; ++i) out.ptr<float>()[t * I + i] = clamped_swiglu(g[i], g[I + i], limit);
  }
}

void Backend::moe_experts_clamped(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                                  const std::vector<ExpertWeights>& experts, float limit, Tensor& out) {
  using v4_ops::check_host;
  DI_CHECK(x.ndim == 2 && topk_ids.ndim == 2, "moe_experts_clamped: x [T, H] and topk_ids [T, k] expected, got ",
           x.describe(), " and ", topk_ids.describe());
  const int64_t T = x.size(0), H = x.size(1), k = topk_ids.size(1);
  const int64_t E = static_cast<int64_t>(experts.size());
  check_host(x, DType::F32, {T, H}, "moe_experts_clamped", "x");
  check_host(topk_ids, DType::I32, {T, k}, "moe_experts_clamped", "topk_ids");
  check_host(topk_weights, DType::F32, {T, k}, "moe_experts_clamped", "topk_weights");
  check_host(out, DType::F32, {T, H}, "moe_experts_clamped", "out");
  std::fill(out.ptr<float>(), out.ptr<float>() + T * H, 0.0f);
  for (int64_t e = 0; e < E; ++e) {
    std::vector<int64_t> rows, slots;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < k; ++j) {
        const int32_t id = topk_ids.ptr<const int32_t>()[t * k + j];
        DI_CHECK(id >= 0 && id < E, "moe_experts_clamped: expert id ", id, " of token ", t,
                 " outside [0, ", E, ")");
        if (id == e) {
          rows.push_back(t);
          slots.push_back(j);
        }
      }
    if (rows.empty()) continue;
    // Packed FP4 experts (U8/I8 [N, K/2] with E8M0 scales per 32 along K) are dequantized here.
    ExpertWeights w = experts[static_cast<size_t>(e)];
    std::vector<HostBuffer> dequantized;
    dequantized.reserve(3);
    for (Weight* part : {&w.gate, &w.up, &w.down}) {
      if (part->w.dtype != DType::U8 && part->w.dtype != DType::I8) continue;
      HostBuffer& f = dequantized.emplace_back(DType::F32, std::vector<int64_t>{part->w.size(0), part->w.size(1) * 2});
      dequantize_fp4_e2m1(part->w, part->scale_inv, f.ptr<float>(), "moe_experts_clamped FP4 expert");
      *part = Weight{};
      part->w = f.tensor();
    }
    const int64_t n = static_cast<int64_t>(rows.size()), I = w.gate.out_features();
    HostBuffer xs(DType::F32, {n, H}), gu(DType::F32, {n, 2 * I}), h(DType::F32, {n, I}),
        y(DType::F32, {n, H});
    for (int64_t r = 0; r < n; ++r)
      std::copy_n(x.ptr<const float>() + rows[r] * H, H, xs.ptr<float>() + r * H);
    HostBuffer g(DType::F32, {n, I}), u(DType::F32, {n, I});
    gemm(xs.tensor(), w.gate, g.tensor());
    gemm(xs.tensor(), w.up, u.tensor());
    for (int64_t r = 0; r < n; ++r) {
      std::copy_n(g.ptr<float>() + r * I, I, gu.ptr<float>() + r * 2 * I);
      std::copy_n(u.ptr<float>() + r * I, I, gu.ptr<float>() + r * 2 * I + I);
    }
    silu_mul_clamped(gu.tensor(), limit, h.tensor());
    gemm(h.tensor(), w.down, y.tensor());
    for (int64_t r = 0; r < n; ++r) {
      const float wt = topk_weights.ptr<const float>()[rows[r] * k + slots[r]];
      float* o = out.ptr<float>() + rows[r] * H;
      for (int64_t d = 0; d < H; ++d) o[d] += wt * y.ptr<float>()[r * H + d];
    }
  }
}

}  // namespace deepinfer
