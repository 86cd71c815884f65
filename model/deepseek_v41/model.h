// DeepSeek-V4.1 forward over the paged KV layer groups of kv_layout.h, on the CPU backend (the
// reference, F32) or CUDA (BF16 activations as V4's, the hyper-connection streams, router and
// indexer scores F32; the weights uploaded by upload_weights, the DSpark drafter's too; no CUDA
// graphs yet): any number of sequences per step, each appending any
// number of tokens after its cached context (prefill, chunked prefill and decode are one code path).
//
//  per step:   single-pass hyper-connections: each site mixes its streams (pre, post, comb) but
//              collapses them with the previous site's pre (the first site: stream 0); the last
//              site's pre collapses the streams for the final norm and head (no hc_head);
//  per layer:  this step's window rows go to the window cache (FP8 rows); a KV source pools the
//              groups the step completes (ratio 1: every token) into its shared compressed rows
//              (FP4-rounded, after RoPE at the group's first position) and makes their indexer keys
//              (FP4-rounded RoPE(k_norm(wk(entry))) before the entry's RoPE); an index source
//              scores its (FP4-rounded) queries against its group's keys and keeps the top
//              index_topk visible entries per query (the candidate source also its top
//              candidate_topk_blocks blocks, which constrain the later index sources); the layers
//              in between reuse the last source's choice; each query attends its window rows plus
//              the chosen entries, with its head's sink;
//  logits:     only at batch.logits_indices.
//  truncation: with prefill truncation on (truncation.h, DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE=
//              compact), the layers above the last KV source run on each sequence's rows from
//              batch.host_replay_floor on only (a compacted copy of the step), their window
//              attention reading no row below it.
//  Engram:     per step, each token's compressed id (the token map) goes to the "engram_tokens"
//              cache; its 2..N-gram hash rows (engram_hash.h, the look-back read from that cache, cut at
//              the sequence start) are gathered from each Engram layer's table, projected by wkv into
//              hc keys and one value, and added to every stream gated by engram_gate, before the
//              layer's first hyper-connection site.
//  DSpark:     with the drafter loaded (dspark.h), each step also writes every token's drafter
//              context rows (from the mean over the hc streams of the dspark_target_layer_ids
//              layers' outputs) into the "dspark_context" group; propose_blocks drafts from them.
//              A verify step writes rows of drafts that may be rejected: only rows before a
//              block's anchor are read, and those are verified (the next step rewrites the rest).
//              With prefill truncation only the kept rows' context rows are written (a block
//              reads its last sliding_window positions, all at or above the floor).
#pragma once
#include <memory>
#include <span>
#include <vector>

#include "model/deepseek_v4/step_ops.h"
#include "model/deepseek_v41/config.h"
#include "model/deepseek_v41/dspark.h"
#include "model/deepseek_v41/engram_hash.h"
#include "model/deepseek_v41/kv_layout.h"
#include "model/deepseek_v41/truncation.h"
#include "model/deepseek_v41/weights.h"
#include "model/model.h"

namespace deepinfer {

class DeepseekV41Model : public Model {
 public:
  // truncation: from v41_prefill_truncation (off when default-constructed).
  DeepseekV41Model(DeepseekV41Config config, V41Weights weights, Backend& backend,
                   V41PrefillTruncation truncation = {});
  const ModelConfig& config() const override { return config_.base; }
  const DeepseekV41Config& v41_config() const { return config_; }
  const V41KvLayout& kv_layout() const { return layout_; }
  std::vector<KvGroupSpec> kv_groups() const override { return layout_.groups; }
  int vocab_size() const override { return static_cast<int>(config_.base.vocab_size); }
  // hidden_out: F32 [T, hc_mult * hidden], the hyper-connection streams after the last layer.
  void forward(const StepBatch& batch, KvCaches& kv, Tensor& logits,
               Tensor* hidden_out = nullptr) override;
  int64_t mtp_hidden_size() const override { return config_.hc_mult * config_.base.hidden_size; }
  uint64_t workspace_epoch() const override { return arena_.epoch(); }
  // The last forward's peak of temporaries (step_arena.h), for tests and benches.
  size_t step_peak_bytes() const { return arena_.peak_bytes(); }
  // Each step reads its token ids and block tables back (StepHost): not capturable.
  bool graph_capturable() const override { return false; }
  PrefillTruncation prefill_truncation() const override;
  const V41PrefillTruncation& truncation() const { return trunc_; }

  // The DSpark drafter: drafts per block (0: not loaded), its KV group, one block per sequence.
  int draft_block_size() const { return drafter_ ? drafter_->block_size() : 0; }
  int draft_kv_group() const { return layout_.dspark; }
  bool draft_confidences() const { return drafter_ && drafter_->has_confidence(); }
  struct BlockSeq {
    int32_t anchor = 0;      // the sequence's last token (sampled, not computed)
    int64_t anchor_pos = 0;  // its position: rows [0, anchor_pos) are computed
    std::span<const int32_t> block_ids;  // its table in draft_kv_group()
  };
  // Drafts (and confidences) of one block per sequence from the context rows in kv; drafts are
  // ids in [0, vocab). base_logits (tests): DsparkDrafter::propose's.
  void propose_blocks(std::span<const BlockSeq> seqs, KvCaches& kv, int64_t vocab,
                      std::vector<DsparkDrafter::Output>& out, HostBuffer* base_logits = nullptr);

 private:
  using StepHost = v4_family::StepHost;
  // What an index source chose for one sequence of the step, reused up to the next index source:
  // chosen I32 [nq, k] (entry ids, -1 empty); candidates F32 [nq, entries] (0 / -inf) from the
  // candidate source.
  struct SeqChoice {
    DeviceBuffer chosen, candidates;
    int64_t k = 0;
  };
  // A forward's temporaries (step_arena.h; given back together when the next step starts).
  DeviceBuffer alloc(DType dtype, std::vector<int64_t> dims) { return arena_.alloc(dtype, dims); }
  // A device backend's copies of the host weights (v4_family::DeviceUploader: F32 linears BF16, the
  // 32x32-block FP8 ones FP8 with their scales, routed experts packed FP4 when loaded so; Engram
  // tables copied as they are).
  void upload_weights();
  // F32 [T, hc] rows on the device: one-hot on stream 0 (the first site's pre), or 1 / hc each (the
  // drafter's mean over the streams); a view of buffers grown on the host when T outgrows them.
  Tensor constant_pre(bool mean, int64_t T);
  // rows [R, C] (activations) -> their slots of a cache in `format` (kv_layout.h).
  void store_packed(const Tensor& rows, Backend::FakeQuant format, const Tensor& cache,
                    const Tensor& slot_mapping);
  // Layer l's attention: x [T, H] its normed input, qr [T, q_lora] the q_norm output, q [T, heads,
  // D] the rotated queries; out [T, heads, D] before the inverse RoPE.
  void attention(int l, const StepBatch& batch, const StepHost& sh, KvCaches& kv, const Tensor& x,
                 const Tensor& qr, const Tensor& q, std::vector<SeqChoice>& choice, Tensor& out);
  // A KV source's compressed rows for sequence s: the groups its tokens [p0, end) complete.
  void compress(int l, const StepBatch& batch, const StepHost& sh, KvCaches& kv, const Tensor& x,
                int64_t s);
  // One block over streams [T, hc, H] (F32) in place (next: scratch of the same shape); pre [T,
  // hc]: the previous site's pre in, this block's last site's pre out.
  void block(int l, const StepBatch& batch, const StepHost& sh, KvCaches& kv,
             std::vector<SeqChoice>& choice, DeviceBuffer& streams, DeviceBuffer& next,
             DeviceBuffer& pre);
  // The step's Engram rows, I32 [engram layers * T * cols] (layer-major), after caching the step's
  // compressed ids.
  DeviceBuffer engram_rows(const StepBatch& batch, const StepHost& sh, KvCaches& kv);
  // The truncated layers over the rows of `batch` at or after each sequence's replay floor:
  // streams / pre [T, ...] of the full step in, the kept rows' logits out (the rest of forward;
  // hidden_out only when no row is skipped).
  void truncated_layers(const StepBatch& batch, const StepHost& sh, KvCaches& kv,
                        std::vector<SeqChoice>& choice, DeviceBuffer& streams, DeviceBuffer& next,
                        DeviceBuffer& pre, const Tensor& features, Tensor& logits,
                        Tensor* hidden_out);
  // The drafter's taps: layer l's mean over the hc streams into its columns of features (the
  // activation dtype, [rows, taps * H]; nothing when l is no tap layer or no drafter is loaded).
  void tap(int l, const Tensor& streams, const Tensor& features);
  // The drafter's context rows of `features` at `positions` into batch's "dspark_context" slots.
  void store_drafter_rows(const Tensor& features, const Tensor& positions, const StepBatch& batch,
                          KvCaches& kv);
  // Logits of `rows` (I32 on the device) of streams [T, hc, H] collapsed by pre [T, hc].
  void head(const Tensor& streams, const Tensor& pre, const Tensor& rows, Tensor& logits);

  DeepseekV41Config config_;
  V41Weights w_;
  Backend& be_;
  DType act_;
  V41KvLayout layout_;
  v4_family::RopeTables rope_;
  StepArena arena_;
  DeviceBuffer zero_ape_;  // F32 [max ratio, D]: compressor_pool's position bias (V4.1 has none)
  DeviceBuffer token_map_;  // Engram: F32 [vocab, 1], token id -> compressed id
  // F32 [const_rows_, hc] rows: one-hot on stream 0 (the first site's pre), 1 / hc (the mean).
  DeviceBuffer one_hot_, mean_pre_;
  int64_t const_rows_ = 0;
  EngramHashing hashing_;
  std::vector<int> engram_index_;  // per layer: its index in engram_layers, -1: none
  DeviceBuffer engram_ids_;        // this step's engram_rows
  std::unique_ptr<DsparkDrafter> drafter_;  // with w_.dspark loaded
  std::vector<int> tap_index_;              // per layer: its index in dspark_target_layers, -1: none
  V41PrefillTruncation trunc_;
  // Per sequence of the step: no window row below it is read (the truncated layers; empty: none).
  std::vector<int64_t> window_floor_;
};

}  // namespace deepinfer
