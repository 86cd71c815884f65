// engram_gate: DeepSeek-V4.1 Engram's gated write of an n-gram lookup into the hyper-connection
// streams (host reference; backend.h spells out the math). fp32, as the PR's DeepseekV41Engram.
#include <algorithm>
#include <cmath>

#include "backend/backend.h"
#include "backend/cpu/v4_common.h"

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

}  // namespace deepinfer
