#include "core/quant.h"

#include <cmath>

#include "core/error.h"

namespace deepinfer {

float scale_value(const Tensor& scales, int64_t index) {
  switch (scales.dtype) {
    case DType::F32: return scales.ptr<const float>()[index];
    case DType::F8_E8M0:
    case DType::U8: return e8m0_to_float(scales.ptr<const uint8_t>()[index]);
    default: fail("scale tensor ", scales.describe(), ": dtype must be F32, F8_E8M0 or U8");
  }
}

void dequantize_fp4_e2m1(const Tensor& packed, const Tensor& scales, float* out, const char* what) {
  DI_CHECK(packed.dtype == DType::I8 || packed.dtype == DType::U8, what,
           ": FP4 e2m1 weight must be I8 or U8 (two values per byte), got ", packed.describe());
  DI_CHECK(packed.ndim == 2 && packed.is_contiguous(), what, ": FP4 weight must be a contiguous [N, K/2], got ",
           packed.describe());
  const int64_t n = packed.size(0), k = packed.size(1) * 2;
  DI_CHECK(k % 32 == 0, what, ": FP4 weight's K = ", k, " (2 x ", packed.size(1),
           ") is not a multiple of the 32-element scale block");
  DI_CHECK(scales.ndim == 2 && scales.size(0) == n && scales.size(1) == k / 32 && scales.is_contiguous(),
           what, ": FP4 scales must be [", n, ", ", k / 32, "] (one per 32 along K), got ",
           scales.describe());
  DI_CHECK(scales.dtype == DType::F32 || scales.dtype == DType::F8_E8M0 || scales.dtype == DType::U8,
           what, ": FP4 scales must be F8_E8M0, U8 or F32, got ", scales.describe());
  const uint8_t* p = packed.ptr<const uint8_t>();
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t b = 0; b < k / 32; ++b) {
      const float s = scale_value(scales, r * (k / 32) + b);
      for (int64_t j = 0; j < 32; j += 2) {
        const int64_t c = b * 32 + j;
        const uint8_t byte = p[r * (k / 2) + c / 2];
        out[r * k + c] = fp4_e2m1_to_float(byte & 0xfu) * s;
        out[r * k + c + 1] = fp4_e2m1_to_float(static_cast<uint8_t>(byte >> 4)) * s;
      }
    }
  }
}

void dequantize_fp8_blocks(const Tensor& w, const Tensor& scales, int block, float* out,
                           const char* what) {
  DI_CHECK(w.dtype == DType::F8_E4M3 && w.ndim == 2 && w.is_contiguous(), what,
           ": FP8 weight must be a contiguous F8_E4M3 [N, K], got ", w.describe());
  DI_CHECK(block > 0, what, ": block size must be > 0");
  const int64_t n = w.size(0), k = w.size(1);
  const int64_t bn = (n + block - 1) / block, bk = (k + block - 1) / block;
  DI_CHECK(scales.ndim == 2 && scales.size(0) == bn && scales.size(1) == bk && scales.is_contiguous(),
           what, ": FP8 block scales must be [", bn, ", ", bk, "] for ", block, "x", block,
           " blocks of [", n, ", ", k, "], got ", scales.describe());
  const uint8_t* q = w.ptr<const uint8_t>();
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      out[r * k + c] = fp8_e4m3_to_float(q[r * k + c]) * scale_value(scales, (r / block) * bk + c / block);
    }
  }
}

}  // namespace deepinfer
