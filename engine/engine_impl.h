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
#include "engine/request_state.h"
#include "grammar/grammar.h"
#include "kv/block_manager.h"
#include "model/config.h"
#include "model/model.h"
#include "runner/runner.h"
#include "sample/sampler.h"
#include "sched/scheduler.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {

// The runner's sizes from the engine's config (the engine's runner and the KV-sizing profile
// step use the same one).
inline RunnerConfig runner_config(const EngineConfig& cfg, int num_kv_blocks, int max_model_len) {
  RunnerConfig rc;
  rc.num_kv_blocks = num_kv_blocks;
  rc.kv_block_size = cfg.kv_block_size;
  rc.max_num_batched_tokens = cfg.max_num_batched_tokens;
  rc.max_num_seqs = cfg.max_num_seqs;
  rc.max_model_len = max_model_len;
  rc.use_graphs = !cfg.enforce_eager;
  return rc;
}

struct Engine::Impl {
  // `tokenizer` may be null (token-id prompts only, empty text).
  Impl(const EngineConfig& config, std::unique_ptr<Backend> backend, std::unique_ptr<Model> model,
       std::unique_ptr<Tokenizer> tokenizer);

  std::string add_request(const Prompt& prompt, const SamplingParams& params,
                          std::string request_id);
  std::vector<RequestOutput> step();
  bool abort(const std::string& request_id);
  bool has_unfinished() const { return !requests_.empty(); }
  std::vector<int32_t> tokenize(const Prompt& prompt, const std::string& request_id) const;
  void refresh_load_stats();  // stats.num_free_kv_blocks, num_running_seqs, num_waiting_seqs

  EngineConfig config;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  int max_model_len = 0;
  EngineStats stats;

 private:
  double now_s() const;
  // Appends a sampled token, detokenizes, checks stop conditions; finishes the sample if done.
  void append_token(SeqState& seq, const SampleResult& sample);
  void finish_seq(SeqState& seq, FinishReason reason, std::string stop_reason = "");
  bool is_stop_token(const RequestState& r, int32_t token) const;
  RequestOutput make_output(RequestState& r);

  // Asynchronous scheduling (engine/engine.cpp): a submitted step and what the engine
  // needs to take its results. Sequences finished while their step is in flight are
  // set to null in `plan` (their row's token is discarded).
  struct InFlight {
    SchedulerOutput plan;
    bool argmax_only = false;  // the runner returns token ids (argmax or sampled on the device)
    bool step_done = false;  // scheduler_->on_step_done(plan) already called
  };
  void submit(SchedulerOutput plan, bool tokens_from_previous);
  // While the oldest step runs, schedules the next one assuming each of its sequences
  // gets one more token (a placeholder until collected) and submits it with its tokens
  // taken from the running step's device-chosen tokens (argmax or Backend::sample). Only in the steady decode state
  // where that is safe (see the definition); otherwise does nothing.
  void run_ahead();
  std::vector<RequestOutput> collect();

  std::deque<InFlight> in_flight_;
  SchedulerOutput deferred_;  // scheduled by run_ahead, submitted after the next collect

  std::vector<int32_t> eos_ids_;
  std::unique_ptr<BlockManager> blocks_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<Runner> runner_;
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
