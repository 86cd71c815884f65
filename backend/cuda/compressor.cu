// compressor_pool on CUDA (the reference: backend/cpu/compressor.cpp): DeepSeek-V4's KV
// compressor pooling (CSA with overlapping windows, HCA and the indexer's without). One
// thread per output (window, column): a max pass, then the softmax-weighted sum over the
// window's slots in the CPU's slot order (the previous window's first halves, then this
// window's second halves). Per output only: batch-invariant, graph-safe.
#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_utils.cuh"

namespace deepinfer::cuda {
namespace {

struct PoolArgs {
  const void* kv;  // [T, C] (row stride ldk)
  int kv_kind;
  const void* gate;  // [T, C] (row stride ldg)
  int g_kind;
  int64_t ldk, ldg;
  const float* ape;         // [r, C]
  const float* prior_kv;    // [r, D] or nullptr
  const float* prior_gate;  // [r, D] (gate + ape) or nullptr
  int r, n, D;
  int64_t C;
  bool overlap;
  void* out;  // [n, D]
  int o_kind;
};

// Slot s of window w's softmax at column c: its logit and value; false when empty.
__device__ __forceinline__ bool pool_slot(const PoolArgs& a, int w, int c, int s, float* lg, float* val) {
  if (a.overlap && s < a.r) {  // previous window's first halves
    if (w > 0) {
      const int64_t src = int64_t{w - 1} * a.r + s;
      *lg = ld(a.gate, src * a.ldg + c, a.g_kind) + a.ape[int64_t{s} * a.C + c];
      *val = ld(a.kv, src * a.ldk + c, a.kv_kind);
      return true;
    }
    if (a.prior_kv) {
      *lg = a.prior_gate[int64_t{s} * a.D + c];
      *val = a.prior_kv[int64_t{s} * a.D + c];
      return true;
    }
    return false;
  }
  const int j = a.overlap ? s - a.r : s;
  const int64_t off = a.overlap ? a.D : 0, src = int64_t{w} * a.r + j;
  *lg = ld(a.gate, src * a.ldg + off + c, a.g_kind) + a.ape[int64_t{j} * a.C + off + c];
  *val = ld(a.kv, src * a.ldk + off + c, a.kv_kind);
  return true;
}

__global__ void compressor_pool_kernel(PoolArgs a) {
  const int64_t total = int64_t{a.n} * a.D;
  const int slots = a.overlap ? 2 * a.r : a.r;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int w = static_cast<int>(i / a.D), c = static_cast<int>(i % a.D);
    float m = -INFINITY, lg = 0.0f, val = 0.0f;
    for (int s = 0; s < slots; ++s)
      if (pool_slot(a, w, c, s, &lg, &val)) m = fmaxf(m, lg);
    float denom = 0.0f, acc = 0.0f;
    for (int s = 0; s < slots; ++s) {
      if (!pool_slot(a, w, c, s, &lg, &val)) continue;
      const float e = expf(lg - m);
      denom += e;
      acc += e * val;
    }
    st(a.out, i, a.o_kind, acc / denom);
  }
}

}  // namespace

void CudaBackend::compressor_pool(const Tensor& kv, const Tensor& gate, const Tensor& ape, int ratio, bool overlap,
                                  const Tensor& prior_kv, const Tensor& prior_gate, Tensor& out) {
  const char* op = "compressor_pool";
  DI_CHECK(ratio > 0, op, ": ratio must be > 0, got ", ratio);
  check_device(kv, "compressor_pool kv");
  DI_CHECK(kv.ndim == 2, op, ": kv must be [T, C], got ", kv.describe());
  const int64_t T = kv.size(0), C = kv.size(1), r = ratio, n = T / r;
  DI_CHECK(!overlap || C % 2 == 0, op, ": overlapping kv needs an even width, got ", kv.describe());
  const int64_t D = overlap ? C / 2 : C;
  check_float(kv, "compressor_pool kv");
  check_float(gate, "compressor_pool gate");
  const RowView kr = rows_of(kv, "compressor_pool kv"), gr = rows_of(gate, "compressor_pool gate");
  DI_CHECK(gate.ndim == 2 && gr.rows == T && gr.cols == C, op, ": gate ", gate.describe(), " must match kv ",
           kv.describe());
  check_exact(ape, {DType::F32}, {r, C}, "compressor_pool ape");
  check_exact(out, {DType::F32, DType::BF16}, {n, D}, "compressor_pool out");
  const bool prior = prior_kv.defined();
  DI_CHECK(!prior || overlap, op, ": prior rows are only for overlapping windows");
  if (prior) {
    check_exact(prior_kv, {DType::F32}, {r, D}, "compressor_pool prior_kv");
    check_exact(prior_gate, {DType::F32}, {r, D}, "compressor_pool prior_gate");
  }
  if (n == 0 || D == 0) return;
  PoolArgs a{kv.data, float_kind(kv.dtype), gate.data, float_kind(gate.dtype), kr.row_stride, gr.row_stride,
             ape.ptr<float>(),
             prior ? prior_kv.ptr<float>() : nullptr, prior ? prior_gate.ptr<float>() : nullptr,
             ratio, static_cast<int>(n), static_cast<int>(D), C, overlap, out.data, float_kind(out.dtype)};
  const unsigned grid = std::min<unsigned>(ceil_div(n * D, 256), static_cast<unsigned>(num_sms_) * 8);
  compressor_pool_kernel<<<grid, 256, 0, stream_>>>(a);
  check_launch(op, kv.describe() + " ratio " + std::to_string(ratio));
}

}  // namespace deepinfer::cuda
