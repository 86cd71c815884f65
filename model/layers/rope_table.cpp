#include "model/layers/rope_table.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace deepinfer {

double yarn_get_mscale(double factor, double mscale) {
  return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

double rope_attention_factor(const RopeScaling& s) {
  if (!s.is_yarn()) return 1.0;
  if (s.attention_factor >= 0) return s.attention_factor;
  if (s.mscale != 0.0 && s.mscale_all_dim != 0.0) {
    return yarn_get_mscale(s.factor, s.mscale) / yarn_get_mscale(s.factor, s.mscale_all_dim);
  }
  return yarn_get_mscale(s.factor, 1.0);
}

std::vector<float> rope_inv_freq(const RopeDims& rope) {
  const int64_t dim = rope.dim;  // transformers: head_dim = qk_rope_head_dim
  DI_CHECK(dim > 0 && dim % 2 == 0, "rope: the rotated dims must be even and positive, got ", dim);
  const double base = rope.theta;
  const int64_t half = dim / 2;
  // pos_freqs = base ** (arange(0, dim, 2) / dim), computed by torch in float32.
  std::vector<float> pos_freqs(half);
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    pos_freqs[i] = static_cast<float>(std::pow(base, static_cast<double>(exponent)));
  }
  std::vector<float> inv(half);
  if (!rope.scaling.is_yarn()) {
    for (int64_t i = 0; i < half; ++i) inv[i] = 1.0f / pos_freqs[i];
    return inv;
  }
  const RopeScaling& y = rope.scaling;
  const double factor = y.factor;
  const double original = static_cast<double>(y.original_max_position_embeddings);
  // find_correction_dim / find_correction_range (python doubles).
  auto correction_dim = [&](double rotations) {
    return (static_cast<double>(dim) * std::log(original / (rotations * 2.0 * std::numbers::pi))) /
           (2.0 * std::log(base));
  };
  double low = correction_dim(y.beta_fast), high = correction_dim(y.beta_slow);
  if (y.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // linear_ramp_factor's singularity guard
  for (int64_t i = 0; i < half; ++i) {
    // ramp = clamp((i - low) / (high - low), 0, 1) in float32; extrapolation share = 1 - ramp.
    float ramp = (static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low);
    ramp = std::clamp(ramp, 0.0f, 1.0f);
    const float extrapolation = 1.0f - ramp;
    const float inv_extra = 1.0f / pos_freqs[i];
    const float inv_inter = 1.0f / (static_cast<float>(factor) * pos_freqs[i]);
    inv[i] = inv_inter * (1.0f - extrapolation) + inv_extra * extrapolation;
  }
  return inv;
}

HostBuffer rope_cos_sin_table(const RopeDims& rope, int64_t num_positions) {
  const std::vector<float> inv = rope_inv_freq(rope);
  const int64_t half = static_cast<int64_t>(inv.size()), dim = 2 * half;
  const float attention_factor = static_cast<float>(rope_attention_factor(rope.scaling));
  HostBuffer table(DType::F32, {num_positions, dim});
  float* t = table.ptr<float>();
  for (int64_t p = 0; p < num_positions; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const float angle = inv[i] * static_cast<float>(p);  // fp32 product, as torch does
      t[p * dim + i] = static_cast<float>(std::cos(static_cast<double>(angle))) * attention_factor;
      t[p * dim + half + i] =
          static_cast<float>(std::sin(static_cast<double>(angle))) * attention_factor;
    }
  }
  return table;
}

}  // namespace deepinfer
