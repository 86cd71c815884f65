// DeepseekV32Model: DeepSeek-V3.2 = V3's forward (DeepseekV3Model) with DeepSeek sparse
// attention in every layer (MODELS.md, "V3.2"):
//
//  per layer l:  q_lora = q_a_layernorm(q_a_proj(xn)), MLA projections, latent rows -> cache
//                indices = lightning indexer(xn, q_lora) over the layer's key cache   [T, topk]
//                x += o_proj(MLA over the positions in indices)  (direct form in prefill
//                     without cached context, absorbed form over the paged latent cache else)
//                x += MLP / MoE, as V3
//
// KV state: two layer groups (Model::kv_groups), each with its own block tables:
//   0 "latent"        the MLA latent row [c_kv | k_rope] (kv_lora + rope) of every layer;
//   1 "indexer_keys"  the indexer key (index_head_dim) of every layer.
// The MTP layer (layer id num_hidden_layers, when loaded: transformers 5.17 ignores it) is
// V3's with the same sparse attention: its block has an indexer of its own (tensors
// model.layers.{L}.self_attn.indexer.*, as vLLM's deepseek_mtp runs V3.2's decoder layer),
// so it has a cache in both groups (num_mtp_kv_groups() = 2).
// Every op runs on the device with shapes from the step (the indexer's scores are [T,
// max_seq_len], top-k is index_topk wide), so decode steps replay as CUDA graphs.
#pragma once
#include <span>
#include <vector>

#include "model/deepseek_v3/model.h"
#include "model/layers/indexer.h"

namespace deepinfer {

// DeepseekV32Model::kv_groups for `config` (the registry's Architecture::kv_groups).
std::vector<KvGroupSpec> deepseek_v32_kv_groups(const ModelConfig& config);

class DeepseekV32Model final : public DeepseekV3Model {
 public:
  // indexer[l]: layer l's indexer weights, then the MTP block's when `weights` hold it; on
  // `backend` like `weights`.
  DeepseekV32Model(ModelConfig config, ModelWeights weights,
                   std::vector<MlaAbsorbedWeights> absorbed, std::vector<IndexerWeights> indexer,
                   Backend& backend);

  std::vector<KvGroupSpec> kv_groups() const override;
  int num_mtp_kv_groups() const override { return 2; }  // latent and indexer keys
  uint64_t workspace_epoch() const override;             // V3's and the indexers'

 protected:
  void attention(int layer, const StepBatch& batch, MlaStep& step, KvCaches& kv, const Tensor& xn,
                 Tensor& out) override;
  void check_kv_caches(const KvCaches& kv) const override;

 private:
  // out = o_proj(MLA over the indexer's positions) for one block: latent rows to `latent`,
  // indexer keys to `keys` (KV group 1, addressed by batch.kv_groups[1]).
  void sparse_attention(const AttentionWeights& w, const MlaAbsorbedWeights& absorbed, const IndexerWeights& iw,
                        const StepBatch& batch, MlaStep& step, const Tensor& latent, const Tensor& keys,
                        const Tensor& xn, MlaWorkspace& mla_ws, IndexerWorkspace& ws, Tensor& out);

  const IndexerDims dims_;
  std::vector<IndexerWeights> indexer_;
  IndexerWorkspace indexer_ws_;      // the main layers'
  IndexerWorkspace mtp_indexer_ws_;  // the MTP layer's (sized by its MLA workspace)
};

}  // namespace deepinfer
