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
// No MTP layer (transformers 5.17 ignores it; V3.2's MTP block has an indexer of its own).
// Every op runs on the device with shapes from the step (the indexer's scores are [T,
// max_seq_len], top-k is index_topk wide), so decode steps replay as CUDA graphs.
#pragma once
#include <vector>

#include "model/deepseek_v3/model.h"
#include "model/layers/indexer.h"

namespace deepinfer {

// DeepseekV32Model::kv_groups for `config` (the registry's Architecture::kv_groups).
std::vector<KvGroupSpec> deepseek_v32_kv_groups(const ModelConfig& config);

class DeepseekV32Model final : public DeepseekV3Model {
 public:
  // indexer[l]: layer l's indexer weights, on `backend` like `weights`.
  DeepseekV32Model(ModelConfig config, ModelWeights weights,
                   std::vector<MlaAbsorbedWeights> absorbed, std::vector<IndexerWeights> indexer,
                   Backend& backend);

  std::vector<KvGroupSpec> kv_groups() const override;
  int num_mtp_layers() const override { return 0; }
  uint64_t workspace_epoch() const override;  // V3's and the indexer's

 protected:
  void attention(int layer, const StepBatch& batch, MlaStep& step, KvCaches& kv, const Tensor& xn,
                 Tensor& out) override;
  void check_kv_caches(const KvCaches& kv) const override;

 private:
  std::vector<IndexerWeights> indexer_;
  IndexerWorkspace indexer_ws_;
};

}  // namespace deepinfer
