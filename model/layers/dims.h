// The dimension structs the shared layers take (model/layers/*.h), built once from an
// architecture's config (ModelConfig::mla_dims, ffn_dims; V3.2's IndexerDims: indexer.h;
// RoPE: rope_table.h's RopeDims), so no layer reads a whole config.
#pragma once
#include <cstdint>

namespace deepinfer {

// The dimensions MLA reads (built once from an architecture's config: ModelConfig::mla_dims).
struct MlaDims {
  int64_t heads = 0;
  int64_t q_lora_rank = 0;  // 0: no query compression (a single q_proj)
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  bool rope_interleave = true;
  double softmax_scale = 0;  // qk_head_dim^-0.5, times mscale^2 under YaRN with mscale_all_dim
  bool has_q_lora() const { return q_lora_rank > 0; }
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  int64_t kv_row_dim() const { return kv_lora_rank + qk_rope_head_dim; }  // cached values per token
};

// The dimensions the feed-forward workspace is sized by (built once from an architecture's
// config: ModelConfig::ffn_dims).
struct FfnDims {
  int64_t hidden = 0;
  int64_t max_intermediate = 0;  // largest of the dense MLP, shared-expert and routed intermediates
  int64_t n_routed_experts = 0;  // 0: dense layers only
  int64_t top_k = 0;             // experts per token
};

}  // namespace deepinfer
