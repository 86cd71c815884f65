// The lightning indexer of DeepSeek sparse attention (V3.2; V4's CSA layers have one
// too): per query token t and earlier position s,
//   score(t, s) = sum_h w[t, h] * ReLU(q[t, h] . k[s]) * head_dim^-0.5,
//   q = wq_b(q_lora output) [heads, head_dim], k = LayerNorm(wk(x)) [head_dim] (one
//   key per token, shared by the heads), w = weights_proj(x) * heads^-0.5,
// with non-interleaved RoPE on the first rope_dim of q's and k's dims; the index_topk
// best positions become MLA's attention set. Dimensions only here (no config).
// The RoPE table is MLA's (transformers 5.17 feeds the indexer the same cos/sin, YaRN's
// attention factor folded in; DeepSeek's reference freqs_cis has no such factor, which
// agrees whenever mscale == mscale_all_dim, as in V3.2's config). Not simulated: the
// reference's Hadamard rotation of q and k (orthogonal, q.k unchanged) and its FP8
// quantization of them before scoring (precision only; transformers skips both too).
//
// indexer_forward runs it over a step: keys of the step's tokens go to the layer's indexer
// key cache first, so prefill, chunked prefill and decode all score against the cache.
#pragma once
#include <cstdint>
#include <vector>

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

// transformers (nn.LayerNorm(index_head_dim, eps=1e-6)) and DeepSeek's reference LayerNorm.
inline constexpr float kIndexerKeyNormEps = 1e-6f;

// The most bytes the scores workspace (F32 [token capacity, context capacity]) may take: 8 GiB,
// e.g. 16,384 tokens of a step over 128k-token contexts. A step past it is refused
// (indexer_scores_capacity) rather than allocated.
inline constexpr int64_t kIndexerScoresMaxBytes = int64_t{8} << 30;

// The context capacity of a scores workspace of `rows` token rows that must hold `max_ctx`
// columns and held `old_capacity`: geometric growth (2x, long prompts and growing decode
// contexts reallocate rarely) within max_bytes. Throws Error naming the step's tokens, its
// context, the bytes needed and the limit when even max_ctx columns do not fit.
int64_t indexer_scores_capacity(int64_t rows, int64_t max_ctx, int64_t old_capacity,
                                int64_t max_bytes = kIndexerScoresMaxBytes);

// Scratch sized for `capacity` tokens (reused by every layer); `scores` grows with the
// longest context of a step (indexer_scores_capacity).
struct IndexerWorkspace {
  std::vector<DeviceBuffer> buffers;
  Tensor q;        // [cap, n_heads * head_dim]
  Tensor k;        // [cap, head_dim]
  Tensor weights;  // F32 [cap, n_heads]
  Tensor indices;  // I32 [cap, topk]
  DeviceBuffer scores_buffer;
  Tensor scores;   // F32 [cap, ctx_capacity]
  int64_t capacity = 0;
  int64_t ctx_capacity = 0;
  // Bumped by each reallocation (scores growth here, a new workspace by its owner): CUDA
  // graphs captured before hold stale pointers (Model::workspace_epoch).
  uint64_t epoch = 0;
};
IndexerWorkspace make_indexer_workspace(const IndexerDims& dims, Backend& backend, int64_t capacity);

// The positions token t of the step attends, I32 [T, topk] (a view of ws.indices): the
// index_topk best by score (backend indexer_topk: ties to the lower position, written in
// ascending order, -1 padded when the context is shorter than index_topk). x [T, hidden]:
// the layer's normed input; q_lora [T, q_lora_rank]: q_a_layernorm(q_a_proj(x)). keys: the
// layer's indexer key cache [blocks, block_size, head_dim] with the step's addressing
// (this step's keys are written into it). positions I32 [T], cos_sin: the model's RoPE
// table [max_positions, rope_dim] (non-interleaved here). max_ctx: the step's longest
// sequence (StepBatch::max_seq_len).
Tensor indexer_forward(Backend& backend, const IndexerDims& dims, const IndexerWeights& w,
                       const Tensor& positions, const Tensor& cos_sin, const Tensor& x,
                       const Tensor& q_lora, PagedKV& keys, int64_t max_ctx, IndexerWorkspace& ws);

}  // namespace deepinfer
