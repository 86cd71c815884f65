// Runner: turns the scheduler's decision into a StepBatch on the model's
// backend, owns the paged KV cache memory and the step's device buffers, runs
// the forward and hands back the logits rows that will be sampled, or the tokens
// themselves (argmax, or Backend::sample with per-row parameters) chosen on the device.
//
// Two ways to run a step:
//  - execute / execute_argmax: run and wait (the synchronous engine loop);
//  - run_mtp: the MTP layer over rows of the last step's hidden states (spec decoding);
//  - submit, then collect_logits / collect_argmax: the step is issued on the backend's
//    stream and the host goes on (asynchronous scheduling). Up to two steps may be in
//    flight, collected in submission order; the second may take its input tokens from
//    the first one's argmax on the device (tokens_from_previous), so the engine can issue
//    step N+1 before it has read step N's tokens.
//
// Uniform steps (every sequence computes q new tokens after cached context, each with its
// logits row: decode, q = 1, and speculative verify steps, q = 1 + k) replay a CUDA graph
// where the backend has them (runner/decode_graphs.h).
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "kv/block_manager.h"
#include "kv/kv_groups.h"
#include "model/model.h"
#include "runner/decode_graphs.h"
#include "runner/step_inputs.h"

namespace deepinfer {

struct RunnerConfig {
  int num_kv_blocks = 0;
  int kv_block_size = 16;
  int max_num_batched_tokens = 8192;  // capacity of the step buffers
  int max_num_seqs = 256;
  int max_model_len = 0;              // capacity of one block table row (in tokens)
  // CUDA graphs for pure decode steps when the backend supports them; false runs every
  // step eagerly (EngineConfig::enforce_eager, --enforce-eager).
  bool use_graphs = true;
  // Tokens are chosen (argmax, Backend::sample) from the first sample_vocab columns of each
  // logits row; 0: all of them. The engine sets the tokenizer's size when the model's vocab has
  // padding rows beyond it.
  int sample_vocab = 0;
  // Speculative decoding: logits rows per sequence a step may return (1 + k drafts);
  // sizes the logits and token buffers.
  int max_logits_per_seq = 1;
  // KV layers beyond the model's main ones (1: the MTP layer's latent cache, in the group
  // Model::mtp_kv_group() names, same blocks). With one, every target step also keeps each
  // row's final hidden state (MTP drafting reads them).
  int num_mtp_kv_layers = 0;
};

struct RunnerStats {
  int64_t num_steps = 0;
  int64_t num_graph_steps = 0;     // steps that replayed a captured graph
  int64_t num_graphs_captured = 0;  // captures, re-captures after workspace growth included
  int64_t num_capture_failures = 0;
  int64_t num_mtp_graph_runs = 0;  // run_mtp passes that replayed a captured graph
};

class Runner {
 public:
  Runner(Model& model, Backend& backend, const RunnerConfig& config);

  // Runs one step and waits. Returns host F32 logits [sum of num_logits of the seqs with
  // needs_logits, vocab], in the order of `seqs`; valid until the next call. A logits step may
  // ask a row for every new token (prompt logprobs); only argmax steps are bounded by
  // max_num_seqs x max_logits_per_seq rows.
  const Tensor& execute(std::span<const RunSeq> seqs);
  // Same step, but only the argmax of each logits row comes back (lowest id on
  // ties): greedy batches skip copying [rows, vocab] logits to the host.
  const std::vector<int32_t>& execute_argmax(std::span<const RunSeq> seqs);

  // Issues one step without waiting for it. argmax_only: collect_argmax gives its result
  // (one token per logits row), else collect_logits. sample_rows (argmax_only only): one
  // SampleRowParams per logits row; the tokens are then Backend::sample's (greedy rows
  // argmax) instead of the argmax of every row. tokens_from_previous: every sequence computes one token, and the
  // token of sequence i is row i of the previous submitted step's tokens (that step must be
  // argmax_only with at least as many rows); token_ids' last entry is then not read.
  // At most two steps in flight, at most one of them not argmax_only.
  void submit(std::span<const RunSeq> seqs, bool argmax_only, bool tokens_from_previous = false,
              std::span<const SampleRowParams> sample_rows = {});
  // Waits for the oldest submitted step and returns its result (valid until the next collect).
  const std::vector<int32_t>& collect_argmax();
  const Tensor& collect_logits();
  int num_in_flight() const { return static_cast<int>(in_flight_.size()); }

  const RunnerStats& stats() const { return stats_; }
  // KV copy-on-write: copies every layer's rows of each src block to its dst block,
  // in order, before the next submitted step (runner/block_copy.cpp).
  void copy_blocks(std::span<const BlockCopy> copies);
  // Bytes of KV cache per block of every group's layers, each counted as one row per token
  // (exact for models whose groups are all full attention, e.g. V3's one group; sizing
  // with window or compressed groups uses kv_cache_bytes in kv/kv_groups.h).
  static int64_t kv_bytes_per_block(const Model& model, DType dtype, int block_size,
                                    int num_mtp_kv_layers = 0);
  // The model's KV groups with the MTP layers added to its MTP group: what the runner
  // allocates and the block manager must account (one entry per group, in order).
  static std::vector<KvGroupSpec> kv_groups(const Model& model, int num_mtp_kv_layers);
  // Pool sizes' limits from a runner config (kv_group_pools(kv_groups, num_kv_blocks, ...)
  // gives the block manager the pools the runner allocates).
  static KvPoolLimits pool_limits(const RunnerConfig& config);
  const std::vector<KvGroupSpec>& kv_groups() const { return groups_; }
  // Uniform steps replay CUDA graphs: asked for (RunnerConfig::use_graphs), a backend that
  // has them and a model whose steps can be captured (Model::graph_capturable).
  bool graphs_enabled() const {
    return config_.use_graphs && backend_.supports_graphs() && model_.graph_capturable();
  }
  int group_num_blocks(int g) const { return group_blocks_[static_cast<size_t>(g)]; }

  // Speculative decoding (no step in flight): runs the model's MTP layer over `seqs`
  // (token_ids: each position's NEXT token; positions [num_computed, + num_new)), its KV in
  // the MTP layer's cache (block_ids: the table of the model's MTP KV group, the only group
  // the step addresses). hidden_rows[t]: the hidden input of token t of the call, a row of
  // the last target step's hidden states (hidden_from_target) or of the previous pass's
  // output. Returns the argmax (over sample_vocab, lowest id on ties; a NaN row gives a
  // negative id) of each logits row, chosen on the device; with logits_to_host,
  // mtp_logits() then holds the host F32 logits [rows, vocab] too.
  const std::vector<int32_t>& run_mtp(std::span<const RunSeq> seqs, std::span<const int32_t> hidden_rows,
                                      bool hidden_from_target, bool logits_to_host = false);
  // The same pass issued without waiting (at most two pending), its result from
  // collect_mtp in issue order (valid until the next collect). tokens_from_previous: every
  // sequence computes one row and its token is row i of the previous pass's device argmax
  // (chained drafts: no host wait between passes); token_ids' entry is then not read. Two
  // pending passes with logits_to_host may have max_overlapped_mtp_rows() rows each.
  void submit_mtp(std::span<const RunSeq> seqs, std::span<const int32_t> hidden_rows, bool hidden_from_target,
                  bool logits_to_host = false, bool tokens_from_previous = false);
  const std::vector<int32_t>& collect_mtp();
  int max_overlapped_mtp_rows() const { return static_cast<int>(max_rows_ / 2); }
  // Host logits of the last run_mtp with logits_to_host (valid until the next call).
  const Tensor& mtp_logits() const { return logits_out_; }

 private:
  struct Pending {
    bool argmax_only = false;
    bool wide = false;     // logits in wide_logits_ / host_wide_logits_
    int64_t num_rows = 0;  // logits rows the host reads
    int64_t fence = 0;
    int slot = 0;  // host staging / result slot
  };
  // Runs the model on the inputs in inputs_ (eagerly, or by the graph of graph_shape for
  // uniform steps); returns the device logits [num_logits, vocab].
  Tensor forward(const StepLayout& layout, const StepHostInfo& info, const DecodePadding* graph_shape, bool wide);
  // Runs body through the graph of `shape` in `graphs`: replays it (true), or runs body
  // eagerly (growing every workspace to the shape) and then captures it for the next
  // steps of the shape (false; a shape that fails to capture runs eagerly from then on).
  bool run_graphed(DecodeGraphs& graphs, const DecodePadding& shape, const std::function<void()>& body);
  // The StepBatch over inputs_ (device views at the layout's offsets).
  StepBatch step_batch(const StepLayout& layout, const StepHostInfo& info) const;

  Model& model_;
  Backend& backend_;
  RunnerConfig config_;
  int max_blocks_per_seq_ = 0;
  std::vector<KvGroupSpec> groups_;  // kv_groups(model, num_mtp_kv_layers)
  std::vector<int> group_blocks_;    // blocks of each group's pool
  int mtp_layer_ = 0;                // the MTP layer's index in its group
  std::vector<DeviceBuffer> kv_memory_;  // per layer of every group [blocks_g, block_size, row_dim_g]
  KvCaches kv_;                          // kv_[g][l]: views of kv_memory_
  DeviceBuffer inputs_;      // I32 device: every step input in one buffer (StepLayout)
  DeviceBuffer staging_[2];  // I32 host (page-locked on CUDA): inputs being built / in flight
  DeviceBuffer logits_, argmax_ids_;  // device [max_seqs, vocab] F32, [max_seqs] I32
  DeviceBuffer sample_params_;        // device I32 [max_seqs, kSampleRowWords]
  DeviceBuffer host_ids_[2];          // I32 host [max_seqs] per slot
  DeviceBuffer host_sample_params_[2];  // I32 host [max_seqs, kSampleRowWords] per slot
  DeviceBuffer host_logits_;          // F32 host [max_seqs, vocab]
  // Logits steps with more rows than max_rows_ (prompt logprobs: a row per prompt position of a
  // prefill chunk, up to max_num_batched_tokens) use these, allocated on first need and grown to
  // the largest such step (eager steps only: graphs keep logits_' address).
  DeviceBuffer wide_logits_, host_wide_logits_;  // F32 device / host [rows, vocab]
  int64_t max_rows_ = 0;              // logits rows per step (max_seqs x max_logits_per_seq, capped)
  DeviceBuffer hidden_;               // [max_tokens, hidden] target hidden states (with an MTP KV layer)
  DeviceBuffer mtp_in_, mtp_out_[2];  // [max_tokens, hidden] MTP inputs / outputs (chained)
  DeviceBuffer mtp_rows_, host_mtp_rows_[2];  // I32 [max_tokens] hidden source rows (host: per slot)
  DeviceBuffer mtp_ids_;              // I32 [max_rows] device argmax of MTP rows (not argmax_ids_:
                                      // a later tokens_from_previous step reads that)
  int mtp_cur_ = 0;                   // mtp_out_ index written by the last run_mtp
  int64_t mtp_out_rows_ = 0;          // rows it wrote (a chained pass reads those only)
  int64_t hidden_rows_ = 0;           // rows in hidden_ from the last target step
  std::vector<int32_t> ids_out_;
  Tensor logits_out_;
  DecodeGraphs graphs_;
  // MTP passes of one row per sequence, by (source, destination) of the hidden states:
  // [0] target -> mtp_out_[0], [1] mtp_out_[0] -> [1], [2] mtp_out_[1] -> [0].
  DecodeGraphs mtp_graphs_[3];
  std::deque<Pending> in_flight_;
  struct MtpPending {
    int64_t fence = 0;
    int slot = 0;           // host ids / staging slot
    int64_t rows = 0;       // logits rows (drafts) it returns
    bool logits = false;    // its logits come to the host, at row logits_row0 of host_logits_
    int64_t logits_row0 = 0;
  };
  std::deque<MtpPending> mtp_pending_;
  int64_t last_mtp_rows_ = -1;  // logits rows of the last submitted MTP pass
  int next_slot_ = 0;
  int64_t last_argmax_rows_ = -1;  // token rows of the last submitted step (-1: logits step)
  RunnerStats stats_;
};

}  // namespace deepinfer
