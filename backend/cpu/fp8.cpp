// Default Backend::quantize_fp8_1x128 and Backend::gemm_fp8_1x128: the host reference of
// FP8 activations (DeepSeek-V3's 1x128 recipe) and of the FP8 x FP8 GEMM with 1x128 (x)
// and 128x128 (W) block scales. Plain loops: tests/ops compares the CUDA kernels with them
// and the CPU backend runs them as they are (its gemm() stays W8A32, never this path).
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/backend.h"

namespace deepinfer {
namespace {

constexpr int64_t kBlock = 128;   // activation block (columns) and weight block (both dims)
constexpr float kFp8Max = 448.0f;  // largest finite e4m3

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

float load(const Tensor& t, int64_t r, int64_t c) {
  const int64_t i = r * t.stride[0] + c * t.stride[1];
  return t.dtype == DType::BF16 ? bf16_to_float(t.ptr<uint16_t>()[i]) : t.ptr<float>()[i];
}

void check_host(const Tensor& t, const char* op, const char* what) {
  DI_CHECK(t.device == Device::CPU, op, ": ", what, " ", t.describe(),
           " must be host memory (this backend has no override)");
}

}  // namespace

void Backend::quantize_fp8_1x128(const Tensor& x, Tensor& q, Tensor& scales) {
  const char* op = "quantize_fp8_1x128";
  check_host(x, op, "x");
  check_host(q, op, "q");
  check_host(scales, op, "scales");
  DI_CHECK(x.ndim == 2 && (x.dtype == DType::F32 || x.dtype == DType::BF16) && x.stride[1] == 1,
           op, ": x ", x.describe(), " must be F32/BF16 [M, K] with contiguous rows");
  const int64_t M = x.size(0), K = x.size(1), blocks = ceil_div(K, kBlock);
  DI_CHECK(q.dtype == DType::F8_E4M3 && q.ndim == 2 && q.is_contiguous() && q.size(0) == M &&
               q.size(1) == K,
           op, ": q ", q.describe(), " must be contiguous F8_E4M3 [", M, ", ", K, "]");
  DI_CHECK(scales.dtype == DType::F32 && scales.ndim == 2 && scales.is_contiguous() &&
               scales.size(0) == blocks && scales.size(1) == M,
           op, ": scales ", scales.describe(), " must be contiguous F32 [", blocks, ", ", M, "]");
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t k0 = b * kBlock, k1 = std::min(K, k0 + kBlock);
      float amax = 0.0f;
      for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(load(x, m, k)));
      const float scale = amax > 0.0f ? amax / kFp8Max : 1.0f;
      scales.ptr<float>()[b * M + m] = scale;
      for (int64_t k = k0; k < k1; ++k)
        q.ptr<uint8_t>()[m * K + k] = float_to_fp8_e4m3(load(x, m, k) / scale);
    }
  }
}

void Backend::gemm_fp8_1x128(const Tensor& q, const Tensor& scales, const Weight& w, Tensor& out) {
  const char* op = "gemm_fp8_1x128";
  check_host(q, op, "q");
  check_host(scales, op, "scales");
  check_host(w.w, op, "weight");
  check_host(w.scale_inv, op, "weight scale_inv");
  check_host(out, op, "out");
  DI_CHECK(q.dtype == DType::F8_E4M3 && q.ndim == 2 && q.is_contiguous(), op, ": q ",
           q.describe(), " must be contiguous F8_E4M3 [M, K]");
  const int64_t M = q.size(0), K = q.size(1), blocks = ceil_div(K, kBlock);
  DI_CHECK(scales.dtype == DType::F32 && scales.ndim == 2 && scales.is_contiguous() &&
               scales.size(0) == blocks && scales.size(1) == M,
           op, ": scales ", scales.describe(), " must be contiguous F32 [", blocks, ", ", M, "]");
  DI_CHECK(w.w.dtype == DType::F8_E4M3 && w.w.ndim == 2 && w.w.is_contiguous() &&
               w.w.size(1) == K && w.block_n == kBlock && w.block_k == kBlock,
           op, ": weight ", w.w.describe(), " must be contiguous F8_E4M3 [N, ", K,
           "] with 128x128 blocks (got ", w.block_n, "x", w.block_k, ")");
  const int64_t N = w.w.size(0);
  DI_CHECK(w.scale_inv.dtype == DType::F32 && w.scale_inv.ndim == 2 &&
               w.scale_inv.size(0) == ceil_div(N, kBlock) && w.scale_inv.size(1) == blocks &&
               w.scale_inv.stride[1] == 1,
           op, ": weight scale_inv ", w.scale_inv.describe(), " must be F32 [", ceil_div(N, kBlock),
           ", ", blocks, "]");
  DI_CHECK(out.ndim == 2 && (out.dtype == DType::F32 || out.dtype == DType::BF16) &&
               out.stride[1] == 1 && out.size(0) == M && out.size(1) == N,
           op, ": out ", out.describe(), " must be F32/BF16 [", M, ", ", N, "]");
  // Decoded e4m3 tables: products of two e4m3 values are exact in fp32, so only the
  // per-block sums and the scaling round.
  std::vector<float> qf(static_cast<size_t>(M * K)), wf(static_cast<size_t>(N * K));
  for (int64_t i = 0; i < M * K; ++i) qf[i] = fp8_e4m3_to_float(q.ptr<uint8_t>()[i]);
  for (int64_t i = 0; i < N * K; ++i) wf[i] = fp8_e4m3_to_float(w.w.ptr<uint8_t>()[i]);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (int64_t b = 0; b < blocks; ++b) {
        float part = 0.0f;  // one 128-wide K block, promoted with both scales
        for (int64_t k = b * kBlock; k < std::min(K, (b + 1) * kBlock); ++k)
          part += qf[m * K + k] * wf[n * K + k];
        const float s = scales.ptr<float>()[b * M + m] *
                        w.scale_inv.ptr<float>()[(n / kBlock) * w.scale_inv.stride[0] + b];
        acc += part * s;
      }
      const int64_t o = m * out.stride[0] + n;
      if (out.dtype == DType::BF16)
        out.ptr<uint16_t>()[o] = float_to_bf16(acc);
      else
        out.ptr<float>()[o] = acc;
    }
  }
}

}  // namespace deepinfer
