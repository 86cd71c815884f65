// Engine::Impl: the step loop over scheduler, runner and sampler. Built by
// Engine(EngineConfig) from a checkpoint, or directly from parts (tests use a
// fake deterministic model on the CPU backend).
#pragma once
#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "deepinfer/engine.h"
#include "dist/communicator.h"
#include "engine/request_state.h"
#include "grammar/grammar.h"
#include "kv/block_manager.h"
#include "model/config.h"
#include "model/model.h"
#include "runner/runner.h"
#include "sample/sampler.h"
#include "sched/scheduler.h"
#include "spec/proposer.h"
#include "spec/verify_schedule.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {

// The runner's sizes from the engine's config (the engine's runner and the KV-sizing profile
// step use the same one).
// A model whose drafter proposes a block per forward from context rows the target's steps write
// (V4.1's DSpark, engine_spec.cpp): the "mtp" speculator runs it instead of an MTP layer.
bool has_block_drafter(const Model& model);

inline RunnerConfig runner_config(const EngineConfig& cfg, const Model& model, int num_kv_blocks, int max_model_len) {
  RunnerConfig rc;
  rc.num_kv_blocks = num_kv_blocks;
  rc.kv_block_size = cfg.kv_block_size;
  rc.max_num_batched_tokens = cfg.max_num_batched_tokens;
  rc.max_num_seqs = cfg.max_num_seqs;
  rc.max_model_len = max_model_len;
  rc.use_graphs = !cfg.enforce_eager;
  const int k = std::max(cfg.num_speculative_tokens, 0);
  rc.max_logits_per_seq = 1 + k;
  rc.num_mtp_kv_layers = k > 0 && cfg.speculator == "mtp" && model.num_mtp_layers() > 0 ? 1 : 0;
  return rc;
}

// Block tables of KV groups 1.. for a throwaway step over a still-empty cache (the KV
// sizing profile, step-time measurement): sequence `seq` of sequences of `tokens` tokens
// each takes consecutive blocks of every group, wrapping around a pool too small for all
// (rows nobody reads). Empty for a model with one group.
inline std::vector<std::vector<int32_t>> scratch_block_tables(const Runner& runner, int seq, int64_t tokens,
                                                              int block_size) {
  std::vector<std::vector<int32_t>> tables;
  const std::vector<KvGroupSpec>& groups = runner.kv_groups();
  for (size_t g = 1; g < groups.size(); ++g) {
    const int64_t rows = tokens / groups[g].tokens_per_row;
    const int64_t n = (rows + block_size - 1) / block_size, pool = runner.group_num_blocks(static_cast<int>(g));
    std::vector<int32_t>& t = tables.emplace_back();
    for (int64_t i = 0; i < n; ++i) t.push_back(static_cast<int32_t>((seq * n + i) % pool));
  }
  return tables;
}

// Token id of a sequence's entries while the step that chooses them is in flight
// (asynchronous scheduling: run_ahead's last token, spec_run_ahead's last token and drafts);
// collect() replaces them.
inline constexpr int32_t kPlaceholderToken = -1;

// The speculation fields' own checks (k in 0..16, a known speculator): one place, run by
// Engine(EngineConfig) before any weight loads and by Impl (engines built from parts).
void check_speculation_config(const EngineConfig& config);

struct Engine::Impl {
  // `tokenizer` may be null (token-id prompts only, empty text).
  // `comm`: the processes of a run of several (EngineConfig::tp/ep/dp), null for one.
  Impl(const EngineConfig& config, std::unique_ptr<Backend> backend, std::unique_ptr<Model> model,
       std::unique_ptr<Tokenizer> tokenizer, std::unique_ptr<Communicator> comm = nullptr);

  std::string add_request(const Prompt& prompt, const SamplingParams& params,
                          std::string request_id);
  std::vector<RequestOutput> step();
  bool abort(const std::string& request_id);
  bool has_unfinished() const { return !requests_.empty(); }
  std::vector<int32_t> tokenize(const Prompt& prompt, const std::string& request_id) const;
  void refresh_load_stats();  // stats.num_free_kv_blocks, num_running_seqs, num_waiting_seqs, num_eplb_replacements

  EngineConfig config;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<Communicator> comm;  // after backend (NCCL uses its stream), before the runner
  int max_model_len = 0;
  // Ids the engine samples from: the model's vocabulary, or the tokenizer's when it is smaller
  // (a model's padding rows, e.g. DeepSeek-V3's 129,280 for a 128,815-id tokenizer, are never
  // chosen: logits columns from here on are not read).
  int sample_vocab = 0;
  EngineStats stats;

 private:
  double now_s() const;
  // Appends a sampled token, detokenizes, checks stop conditions; finishes the sample if done.
  void append_token(SeqState& seq, const SampleResult& sample);
  void finish_seq(SeqState& seq, FinishReason reason, std::string stop_reason = "");
  // Ends a sequence whose row had no token (NaN logits, all masked) with FinishReason::Error.
  void fail_seq(SeqState& seq, const std::string& error);
  bool is_stop_token(const RequestState& r, int32_t token) const;
  RequestOutput make_output(RequestState& r);

  // Asynchronous scheduling (engine/engine.cpp): a submitted step and what the engine
  // needs to take its results. Sequences finished while their step is in flight are
  // set to null in `plan` (their row's token is discarded).
  struct InFlight {
    SchedulerOutput plan;
    std::vector<int> begins;  // per plan.seqs: num_computed_tokens before the step
    std::vector<int> rows;    // per plan.seqs: first row (token) of the step
    std::vector<int> logits_rows;  // per plan.seqs: its logits rows (prompt-logprob rows, then sampled)
    std::vector<int> prompt_rows;  // per plan.seqs: of those, prompt-logprob rows (positions from begin)
    std::vector<int> prompt_from;  // per plan.seqs: the prompt position of its first prompt-logprob row
    bool argmax_only = false;  // the runner returns token ids (argmax or sampled on the device)
    bool step_done = false;  // scheduler_->on_step_done(plan) already called
    // Drafts in flight (spec_run_ahead): verify_q > 0: a uniform verify step of verify_q tokens
    // per sequence whose accepted counts the device computes; device_drafts: its drafts were
    // made on the device (token_ids hold placeholders; acceptance is the device's count);
    // next_drafts >= 0: the step after it was issued ahead with that many drafts per sequence.
    int verify_q = 0;
    bool device_drafts = false;
    int next_drafts = -1;
  };
  // assumed >= 0: the plan was scheduled by spec_run_ahead (runner SpecStep::assumed).
  void submit(SchedulerOutput plan, bool tokens_from_previous, int assumed = -1);
  // Drafts in flight: while a uniform verify step runs, schedules the next one as if all its
  // drafts were accepted, has the device make its drafts (Runner::draft_ahead) and submits
  // it, fixed up on the device from the accepted counts; collect() then reconciles the
  // host's sequences one step late. Only where that cannot change any output (see the
  // definition); otherwise does nothing.
  void spec_run_ahead();
  // While the oldest step runs, schedules the next one assuming each of its sequences
  // gets one more token (a placeholder until collected) and submits it with its tokens
  // taken from the running step's device-chosen tokens (argmax or Backend::sample). Only in the steady decode state
  // where that is safe (see the definition); otherwise does nothing.
  void run_ahead();
  std::vector<RequestOutput> collect();
  SampleResult sample_next(SeqState& seq, int row, const Tensor* logits,
                           const std::vector<int32_t>* argmax_ids);
  // SamplingParams::prompt_logprobs (engine/engine_score.cpp): the prompt positions of sample
  // 0's step [begin, end) that need a logits row (not yet scored, before the last prompt token);
  // returns how many and sets `from` to the first.
  int prompt_logprob_rows(const SeqState& seq, int begin, int end, int& from) const;
  // Scores prompt positions [from, from + count) from consecutive logits rows starting at `row`.
  // False (the sequence failed) on a non-finite row.
  bool score_prompt(SeqState& seq, const Tensor& logits, int row, int from, int count);
  // Speculative decoding (engine/engine_spec.cpp): drafts for the sequences of a collected
  // step (at most draft_depth_ each), appended to their token_ids as Sequence::num_draft_tokens.
  void propose_drafts(const InFlight& step);
  // spec_varlen: the next steps' draft depth from the batch, the measured acceptance and the
  // step times (choose_draft_depth); else k.
  void update_draft_depth();
  // Expected survival by draft position over the run: recent accepted / made drafts (counts
  // decay by 0.9 per verify step, so a change of load or text shows within ~10 steps); a
  // position without counts takes the one before it (1 before any: drafting is tried).
  std::vector<double> run_survival() const;
  // spec_varlen 1: confidences of a request's next num_drafts drafts from its own recent
  // acceptance blended with the run's survival.
  std::vector<float> history_confidences(const RequestState& r, int num_drafts, std::span<const double> run) const;
  // The step computed only decode tokens of sequences without drafts (none of a prompt):
  // with draft depth 0 it may be followed by a step issued ahead, as k = 0 does.
  static bool decode_only(const InFlight& step);
  // How many drafts a sequence may take: k cut so the verify step can neither pass
  // max_tokens nor max_model_len.
  int draft_budget(const SeqState& seq) const;
  void make_proposer();
  // spec_varlen without given step times: measures the table's batches the engine's
  // sequences now need (engine/engine_spec.cpp says when and how); only while nothing is
  // in flight (it runs throwaway steps on scratch KV blocks).
  void grow_step_times();
  bool measure_step_batch(int num_seqs, int context);
  void log_step_times() const;
  // Adds one verify step's counts to the request's and the run's SpecDecodeStats.
  void count_verified(RequestState& r, int num_drafts, int num_accepted, int num_emitted);
  int spec_k_ = 0;  // resolved num_speculative_tokens
  std::unique_ptr<MtpExecutor> mtp_exec_;
  std::unique_ptr<BlockDraftExecutor> block_exec_;  // a block drafter's (DSpark) instead
  std::unique_ptr<Proposer> proposer_;
  StepCost step_cost_;  // spec_varlen: from the step times measured so far (or given)
  std::vector<int> step_time_batches_;  // batches still to measure, ascending (grow_step_times)
  int draft_depth_ = 0;  // drafts the next proposal may make per sequence (update_draft_depth)
  int num_depth_drops_ = 0;  // times update_draft_depth went from drafting to depth 0
  // The factor the run's acceptance history fades by on a step without drafts (collect).
  double undrafted_fade() const;
  // Accepted / verified drafts by draft position, decayed per verify step: the expected
  // survival choose_draft_depth reads.
  std::vector<double> accepted_decayed_, drafted_decayed_;

  std::deque<InFlight> in_flight_;
  SchedulerOutput deferred_;  // scheduled by run_ahead, submitted after the next collect

  std::vector<int32_t> eos_ids_;
  std::unique_ptr<BlockManager> blocks_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<Runner> runner_;

 public:
  Runner& runner() { return *runner_; }

 private:
  std::unique_ptr<Sampler> sampler_;
  std::shared_ptr<const grammar::Vocabulary> grammar_vocab_;
  std::unique_ptr<grammar::GrammarCache> grammar_cache_;
  std::vector<uint32_t> bitmask_;
  std::unordered_map<std::string, std::unique_ptr<RequestState>> requests_;
  int64_t next_request_ = 0;
  int64_t next_seq_id_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace deepinfer
