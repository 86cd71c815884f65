// The register form of one rms_norm row (norm18), shared by elementwise.cu (rms_norm,
// add_rms_norm) and fused_mla.cu (rms_norm_pair): out = rms_norm(res + x) * w with res updated
// (add), or rms_norm(x) * w, by the block's first `threads` threads, for rows of at most
// kNormRegs * threads columns. Same float operations in the same order as the two-pass loops
// of those files (thread t sums columns t, t + threads, ... in order; the warps' trees, then the
// warp partials in lane order), so the same bits; but the loop's passes are chains of dependent
// loads (its store to res, or to out, may alias the next load, so the compiler issues one
// element's loads after the previous element's store: 8 round trips a pass at 2,048 columns),
// and here every load of the row is issued before the first use: one round trip.
#pragma once
#include "backend/cuda/device_utils.cuh"

namespace deepinfer::cuda {

// Columns per thread the register form holds (2,048 at 256 threads, 1,024 at 128).
constexpr int kNormRegs = 8;

struct NormRow {
  const void* x;
  void* res;  // add only; the dtype of x
  const void* w;
  void* out;
  int64_t ldx, ldr, ldo, H;
  int out_kind;
};

// Row r of n (H <= kNormRegs * threads), x and res of type T, w of type W (BF16 or float: typed
// loads, so no dtype branch sits between a load and the next). Calls pdl_wait() (on every thread)
// and pdl_trigger(). The weight is loaded before pdl_wait (no kernel writes it). scratch: 32
// floats of shared memory, used once.
template <typename T, typename W>
__device__ __forceinline__ void rms_norm_row_regs(const NormRow& n, int64_t r, int threads, float eps, bool add,
                                                  float* scratch) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const T* x = static_cast<const T*>(n.x) + r * n.ldx;
  T* res = static_cast<T*>(n.res) + r * n.ldr;
  const W* wp = static_cast<const W*>(n.w);
  constexpr int kRes = sizeof(T) == 2 ? 1 : 0;  // float_kind of T (round_to, st)
  // Indices clamped into the row: every load is in range and no branch separates them; the extra
  // ones are discarded below. Values stay in their storage type until used.
  int64_t col[kNormRegs];
#pragma unroll
  for (int i = 0; i < kNormRegs; ++i) {
    const int64_t c = tid + int64_t{i} * threads;
    col[i] = c < n.H ? c : n.H - 1;
  }
  W w[kNormRegs];
  T v[kNormRegs], rv[kNormRegs];
#pragma unroll
  for (int i = 0; i < kNormRegs; ++i) w[i] = wp[col[i]];
  pdl_wait();     // a programmatic dependent (pdl_launch.cuh): x and res after the kernel before
  pdl_trigger();  // the next GEMM may start streaming its weights (dec18)
#pragma unroll
  for (int i = 0; i < kNormRegs; ++i) v[i] = x[col[i]];
  if (add) {
#pragma unroll
    for (int i = 0; i < kNormRegs; ++i) rv[i] = res[col[i]];
  }
  const bool active = tid < threads;
  float f[kNormRegs];
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < kNormRegs; ++i) {
    const int64_t c = tid + int64_t{i} * threads;
    f[i] = to_f(v[i]);
    if (active && c < n.H) {
      if (add) {
        f[i] = round_to(to_f(rv[i]) + f[i], kRes);
        st(res, c, kRes, f[i]);
      }
      ss += f[i] * f[i];
    }
  }
  // block_sum's tree over `threads` threads, with one barrier (scratch is written once).
  ss = warp_sum(ss);
  if (lane == 0) scratch[warp] = ss;
  __syncthreads();
  float total = lane < (threads >> 5) ? scratch[lane] : 0.0f;
  total = warp_sum(total);
  const float inv = rsqrtf(total / static_cast<float>(n.H) + eps);
#pragma unroll
  for (int i = 0; i < kNormRegs; ++i) {
    const int64_t c = tid + int64_t{i} * threads;
    if (active && c < n.H) st(n.out, r * n.ldo + c, n.out_kind, f[i] * inv * to_f(w[i]));
  }
}

// rms_norm_row_regs for x (and res) of x_kind and w of w_kind (float_kind: 0 F32, 1 BF16).
__device__ __forceinline__ void rms_norm_row_regs(const NormRow& n, int x_kind, int w_kind, int64_t r, int threads,
                                                  float eps, bool add, float* scratch) {
  if (x_kind) {
    if (w_kind)
      rms_norm_row_regs<bf16, bf16>(n, r, threads, eps, add, scratch);
    else
      rms_norm_row_regs<bf16, float>(n, r, threads, eps, add, scratch);
  } else {
    if (w_kind)
      rms_norm_row_regs<float, bf16>(n, r, threads, eps, add, scratch);
    else
      rms_norm_row_regs<float, float>(n, r, threads, eps, add, scratch);
  }
}

}  // namespace deepinfer::cuda
