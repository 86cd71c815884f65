// DeepSeek-V3's 1x128 activation quantization on the device (e4m3, one F32 scale = amax / 448
// per row and 128 columns), shared by fp8_gemm.cu (cuBLASLt's FP8 GEMMs) and
// moe_cutlass_fp8.cu (CUTLASS's blockwise-scaled grouped GEMMs): the same arithmetic as the
// CPU reference (backend/cpu/fp8.cpp), so q and the scales match it bit for bit.
#pragma once
#include "backend/cuda/device_utils.cuh"

namespace deepinfer::cuda {

constexpr int kFp8Block = 128;
constexpr float kFp8Max = 448.0f;

// One 128-column block held by a warp (lane l: v[0..3] = columns k0 .. k0 + 3, zeros past K):
// scale = amax / 448 (1 when the block is all zero), q_row[k] = e4m3(v / scale), RNE,
// saturating, for k < K. Returns the scale.
__device__ inline float quantize_warp_block(const float (&v)[4], int k0, int K, uint8_t* q_row) {
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < 4; ++j) amax = fmaxf(amax, fabsf(v[j]));
  amax = warp_max(amax);
  const float scale = amax > 0.0f ? amax / kFp8Max : 1.0f;
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (k0 + j < K) q_row[k0 + j] = __nv_cvt_float_to_fp8(v[j] / scale, __NV_SATFINITE, __NV_E4M3);
  return scale;
}

// Expert e of permuted row r: the last e with off[e] <= r (empty experts have off[e] == off[e + 1]).
__device__ inline int segment_of(const int32_t* off, int E, int r) {
  int lo = 0, hi = E - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (off[mid] <= r) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// 1x128 quantization of the permuted expert rows, one warp per (row, 128-column block), the
// same arithmetic as quantize_warp_block. Expert e owns rows [off[e], off[e + 1]) of q; its
// scales [kb, rows_e] (rows fastest) start at off[e] * kb: CUTLASS's M-major 1x128 SFA of the
// expert's group. Rows from off[E] on (launched for all `rows`) are left alone. kSwiglu = false:
// row r is x[row_token[r]] (the gather); true: row r is bf16(silu(g) * u) of row r of x (g at
// column k, u at up_offset + k), what silu_mul stores.
template <bool kSwiglu>
__global__ void quantize_segments_kernel(const bf16* x, int64_t ldx, const int32_t* row_token, int64_t up_offset,
                                         const int32_t* off, int E, int rows, int K, uint8_t* q, float* scales) {
  const int blocks = (K + kFp8Block - 1) / kFp8Block;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (item >= static_cast<int64_t>(rows) * blocks) return;
  const int r = static_cast<int>(item / blocks), b = static_cast<int>(item % blocks);
  if (r >= off[E]) return;
  const int e = segment_of(off, E, r);
  const int local = r - off[e], rows_e = off[e + 1] - off[e];
  const int64_t src = kSwiglu ? r : row_token[r];
  const int lane = threadIdx.x & 31;
  const int k0 = b * kFp8Block + lane * 4;
  float v[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    v[j] = 0.0f;
    if (k0 + j < K) {
      if (kSwiglu) {
        const float g = to_f(x[src * ldx + k0 + j]), u = to_f(x[src * ldx + up_offset + k0 + j]);
        v[j] = to_f(__float2bfloat16_rn(g / (1.0f + __expf(-g)) * u));
      } else {
        v[j] = to_f(x[src * ldx + k0 + j]);
      }
    }
  }
  const float scale = quantize_warp_block(v, k0, K, q + static_cast<int64_t>(r) * K);
  if (lane == 0) scales[static_cast<int64_t>(off[e]) * blocks + static_cast<int64_t>(b) * rows_e + local] = scale;
}

}  // namespace deepinfer::cuda
