// Routed experts kept as DeepSeek-V4 ships them: FP4 e2m1 weights packed two per byte
// (element k of a row is the low nibble of byte k/2 when k is even; core/quant.h) with one
// E8M0 scale (2^(byte - 127)) per 32 along K. The reference dequantizes to F32 first
// (backend/cpu/v4_routing.cpp); here the packed bytes are read as they are (4.25 bits per
// weight), for the few-token steps where the expert GEMMs are weight-read bound:
//  - gate|up: grid (2I / 8, pairs), one warp per output column: lane l takes the 32-element
//    scale groups l, l + 32, ... (16 packed bytes and one scale byte each), dots them with the
//    pair's token row (in shared memory as F32), then the warp tree. F32 out;
//  - silu_mul_clamped on the F32 pair rows (the limit: +inf for the plain SwiGLU);
//  - down: the same kernel over the activations; then each token sums its k slots in slot
//    order. Every (pair, column) is computed on its own in a fixed order: batch-invariant.
// CUDA cores: correct for any row count, fast only for few. Used for steps of one token and in
// the batch-invariant configuration; from CudaOptions::moe_qgemm_min_tokens tokens moe.cu takes
// the tensor-core grouped GEMM of moe_qgemm.cu instead (BF16 gate | up outputs and activations).
#include <cmath>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_utils.cuh"

namespace deepinfer::cuda {
namespace {

constexpr int kWarps = 8;

struct Fp4Args {
  const void* x;  // activation rows (row of pair p: p / x_div), row stride ldx
  int x_kind;
  int64_t ldx;
  int x_div;
  const int32_t* ids;  // [P] expert of pair p
  int E;
  const void* const* w1;  // per expert: packed [N1, K/2] (rows n < N1)
  const void* const* s1;  //             scales [N1, K/32]
  const void* const* w2;  // rows n >= N1 (row n - N1), or nullptr when N == N1
  const void* const* s2;
  int N1, N, K;
  float* out;  // [P, N]
};

// The code's 3 magnitude bits placed as a float's low two exponent bits and top mantissa bit give
// code x 2^-126 (code 1 = 0.5 as the subnormal 2^-127); x 2^126 is exact. (A local table indexed
// per nibble went through local memory: bench/NOTES.md "mixq".)
__device__ __forceinline__ float e2m1(uint32_t nibble) {
  return __uint_as_float(((nibble & 7u) << 22) | ((nibble & 8u) << 28)) * 0x1p126f;
}

// grid (ceil(N / kWarps), P); dynamic shared memory: K floats (the pair's row).
__global__ void __launch_bounds__(kWarps * 32) fp4_rows_kernel(Fp4Args a) {
  extern __shared__ float xs[];
  const int p = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row = p / a.x_div;
  for (int k = threadIdx.x; k < a.K; k += kWarps * 32) xs[k] = ld(a.x, row * a.ldx + k, a.x_kind);
  __syncthreads();
  const int n = blockIdx.x * kWarps + warp;
  if (n >= a.N) return;
  const int e = a.ids[p];
  float* o = a.out + int64_t{p} * a.N + n;
  if (e < 0 || e >= a.E) {  // trusted ids (the routing wrote them); never read out of bounds
    if (lane == 0) *o = __int_as_float(0x7fc00000);
    return;
  }
  const bool first = n < a.N1;
  const int r = first ? n : n - a.N1;
  const uint8_t* w = static_cast<const uint8_t*>(first ? a.w1[e] : a.w2[e]) + int64_t{r} * (a.K / 2);
  const uint8_t* s = static_cast<const uint8_t*>(first ? a.s1[e] : a.s2[e]) + int64_t{r} * (a.K / 32);
  float acc = 0.0f;
  for (int b = lane; b < a.K / 32; b += 32) {
    const uint4 v = *reinterpret_cast<const uint4*>(w + int64_t{b} * 16);
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
    const float* xb = xs + b * 32;
    float part = 0.0f;
#pragma unroll
    for (int q = 0; q < 4; ++q)
#pragma unroll
      for (int i = 0; i < 8; ++i) part += e2m1(words[q] >> (4 * i)) * xb[q * 8 + i];
    acc += part * ldexpf(1.0f, static_cast<int>(s[b]) - 127);
  }
  acc = warp_sum(acc);
  if (lane == 0) *o = acc;
}

// out[t, h] = sum_j weights[t, j] * y[t * K + j, h] in slot order.
__global__ void fp4_combine_kernel(const float* y, int64_t H, const float* weights, int K, void* out, int o_kind,
                                   int64_t ldo) {
  const int64_t t = blockIdx.x;
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < K; ++j) acc += weights[t * K + j] * y[(t * K + j) * H + h];
    st(out, t * ldo + h, o_kind, acc);
  }
}

void check_fp4(const Weight& w, int64_t n, int64_t k, const char* what, size_t e) {
  DI_CHECK(w.w.device == Device::CUDA && (w.w.dtype == DType::U8 || w.w.dtype == DType::I8) && w.w.ndim == 2 &&
               w.w.is_contiguous() && w.w.shape[0] == n && w.w.shape[1] == k / 2,
           "moe_experts (FP4): expert ", e, " ", what, " ", w.w.describe(), " must be packed U8/I8 [", n, ", ", k / 2,
           "] on cuda");
  DI_CHECK(w.scale_inv.device == Device::CUDA &&
               (w.scale_inv.dtype == DType::U8 || w.scale_inv.dtype == DType::F8_E8M0) && w.scale_inv.is_contiguous() &&
               w.scale_inv.numel() == n * (k / 32),
           "moe_experts (FP4): expert ", e, " ", what, " scales ", w.scale_inv.describe(), " must be E8M0 bytes [", n,
           ", ", k / 32, "] (one per 32 along K)");
}

}  // namespace

void CudaBackend::check_fp4_experts(const std::vector<ExpertWeights>& experts, int64_t H, int64_t I, const char* op) {
  DI_CHECK(H % 32 == 0 && I % 32 == 0 && H <= 16384 && I <= 16384, op,
           ": FP4 experts need hidden and intermediate sizes that are multiples of 32 (<= 16384), got H ", H, ", I ", I);
  for (size_t e = 0; e < experts.size(); ++e) {
    check_fp4(experts[e].gate, I, H, "gate", e);
    check_fp4(experts[e].up, I, H, "up", e);
    check_fp4(experts[e].down, H, I, "down", e);
  }
}

void CudaBackend::moe_experts_fp4(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                                  const std::vector<ExpertWeights>& experts, float limit, Tensor& out, const char* op) {
  // x, out, topk_ids and topk_weights are checked by routed_experts (moe.cu), the caller, and
  // the expert weights by check_fp4_experts.
  const RowView xv = rows_of(x, "moe_experts x"), ov = rows_of(out, "moe_experts out");
  const int64_t T = xv.rows, H = xv.cols, I = experts[0].gate.w.shape[0];
  if (T == 0) return;
  const int E = static_cast<int>(experts.size()), K = static_cast<int>(topk_ids.shape[1]);
  const int64_t P = T * K;
  const void* const* ptrs = static_cast<const void* const*>(expert_table(experts).ptrs.tensor().data);
  float* hidden = static_cast<float*>(scratch(kSlotMoeHidden, static_cast<size_t>(P * 2 * I) * 4, op));
  float* act = static_cast<float*>(scratch(kSlotMoeAct, static_cast<size_t>(P * I) * 4, op));
  float* y = static_cast<float*>(scratch(kSlotMoeOut, static_cast<size_t>(P * H) * 4, op));
  const std::string shapes = x.describe() + " top_k " + std::to_string(K) + " FP4 experts " + std::to_string(E);
  const size_t smem_max = static_cast<size_t>(std::max(H, I)) * 4;
  set_smem_limit(reinterpret_cast<const void*>(fp4_rows_kernel), smem_max, op);
  Fp4Args gu{xv.data, float_kind(xv.dtype), xv.row_stride, K, topk_ids.ptr<int32_t>(), E,
             ptrs, ptrs + size_t{3} * E, ptrs + static_cast<size_t>(E), ptrs + size_t{4} * E,
             static_cast<int>(I), static_cast<int>(2 * I), static_cast<int>(H), hidden};
  fp4_rows_kernel<<<dim3(ceil_div(2 * I, kWarps), static_cast<unsigned>(P)), kWarps * 32,
                    static_cast<size_t>(H) * 4, stream_>>>(gu);
  check_launch("moe_experts (FP4 gate|up)", shapes);
  Tensor ht(hidden, DType::F32, {P, 2 * I}, Device::CUDA), at(act, DType::F32, {P, I}, Device::CUDA);
  silu_mul_clamped(ht, limit, at);
  Fp4Args dn{act, 0, I, 1, topk_ids.ptr<int32_t>(), E, ptrs + size_t{2} * E, ptrs + size_t{5} * E, nullptr, nullptr,
             static_cast<int>(H), static_cast<int>(H), static_cast<int>(I), y};
  fp4_rows_kernel<<<dim3(ceil_div(H, kWarps), static_cast<unsigned>(P)), kWarps * 32, static_cast<size_t>(I) * 4,
                    stream_>>>(dn);
  check_launch("moe_experts (FP4 down)", shapes);
  fp4_combine_kernel<<<static_cast<unsigned>(T), 256, 0, stream_>>>(y, H, topk_weights.ptr<float>(), K, ov.data,
                                                                   float_kind(ov.dtype), ov.row_stride);
  check_launch("moe_experts (FP4 combine)", shapes);
}

}  // namespace deepinfer::cuda
