// DeepSeek-V4's MoE pieces on CUDA (the reference: backend/cpu/v4_routing.cpp):
//  - moe_routing_sqrt_softplus: one warp per token. scores = sqrt(softplus(logits)); the
//    experts are the hash rows (tid2eid, gathered by the model) or k rounds of a warp argmax
//    over score + bias (higher first, ties to the lower index: the CPU's partial_sort order);
//    lane 0 sums the chosen scores in slot order. Per token only: batch-invariant.
//  - silu_mul_clamped: elementwise; with limit = +inf the bits of silu_mul.
// moe_experts_clamped runs moe_experts' path (moe.cu) with the clamped activation.
#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_utils.cuh"

namespace deepinfer::cuda {
namespace {

struct SqrtSoftplusArgs {
  const float* logits;  // [T, E]
  const float* bias;    // [E] or nullptr
  const int32_t* hash;  // [T, k] or nullptr
  int T, E, K;
  float scaling;
  int32_t* ids;
  float* weights;
};

constexpr int kRoutingWarps = 4;

// Shared memory: per warp 2 * E floats (scores, choice scores).
__global__ void sqrt_softplus_routing_kernel(SqrtSoftplusArgs a) {
  extern __shared__ float sm[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int t = blockIdx.x * kRoutingWarps + warp;
  if (t >= a.T) return;
  float* score = sm + warp * 2 * a.E;
  float* choice = score + a.E;
  const float* x = a.logits + int64_t{t} * a.E;
  for (int e = lane; e < a.E; e += 32) {
    const float v = x[e];
    score[e] = sqrtf(v > 20.0f ? v : log1pf(expf(v)));  // torch softplus (threshold 20)
    choice[e] = score[e] + (a.bias ? a.bias[e] : 0.0f);
  }
  __syncwarp();
  int32_t* ids = a.ids + int64_t{t} * a.K;
  if (a.hash) {
    for (int j = lane; j < a.K; j += 32) ids[j] = a.hash[int64_t{t} * a.K + j];
  } else {
    for (int j = 0; j < a.K; ++j) {
      float best = -INFINITY;
      int arg = 0x7fffffff;
      for (int e = lane; e < a.E; e += 32) {
        const float v = choice[e];
        if (v > best || (v == best && e < arg)) {
          best = v;
          arg = e;
        }
      }
      warp_argmax(best, arg);
      if (lane == 0) {
        ids[j] = arg;
        choice[arg] = -INFINITY;  // taken (choices are finite: score >= 0 plus a finite bias)
      }
      __syncwarp();
    }
  }
  __syncwarp();
  if (lane == 0) {
    // Hash ids are trusted here (load_v4_weights checks tid2eid); one outside the range gives
    // NaN weights rather than a read out of bounds.
    float sum = 0.0f;
    for (int j = 0; j < a.K; ++j) {
      const int e = ids[j];
      sum += e >= 0 && e < a.E ? score[e] : __int_as_float(0x7fc00000);
    }
    for (int j = 0; j < a.K; ++j) {
      const int e = ids[j];
      const float s = e >= 0 && e < a.E ? score[e] : __int_as_float(0x7fc00000);
      a.weights[int64_t{t} * a.K + j] = s / (sum + 1e-20f) * a.scaling;
    }
  }
}

__global__ void silu_mul_clamped_kernel(const void* g, int g_kind, int64_t ldg, int64_t rows, int64_t I,
                                        float limit, void* out, int out_kind, int64_t ldo) {
  const int64_t n = rows * I;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / I, c = i % I;
    const float a = fminf(ld(g, r * ldg + c, g_kind), limit);
    const float b = fminf(fmaxf(ld(g, r * ldg + I + c, g_kind), -limit), limit);
    st(out, r * ldo + c, out_kind, a / (1.0f + __expf(-a)) * b);  // silu_mul_kernel's formula
  }
}

}  // namespace

void CudaBackend::moe_routing_sqrt_softplus(const Tensor& logits, const Tensor& bias, const Tensor& hash_ids,
                                            int top_k, float scaling, Tensor& topk_ids, Tensor& topk_weights) {
  const char* op = "moe_routing_sqrt_softplus";
  check_device(logits, "moe_routing_sqrt_softplus logits");
  DI_CHECK(logits.ndim == 2, op, ": logits must be [T, E], got ", logits.describe());
  const int64_t T = logits.size(0), E = logits.size(1), k = top_k;
  DI_CHECK(k > 0 && k <= E, op, ": top_k ", k, " outside [1, ", E, "]");
  check_exact(logits, {DType::F32}, {T, E}, "moe_routing_sqrt_softplus logits");
  if (bias.defined()) check_exact(bias, {DType::F32}, {E}, "moe_routing_sqrt_softplus bias");
  if (hash_ids.defined()) check_exact(hash_ids, {DType::I32}, {T, k}, "moe_routing_sqrt_softplus hash_ids");
  check_exact(topk_ids, {DType::I32}, {T, k}, "moe_routing_sqrt_softplus topk_ids");
  check_exact(topk_weights, {DType::F32}, {T, k}, "moe_routing_sqrt_softplus topk_weights");
  if (T == 0) return;
  SqrtSoftplusArgs a{logits.ptr<float>(), bias.defined() ? bias.ptr<float>() : nullptr,
                     hash_ids.defined() ? hash_ids.ptr<int32_t>() : nullptr, static_cast<int>(T),
                     static_cast<int>(E), static_cast<int>(k), scaling, topk_ids.ptr<int32_t>(),
                     topk_weights.ptr<float>()};
  const size_t smem = size_t{kRoutingWarps} * 2 * E * sizeof(float);
  set_smem_limit(reinterpret_cast<const void*>(sqrt_softplus_routing_kernel), smem, op);
  sqrt_softplus_routing_kernel<<<ceil_div(T, kRoutingWarps), kRoutingWarps * 32, smem, stream_>>>(a);
  check_launch(op, logits.describe());
}

void CudaBackend::silu_mul_clamped(const Tensor& gate_up, float limit, Tensor& out) {
  const RowView g = rows_of(gate_up, "silu_mul_clamped gate_up");
  const RowView o = rows_of(out, "silu_mul_clamped out");
  check_float(gate_up, "silu_mul_clamped gate_up");
  check_float(out, "silu_mul_clamped out");
  DI_CHECK(g.rows == o.rows && g.cols == 2 * o.cols, "silu_mul_clamped: gate_up ", gate_up.describe(),
           " must be [T, 2 * I] for out ", out.describe());
  DI_CHECK(!std::isnan(limit), "silu_mul_clamped: limit is NaN");
  const int64_t n = o.rows * o.cols;
  if (n == 0) return;
  const unsigned grid = std::min<unsigned>(ceil_div(n, 256), static_cast<unsigned>(num_sms_) * 8);
  silu_mul_clamped_kernel<<<grid, 256, 0, stream_>>>(g.data, float_kind(g.dtype), g.row_stride, o.rows, o.cols,
                                                     limit, o.data, float_kind(o.dtype), o.row_stride);
  check_launch("silu_mul_clamped", gate_up.describe());
}

}  // namespace deepinfer::cuda
