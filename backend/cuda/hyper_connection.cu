// DeepSeek-V4's manifold-constrained hyper-connections on CUDA (the reference:
// backend/cpu/hyper_connection.cpp; backend.h gives the math).
//  - hc_pre / hc_head: one block per token. The RMS of the token's flattened streams is a
//    fixed-order block sum; mix row m (fn[m] . flat) is one warp's dot product (lanes stride
//    the row, then the warp tree), scaled by the RMS afterwards; thread 0 then runs the tiny
//    sigmoid / softmax / Sinkhorn steps in the CPU's order, and the collapse sums the streams
//    in ascending order. Nothing depends on the other tokens of the launch: batch-invariant
//    by construction, and the grid depends on the shapes only (graph-safe).
//  - hc_mix (V4.1): hc_pre's kernel writing pre instead of the collapse.
//  - hc_post, hc_collapse (V4.1): elementwise, each output sums the streams in ascending order.
// Streams and outputs F32 or BF16; fn, base, scale, post and comb F32.
#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_utils.cuh"

namespace deepinfer::cuda {
namespace {

constexpr int kMaxHc = 8;
constexpr int kMaxMixes = (2 + kMaxHc) * kMaxHc;
constexpr int kThreads = 256;

struct MixArgs {
  const void* x;  // [T, hc, H] contiguous
  int x_kind;
  const float* fn;  // [mixes, hc * H]
  const float* base;
  const float* scale;
  int hc, H, mixes, iters;
  bool head;  // hc_head: mixes == hc, pre only
  float hc_eps, norm_eps;
  void* collapsed;  // [T, H]
  int c_kind;
  float* post;  // [T, hc] (hc_pre)
  float* comb;  // [T, hc, hc] (hc_pre)
  float* pre_out = nullptr;  // [T, hc] (hc_mix: pre written, no collapse)
};

__device__ __forceinline__ float sigmoidf(float v) { return 1.0f / (1.0f + expf(-v)); }

__global__ void __launch_bounds__(kThreads) hc_mix_kernel(MixArgs a) {
  __shared__ float red[32];
  __shared__ float mix[kMaxMixes];
  __shared__ float pre[kMaxHc];
  const int t = blockIdx.x, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int hc = a.hc;
  const int64_t n = int64_t{hc} * a.H;
  const int64_t base_i = int64_t{t} * n;
  float ss = 0.0f;
  for (int64_t i = tid; i < n; i += kThreads) {
    const float v = ld(a.x, base_i + i, a.x_kind);
    ss += v * v;
  }
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(n) + a.norm_eps);
  for (int m = warp; m < a.mixes; m += kThreads / 32) {
    const float* w = a.fn + int64_t{m} * n;
    float acc = 0.0f;
    for (int64_t i = lane; i < n; i += 32) acc += w[i] * ld(a.x, base_i + i, a.x_kind);
    acc = warp_sum(acc);
    if (lane == 0) mix[m] = acc * inv;
  }
  __syncthreads();
  if (tid == 0) {
    const float* b = a.base;
    const float* sc = a.scale;
    for (int k = 0; k < hc; ++k) pre[k] = sigmoidf(mix[k] * sc[0] + b[k]) + a.hc_eps;
    if (a.pre_out != nullptr)
      for (int k = 0; k < hc; ++k) a.pre_out[int64_t{t} * hc + k] = pre[k];
    if (!a.head) {
      for (int k = 0; k < hc; ++k) a.post[int64_t{t} * hc + k] = 2.0f * sigmoidf(mix[hc + k] * sc[1] + b[hc + k]);
      float c[kMaxHc * kMaxHc];  // c[j * hc + k]: row j, column k
      for (int j = 0; j < hc; ++j) {
        float mx = -INFINITY;
        for (int k = 0; k < hc; ++k) {
          c[j * hc + k] = mix[2 * hc + j * hc + k] * sc[2] + b[2 * hc + j * hc + k];
          mx = fmaxf(mx, c[j * hc + k]);
        }
        float sum = 0.0f;
        for (int k = 0; k < hc; ++k) sum += (c[j * hc + k] = expf(c[j * hc + k] - mx));
        for (int k = 0; k < hc; ++k) c[j * hc + k] = c[j * hc + k] / sum + a.hc_eps;
      }
      for (int it = 0; it < a.iters; ++it) {
        if (it > 0) {  // rows (the first round's rows are the softmax above)
          for (int j = 0; j < hc; ++j) {
            float s = 0.0f;
            for (int k = 0; k < hc; ++k) s += c[j * hc + k];
            for (int k = 0; k < hc; ++k) c[j * hc + k] /= (s + a.hc_eps);
          }
        }
        for (int k = 0; k < hc; ++k) {  // columns
          float s = 0.0f;
          for (int j = 0; j < hc; ++j) s += c[j * hc + k];
          for (int j = 0; j < hc; ++j) c[j * hc + k] /= (s + a.hc_eps);
        }
      }
      for (int i = 0; i < hc * hc; ++i) a.comb[int64_t{t} * hc * hc + i] = c[i];
    }
  }
  __syncthreads();
  if (a.collapsed == nullptr) return;
  for (int d = tid; d < a.H; d += kThreads) {
    float acc = 0.0f;
    for (int k = 0; k < hc; ++k) acc += pre[k] * ld(a.x, base_i + int64_t{k} * a.H + d, a.x_kind);
    st(a.collapsed, int64_t{t} * a.H + d, a.c_kind, acc);
  }
}

__global__ void hc_post_kernel(const void* x, int x_kind, const void* f, int f_kind, const float* post,
                               const float* comb, int64_t T, int hc, int64_t H, void* out, int o_kind) {
  const int64_t n = T * hc * H;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / (hc * H), k = (i / H) % hc, d = i % H;
    const float* c = comb + t * hc * hc;
    float acc = post[t * hc + k] * ld(f, t * H + d, f_kind);
    for (int j = 0; j < hc; ++j) acc += c[j * hc + k] * ld(x, (t * hc + j) * H + d, x_kind);
    st(out, i, o_kind, acc);
  }
}

// hc_collapse: out[t, d] = sum_k pre[t, k] streams[t, k, d], the streams in ascending order.
__global__ void hc_collapse_kernel(const void* x, int x_kind, const float* pre, int64_t T, int hc, int64_t H,
                                   void* out, int o_kind) {
  const int64_t n = T * H;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / H, d = i % H;
    float acc = 0.0f;
    for (int k = 0; k < hc; ++k) acc += pre[t * hc + k] * ld(x, (t * hc + k) * H + d, x_kind);
    st(out, i, o_kind, acc);
  }
}

void launch_mix(CudaBackend& be, const MixArgs& a, int64_t T, const char* op, const std::string& shapes) {
  if (T == 0) return;
  hc_mix_kernel<<<static_cast<unsigned>(T), kThreads, 0, be.stream()>>>(a);
  be.check_launch(op, shapes);
}

}  // namespace

void CudaBackend::hc_pre(const Tensor& streams, const Tensor& fn, const Tensor& base, const Tensor& scale,
                         const HyperConnectionParams& p, Tensor& collapsed, Tensor& post, Tensor& comb) {
  const char* op = "hc_pre";
  check_device(streams, "hc_pre streams");
  DI_CHECK(streams.ndim == 3, op, ": streams must be [T, hc, H], got ", streams.describe());
  const int64_t T = streams.size(0), hc = p.hc_mult, H = streams.size(2), mixes = (2 + hc) * hc;
  DI_CHECK(hc >= 1 && hc <= kMaxHc, op, ": CUDA takes hc_mult in [1, ", kMaxHc, "], got ", hc);
  DI_CHECK(p.sinkhorn_iters >= 1, op, ": sinkhorn_iters must be >= 1, got ", p.sinkhorn_iters);
  check_exact(streams, {DType::F32, DType::BF16}, {T, hc, H}, "hc_pre streams");
  check_exact(fn, {DType::F32}, {mixes, hc * H}, "hc_pre fn");
  check_exact(base, {DType::F32}, {mixes}, "hc_pre base");
  check_exact(scale, {DType::F32}, {3}, "hc_pre scale");
  check_exact(collapsed, {DType::F32, DType::BF16}, {T, H}, "hc_pre collapsed");
  check_exact(post, {DType::F32}, {T, hc}, "hc_pre post");
  check_exact(comb, {DType::F32}, {T, hc, hc}, "hc_pre comb");
  MixArgs a{streams.data, float_kind(streams.dtype), fn.ptr<float>(), base.ptr<float>(), scale.ptr<float>(),
            static_cast<int>(hc), static_cast<int>(H), static_cast<int>(mixes), p.sinkhorn_iters, false,
            p.hc_eps, p.norm_eps, collapsed.data, float_kind(collapsed.dtype), post.ptr<float>(),
            comb.ptr<float>()};
  launch_mix(*this, a, T, op, streams.describe());
}

void CudaBackend::hc_mix(const Tensor& streams, const Tensor& fn, const Tensor& base, const Tensor& scale,
                         const HyperConnectionParams& p, Tensor& pre, Tensor& post, Tensor& comb) {
  const char* op = "hc_mix";
  check_device(streams, "hc_mix streams");
  DI_CHECK(streams.ndim == 3, op, ": streams must be [T, hc, H], got ", streams.describe());
  const int64_t T = streams.size(0), hc = p.hc_mult, H = streams.size(2), mixes = (2 + hc) * hc;
  DI_CHECK(hc >= 1 && hc <= kMaxHc, op, ": CUDA takes hc_mult in [1, ", kMaxHc, "], got ", hc);
  DI_CHECK(p.sinkhorn_iters >= 1, op, ": sinkhorn_iters must be >= 1, got ", p.sinkhorn_iters);
  check_exact(streams, {DType::F32, DType::BF16}, {T, hc, H}, "hc_mix streams");
  check_exact(fn, {DType::F32}, {mixes, hc * H}, "hc_mix fn");
  check_exact(base, {DType::F32}, {mixes}, "hc_mix base");
  check_exact(scale, {DType::F32}, {3}, "hc_mix scale");
  check_exact(pre, {DType::F32}, {T, hc}, "hc_mix pre");
  check_exact(post, {DType::F32}, {T, hc}, "hc_mix post");
  check_exact(comb, {DType::F32}, {T, hc, hc}, "hc_mix comb");
  MixArgs a{streams.data, float_kind(streams.dtype), fn.ptr<float>(), base.ptr<float>(), scale.ptr<float>(),
            static_cast<int>(hc), static_cast<int>(H), static_cast<int>(mixes), p.sinkhorn_iters, false,
            p.hc_eps, p.norm_eps, nullptr, 0, post.ptr<float>(), comb.ptr<float>(), pre.ptr<float>()};
  launch_mix(*this, a, T, op, streams.describe());
}

void CudaBackend::hc_collapse(const Tensor& streams, const Tensor& pre, Tensor& out) {
  const char* op = "hc_collapse";
  check_device(streams, "hc_collapse streams");
  DI_CHECK(streams.ndim == 3, op, ": streams must be [T, hc, H], got ", streams.describe());
  const int64_t T = streams.size(0), hc = streams.size(1), H = streams.size(2);
  check_exact(streams, {DType::F32, DType::BF16}, {T, hc, H}, "hc_collapse streams");
  check_exact(pre, {DType::F32}, {T, hc}, "hc_collapse pre");
  check_exact(out, {DType::F32, DType::BF16}, {T, H}, "hc_collapse out");
  const int64_t n = T * H;
  if (n == 0) return;
  const unsigned grid = std::min<unsigned>(ceil_div(n, 256), static_cast<unsigned>(num_sms_) * 8);
  hc_collapse_kernel<<<grid, 256, 0, stream_>>>(streams.data, float_kind(streams.dtype), pre.ptr<float>(), T,
                                                static_cast<int>(hc), H, out.data, float_kind(out.dtype));
  check_launch(op, streams.describe());
}

void CudaBackend::hc_head(const Tensor& streams, const Tensor& fn, const Tensor& base, const Tensor& scale,
                          const HyperConnectionParams& p, Tensor& out) {
  const char* op = "hc_head";
  check_device(streams, "hc_head streams");
  DI_CHECK(streams.ndim == 3, op, ": streams must be [T, hc, H], got ", streams.describe());
  const int64_t T = streams.size(0), hc = p.hc_mult, H = streams.size(2);
  DI_CHECK(hc >= 1 && hc <= kMaxHc, op, ": CUDA takes hc_mult in [1, ", kMaxHc, "], got ", hc);
  check_exact(streams, {DType::F32, DType::BF16}, {T, hc, H}, "hc_head streams");
  check_exact(fn, {DType::F32}, {hc, hc * H}, "hc_head fn");
  check_exact(base, {DType::F32}, {hc}, "hc_head base");
  check_exact(scale, {DType::F32}, {1}, "hc_head scale");
  check_exact(out, {DType::F32, DType::BF16}, {T, H}, "hc_head out");
  MixArgs a{streams.data, float_kind(streams.dtype), fn.ptr<float>(), base.ptr<float>(), scale.ptr<float>(),
            static_cast<int>(hc), static_cast<int>(H), static_cast<int>(hc), 1, true, p.hc_eps, p.norm_eps,
            out.data, float_kind(out.dtype), nullptr, nullptr};
  launch_mix(*this, a, T, op, streams.describe());
}

void CudaBackend::hc_post(const Tensor& streams, const Tensor& f, const Tensor& post, const Tensor& comb,
                          Tensor& out) {
  const char* op = "hc_post";
  check_device(streams, "hc_post streams");
  DI_CHECK(streams.ndim == 3, op, ": streams must be [T, hc, H], got ", streams.describe());
  const int64_t T = streams.size(0), hc = streams.size(1), H = streams.size(2);
  check_exact(streams, {DType::F32, DType::BF16}, {T, hc, H}, "hc_post streams");
  check_exact(f, {DType::F32, DType::BF16}, {T, H}, "hc_post f");
  check_exact(post, {DType::F32}, {T, hc}, "hc_post post");
  check_exact(comb, {DType::F32}, {T, hc, hc}, "hc_post comb");
  check_exact(out, {DType::F32, DType::BF16}, {T, hc, H}, "hc_post out");
  DI_CHECK(out.data != streams.data, op, ": out must not alias streams");
  const int64_t n = T * hc * H;
  if (n == 0) return;
  const unsigned grid = std::min<unsigned>(ceil_div(n, 256), static_cast<unsigned>(num_sms_) * 8);
  hc_post_kernel<<<grid, 256, 0, stream_>>>(streams.data, float_kind(streams.dtype), f.data, float_kind(f.dtype),
                                            post.ptr<float>(), comb.ptr<float>(), T, static_cast<int>(hc), H,
                                            out.data, float_kind(out.dtype));
  check_launch(op, streams.describe());
}

}  // namespace deepinfer::cuda
