// DeepseekV32Model: DeepSeek-V3.2 = V3's forward (DeepseekV3Model) with DeepSeek sparse
// attention in every layer (MODELS.md, "V3.2"):
//
//  per layer l:  q_lora = q_a_layernorm(q_a_proj(xn)), MLA projections, latent rows -> cache
//                indices = lightning indexer(xn, q_lora) over the layer's key cache   [T, topk]
//                x += o_proj(MLA over the positions in indices)  (direct form in prefill
//                     without cached context, absorbed form over the paged latent cache else)
//                x += MLP / MoE, as V3
//
// KV state per layer: the MLA latent row (kv_lora + rope) and the indexer key (head_dim).
// Until kv/ has layer groups, both live in the runner's uniform caches (the seam below):
// num_kv_layers() = 2 * layers, kv_cache[l] = layer l's latent cache, kv_cache[layers + l]
// its key cache (same block tables and slots), every cache [blocks, block_size,
// kv_row_dim()] with kv_row_dim() = max(latent row, head_dim); a cache whose row is wider
// than its content is used as [blocks, block_size, content] over its leading values.
// No MTP layer (transformers 5.17 ignores it; V3.2's MTP block has an indexer of its own).
#pragma once
#include <vector>

#include "model/deepseek_v3/model.h"
#include "model/layers/indexer.h"

namespace deepinfer {

class DeepseekV32Model final : public DeepseekV3Model {
 public:
  // indexer[l]: layer l's indexer weights, on `backend` like `weights`.
  DeepseekV32Model(ModelConfig config, ModelWeights weights,
                   std::vector<MlaAbsorbedWeights> absorbed, std::vector<IndexerWeights> indexer,
                   Backend& backend);

  int num_kv_layers() const override { return 2 * config_.num_hidden_layers; }
  int kv_row_dim() const override;
  int num_mtp_layers() const override { return 0; }

 protected:
  void attention(int layer, const StepBatch& batch, MlaStep& step, std::vector<Tensor>& kv_cache,
                 const Tensor& xn, Tensor& out) override;
  void check_kv_caches(const std::vector<Tensor>& kv_cache) const override;

 private:
  std::vector<IndexerWeights> indexer_;
  IndexerWorkspace indexer_ws_;
};

}  // namespace deepinfer
