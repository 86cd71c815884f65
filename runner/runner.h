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

class Communicator;  // dist/communicator.h

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
  // KV layers beyond the model's main ones (1: the MTP layer's caches, one more layer in each
  // group Model::mtp_kv_group() / num_mtp_kv_groups() name, same blocks). With one, every target step also keeps each
  // row's final hidden state (MTP drafting reads them).
  int num_mtp_kv_layers = 0;
  // Several processes (runner/step_follow.cpp): rank 0 of `comm` (the leader) broadcasts each
  // step's inputs and KV block copies before running them; the other ranks run follow(). Steps
  // then run eagerly and synchronously (no graphs, no tokens from the device, no drafts).
  // nullptr or one rank: nothing is broadcast.
  Communicator* comm = nullptr;
  // Attention data parallelism over comm's ranks (model/parallel.h): dp_size groups of
  // comm->size() / dp_size ranks (--tp; rank = group x T + tp_rank). The leader gives each
  // sequence to group block_ids[0] % dp_size (sticky: its KV lives there; a prefix shares its
  // first block, so with it its group), every group runs its sequences on each of its ranks (a
  // filler step when it has none: the MoE layers need every rank), and the logits rows come back
  // to the leader in the step's order. 1: every rank runs the whole step.
  // With dp_size > 1 each rank's KV pool is its partition (num_kv_blocks blocks): the leader's
  // block manager holds dp_size x num_kv_blocks (BlockManager::set_partitions), block b is block
  // b / dp_size of group b % dp_size, and the leader translates tables and copies per group.
  int dp_size = 1;
};

// Speculative decoding with drafts in flight (Runner::submit's `spec`, Runner::draft_ahead).
struct SpecStep {
  // > 0: a uniform verify step of verify_q tokens per sequence whose tokens come back as ids
  // (argmax_only): after it the device computes each sequence's accepted drafts and last token
  // (Backend::spec_accept), kept for the next step and read back by collect_argmax (accepted()).
  int verify_q = 0;
  // >= 0: the step follows draft_ahead and is laid out as if all `assumed` drafts of the
  // previous verify step were accepted, one token and the new drafts per sequence, in the same
  // sequence order: the device shifts it by each sequence's accepted count (Backend::spec_shift)
  // and writes its tokens (the previous step's last token, then the drafts). token_ids' entries
  // of those tokens are not read.
  int assumed = -1;
};
// One sequence of Runner::draft_ahead: where the verify step in flight began, and the block
// table of the MTP layer's KV group.
struct DraftAheadSeq {
  int begin = 0;
  std::span<const int32_t> block_ids;
};

struct RunnerStats {
  int64_t num_steps = 0;
  int64_t num_graph_steps = 0;     // steps that replayed a captured graph
  int64_t num_graphs_captured = 0;  // captures, re-captures after workspace growth included
  int64_t num_capture_failures = 0;
  int64_t num_mtp_graph_runs = 0;  // run_mtp passes that replayed a captured graph
  int64_t num_drafts_ahead = 0;    // draft_ahead calls (drafts made on the device with a verify step in flight)
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
              std::span<const SampleRowParams> sample_rows = {}, const SpecStep& spec = {});
  // Waits for the oldest submitted step and returns its result (valid until the next collect).
  const std::vector<int32_t>& collect_argmax();
  // Of the step collect_argmax just returned, when it was a SpecStep::verify_q step: each
  // sequence's accepted drafts as the device counted them (else empty).
  const std::vector<int32_t>& accepted() const { return accepted_out_; }
  // Speculative decoding with drafts in flight: while verify step N (the last submitted, a
  // SpecStep::verify_q step of q = 1 + k tokens per sequence, `seqs` in its order) runs, makes
  // num_drafts MTP drafts per sequence for step N + 1 on the device, nothing read by the host:
  // the MTP layer over all q rows of each sequence (positions begin .. begin + k; tokens: step
  // N's chosen ids; hidden: its target rows; rows past the accepted ones write MTP KV that
  // the chained passes and the next rounds rewrite before any query reads it), draft 1 from
  // row accepted[s] (Backend::spec_select_rows), then num_drafts - 1 chained passes at
  // positions begin + k + d shifted by accepted[s] - k (Backend::spec_shift). The next
  // submit (SpecStep::assumed = k) takes them. The first pass is uniform (q rows per
  // sequence), so it replays a CUDA graph as the chained passes and verify steps do.
  void draft_ahead(std::span<const DraftAheadSeq> seqs, int num_drafts);
  const Tensor& collect_logits();
  int num_in_flight() const { return static_cast<int>(in_flight_.size()); }

  const RunnerStats& stats() const { return stats_; }
  // Several processes: on a rank other than the leader, runs every step the leader broadcasts
  // (the model's collectives pair with the leader's) until it stops (the leader's runner is
  // destroyed or calls stop_followers). Returns the number of steps followed.
  int64_t follow();
  // The leader: tells the followers that no step follows (once; the destructor calls it).
  void stop_followers();
  // Holds / releases EPLB's statistics flush on every rank at this point between steps
  // (Model::hold_expert_replacement; the leader broadcasts it). No step may be in flight.
  void hold_expert_replacement(bool hold);
  ~Runner();
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
  // The KV caches (kv_caches()[g][l]) for a drafter that reads them between steps (V4.1's DSpark,
  // engine_spec.cpp): nothing may be in flight.
  KvCaches& kv_caches() {
    DI_CHECK(in_flight_.empty(), "runner: the KV caches are read while a step is in flight");
    return kv_;
  }
  // Host logits of the last run_mtp with logits_to_host (valid until the next call).
  const Tensor& mtp_logits() const { return logits_out_; }

 private:
  struct Pending {
    bool argmax_only = false;
    int64_t num_accepted = 0;  // SpecStep::verify_q: sequences whose accepted counts come back
    bool wide = false;     // logits in wide_logits_ / host_wide_logits_
    int64_t num_rows = 0;  // logits rows the host reads
    int64_t fence = 0;
    int slot = 0;  // host staging / result slot
  };
  // Runs the model on the inputs in inputs_ (eagerly, or by the graph of graph_shape for
  // uniform steps); returns the device logits [num_logits, vocab].
  Tensor forward(const StepLayout& layout, const StepHostInfo& info, const DecodePadding* graph_shape, bool wide);
  // One MTP pass (submit_mtp, draft_ahead): builds its inputs in `staging`, uploads them, then takes on the device what is given:
  // device_tokens ([tokens]: every token), device_rows ([tokens]: the hidden source rows
  // instead of host_rows), shift (spec_shift of the layout by the last verify step's
  // accepted counts); runs the layer (graphed when uniform) and leaves the argmax of its
  // logits rows in mtp_ids_. Returns the number of those rows.
  // staging / rows_staging: host buffers untouched until the pass's uploads are done.
  // shift_assumed < 0: no shift. logits_out: the pass's device logits [rows, vocab].
  int64_t mtp_pass(std::span<const RunSeq> seqs, std::span<const int32_t> host_rows, bool hidden_from_target,
                   Tensor& staging, Tensor& rows_staging, const Tensor* device_tokens, const Tensor* device_rows,
                   int shift_assumed, Tensor& logits_out);
  // spec_shift of a built step's layout in inputs_ by the last verify step's accepted counts.
  void shift_inputs(const StepLayout& l, int num_seqs, int assumed, SpecShift& f);
  // Runs body through the graph of `shape` in `graphs`: replays it (true), or runs body
  // eagerly (growing every workspace to the shape) and then captures it for the next
  // steps of the shape (false; a shape that fails to capture runs eagerly from then on).
  bool run_graphed(DecodeGraphs& graphs, const DecodePadding& shape, const std::function<void()>& body);
  // The StepBatch over inputs_ (device views at the layout's offsets).
  StepBatch step_batch(const StepLayout& layout, const StepHostInfo& info) const;

  // The leader's half of step following: sends the step's layout, host info and inputs
  // (host[0, l.total)) / a block copy list to the followers (runner/step_follow.cpp).
  bool leads() const;
  int dp_rank() const;  // this rank's data-parallel group (0 without --dp)
  void lead_step(const StepLayout& l, const StepHostInfo& info, const int32_t* host);
  void lead_copies(std::span<const BlockCopy> copies);
  // Data parallelism: splits the step among the ranks, broadcasts every rank's part, leaves rank
  // 0's inputs in host[0, capacity) and returns its layout; dp_ then describes the step.
  StepLayout lead_dp_step(std::span<const RunSeq> seqs, int32_t* host, int64_t capacity, StepHostInfo& info);
  // After a data-parallel step's forward (own rows in the logits buffer): gathers every rank's
  // rows; the leader's come back in the step's order ([rows, vocab]), the others' are dropped.
  Tensor gather_dp_logits(int64_t vocab);
  struct DpStep {
    bool active = false;
    std::vector<int32_t> num_tokens;  // [dp] tokens of each rank's part
    std::vector<int64_t> num_rows;    // [dp] logits rows of each rank's part (a filler's too)
    std::vector<int64_t> row_src;     // leader: row i of the step = gathered row row_src[i]
  } dp_;
  DeviceBuffer dp_logits_;  // [dp x max_rows, vocab] F32
  bool followers_stopped_ = false;

  Model& model_;
  Backend& backend_;
  RunnerConfig config_;
  int max_blocks_per_seq_ = 0;
  std::vector<KvGroupSpec> groups_;  // kv_groups(model, num_mtp_kv_layers)
  std::vector<int> group_blocks_;    // blocks of each group's pool
  std::vector<Tensor> mtp_kv_;       // the MTP layer's cache in each of its groups (Model::mtp_kv_group())
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
  // Drafts in flight (SpecStep, draft_ahead): the last verify step's accepted counts and last
  // tokens (device [max_seqs]; host per slot), the drafts made for the next step (device
  // [max_logits_per_seq, max_seqs], one row per draft position) and draft 1's MTP rows.
  DeviceBuffer spec_accepted_, spec_last_, spec_drafts_, spec_rows_, host_accepted_[2];
  // Host staging of draft_ahead's passes: [2 rounds][passes], each inputs + hidden rows
  // (a round's uploads are done before the next round's verify step is collected, so
  // alternating rounds never overwrite staging a copy still reads).
  std::vector<DeviceBuffer> ahead_staging_[2];
  int ahead_round_ = 0;
  std::vector<int32_t> ahead_zeros_;  // token_ids of draft_ahead's RunSeqs (the device writes the tokens)
  int last_verify_q_ = 0;             // of the last submitted step (0: not a verify_q step)
  int last_verify_seqs_ = 0;
  int ahead_drafts_ = 0;              // drafts the last draft_ahead made (for SpecStep::assumed)
  std::vector<int32_t> accepted_out_;
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
