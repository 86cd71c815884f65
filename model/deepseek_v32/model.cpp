#include "model/deepseek_v32/model.h"

#include <algorithm>

#include "model/deepseek_v32/config.h"
#include "model/layers/common.h"

namespace deepinfer {

DeepseekV32Model::DeepseekV32Model(ModelConfig config, ModelWeights weights,
                                   std::vector<MlaAbsorbedWeights> absorbed,
                                   std::vector<IndexerWeights> indexer, Backend& backend)
    : DeepseekV3Model(std::move(config), std::move(weights), std::move(absorbed), backend),
      dims_(deepseek_v32_indexer(config_)),
      indexer_(std::move(indexer)) {
  const size_t blocks = weights_.layers.size() + weights_.mtp.size();
  DI_CHECK(config_.has_q_lora() && indexer_.size() == blocks, config_.source,
           ": deepseek_v32 needs an indexer (and q_lora) in each of its ", blocks,
           " blocks (main and MTP layers), got ", indexer_.size());
  if (MtpLayer* mtp = mtp_layer()) {
    const IndexerWeights& iw = indexer_.back();
    mtp->set_attention([this, &iw](const StepBatch& batch, MlaStep& step, std::span<Tensor> kv,
                                   const AttentionWeights& w, const MlaAbsorbedWeights& absorbed, const Tensor& xn,
                                   MlaWorkspace& ws, Tensor& out) {
      DI_CHECK(kv.size() == 2 && kv[1].ndim == 3 && kv[1].size(2) == dims_.head_dim,
               "mtp forward: deepseek_v32's MTP layer needs its latent and indexer key caches (KV groups 0 and 1, "
               "keys [blocks, block_size, ", dims_.head_dim, "]), got ", kv.size(), " caches");
      sparse_attention(w, absorbed, iw, batch, step, kv[0], kv[1], xn, ws, mtp_indexer_ws_, out);
    });
  }
}

std::vector<KvGroupSpec> deepseek_v32_kv_groups(const ModelConfig& config) {
  std::vector<KvGroupSpec> groups = deepseek_v3_kv_groups(config);  // 0: the latent rows
  KvGroupSpec keys;
  keys.name = "indexer_keys";
  keys.num_layers = config.num_hidden_layers;
  keys.row_dim = deepseek_v32_indexer(config).head_dim;
  groups.push_back(keys);
  return groups;
}

std::vector<KvGroupSpec> DeepseekV32Model::kv_groups() const { return deepseek_v32_kv_groups(config_); }

uint64_t DeepseekV32Model::workspace_epoch() const {
  return DeepseekV3Model::workspace_epoch() + indexer_ws_.epoch + mtp_indexer_ws_.epoch;
}

void DeepseekV32Model::check_kv_caches(const KvCaches& kv) const {
  DeepseekV3Model::check_kv_caches(kv);
  const int L = config_.num_hidden_layers;
  DI_CHECK(kv.size() >= 2 && static_cast<int>(kv[1].size()) >= L, "forward: deepseek_v32 needs KV "
           "group 1 (indexer keys) with ", L, " layers, got ", kv.size(), " groups");
  for (int l = 0; l < L; ++l) {
    const Tensor& c = kv[1][l];
    DI_CHECK(c.ndim == 3 && c.size(2) == dims_.head_dim, "forward: indexer key cache of "
             "layer ", l, " ", c.describe(), " must be [blocks, block_size, ", dims_.head_dim, "]");
  }
}

void DeepseekV32Model::sparse_attention(const AttentionWeights& w, const MlaAbsorbedWeights& absorbed,
                                        const IndexerWeights& iw, const StepBatch& batch, MlaStep& step,
                                        const Tensor& latent, const Tensor& keys_cache, const Tensor& xn,
                                        MlaWorkspace& mla_ws, IndexerWorkspace& ws, Tensor& out) {
  const int64_t T = xn.size(0);
  DI_CHECK(batch.kv_groups.size() >= 2, "forward: deepseek_v32 needs the block tables of KV group 1 "
           "(indexer keys) in StepBatch::kv_groups, got ", batch.kv_groups.size(), " groups");
  if (ws.capacity < mla_ws.capacity) {
    const uint64_t epoch = ws.epoch;
    ws = make_indexer_workspace(dims_, backend_, mla_ws.capacity);
    ws.epoch = epoch + 1;
  }
  step.kv.cache = latent;
  mla_project(backend_, mla_dims_, w, step, xn, mla_ws);  // latent rows -> cache, q_a kept
  PagedKV keys = step.kv;  // the step's sequences, with group 1's cache, tables and slots
  keys.cache = keys_cache;
  keys.block_tables = batch.kv_groups[1].block_tables;
  keys.slot_mapping = batch.kv_groups[1].slot_mapping;
  const Tensor q_lora = cols_view(mla_ws.q_a, T, config_.q_lora_rank);  // [T, q_lora_rank]
  const Tensor indices = indexer_forward(backend_, dims_, iw, *step.positions, *step.cos_sin, xn, q_lora, keys,
                                         batch.max_seq_len, ws);  // [T, topk]
  mla_attend(backend_, mla_dims_, w, absorbed, step, T, mla_ws, out, &indices);
}

void DeepseekV32Model::attention(int layer, const StepBatch& batch, MlaStep& step, KvCaches& kv,
                                 const Tensor& xn, Tensor& out) {
  sparse_attention(weights_.layers[layer].attn, absorbed_[layer], indexer_[layer], batch, step, kv[0][layer],
                   kv[1][layer], xn, mla_ws_, indexer_ws_, out);
}

}  // namespace deepinfer
