// DeepSeek-V4.1 Engram on CUDA (the reference: backend/cpu/engram.cpp; backend.h gives the math).
//  - engram_gate: one block per (token, stream): the three sums (h.h, key.key, h.w.key) are fixed-
//    order block sums in fp32 (the CPU sums in double: the gate differs by rounding only), then every
//    thread writes h + gate * value for its channels. Batch-invariant by construction.
//  - embedding_fp8_rows: elementwise, e4m3 * 2^(b - 127) (or the F32 scale) as the CPU computes it
//    (one float multiply: the same bits). An id outside the table gives NaN (the CPU throws).
#include <cmath>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_utils.cuh"

namespace deepinfer::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) engram_gate_kernel(const float* streams, const float* kv,
                                                               const float* weight, int hc, int H, float eps,
                                                               float* out) {
  __shared__ float red[32];
  const int64_t t = blockIdx.x / hc;
  const int k = static_cast<int>(blockIdx.x % hc);
  const float* h = streams + (t * hc + k) * H;
  const float* key = kv + t * (hc + 1) * H + int64_t{k} * H;
  const float* value = kv + t * (hc + 1) * H + int64_t{hc} * H;
  const float* w = weight + int64_t{k} * H;
  float hh = 0.0f, kk = 0.0f, dot = 0.0f;
  for (int d = threadIdx.x; d < H; d += kThreads) {
    hh += h[d] * h[d];
    kk += key[d] * key[d];
    dot += h[d] * w[d] * key[d];
  }
  hh = block_sum(hh, red);
  kk = block_sum(kk, red);
  dot = block_sum(dot, red);
  const float rstd = (1.0f / sqrtf(hh / static_cast<float>(H) + eps)) * (1.0f / sqrtf(kk / static_cast<float>(H) + eps));
  const float g = dot * rstd * (1.0f / sqrtf(static_cast<float>(H)));
  const float root = sqrtf(fmaxf(fabsf(g), 1e-6f));
  const float s = signbit(g) ? -root : root;
  const float gate = 1.0f / (1.0f + expf(-s));
  float* o = out + (t * hc + k) * H;
  __syncthreads();  // out may be streams: every read of h is done
  for (int d = threadIdx.x; d < H; d += kThreads) o[d] = h[d] + gate * value[d];
}

// scale_kind: 0 F32 scales, 1 E8M0 bytes.
__global__ void embedding_fp8_rows_kernel(const int32_t* ids, int64_t N, const uint8_t* table, int64_t R, int64_t C,
                                          const void* scales, int scale_kind, void* out, int o_kind, int64_t ldo) {
  const int64_t total = N * C, B = C / 32;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t n = i / C, c = i % C;
    const int64_t r = ids[n];
    float v = __int_as_float(0x7fc00000);
    if (r >= 0 && r < R) {
      const float s = scale_kind == 0
                          ? static_cast<const float*>(scales)[r * B + c / 32]
                          : ldexpf(1.0f, static_cast<int>(static_cast<const uint8_t*>(scales)[r * B + c / 32]) - 127);
      v = fp8_to_f(table[r * C + c]) * s;
    }
    st(out, n * ldo + c, o_kind, v);
  }
}

}  // namespace

void CudaBackend::engram_gate(const Tensor& streams, const Tensor& kv, const Tensor& weight, float eps, Tensor& out) {
  check_device(streams, "engram_gate streams");
  DI_CHECK(streams.ndim == 3, "engram_gate: streams must be [T, hc, H], got ", streams.describe());
  const int64_t T = streams.size(0), hc = streams.size(1), H = streams.size(2);
  check_exact(streams, {DType::F32}, {T, hc, H}, "engram_gate streams");
  check_exact(kv, {DType::F32}, {T, (hc + 1) * H}, "engram_gate kv");
  check_exact(weight, {DType::F32}, {hc, H}, "engram_gate weight");
  check_exact(out, {DType::F32}, {T, hc, H}, "engram_gate out");
  if (T * hc == 0 || H == 0) return;
  engram_gate_kernel<<<static_cast<unsigned>(T * hc), kThreads, 0, stream_>>>(
      streams.ptr<float>(), kv.ptr<float>(), weight.ptr<float>(), static_cast<int>(hc), static_cast<int>(H), eps,
      out.ptr<float>());
  check_launch("engram_gate", streams.describe());
}

void CudaBackend::embedding_fp8_rows(const Tensor& ids, const Tensor& table, const Tensor& scales, Tensor& out) {
  check_device(table, "embedding_fp8_rows table");
  DI_CHECK(table.ndim == 2 && table.dtype == DType::F8_E4M3 && table.is_contiguous() && table.size(1) % 32 == 0,
           "embedding_fp8_rows: table must be contiguous F8_E4M3 [R, C] with C % 32 == 0, got ", table.describe());
  const int64_t R = table.size(0), C = table.size(1), B = C / 32, N = ids.numel();
  check_device(scales, "embedding_fp8_rows scales");
  DI_CHECK(scales.ndim == 2 && scales.size(0) == R && scales.size(1) == B && scales.is_contiguous() &&
               (scales.dtype == DType::F8_E8M0 || scales.dtype == DType::U8 || scales.dtype == DType::F32),
           "embedding_fp8_rows: scales must be contiguous F8_E8M0/U8/F32 [", R, ", ", B, "], got ",
           scales.describe());
  check_dtype(ids, DType::I32, "embedding_fp8_rows ids");
  DI_CHECK(ids.is_contiguous(), "embedding_fp8_rows: ids must be contiguous, got ", ids.describe());
  const RowView o = rows_of(out, "embedding_fp8_rows out");
  check_float(out, "embedding_fp8_rows out");
  DI_CHECK(o.rows == N && o.cols == C, "embedding_fp8_rows: out ", out.describe(), " must be [", N, ", ", C, "]");
  if (N == 0 || C == 0) return;
  embedding_fp8_rows_kernel<<<std::min<unsigned>(ceil_div(N * C, 256), static_cast<unsigned>(num_sms_) * 8), 256, 0,
                              stream_>>>(ids.ptr<int32_t>(), N, table.ptr<uint8_t>(), R, C, scales.data,
                                         scales.dtype == DType::F32 ? 0 : 1, o.data, float_kind(o.dtype),
                                         o.row_stride);
  check_launch("embedding_fp8_rows", ids.describe() + " " + table.describe());
}

}  // namespace deepinfer::cuda
