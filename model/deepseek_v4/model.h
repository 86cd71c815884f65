// DeepSeek-V4 forward over the paged KV layer groups of kv_layout.h, on any backend (the
// CPU reference or CUDA): any number of sequences per step, each appending any number of
// tokens after its cached context (prefill, chunked prefill, decode and prefix hits are one
// code path). Every tensor op runs on the backend's device; the host only computes the
// step's addressing (slots, row lists, positions of compressed entries, hash-routing rows)
// from the step's host mirrors and block tables, and uploads those small I32 tensors.
//
//  per step:    token-wise work (hyper-connections, projections, MoE) over all the step's rows;
//               the hyper-connection streams stay F32 on every backend, the rest is in the
//               backend's activation dtype;
//  per layer:   this step's window rows and compressor inputs go to their caches first, then
//               per sequence the compression groups the step completes are pooled into the
//               entry caches (CSA: also the indexer's keys), and each query attends its window
//               rows plus the visible (HCA) or indexer-chosen (CSA) entries, gathered from the
//               sequence's blocks;
//  logits:      only at batch.logits_indices.
#pragma once
#include <vector>

#include "model/deepseek_v4/config.h"
#include "model/deepseek_v4/kv_layout.h"
#include "model/deepseek_v4/step_arena.h"
#include "model/deepseek_v4/step_ops.h"
#include "model/deepseek_v4/weights.h"
#include "model/model.h"

namespace deepinfer {

class DeepseekV4Model : public Model {
 public:
  DeepseekV4Model(DeepseekV4Config config, V4Weights weights, Backend& backend);
  const ModelConfig& config() const override { return config_.base; }
  const DeepseekV4Config& v4_config() const { return config_; }
  const V4KvLayout& kv_layout() const { return layout_; }
  std::vector<KvGroupSpec> kv_groups() const override { return layout_.groups; }
  int vocab_size() const override { return static_cast<int>(config_.base.vocab_size); }
  // hidden_out: F32 [T, hc_mult * hidden] on the backend's device, the hyper-connection
  // streams after the last layer (before hc_head), what the MTP block drafts from.
  void forward(const StepBatch& batch, KvCaches& kv, Tensor& logits, Tensor* hidden_out = nullptr) override;
  // The MTP block (DeepSeek's MTPBlock, window-only): its K=V rows are one more layer of the
  // "window" group (the runner adds it there; same block tables, same sliding window).
  int num_mtp_layers() const override { return static_cast<int>(w_.mtp.size()); }
  int mtp_kv_group() const override { return layout_.window; }
  int64_t mtp_hidden_size() const override { return config_.hc_mult * config_.base.hidden_size; }
  DType mtp_hidden_dtype(DType) const override { return DType::F32; }
  // Row i: token t_{i+1} (batch.token_ids) at position i with hidden_in [T, hc * hidden] =
  // the target's streams h_i (or a chained draft's output streams); hidden_out [T, hc *
  // hidden] its output streams; logits from its own hc_head and norm and the shared head.
  void mtp_forward(const StepBatch& batch, std::span<Tensor> kv, const Tensor& hidden_in, Tensor& hidden_out,
                   Tensor& logits) override;
  uint64_t workspace_epoch() const override { return arena_.epoch(); }
  // Each step reads its token ids and block tables back and uploads row lists built from them
  // (StepHost): not capturable until that addressing is computed on the device.
  bool graph_capturable() const override { return false; }

 private:
  using StepHost = v4_family::StepHost;
  void check_step(const StepBatch& batch, const KvCaches& kv) const;
  void check_positions(const StepBatch& batch) const;
  DeviceBuffer alloc(DType dtype, std::vector<int64_t> dims) { return arena_.alloc(dtype, dims); }
  DeviceBuffer upload(const std::vector<int32_t>& v);
  // Layer l's attention over the step: x [T, H] its normed input, qr [T, q_lora] the q_norm
  // output, q [T, heads, D] the rotated queries; out [T, heads, D] before the inverse RoPE.
  // l: the main layer's index, -1 for the MTP block (window-only); its window rows live in
  // window_cache, addressed by window group `window_group` of the step.
  void attention(const V4Layer& L, int l, const StepBatch& batch, const StepHost& sh, KvCaches& kv,
                 const Tensor& window_cache, int window_group, const Tensor& x, const Tensor& qr, const Tensor& q,
                 Tensor& out);
  // One block (attention then MoE, each between hc_pre and hc_post) over streams [T, hc, H]
  // (F32) in place (next: scratch of the same shape).
  void block(const V4Layer& L, int l, const StepBatch& batch, const StepHost& sh, KvCaches& kv,
             const Tensor& window_cache, int window_group, DeviceBuffer& streams, DeviceBuffer& next);
  void head_logits(const StepBatch& batch, const Tensor& streams, const V4HyperConnection& hc_head,
                   const Tensor& norm, Tensor& logits);

  DeepseekV4Config config_;
  V4Weights w_;
  Backend& be_;
  DType act_;  // the backend's activation dtype
  V4KvLayout layout_;
  v4_family::RopeTables rope_;
  DeviceBuffer ones_;  // F32 [head_dim]: the unweighted per-head norm
  StepArena arena_;    // every temporary of a forward / mtp_forward (step_arena.h)
  UploadStage stage_;  // their host-built I32 lists, uploaded without a wait each
};

}  // namespace deepinfer
