// DeepSeek-V4.1's DSpark drafter on the CPU and CUDA backends (issue 19 item 4; bench/NOTES.md "V4.1 DSpark
// drafter" has the sources: DeepSpec's DSpark, SGLang's V4 DSpark; the transformers PR has its config
// only). One forward proposes a block of B = dspark_block_size drafts per sequence:
//
//  context:  the target's outputs at dspark_target_layer_ids (each the mean over the hc streams of
//            that layer's output) are concatenated and fused, f = main_norm(main_proj(taps)); every
//            stage s turns f into its own K=V context row kv_norm(wkv_s(f)) with RoPE at the row's
//            position (context_rows). Only verified positions get context rows: the block's own rows
//            are never kept, so rejected drafts leave nothing behind.
//  block:    tokens [anchor, noise x (B - 1)] at positions anchor_pos .. anchor_pos + B - 1 (the
//            anchor is the sequence's last token, sampled and not yet computed); the shared
//            embedding copied into every hc stream; each stage is a V4.1 block with window
//            attention only: hc_pre (the site's own pre) -> attn_norm -> queries (wq_a, q_norm, wq_b,
//            RoPE) against [the context rows at positions > p - sliding_window ; all B block rows]
//            with the heads' sinks -> inverse RoPE -> grouped output -> hc_post; then hc_pre -> ffn_norm
//            -> MoE (dspark_n_routed_experts, top dspark_num_experts_per_tok, V4.1's router) ->
//            hc_post. Then hc_head -> h_i, norm, the target's head: base logits of draft i.
//  drafts:   sequentially, logits_i = base_i + markov_w2 · markov_w1[prev_i] (prev_1 = anchor,
//            prev_i = draft_{i-1}); draft_i = argmax over the first `vocab` ids (lowest on ties):
//            Backend::markov_argmax, on the device (the ids come back once, after the block).
//  confidence: c_i = sigmoid(proj · [h_i ; markov_w1[prev_i]]) = P(draft i accepted | drafts < i
//            were) (Backend::dspark_confidence): Proposal::confidences as schedule_verify_lengths
//            reads them.
// Every step is a backend op: the blocks run as the V4.1 forward's (the streams and hyper-connection
// mixes F32, the rest in the activation dtype: F32 on the CPU, BF16 on CUDA); the context rows are in
// the activation dtype (the main model's window rows are FP8; the drafter's are not quantized yet).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "model/deepseek_v4/step_arena.h"
#include "model/deepseek_v4/step_ops.h"
#include "model/deepseek_v41/config.h"
#include "model/deepseek_v41/weights.h"

namespace deepinfer {

class DsparkDrafter {
 public:
  // w.dspark must be loaded; w's embedding and head are the drafter's (shared with the target). On a
  // device backend the weights are the device copies (DeepseekV41Model::upload_weights uploads the
  // drafter's with the target's); the confidence head's row is read here, once.
  DsparkDrafter(const DeepseekV41Config& c, const V41Weights& w, Backend& backend);
  int block_size() const { return c_.dspark_block_size; }
  int num_stages() const { return static_cast<int>(w_.dspark.stages.size()); }
  int64_t num_taps() const { return static_cast<int64_t>(c_.dspark_target_layers.size()); }
  bool has_confidence() const { return w_.dspark.confidence.w.defined(); }

  // features [T, taps * H] (activation dtype; tap k's [H] at columns k H ..), positions I32 [T] ->
  // rows[s] [T, head_dim] (activation dtype): stage s's context row of each position.
  void context_rows(const Tensor& features, const Tensor& positions, std::vector<DeviceBuffer>& rows);

  struct Block {
    int32_t anchor = 0;
    int64_t anchor_pos = 0;
    // Per stage: the context rows of positions anchor_pos - n .. anchor_pos - 1, [n, head_dim] in
    // the activation dtype on the backend's device
    // (n >= 0; rows older than sliding_window are not read).
    std::vector<Tensor> context;
  };
  struct Output {
    std::vector<int32_t> drafts;     // [B]
    std::vector<float> confidences;  // [B]; empty without a confidence head
  };
  // One drafter forward over every block. vocab: drafts are chosen among ids [0, vocab). base_logits
  // (optional, tests): host F32 [blocks * B, V], the head's logits before the Markov bias.
  void propose(std::span<const Block> blocks, int64_t vocab, std::vector<Output>& out,
               HostBuffer* base_logits = nullptr);

 private:
  DeviceBuffer alloc(DType dtype, std::vector<int64_t> dims) { return arena_.alloc(dtype, dims); }

  DeepseekV41Config c_;  // the drafter stages' config (dspark_stage_config)
  const V41Weights& w_;
  Backend& be_;
  DType act_;                  // the backend's activation dtype
  DeviceBuffer confidence_w_;  // F32 [H (+ rank)]: the confidence head's row
  StepArena arena_;
  v4_family::RopeTables rope_;
};

}  // namespace deepinfer
