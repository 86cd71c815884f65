// DeepseekV3Model: the DeepSeek-V3/R1/V3.1 (and V2, same graph) forward on any Backend.
//
//  x = embed(ids)                                                   [T, hidden]
//  per layer l:  x += o_proj(MLA(input_layernorm(x)))
//                x += (dense MLP | MoE + shared)(post_attention_layernorm(x))
//  logits = lm_head(norm(x[logits_indices]))                        [R, vocab]
//
// Attention takes the direct form when no sequence of the step has cached context
// (and the backend is not batch-invariant), else the absorbed form over the paged
// latent cache. Only metadata decisions run on the host (batch.host_* fields);
// everything else is backend ops on workspaces allocated once per capacity.
#pragma once
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/layers/mla.h"
#include "model/layers/moe.h"
#include "model/layers/mtp.h"
#include "model/model.h"
#include "model/parallel.h"
#include "model/weights.h"

namespace deepinfer {

class ExpertParallelMoe;

// DeepseekV32Model (model/deepseek_v32/) derives from it and replaces attention().
class DeepseekV3Model : public Model {
 public:
  // `weights` live on `backend`; `absorbed[l]` are layer l's derived MLA weights (then one
  // per loaded MTP layer, when the caller derived them: model/layers/mtp.h).
  // Several processes: `weights` and `absorbed` are the rank's shard (model/parallel.h); forward
  // sums the partial outputs of attention and of the feed-forward blocks over the ranks.
  // With experts split (--ep), the MoE layers dispatch (model/expert_parallel.h); eplb_experts:
  // per layer, host views of every logical expert (EPLB re-placement; empty: placement fixed),
  // kept alive by eplb_owners.
  DeepseekV3Model(ModelConfig config, ModelWeights weights,
                  std::vector<MlaAbsorbedWeights> absorbed, Backend& backend,
                  ParallelPlan parallel = {}, std::vector<std::vector<ExpertWeights>> eplb_experts = {},
                  std::vector<std::shared_ptr<const void>> eplb_owners = {});
  ~DeepseekV3Model() override;

  const ModelConfig& config() const override { return config_; }
  // One group: every layer's MLA latent [c_kv | k_rope] (576 per token in V3), in the
  // backend's activation dtype; the MTP layer joins it (mtp_kv_group 0).
  std::vector<KvGroupSpec> kv_groups() const override;
  int vocab_size() const override { return static_cast<int>(config_.vocab_size); }
  void forward(const StepBatch& batch, KvCaches& kv, Tensor& logits,
               Tensor* hidden_out = nullptr) override;
  uint64_t workspace_epoch() const override;  // forward's and the MTP layer's
  int64_t num_expert_replacements() const override;
  void hold_expert_replacement(bool hold) override;
  double expert_comm_seconds() const override;
  int64_t expert_comm_bytes() const override;
  int num_mtp_layers() const override { return mtp_ ? 1 : 0; }
  void mtp_forward(const StepBatch& batch, std::span<Tensor> kv, const Tensor& hidden_in,
                   Tensor& hidden_out, Tensor& logits) override;

  const ModelWeights& weights() const { return weights_; }
  // Expert parallelism's dispatch (nullptr unless --ep splits the experts).
  const ExpertParallelMoe* expert_parallel() const { return ep_.get(); }
  ExpertParallelMoe* expert_parallel() { return ep_.get(); }

 protected:
  // Layer l's attention: out [T, hidden] = o_proj(MLA(xn)); V3: mla_forward over kv[0][l].
  // `step` holds the step's (group 0) addressing; its .kv.cache is the callee's to set.
  virtual void attention(int layer, const StepBatch& batch, MlaStep& step, KvCaches& kv,
                         const Tensor& xn, Tensor& out);
  // Checks the caches forward receives (V3: one latent cache per main layer in group 0).
  virtual void check_kv_caches(const KvCaches& kv) const;
  // The MTP layer when loaded (V3.2 sets its attention), else nullptr.
  MtpLayer* mtp_layer() { return mtp_.get(); }

  ModelConfig config_;
  MlaDims mla_dims_;  // the shared layers' dimensions, built once from config_
  FfnDims ffn_dims_;
  ModelWeights weights_;
  std::vector<MlaAbsorbedWeights> absorbed_;
  Backend& backend_;
  DeviceBuffer cos_sin_;  // F32 [max_position_embeddings, qk_rope_head_dim]
  MlaWorkspace mla_ws_;

 private:
  void ensure_workspace(int64_t num_tokens);
  void check_batch(const StepBatch& batch, const KvCaches& kv, const Tensor& logits) const;

  MoeRouting routing_;
  ParallelPlan parallel_;
  std::unique_ptr<MtpLayer> mtp_;  // weights_.mtp[0] when loaded

  // Workspaces, grown to the largest step seen (allocated once per capacity).
  int64_t capacity_ = 0;
  uint64_t workspace_epoch_ = 0;  // bumped by each reallocation
  FfnWorkspace ffn_ws_;
  std::unique_ptr<ExpertParallelMoe> ep_;  // --ep: the MoE layers' dispatch and combine
  // Attention data parallelism with --ep 1: the MoE over every rank's rows (moe_over_ranks).
  void moe_over_ranks(const StepBatch& batch, const LayerWeights& layer, const Tensor& xn, Tensor& delta);
  FfnWorkspace dp_ffn_ws_;
  std::vector<DeviceBuffer> dp_buffers_;
  Tensor dp_send_, dp_in_, dp_out_;  // [cap, H], [dp x cap, H] x 2
  int64_t dp_capacity_ = 0;
  std::vector<DeviceBuffer> buffers_;
  Tensor x_, xn_, delta_;  // [cap, hidden]: residual, normed input, block output
  Tensor gathered_, final_;  // [cap, hidden]: rows at logits_indices, after the final norm
};

// DeepseekV3Model::kv_groups for `config` (the registry's Architecture::kv_groups).
std::vector<KvGroupSpec> deepseek_v3_kv_groups(const ModelConfig& config);

// Derives the absorbed MLA weights of every layer (then of every MTP block) from `weights`
// (host-readable, or on `backend`: kv_b_proj is then copied to the host first).
std::vector<MlaAbsorbedWeights> make_absorbed_weights(const ModelConfig& config,
                                                      const ModelWeights& weights, Backend& backend);

}  // namespace deepinfer
