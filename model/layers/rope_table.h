// RoPE angle tables for DeepSeek MLA, as transformers 5.17 computes them
// (DeepseekV3RotaryEmbedding + modeling_rope_utils: default and YaRN inv_freq,
// YaRN attention_factor folded into cos and sin).
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace deepinfer {

struct RopeScaling {
  std::string type = "default";  // "default" or "yarn"
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;
  double attention_factor = -1.0;  // explicit cos/sin factor; < 0 = derived (yarn_attention_factor)
  bool truncate = true;             // floor/ceil the correction range (transformers default)
  bool is_yarn() const { return type == "yarn"; }
};

// The cos/sin factor of a RoPE scaling: 1 unless YaRN; YaRN's explicit attention_factor, else
// get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) when both are non-zero,
// else get_mscale(factor) (model/config.h).
double rope_attention_factor(const RopeScaling& scaling);
// transformers' yarn_get_mscale: 0.1 * mscale * ln(factor) + 1 for factor > 1, else 1.
double yarn_get_mscale(double factor, double mscale);

// What a RoPE table is made from (built once from an architecture's config:
// ModelConfig::rope_dims, V4's main / compressed rope).
struct RopeDims {
  int64_t dim = 0;  // rotated dims (qk_rope_head_dim; transformers' rotary head_dim)
  double theta = 10000.0;
  RopeScaling scaling;
};

// inv_freq [dim / 2] in float32, the values transformers' rope init returns.
std::vector<float> rope_inv_freq(const RopeDims& rope);

// F32 [num_positions, dim] = [cos(p * f_i) * a | sin(p * f_i) * a] with
// a = rope_attention_factor(rope.scaling), the layout Backend::rope reads.
HostBuffer rope_cos_sin_table(const RopeDims& rope, int64_t num_positions);

}  // namespace deepinfer
