#include "model/layers/indexer.h"

#include <algorithm>
#include <cmath>

#include "model/layers/common.h"

namespace deepinfer {

IndexerWorkspace make_indexer_workspace(const IndexerDims& d, Backend& backend, int64_t capacity) {
  IndexerWorkspace ws;
  ws.capacity = capacity;
  auto make = [&](DType dtype, int64_t cols) {
    ws.buffers.push_back(backend.alloc(dtype, {capacity, std::max<int64_t>(cols, 1)}));
    return ws.buffers.back().tensor();
  };
  const DType dt = backend.activation_dtype();
  ws.q = make(dt, d.n_heads * d.head_dim);
  ws.k = make(dt, d.head_dim);
  ws.weights = make(DType::F32, d.n_heads);
  ws.indices = make(DType::I32, d.topk);
  return ws;
}

int64_t indexer_scores_capacity(int64_t rows, int64_t max_ctx, int64_t old_capacity, int64_t max_bytes) {
  const int64_t row_bytes = std::max<int64_t>(rows, 1) * static_cast<int64_t>(sizeof(float));
  DI_CHECK(max_ctx <= max_bytes / row_bytes, "indexer: a step of up to ", rows, " tokens over contexts of up to ",
           max_ctx, " positions needs a scores workspace of ", max_ctx * row_bytes, " bytes (F32 [", rows, ", ",
           max_ctx, "]), over the limit of ", max_bytes, " bytes (kIndexerScoresMaxBytes): lower "
           "max_num_batched_tokens or max_model_len");
  return std::min(std::max(max_ctx, 2 * old_capacity), max_bytes / row_bytes);
}

Tensor indexer_forward(Backend& backend, const IndexerDims& d, const IndexerWeights& w,
                       const Tensor& positions, const Tensor& cos_sin, const Tensor& x,
                       const Tensor& q_lora, PagedKV& keys, int64_t max_ctx, IndexerWorkspace& ws) {
  const int64_t T = x.size(0);
  DI_CHECK(T <= ws.capacity, "indexer_forward: ", T, " tokens exceed the workspace (", ws.capacity,
           ")");
  if (max_ctx > ws.ctx_capacity) {
    ws.ctx_capacity = indexer_scores_capacity(ws.capacity, max_ctx, ws.ctx_capacity);
    ws.scores_buffer = backend.alloc(DType::F32, {ws.capacity, ws.ctx_capacity});
    ws.scores = ws.scores_buffer.tensor();
    ++ws.epoch;
  }
  const int rope = static_cast<int>(d.rope_dim);
  // q = wq_b(q_lora) [T, heads, head_dim]; RoPE (halves) on the first rope_dim of each head.
  Tensor q = cols_view(ws.q, T, d.n_heads * d.head_dim);
  backend.gemm(q_lora, w.wq_b, q);
  Tensor q3 = heads_view(ws.q, T, d.n_heads, d.head_dim, d.head_dim);
  backend.rope(q3, positions, cos_sin, 0, rope, /*interleave=*/false);
  // k = LayerNorm(wk(x)) [T, head_dim], RoPE likewise, then into the key cache.
  Tensor k = cols_view(ws.k, T, d.head_dim);
  backend.gemm(x, w.wk, k);
  backend.layer_norm(k, w.k_norm, w.k_norm_bias, kIndexerKeyNormEps, k);
  Tensor k3 = heads_view(ws.k, T, 1, d.head_dim, d.head_dim);
  backend.rope(k3, positions, cos_sin, 0, rope, /*interleave=*/false);
  backend.kv_store(k, keys);
  // Per-head weights [T, heads] (F32); the reference folds n_heads^-0.5 and head_dim^-0.5
  // into them: score = sum_h w_h * n_heads^-0.5 * head_dim^-0.5 * ReLU(q_h . k).
  Tensor weights = cols_view(ws.weights, T, d.n_heads);
  backend.gemm(x, w.weights_proj, weights);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.n_heads)) /
                                         std::sqrt(static_cast<double>(d.head_dim)));
  Tensor scores = cols_view(ws.scores, T, max_ctx);
  backend.indexer_scores(q3, weights, keys, scale, scores);
  Tensor indices = cols_view(ws.indices, T, d.topk);
  backend.indexer_topk(scores, keys, indices);
  return indices;
}

}  // namespace deepinfer
