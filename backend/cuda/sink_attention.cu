// sink_attention on CUDA (the reference: backend/cpu/sink_attention.cpp): DeepSeek-V4's
// attention over chosen K=V rows with a per-head fp32 sink in the softmax denominator.
// One block per (query, head): warp w scores slots w, w + 8, ... (lanes stride the row, then
// the warp tree); the max and the denominator are fixed-order block reductions over the slot
// index, and each thread owns output columns, summing the slots in ascending order. A slot's
// work depends only on its position in the query's list, never on the other queries of the
// launch or on how much -1 padding follows (exact zeros): batch-invariant by construction.
#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_utils.cuh"

namespace deepinfer::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

struct SinkArgs {
  const void* q;  // [T, heads, D]
  int q_kind;
  const void* kv;  // [S, D]
  int kv_kind;
  const int32_t* indices;  // [T, N]
  const float* sinks;      // [heads]
  int heads, D, N, S;
  float scale;
  void* out;  // [T, heads, D]
  int o_kind;
};

// Shared memory: N floats (logits, then probabilities) and N ints (rows).
__global__ void __launch_bounds__(kThreads) sink_attention_kernel(SinkArgs a) {
  extern __shared__ float sm[];
  __shared__ float red[32];
  float* logit = sm;
  int32_t* rows = reinterpret_cast<int32_t*>(sm + a.N);
  const int h = blockIdx.x, t = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t qo = (int64_t{t} * a.heads + h) * a.D;
  for (int n = tid; n < a.N; n += kThreads) {
    const int32_t r = a.indices[int64_t{t} * a.N + n];
    rows[n] = r >= 0 && r < a.S ? r : -1;
  }
  __syncthreads();
  for (int n = warp; n < a.N; n += kWarps) {
    const int r = rows[n];
    if (r < 0) continue;
    float acc = 0.0f;
    for (int d = lane; d < a.D; d += 32) acc += ld(a.q, qo + d, a.q_kind) * ld(a.kv, int64_t{r} * a.D + d, a.kv_kind);
    acc = warp_sum(acc);
    if (lane == 0) logit[n] = acc * a.scale;
  }
  __syncthreads();
  const float sink = a.sinks[h];
  float m = sink;
  for (int n = tid; n < a.N; n += kThreads)
    if (rows[n] >= 0) m = fmaxf(m, logit[n]);
  m = warp_max(m);
  if (lane == 0) red[warp] = m;
  __syncthreads();
  m = red[0];
  for (int w = 1; w < kWarps; ++w) m = fmaxf(m, red[w]);
  __syncthreads();  // red is reused by block_sum
  float part = 0.0f;
  for (int n = tid; n < a.N; n += kThreads) {
    const float p = rows[n] >= 0 ? expf(logit[n] - m) : 0.0f;
    logit[n] = p;
    part += p;
  }
  const float denom = block_sum(part, red) + expf(sink - m);  // block_sum syncs before reading
  __syncthreads();
  const float inv = 1.0f / denom;
  for (int d = tid; d < a.D; d += kThreads) {
    float acc = 0.0f;
    for (int n = 0; n < a.N; ++n) {
      const int r = rows[n];
      if (r >= 0) acc += logit[n] * ld(a.kv, int64_t{r} * a.D + d, a.kv_kind);
    }
    st(a.out, qo + d, a.o_kind, acc * inv);
  }
}

}  // namespace

void CudaBackend::sink_attention(const Tensor& q, const Tensor& kv, const Tensor& indices, const Tensor& sinks,
                                 float scale, Tensor& out) {
  const char* op = "sink_attention";
  check_device(q, "sink_attention q");
  check_device(kv, "sink_attention kv");
  check_device(indices, "sink_attention indices");
  DI_CHECK(q.ndim == 3 && kv.ndim == 2 && indices.ndim == 2, op,
           ": q [T, heads, D], kv [S, D], indices [T, N] expected, got ", q.describe(), ", ", kv.describe(), ", ",
           indices.describe());
  const int64_t T = q.size(0), heads = q.size(1), D = q.size(2), S = kv.size(0), N = indices.size(1);
  check_exact(q, {DType::F32, DType::BF16}, {T, heads, D}, "sink_attention q");
  check_exact(kv, {DType::F32, DType::BF16}, {S, D}, "sink_attention kv");
  check_exact(indices, {DType::I32}, {T, N}, "sink_attention indices");
  check_exact(sinks, {DType::F32}, {heads}, "sink_attention sinks");
  check_exact(out, {DType::F32, DType::BF16}, {T, heads, D}, "sink_attention out");
  constexpr int64_t kMaxSlots = 24 * 1024;  // 192 KiB of shared memory
  DI_CHECK(N <= kMaxSlots, op, ": CUDA takes at most ", kMaxSlots, " rows per query, got ", indices.describe());
  DI_CHECK(heads <= 65535, op, ": at most 65535 heads, got ", q.describe());
  if (T == 0 || heads == 0 || D == 0) return;
  SinkArgs a{q.data, float_kind(q.dtype), kv.data, float_kind(kv.dtype), indices.ptr<int32_t>(), sinks.ptr<float>(),
             static_cast<int>(heads), static_cast<int>(D), static_cast<int>(N), static_cast<int>(S), scale,
             out.data, float_kind(out.dtype)};
  const size_t smem = static_cast<size_t>(std::max<int64_t>(N, 1)) * 8;
  set_smem_limit(reinterpret_cast<const void*>(sink_attention_kernel), smem, op);
  sink_attention_kernel<<<dim3(static_cast<unsigned>(heads), static_cast<unsigned>(T)), kThreads, smem, stream_>>>(a);
  check_launch(op, q.describe() + " kv " + kv.describe() + " indices " + indices.describe());
}

}  // namespace deepinfer::cuda
