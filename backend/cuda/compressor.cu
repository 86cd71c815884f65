// compressor_pool on CUDA (the reference: backend/cpu/compressor.cpp): DeepSeek-V4's KV
// compressor pooling (CSA with overlapping windows, HCA and the indexer's without). One
// thread per output (window, column): a max pass, then the softmax-weighted sum over the
// window's slots in the CPU's slot order (the previous window's first halves, then this
// window's second halves). Per output only: batch-invariant, graph-safe.
#include <algorithm>
#include <cmath>
#include <string>

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
  const int32_t* row_ids;  // compressor_pool_rows: [n, slots] rows of kv / gate (-1: empty), else nullptr
};

// Slot s of window w's softmax at column c: its logit and value; false when empty.
__device__ __forceinline__ bool pool_slot(const PoolArgs& a, int w, int c, int s, float* lg, float* val) {
  if (a.row_ids != nullptr) {  // listed rows: slot s reads row_ids[w, s]
    const int slots = a.overlap ? 2 * a.r : a.r;
    const int32_t src = a.row_ids[int64_t{w} * slots + s];
    if (src < 0) return false;
    const int j = s % a.r;
    const int64_t col = a.overlap && s >= a.r ? a.D + c : c;
    *lg = ld(a.gate, src * a.ldg + col, a.g_kind) + a.ape[int64_t{j} * a.C + col];
    *val = ld(a.kv, src * a.ldk + col, a.kv_kind);
    return true;
  }
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
    st(a.out, i, a.o_kind, denom > 0.0f ? acc / denom : 0.0f);  // no slot (compressor_pool_rows): 0
  }
}

struct PoolShape {
  int64_t rows, C, D;
  RowView kr, gr;
};

// kv and gate device rows [rows, C] (row-strided views), ape [ratio, C]: their shape and rows.
PoolShape check_pool_inputs(const Tensor& kv, const Tensor& gate, const Tensor& ape, int ratio, bool overlap,
                            const char* op) {
  const std::string name(op);
  DI_CHECK(ratio > 0, op, ": ratio must be > 0, got ", ratio);
  check_device(kv, (name + " kv").c_str());
  DI_CHECK(kv.ndim == 2, op, ": kv must be [rows, C], got ", kv.describe());
  const int64_t rows = kv.size(0), C = kv.size(1);
  DI_CHECK(!overlap || C % 2 == 0, op, ": overlapping kv needs an even width, got ", kv.describe());
  check_float(kv, (name + " kv").c_str());
  check_float(gate, (name + " gate").c_str());
  const RowView kr = rows_of(kv, (name + " kv").c_str()), gr = rows_of(gate, (name + " gate").c_str());
  DI_CHECK(gate.ndim == 2 && gr.rows == rows && gr.cols == C, op, ": gate ", gate.describe(), " must match kv ",
           kv.describe());
  check_exact(ape, {DType::F32}, {ratio, C}, (name + " ape").c_str());
  return {rows, C, overlap ? C / 2 : C, kr, gr};
}

}  // namespace

void CudaBackend::compressor_pool(const Tensor& kv, const Tensor& gate, const Tensor& ape, int ratio, bool overlap,
                                  const Tensor& prior_kv, const Tensor& prior_gate, Tensor& out) {
  const char* op = "compressor_pool";
  const PoolShape ps = check_pool_inputs(kv, gate, ape, ratio, overlap, op);
  const int64_t T = ps.rows, C = ps.C, D = ps.D, r = ratio, n = T / r;
  const RowView& kr = ps.kr;
  const RowView& gr = ps.gr;
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
             ratio, static_cast<int>(n), static_cast<int>(D), C, overlap, out.data, float_kind(out.dtype), nullptr};
  const unsigned grid = std::min<unsigned>(ceil_div(n * D, 256), static_cast<unsigned>(num_sms_) * 8);
  compressor_pool_kernel<<<grid, 256, 0, stream_>>>(a);
  check_launch(op, kv.describe() + " ratio " + std::to_string(ratio));
}

void CudaBackend::compressor_pool_rows(const Tensor& kv, const Tensor& gate, const Tensor& ape, const Tensor& row_ids,
                                       int ratio, bool overlap, Tensor& out) {
  const char* op = "compressor_pool_rows";
  const PoolShape ps = check_pool_inputs(kv, gate, ape, ratio, overlap, op);
  check_device(row_ids, "compressor_pool_rows row_ids");
  DI_CHECK(row_ids.ndim == 2, op, ": row_ids must be [n, slots], got ", row_ids.describe());
  const int64_t C = ps.C, D = ps.D, r = ratio, n = row_ids.size(0), slots = overlap ? 2 * r : r;
  const RowView& kr = ps.kr;
  const RowView& gr = ps.gr;
  check_exact(row_ids, {DType::I32}, {n, slots}, "compressor_pool_rows row_ids");
  check_exact(out, {DType::F32, DType::BF16}, {n, D}, "compressor_pool_rows out");
  if (n == 0 || D == 0) return;
  PoolArgs a{kv.data, float_kind(kv.dtype), gate.data, float_kind(gate.dtype), kr.row_stride, gr.row_stride,
             ape.ptr<float>(), nullptr, nullptr, ratio, static_cast<int>(n), static_cast<int>(D), C, overlap,
             out.data, float_kind(out.dtype), row_ids.ptr<int32_t>()};
  const unsigned grid = std::min<unsigned>(ceil_div(n * D, 256), static_cast<unsigned>(num_sms_) * 8);
  compressor_pool_kernel<<<grid, 256, 0, stream_>>>(a);
  check_launch(op, kv.describe() + " rows " + row_ids.describe() + " ratio " + std::to_string(ratio));
}

}  // namespace deepinfer::cuda
