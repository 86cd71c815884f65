// Device-side helpers for the .cu files: bf16/float conversions, loads and stores of
// run-time-dtype activations, warp and block reductions in a fixed order (the result never depends on how many rows share a launch).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace deepinfer::cuda {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) { return x; }
template <>
__device__ __forceinline__ bf16 from_f<bf16>(float x) { return __float2bfloat16_rn(x); }

// Activations whose dtype is a run-time flag (float_kind in cuda_common.h: 0 = F32, 1 = BF16):
// element i of p as float, store v rounded to the dtype, and v as a later read would give it.
__device__ __forceinline__ float ld(const void* p, int64_t i, int kind) {
  return kind ? __bfloat162float(static_cast<const bf16*>(p)[i]) : static_cast<const float*>(p)[i];
}
__device__ __forceinline__ void st(void* p, int64_t i, int kind, float v) {
  if (kind)
    static_cast<bf16*>(p)[i] = __float2bfloat16_rn(v);
  else
    static_cast<float*>(p)[i] = v;
}
__device__ __forceinline__ float round_to(float v, int kind) {
  return kind ? __bfloat162float(__float2bfloat16_rn(v)) : v;
}

__device__ __forceinline__ float fp8_to_f(uint8_t b) {
  __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), __NV_E4M3);
  return __half2float(__half(h));
}

// Butterfly sum over the warp: every lane gets the same value, summed in a fixed tree.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Butterfly argmax over the warp: every lane gets the best (v, i) of the lanes; a higher value
// wins, an equal one goes to the lower index.
template <typename Index>
__device__ __forceinline__ void warp_argmax(float& v, Index& i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const Index oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (ov > v || (ov == v && oi < i)) {
      v = ov;
      i = oi;
    }
  }
}

// Block-wide sum (blockDim.x a multiple of 32, <= 1024); `scratch` holds 32 floats.
// Fixed order: warp trees, then warp 0 sums the partials in lane order.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int num_warps = blockDim.x >> 5;
  float r = lane < num_warps ? scratch[lane] : 0.0f;
  r = warp_sum(r);
  return r;
}

// Sequence of token t of a paged step (PagedKV: query_start [S + 1], seq_lens [S]) and its
// position in that sequence (query token i of sequence s sits at seq_lens[s] - q_len(s) + i).
__device__ __forceinline__ void locate(const int32_t* query_start, const int32_t* seq_lens, int S,
                                       int t, int* seq, int* pos) {
  int lo = 0, hi = S - 1;
  while (lo < hi) {  // last s with query_start[s] <= t
    const int mid = (lo + hi + 1) / 2;
    if (query_start[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  *seq = lo;
  const int q_len = query_start[lo + 1] - query_start[lo];
  *pos = seq_lens[lo] - q_len + (t - query_start[lo]);
}

// Programmatic dependent launch (sm_90; dec18). pdl_trigger: this grid's dependents (a kernel
// launched after it with the programmatic-serialization attribute, CudaBackend::pdl_) may start
// once every block of this grid has triggered; a no-op when the next kernel is a plain launch.
// pdl_wait: in a kernel launched with the attribute, waits until the previous grid has completed
// and its memory is visible (a no-op in a plain launch). Nothing the previous kernels write may
// be read before pdl_wait; data no kernel writes (weights) may.
// (sm_90 and later only; nothing on older targets, which have no programmatic launches.)
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

}  // namespace deepinfer::cuda
