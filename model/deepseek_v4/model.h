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
  // Decode steps (one new token per sequence) build their row lists on the device
  // (DecodeRows) and read nothing back: the runner captures and replays them. Other steps
  // (prefill, verify) and mtp_forward read their token ids and block tables back and upload
  // row lists built from them (StepHost): they run eagerly.
  bool graph_capturable() const override { return true; }
  int max_graph_tokens_per_seq() const override { return 1; }
  bool mtp_graph_capturable() const override { return false; }

 private:
  using StepHost = v4_family::StepHost;
  // A decode step's addressing, built on the device once per step (Backend::v4_decode_rows)
  // from the context lengths and block tables, for S sequences of one new token each. The
  // attention of a layer reads rows [S * W window rows | S * E entries] gathered into one
  // table, through indices [S, W + E]: slot j < W is the window row e - W + j, slot W + i entry
  // i (HCA: every visible one; CSA: the indexer's i-th choice); -1 where none. E is fixed by the
  // step's max_seq_len (a graph's context bucket), so the lists' shapes are the step shape's.
  struct DecodeRows {
    int64_t S = 0, W = 0, hca_entries = 0, csa_keys = 0, topk = 0;
    DeviceBuffer win_slots;                  // I32 [S, W] window rows' slots (0 where none)
    DeviceBuffer idx_win, idx_hca, idx_csa;  // I32 [S, W + E] per layer kind
    DeviceBuffer hca_pool, hca_out, hca_pos, hca_vis;  // [S, ratio] pending rows, [S, 1] entry slot, position; [S, E]
    DeviceBuffer csa_pool, csa_out, key_out, csa_pos, key_ids;  // [S, 2 ratio], [S, 1] x 3, [S, csa_keys]
  };
  bool is_decode(const StepBatch& batch) const;
  DecodeRows decode_rows(const StepBatch& batch, KvCaches& kv);
  // The decode path of attention() after this step's rows are stored (dr: the step's lists).
  void decode_attention(const V4Layer& L, int l, const StepBatch& batch, const DecodeRows& dr, KvCaches& kv,
                        const Tensor& window_cache, const Tensor& iq, const Tensor& iw, const Tensor& q, Tensor& out);
  void check_step(const StepBatch& batch, const KvCaches& kv) const;
  void check_positions(const StepBatch& batch) const;
  DeviceBuffer alloc(DType dtype, std::vector<int64_t> dims) { return arena_.alloc(dtype, dims); }
  DeviceBuffer upload(const std::vector<int32_t>& v);
  // Layer l's attention over the step: x [T, H] its normed input, qr [T, q_lora] the q_norm
  // output, q [T, heads, D] the rotated queries; out [T, heads, D] before the inverse RoPE.
  // l: the main layer's index, -1 for the MTP block (window-only); its window rows live in
  // window_cache, addressed by window group `window_group` of the step.
  // dr: a decode step's device-built lists (sh unused), else null (sh's host addressing).
  void attention(const V4Layer& L, int l, const StepBatch& batch, const StepHost& sh, const DecodeRows* dr,
                 KvCaches& kv, const Tensor& window_cache, int window_group, const Tensor& x, const Tensor& qr,
                 const Tensor& q, Tensor& out);
  // One block (attention then MoE, each between hc_pre and hc_post) over streams [T, hc, H]
  // (F32) in place (next: scratch of the same shape).
  void block(const V4Layer& L, int l, const StepBatch& batch, const StepHost& sh, const DecodeRows* dr, KvCaches& kv,
             const Tensor& window_cache, int window_group, DeviceBuffer& streams, DeviceBuffer& next);
  // check_rows: read logits_indices back to check them (not in a decode step: graph-safe).
  void head_logits(const StepBatch& batch, const Tensor& streams, const V4HyperConnection& hc_head,
                   const Tensor& norm, Tensor& logits, bool check_rows = true);

  DeepseekV4Config config_;
  V4Weights w_;
  Backend& be_;
  DType act_;  // the backend's activation dtype
  V4KvLayout layout_;
  v4_family::RopeTables rope_;
  DeviceBuffer ones_;  // F32 [head_dim]: the unweighted per-head norm
  std::vector<DeviceBuffer> tid2eid_;  // per layer: I32 [vocab, top_k] on the device (hash layers)
  // I32 [n] with entry i = i / hc_mult: its first T * hc_mult entries map row t * hc + k of a
  // step's streams to token t. Grown (doubling) outside captures (the uncaptured step of a shape
  // comes first) and kept.
  DeviceBuffer stream_rows_;
  StepArena arena_;    // every temporary of a forward / mtp_forward (step_arena.h)
  UploadStage stage_;  // their host-built I32 lists, uploaded without a wait each
};

}  // namespace deepinfer
