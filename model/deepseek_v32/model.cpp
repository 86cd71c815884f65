#include "model/deepseek_v32/model.h"

#include <algorithm>

#include "model/layers/common.h"

namespace deepinfer {

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

std::vector<KvGroupSpec> deepseek_v32_kv_groups(const ModelConfig& config) {
  std::vector<KvGroupSpec> groups = deepseek_v3_kv_groups(config);  // 0: the latent rows
  KvGroupSpec keys;
  keys.name = "indexer_keys";
  keys.num_layers = config.num_hidden_layers;
  keys.row_dim = config.indexer.head_dim;
  groups.push_back(keys);
  return groups;
}

std::vector<KvGroupSpec> DeepseekV32Model::kv_groups() const { return deepseek_v32_kv_groups(config_); }

uint64_t DeepseekV32Model::workspace_epoch() const {
  return DeepseekV3Model::workspace_epoch() + indexer_ws_.epoch;
}

void DeepseekV32Model::check_kv_caches(const KvCaches& kv) const {
  DeepseekV3Model::check_kv_caches(kv);
  const int L = config_.num_hidden_layers;
  DI_CHECK(kv.size() >= 2 && static_cast<int>(kv[1].size()) >= L, "forward: deepseek_v32 needs KV "
           "group 1 (indexer keys) with ", L, " layers, got ", kv.size(), " groups");
  for (int l = 0; l < L; ++l) {
    const Tensor& c = kv[1][l];
    DI_CHECK(c.ndim == 3 && c.size(2) == config_.indexer.head_dim, "forward: indexer key cache of "
             "layer ", l, " ", c.describe(), " must be [blocks, block_size, ",
             config_.indexer.head_dim, "]");
  }
}

void DeepseekV32Model::attention(int layer, const StepBatch& batch, MlaStep& step, KvCaches& kv,
                                 const Tensor& xn, Tensor& out) {
  const int64_t T = xn.size(0);
  DI_CHECK(batch.kv_groups.size() >= 2, "forward: deepseek_v32 needs the block tables of KV group 1 "
           "(indexer keys) in StepBatch::kv_groups, got ", batch.kv_groups.size(), " groups");
  if (indexer_ws_.capacity < mla_ws_.capacity) {
    const uint64_t epoch = indexer_ws_.epoch;
    indexer_ws_ = make_indexer_workspace(config_.indexer, backend_, mla_ws_.capacity);
    indexer_ws_.epoch = epoch + 1;
  }
  const AttentionWeights& w = weights_.layers[layer].attn;
  step.kv.cache = kv[0][layer];
  mla_project(backend_, mla_dims_, w, step, xn, mla_ws_);  // latent rows -> cache, q_a kept
  PagedKV keys = step.kv;  // the step's sequences, with group 1's cache, tables and slots
  keys.cache = kv[1][layer];
  keys.block_tables = batch.kv_groups[1].block_tables;
  keys.slot_mapping = batch.kv_groups[1].slot_mapping;
  const Tensor q_lora = cols_view(mla_ws_.q_a, T, config_.q_lora_rank);  // [T, q_lora_rank]
  const Tensor indices =
      indexer_forward(backend_, config_.indexer, indexer_[layer], *step.positions, *step.cos_sin,
                      xn, q_lora, keys, batch.max_seq_len, indexer_ws_);  // [T, topk]
  mla_attend(backend_, mla_dims_, w, absorbed_[layer], step, T, mla_ws_, out, &indices);
}

}  // namespace deepinfer
