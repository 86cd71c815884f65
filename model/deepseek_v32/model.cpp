#include "model/deepseek_v32/model.h"

#include <algorithm>

#include "model/layers/common.h"

namespace deepinfer {
namespace {

// The first num_blocks * block_size * row_dim values of a runner cache [blocks, block_size,
// wider] as a contiguous [blocks, block_size, row_dim] cache (the KV seam, model.h).
Tensor cache_as(const Tensor& cache, int64_t row_dim) {
  Tensor t = cache;
  t.shape[2] = row_dim;
  t.stride = {cache.shape[1] * row_dim, row_dim, 1, 0, 0};
  return t;
}

}  // namespace

DeepseekV32Model::DeepseekV32Model(ModelConfig config, ModelWeights weights,
                                   std::vector<MlaAbsorbedWeights> absorbed,
                                   std::vector<IndexerWeights> indexer, Backend& backend)
    : DeepseekV3Model(std::move(config), std::move(weights), std::move(absorbed), backend),
      indexer_(std::move(indexer)) {
  DI_CHECK(config_.indexer.present() && config_.has_q_lora() &&
               static_cast<int>(indexer_.size()) == config_.num_hidden_layers,
           config_.source, ": deepseek_v32 needs an indexer (and q_lora) in each of its ",
           config_.num_hidden_layers, " layers, got ", indexer_.size());
}

int DeepseekV32Model::kv_row_dim() const {
  return static_cast<int>(std::max(config_.kv_row_dim(), config_.indexer.head_dim));
}

void DeepseekV32Model::check_kv_caches(const std::vector<Tensor>& kv_cache) const {
  const int L = config_.num_hidden_layers;
  DI_CHECK(static_cast<int>(kv_cache.size()) >= 2 * L, "forward: ", kv_cache.size(),
           " KV caches for ", L, " layers; deepseek_v32 takes 2 per layer (latent rows, then "
           "indexer keys)");
  for (int l = 0; l < 2 * L; ++l) {
    const Tensor& c = kv_cache[l];
    DI_CHECK(c.ndim == 3 && c.is_contiguous() && c.size(2) == kv_row_dim(),
             "forward: KV cache ", l, " (", l < L ? "latent rows" : "indexer keys", " of layer ",
             l % L, ") ", c.describe(), " must be contiguous [blocks, block_size, ", kv_row_dim(),
             "]");
  }
}

void DeepseekV32Model::attention(int layer, const StepBatch& batch, MlaStep& step,
                                 std::vector<Tensor>& kv_cache, const Tensor& xn, Tensor& out) {
  const int64_t T = xn.size(0);
  if (indexer_ws_.capacity < mla_ws_.capacity) {
    indexer_ws_ = make_indexer_workspace(config_.indexer, backend_, mla_ws_.capacity);
  }
  const AttentionWeights& w = weights_.layers[layer].attn;
  step.kv.cache = cache_as(kv_cache[layer], config_.kv_row_dim());
  mla_project(backend_, config_, w, step, xn, mla_ws_);  // latent rows -> cache, q_a kept
  PagedKV keys = step.kv;  // same block tables and slots, the layer's key cache
  keys.cache = cache_as(kv_cache[config_.num_hidden_layers + layer], config_.indexer.head_dim);
  const Tensor q_lora = cols_view(mla_ws_.q_a, T, config_.q_lora_rank);  // [T, q_lora_rank]
  const Tensor indices =
      indexer_forward(backend_, config_.indexer, indexer_[layer], *step.positions, *step.cos_sin,
                      xn, q_lora, keys, batch.max_seq_len, indexer_ws_);  // [T, topk]
  mla_attend(backend_, config_, w, absorbed_[layer], step, T, mla_ws_, out, &indices);
}

}  // namespace deepinfer
