// One row of rms_norm / add_rms_norm on the device, shared by the norm kernels (elementwise.cu
// rms_norm_kernel, fused_mla.cu rms_norm_pair_kernel) and the GEMMs' row epilogue (gemm_pipe.cu,
// row_norm.h), so that a norm gives the same bits in each of them.
#pragma once
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/row_norm.h"

namespace deepinfer::cuda {

// Element i of x: a plain load, or (kL2) one from L2 for rows other blocks of the grid wrote.
template <bool kL2>
__device__ __forceinline__ float ld_norm_x(const void* p, int64_t i, int kind) {
  if constexpr (kL2)
    return kind ? __bfloat162float(__ldcg(static_cast<const bf16*>(p) + i)) : __ldcg(static_cast<const float*>(p) + i);
  else
    return ld(p, i, kind);
}

// Row r of n: n.threads virtual threads (a multiple of 32, at most 1024); virtual thread v sums
// columns v, v + threads, ... in order, a virtual warp's sums meet in warp_sum's tree and the warps'
// partials in lane order (block_sum's order); then out = x * inv * w per column. Thread t of the
// block (blockDim.x a multiple of 32) runs virtual threads t, t + blockDim.x, ..., so any block
// size gives the bits of a block of n.threads. scratch: 32 floats of shared memory. Every thread of
// the block calls it (barriers).
template <bool kL2>
__device__ __forceinline__ void rms_norm_row(const NormRows& n, int64_t r, float eps, float* scratch) {
  const int lane = threadIdx.x & 31, first = threadIdx.x & ~31, nt = blockDim.x;
  const int threads = n.threads;
  __syncthreads();  // scratch is free: a previous row's readers are done
  for (int v0 = first; v0 < threads; v0 += nt) {  // uniform over the warp
    float ss = 0.0f;
    for (int64_t c = v0 + lane; c < n.H; c += threads) {
      float v = ld_norm_x<kL2>(n.x, r * n.ldx + c, n.x_kind);
      if (n.res != nullptr) {
        v = round_to(ld(n.res, r * n.ldr + c, n.res_kind) + v, n.res_kind);
        st(n.res, r * n.ldr + c, n.res_kind, v);
      }
      ss += v * v;
    }
    ss = warp_sum(ss);
    if (lane == 0) scratch[v0 >> 5] = ss;
  }
  __syncthreads();
  float total = lane < (threads >> 5) ? scratch[lane] : 0.0f;
  total = warp_sum(total);
  const float inv = rsqrtf(total / static_cast<float>(n.H) + eps);
  for (int v0 = first; v0 < threads; v0 += nt) {
    for (int64_t c = v0 + lane; c < n.H; c += threads) {
      const float v = n.res != nullptr ? ld(n.res, r * n.ldr + c, n.res_kind) : ld_norm_x<kL2>(n.x, r * n.ldx + c, n.x_kind);
      st(n.out, r * n.ldo + c, n.out_kind, v * inv * ld(n.w, c, n.w_kind));
    }
  }
}

__device__ __forceinline__ unsigned ld_acquire_gpu(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// The row epilogue (row_norm.h), called by every block of the GEMM grid after its last output
// store, with `smem` 33 floats of shared memory the block no longer uses. Arrival and wait as
// CUTLASS's generic barrier does them: a block barrier, then thread 0's gpu-scope fence and
// atomic add (release); the waiting thread's acquire loads, then a block barrier. The rows other
// blocks wrote are read from L2.
__device__ __forceinline__ void row_epilogue(const RowEpilogue& e, float* smem) {
  unsigned* ticket = reinterpret_cast<unsigned*>(smem + 32);
  const unsigned total = gridDim.x * gridDim.y * gridDim.z;
  __syncthreads();  // every thread's stores of this block
  if (threadIdx.x == 0) {
    __threadfence();
    *ticket = atomicAdd(e.counter, 1u);
  }
  __syncthreads();
  const unsigned workers = min(static_cast<unsigned>(max(e.workers, 1)), total);
  const unsigned t = *ticket;
  if (t + workers < total) return;  // not one of the last `workers` to arrive
  const int worker = static_cast<int>(t + workers - total);
  if (threadIdx.x == 0) {
    while (ld_acquire_gpu(e.counter) < total) __nanosleep(32);
  }
  __syncthreads();
  const int items = e.rows * e.sides;
  for (int i = worker; i < items; i += static_cast<int>(workers))
    rms_norm_row<true>(e.side[i % e.sides], i / e.sides, e.eps, smem);
  __syncthreads();
  // Leaving: every worker is past its wait once the count reaches total + workers.
  if (threadIdx.x == 0 && atomicAdd(e.counter, 1u) == total + workers - 1) atomicExch(e.counter, 0u);
}

}  // namespace deepinfer::cuda
