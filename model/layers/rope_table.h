// RoPE angle tables for DeepSeek MLA, as transformers 5.17 computes them
// (DeepseekV3RotaryEmbedding + modeling_rope_utils: default and YaRN inv_freq,
// YaRN attention_factor folded into cos and sin).
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace deepinfer {

// inv_freq [qk_rope_head_dim / 2] in float32, the values transformers' rope init returns.
std::vector<float> rope_inv_freq(const ModelConfig& config);

// F32 [num_positions, qk_rope_head_dim] = [cos(p * f_i) * a | sin(p * f_i) * a] with
// a = config.yarn_attention_factor(), the layout Backend::rope reads.
HostBuffer rope_cos_sin_table(const ModelConfig& config, int64_t num_positions);

}  // namespace deepinfer
