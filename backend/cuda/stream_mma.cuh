// Device pieces shared by the weight-streaming GEMM kernels (gemm_stream.cu: weights through
// registers; gemm_pipe.cu: weights staged through shared memory with cp.async). Both compute
// each output from the same fragments in the same order, so they give the same bits (the
// batch-invariant mode may use either for a row):
//   lane l (g = l / 4, q = l % 4) holds 16 consecutive K values k0 + 16 q + j (j < 16) of
//   weight row n0 + g and of activation rows g and g + 8; MMA step s (of 4) takes
//   j = 4s..4s+3 as the K slots {2q, 2q+1, 2q+8, 2q+9} of both operands.
//   K is split over ks = k_split(K) warps of kpw = stream_kpw(K) values each (K alone fixes
//   both); the warps' partial sums are added in warp order (stream_sum_store).
#pragma once
#include <algorithm>

#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/gemm_problem.h"

namespace deepinfer::cuda::smma {

constexpr int kChunk = 64;  // K values per warp step (4 MMAs)

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

struct Chunk16 {  // 16 bf16 values as 8 words (pairs)
  uint32_t w[8];
};

__device__ __forceinline__ Chunk16 load16_bf16(const bf16* p) {
  Chunk16 c;
  const uint4 u0 = *reinterpret_cast<const uint4*>(p);
  const uint4 u1 = *reinterpret_cast<const uint4*>(p + 8);
  c.w[0] = u0.x; c.w[1] = u0.y; c.w[2] = u0.z; c.w[3] = u0.w;
  c.w[4] = u1.x; c.w[5] = u1.y; c.w[6] = u1.z; c.w[7] = u1.w;
  return c;
}

// One byte per weight value (FP8 with per-128 or folded scales).
template <int WK>
constexpr bool one_byte() {
  return WK == kWeightFP8 || WK == kWeightFP8Fold;
}

// 16 e4m3 bytes x scale -> 8 words of bf16 pairs, BF16(e4m3 x scale) each (kWeightFP8Fold).
__device__ __forceinline__ void fp8x16_scaled_to_bf16x16(const uint4& v, float scale, uint32_t (&out)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(
          static_cast<__nv_fp8x2_storage_t>((w[i] >> (16 * h)) & 0xffffu), __NV_E4M3);
      const float2 f = __half22float2(__half2(hr));
      const __nv_bfloat162 b = __floats2bfloat162_rn(f.x * scale, f.y * scale);
      out[2 * i + h] = *reinterpret_cast<const uint32_t*>(&b);
    }
  }
}

// 16 e4m3 bytes -> 8 words of bf16 pairs (exact: e4m3 fits in bf16; x 1 is exact).
__device__ __forceinline__ void fp8x16_to_bf16x16(const uint4& v, uint32_t (&out)[8]) {
  fp8x16_scaled_to_bf16x16(v, 1.0f, out);
}

// Raw weight bytes of one lane for one chunk: bf16 needs 32 bytes, fp8 16.
template <int WK>
struct WRaw {
  uint4 u[one_byte<WK>() ? 1 : 2];
};

template <int WK>
__device__ __forceinline__ WRaw<WK> load_w(const void* row, int k) {
  WRaw<WK> r;
  if constexpr (one_byte<WK>()) {
    r.u[0] = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(row) + k));
  } else {
    const bf16* p = static_cast<const bf16*>(row) + k;
    r.u[0] = __ldg(reinterpret_cast<const uint4*>(p));
    r.u[1] = __ldg(reinterpret_cast<const uint4*>(p + 8));
  }
  return r;
}

template <int WK>
__device__ __forceinline__ void w_words(const WRaw<WK>& r, uint32_t (&w)[8], float fold = 1.0f) {
  if constexpr (WK == kWeightFP8) {
    fp8x16_to_bf16x16(r.u[0], w);
  } else if constexpr (WK == kWeightFP8Fold) {
    fp8x16_scaled_to_bf16x16(r.u[0], fold, w);
  } else {
    w[0] = r.u[0].x; w[1] = r.u[0].y; w[2] = r.u[0].z; w[3] = r.u[0].w;
    w[4] = r.u[1].x; w[5] = r.u[1].y; w[6] = r.u[1].z; w[7] = r.u[1].w;
  }
}

// kWeightFP8Fold: the scale of the lane's 16 values at weight row `wrow`, K offset k (inside one
// block: block_k % 16 == 0); 1 for the other kinds.
template <int WK>
__device__ __forceinline__ float fold_scale(const float* s, const GemmProblem& p, int wrow, int k) {
  if constexpr (WK == kWeightFP8Fold)
    return __ldg(s + static_cast<int64_t>(wrow / p.block_n) * p.scale_cols + k / p.block_k);
  else
    return 1.0f;
}

// FP8 block scale of weight row `wrow` at K offset k (the tile's 8 rows share one 128-row
// block: tiles start at multiples of 8); 1 for BF16.
template <int WK>
__device__ __forceinline__ float chunk_scale(const float* s, int scale_cols, int wrow, int k) {
  if constexpr (WK == kWeightFP8)
    return __ldg(s + (wrow / 128) * scale_cols + k / 128);
  else
    return 1.0f;
}


constexpr int kNT = 2;  // n8 tiles per block: 16 output columns

// Warps splitting K: about 256 K values each, at most 8; depends on K only.
inline int k_split(int K) { return std::clamp(K / 256, 1, 8); }
// K values per warp (a multiple of kChunk; the last warps may get fewer or none).
inline int stream_kpw(int K) {
  const int ks = k_split(K);
  return (((K + ks - 1) / ks + kChunk - 1) / kChunk) * kChunk;
}

// Where the weight rows of the 16-column tile at output column n0 of group / head grp come
// from: base of the [rows, K] weight, its FP8 scales, the tile's first weight row and the
// weight's row count (gemm_pair / gate|up: the second half's columns read the second weight).
struct WeightSource {
  const void* base;
  const float* s;
  int wrow0, wrows;
};
template <int WK>
__device__ __forceinline__ WeightSource weight_source(const GemmProblem& p, int grp, int n0) {
  WeightSource w{nullptr, nullptr, n0, p.N};
  if (p.w_ptrs) {
    const bool second = p.w2_ptrs != nullptr && n0 >= p.n_half;
    w.base = second ? p.w2_ptrs[grp] : p.w_ptrs[grp];
    w.s = second ? (p.s2_ptrs ? p.s2_ptrs[grp] : nullptr) : (p.s_ptrs ? p.s_ptrs[grp] : nullptr);
    if (p.w2_ptrs) {
      w.wrow0 = second ? n0 - p.n_half : n0;
      w.wrows = second ? p.N - p.n_half : p.n_half;
    }
  } else {
    const int64_t wel = static_cast<int64_t>(grp) * p.w_head_stride;
    const bool second = p.w2 != nullptr && n0 >= p.n_half;  // gemm_pair: second weight
    const void* wsrc = second ? p.w2 : p.w;
    w.base = one_byte<WK>() ? static_cast<const void*>(static_cast<const uint8_t*>(wsrc) + wel)
                              : static_cast<const void*>(static_cast<const bf16*>(wsrc) + wel);
    w.s = second ? p.s2 : p.s;
    if (p.w2) {
      w.wrow0 = second ? n0 - p.n_half : n0;
      w.wrows = second ? p.N - p.n_half : p.n_half;
    }
  }
  return w;
}

// Stores one output element: `sum` of row r, column n (of head / group slot grp for the
// per-head form), rounded to the output dtype, into c (or c2 for gemm_pair's second half).
__device__ __forceinline__ void store_out(const GemmProblem& p, int grp, int r, int n, float sum) {
  void* c = p.c;
  int64_t off = static_cast<int64_t>(grp) * p.c_head_stride + static_cast<int64_t>(r) * p.ldc + n;
  if (p.c2 && n >= p.n_half) {  // gemm_pair: second output
    c = p.c2;
    off = static_cast<int64_t>(r) * p.ldc2 + (n - p.n_half);
  }
  if (p.c_bf16)
    static_cast<bf16*>(c)[off] = __float2bfloat16_rn(sum);
  else
    static_cast<float*>(c)[off] = sum;
}

}  // namespace deepinfer::cuda::smma
