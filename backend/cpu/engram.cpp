// engram_gate: DeepSeek-V4.1 Engram's gated write of an n-gram lookup into the hyper-connection
// streams; embedding_fp8_rows: the row gather of its FP8 tables with their E8M0 scale per 32
// channels (host references; backend.h spells out the math). fp32, as the PR's DeepseekV41Engram.
#include <algorithm>
#include <cmath>

#include "backend/backend.h"
#include "backend/cpu/v4_common.h"
#include "core/dtype.h"

namespace deepinfer {

void Backend::engram_gate(const Tensor& streams, const Tensor& kv, const Tensor& weight, float eps,
                          Tensor& out) {
  using v4_ops::check_host;
  DI_CHECK(streams.ndim == 3, "engram_gate: streams must be [T, hc, H], got ", streams.describe());
  const int64_t T = streams.size(0), hc = streams.size(1), H = streams.size(2);
  check_host(streams, DType::F32, {T, hc, H}, "engram_gate", "streams");
  check_host(kv, DType::F32, {T, (hc + 1) * H}, "engram_gate", "kv");
  check_host(weight, DType::F32, {hc, H}, "engram_gate", "weight");
  check_host(out, DType::F32, {T, hc, H}, "engram_gate", "out");
  const float inv_sqrt_h = 1.0f / std::sqrt(static_cast<float>(H));
  for (int64_t t = 0; t < T; ++t) {
    const float* keys = kv.ptr<const float>() + t * (hc + 1) * H;
    const float* value = keys + hc * H;
    for (int64_t k = 0; k < hc; ++k) {
      const float* h = streams.ptr<const float>() + (t * hc + k) * H;
      const float* key = keys + k * H;
      const float* w = weight.ptr<const float>() + k * H;
      double hh = 0.0, kk = 0.0, dot = 0.0;
      for (int64_t d = 0; d < H; ++d) {
        hh += static_cast<double>(h[d]) * h[d];
        kk += static_cast<double>(key[d]) * key[d];
        dot += static_cast<double>(h[d]) * w[d] * key[d];
      }
      const float rstd = (1.0f / std::sqrt(static_cast<float>(hh / static_cast<double>(H)) + eps)) *
                         (1.0f / std::sqrt(static_cast<float>(kk / static_cast<double>(H)) + eps));
      const float g = static_cast<float>(dot) * rstd * inv_sqrt_h;
      const float root = std::sqrt(std::max(std::fabs(g), 1e-6f));
      const float s = std::signbit(g) ? -root : root;
      const float gate = 1.0f / (1.0f + std::exp(-s));
      float* o = out.ptr<float>() + (t * hc + k) * H;
      for (int64_t d = 0; d < H; ++d) o[d] = h[d] + gate * value[d];
    }
  }
}

void Backend::embedding_fp8_rows(const Tensor& ids, const Tensor& table, const Tensor& scales,
                                 Tensor& out) {
  using v4_ops::check_host;
  DI_CHECK(table.ndim == 2 && table.dtype == DType::F8_E4M3 && table.is_contiguous() &&
               table.size(1) % 32 == 0,
           "embedding_fp8_rows: table must be contiguous F8_E4M3 [R, C] with C % 32 == 0, got ",
           table.describe());
  const int64_t R = table.size(0), C = table.size(1), B = C / 32, N = ids.numel();
  DI_CHECK(scales.ndim == 2 && scales.size(0) == R && scales.size(1) == B && scales.is_contiguous() &&
               (scales.dtype == DType::F8_E8M0 || scales.dtype == DType::U8 ||
                scales.dtype == DType::F32),
           "embedding_fp8_rows: scales must be contiguous F8_E8M0/U8/F32 [", R, ", ", B, "], got ",
           scales.describe());
  DI_CHECK(ids.dtype == DType::I32 && ids.is_contiguous(), "embedding_fp8_rows: ids must be I32, got ",
           ids.describe());
  check_host(out, DType::F32, {N, C}, "embedding_fp8_rows", "out");
  const uint8_t* q = table.ptr<const uint8_t>();
  for (int64_t n = 0; n < N; ++n) {
    const int64_t r = ids.ptr<const int32_t>()[n];
    DI_CHECK(r >= 0 && r < R, "embedding_fp8_rows: id ", r, " outside the table's ", R, " rows");
    float* o = out.ptr<float>() + n * C;
    for (int64_t b = 0; b < B; ++b) {
      const float s = scales.dtype == DType::F32
                          ? scales.ptr<const float>()[r * B + b]
                          : std::ldexp(1.0f, static_cast<int>(scales.ptr<const uint8_t>()[r * B + b]) - 127);
      for (int64_t c = b * 32; c < (b + 1) * 32; ++c) o[c] = fp8_e4m3_to_float(q[r * C + c]) * s;
    }
  }
}

}  // namespace deepinfer
