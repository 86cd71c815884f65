// The lightning indexer of DeepSeek sparse attention (V3.2; V4's CSA layers have one
// too): per query token t and earlier position s,
//   score(t, s) = sum_h w[t, h] * ReLU(q[t, h] . k[s]) * head_dim^-0.5,
//   q = wq_b(q_lora output) [heads, head_dim], k = LayerNorm(wk(x)) [head_dim] (one
//   key per token, shared by the heads), w = weights_proj(x) * heads^-0.5,
// with non-interleaved RoPE on the first rope_dim of q's and k's dims; the index_topk
// best positions become MLA's attention set. Dimensions only here (no config).
#pragma once
#include <cstdint>

#include "backend/backend.h"

namespace deepinfer {

struct IndexerDims {
  int64_t n_heads = 0;   // index_n_heads (64); 0 = no indexer
  int64_t head_dim = 0;  // index_head_dim (128)
  int64_t topk = 0;      // index_topk (2048)
  int64_t rope_dim = 0;  // qk_rope_head_dim (64): rotated dims at the front of q and k
  bool present() const { return n_heads > 0; }
};

// One layer's indexer weights (self_attn.indexer.*).
struct IndexerWeights {
  Weight wq_b;          // [n_heads * head_dim, q_lora_rank]
  Weight wk;            // [head_dim, hidden]
  Tensor k_norm;        // [head_dim] LayerNorm weight
  Tensor k_norm_bias;   // [head_dim] LayerNorm bias
  Weight weights_proj;  // [n_heads, hidden]
};

}  // namespace deepinfer
