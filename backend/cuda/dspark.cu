// The DSpark drafter's heads on CUDA (DeepSeek-V4.1; reference: backend/cpu/dspark.cpp; backend.h
// gives the math).
//  - markov_argmax: one block per drafted block n; each thread scans ids tid, tid + 256, ... of
//    logits[n, step] + bias[n] (one float add, as the CPU makes it: the same sums), keeping the
//    first largest non-NaN sum; a warp then block argmax (higher value wins, equal ones go to the
//    lower id) gives the CPU's id exactly. No id (every sum NaN): -1, next 0.
//  - dspark_confidence: one block per row, the dot product in fixed-order fp32 block sums (the CPU
//    sums in double: the confidences differ by rounding only), then the sigmoid.
#include <climits>
#include <cmath>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_utils.cuh"

namespace deepinfer::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    markov_argmax_kernel(const float* logits, int64_t step, int64_t B, int64_t V, const float* bias, int64_t vocab,
                         int32_t* drafts, int32_t* next) {
  __shared__ float best_v[kThreads / 32];
  __shared__ int best_i[kThreads / 32];
  const int64_t n = blockIdx.x;
  const float* row = logits + (n * B + step) * V;
  const float* add = bias != nullptr ? bias + n * V : nullptr;
  float v = -INFINITY;
  int i = INT_MAX;
  for (int64_t j = threadIdx.x; j < vocab; j += kThreads) {
    const float s = add != nullptr ? row[j] + add[j] : row[j];
    if (!isnan(s) && (i == INT_MAX || s > v)) {
      v = s;
      i = static_cast<int>(j);
    }
  }
  warp_argmax(v, i);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    best_v[warp] = v;
    best_i[warp] = i;
  }
  __syncthreads();
  if (warp != 0) return;
  v = lane < kThreads / 32 ? best_v[lane] : -INFINITY;
  i = lane < kThreads / 32 ? best_i[lane] : INT_MAX;
  warp_argmax(v, i);
  if (lane == 0) {
    const int32_t id = i == INT_MAX ? -1 : i;
    drafts[n * B + step] = id;
    next[n] = id < 0 ? 0 : id;
  }
}

__global__ void __launch_bounds__(kThreads)
    dspark_confidence_kernel(const void* h, int h_kind, int64_t H, const void* e, int e_kind, int64_t R,
                             const float* w, float* out) {
  __shared__ float red[32];
  const int64_t t = blockIdx.x;
  float acc = 0.0f;
  for (int64_t j = threadIdx.x; j < H; j += kThreads) acc += w[j] * ld(h, t * H + j, h_kind);
  for (int64_t k = threadIdx.x; k < R; k += kThreads) acc += w[H + k] * ld(e, t * R + k, e_kind);
  acc = block_sum(acc, red);
  if (threadIdx.x == 0) out[t] = 1.0f / (1.0f + expf(-acc));
}

}  // namespace

void CudaBackend::markov_argmax(const Tensor& logits, int64_t step, const Tensor& bias, int64_t vocab,
                                Tensor& drafts, Tensor& next) {
  check_device(logits, "markov_argmax logits");
  DI_CHECK(logits.ndim == 3, "markov_argmax: logits must be F32 [N, B, V], got ", logits.describe());
  const int64_t N = logits.size(0), B = logits.size(1), V = logits.size(2);
  check_exact(logits, {DType::F32}, {N, B, V}, "markov_argmax logits");
  if (bias.defined()) check_exact(bias, {DType::F32}, {N, V}, "markov_argmax bias");
  check_exact(drafts, {DType::I32}, {N, B}, "markov_argmax drafts");
  check_exact(next, {DType::I32}, {N}, "markov_argmax next");
  DI_CHECK(step >= 0 && step < B, "markov_argmax: step ", step, " outside the block of ", B);
  DI_CHECK(vocab >= 1 && vocab <= V && vocab < INT_MAX, "markov_argmax: vocab ", vocab, " outside [1, ", V, "]");
  if (N == 0) return;
  markov_argmax_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream_>>>(
      logits.ptr<float>(), step, B, V, bias.defined() ? bias.ptr<float>() : nullptr, vocab, drafts.ptr<int32_t>(),
      next.ptr<int32_t>());
  check_launch("markov_argmax", logits.describe());
}

void CudaBackend::dspark_confidence(const Tensor& h, const Tensor& e, const Tensor& w, Tensor& out) {
  check_device(h, "dspark_confidence h");
  DI_CHECK(h.ndim == 2, "dspark_confidence: h must be F32 or BF16 [T, H], got ", h.describe());
  const int64_t T = h.size(0), H = h.size(1), R = e.defined() ? (e.ndim == 2 ? e.size(1) : -1) : 0;
  check_exact(h, {DType::F32, DType::BF16}, {T, H}, "dspark_confidence h");
  if (e.defined()) {
    DI_CHECK(R >= 0, "dspark_confidence: e must be F32 or BF16 [", T, ", R], got ", e.describe());
    check_exact(e, {DType::F32, DType::BF16}, {T, R}, "dspark_confidence e");
  }
  check_exact(w, {DType::F32}, {H + R}, "dspark_confidence w");
  check_exact(out, {DType::F32}, {T}, "dspark_confidence out");
  if (T == 0) return;
  dspark_confidence_kernel<<<static_cast<unsigned>(T), kThreads, 0, stream_>>>(
      h.data, float_kind(h.dtype), H, e.defined() ? e.data : nullptr, e.defined() ? float_kind(e.dtype) : 0, R,
      w.ptr<float>(), out.ptr<float>());
  check_launch("dspark_confidence", h.describe());
}

}  // namespace deepinfer::cuda
