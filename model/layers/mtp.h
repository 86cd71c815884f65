// DeepSeek-V3's multi-token-prediction (MTP) module as one more layer of the model
// (layer id num_hidden_layers), built from backend ops (MODELS.md, "MTP"):
//
//  in   = eh_proj([enorm(embed(t_{i+1})) ; hnorm(h_i)])       [T, 2H] -> [T, H]
//         h_i: the target's last hidden state AFTER the final norm at position i
//  x    = in + o_proj(MLA(input_layernorm(in)))                [T, H]   (its own latent KV)
//  x   += MoE(post_attention_layernorm(x))                      [T, H]
//  out  = shared_head.norm(x)                                   [T, H]  (chained drafts' h)
//  logits = lm_head(out[logits_indices])                        [R, V]  (the shared head)
//
// Row i of a step sits at position i of its sequence (the position of h_i, as vLLM's
// deepseek_mtp.py places it): its latent row goes to that slot of the MTP layer's cache
// and it attends to the MTP rows of positions <= i. (The training script tools/train_tiny
// gives such a row RoPE position i + 1; attention scores depend on position differences
// only, so the two agree up to rounding.)
#pragma once
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "model/layers/mla.h"
#include "model/layers/moe.h"
#include "model/step_batch.h"
#include "model/weights.h"

namespace deepinfer {

// The MTP layer's dimensions (built once by the architecture from its config).
struct MtpDims {
  int64_t hidden = 0;
  int64_t vocab = 0;
  float rms_norm_eps = 1e-6f;
  MlaDims mla;
  FfnDims ffn;
  MoeRouting routing;  // read when the block is MoE
};

// The block's attention: out [T, H] = o_proj(attention(xn)) with the block's weights `w`,
// `absorbed`, its caches `kv` (kv[i]: its cache in KV group Model::mtp_kv_group() + i,
// addressed by batch.kv_groups[i]), the step's MLA addressing `step` (its .kv.cache is the
// callee's to set) and the layer's MLA workspace. Default: V3's MLA over the latent kv[0].
using MtpAttention =
    std::function<void(const StepBatch& batch, MlaStep& step, std::span<Tensor> kv, const AttentionWeights& w,
                       const MlaAbsorbedWeights& absorbed, const Tensor& xn, MlaWorkspace& ws, Tensor& out)>;

class MtpLayer {
 public:
  // `embed` [V, H] and `head` [V, H] are the main model's unless `w` has its own copies.
  MtpLayer(const MtpDims& dims, const MtpWeights& w, MlaAbsorbedWeights absorbed,
           const Tensor& embed, const Weight& head, Backend& backend);

  // An architecture whose blocks attend otherwise (V3.2: the indexer's positions only).
  void set_attention(MtpAttention attention) { attention_ = std::move(attention); }

  // hidden_in [T, H]: h_i per row (batch.token_ids hold t_{i+1}); writes the rows' latent
  // KV into kv[0] (batch.slot_mapping; more caches: MtpAttention); hidden_out [T, H];
  // logits F32 [R, V] at batch.logits_indices. cos_sin: the model's RoPE table.
  void forward(const StepBatch& batch, std::span<Tensor> kv, const Tensor& cos_sin,
               const Tensor& hidden_in, Tensor& hidden_out, Tensor& logits);
  // Bumped by each workspace reallocation (CUDA graphs over forward hold its pointers).
  uint64_t workspace_epoch() const { return workspace_epoch_; }

 private:
  void ensure_workspace(int64_t num_tokens);
  uint64_t workspace_epoch_ = 0;

  const MtpDims dims_;
  const MtpWeights& w_;
  MlaAbsorbedWeights absorbed_;
  Tensor embed_;
  Weight head_;
  Backend& backend_;
  MtpAttention attention_;  // empty: mla_forward over kv[0]
  int64_t capacity_ = 0;
  MlaWorkspace mla_ws_;
  FfnWorkspace ffn_ws_;
  std::vector<DeviceBuffer> buffers_;
  Tensor emb_, cat_, x_, xn_, delta_, gathered_;
};

}  // namespace deepinfer
