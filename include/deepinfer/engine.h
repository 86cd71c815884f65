// deepinfer public API: an Engine built from an EngineConfig runs batches of
// requests (generate) or a stream of them (add_request / step / abort).
//
//   deepinfer::EngineConfig config;
//   config.model_dir = "models/deepseek-v3-tiny-code";
//   deepinfer::Engine engine(config);
//   deepinfer::SamplingParams params;
//   params.temperature = 0;
//   auto outputs = engine.generate({deepinfer::Prompt::from_text("Hello")}, {params});
//   // outputs[0].outputs[0].text, .token_ids, .finish_reason ...
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "deepinfer/sampling_params.h"
#include "deepinfer/spec_step_times.h"

namespace deepinfer {

// Draft tokens per step when EngineConfig::num_speculative_tokens is left unset and the
// checkpoint has an MTP layer (DeepSeek-V3 and V4 ship one).
inline constexpr int kDefaultSpecTokens = 3;

struct EngineConfig {
  std::string model_dir;          // HF checkpoint directory (config.json, *.safetensors, tokenizer.json)
  // Benchmarks: build the model from this config.json with random weights instead.
  std::string random_weights_config;
  uint64_t random_weights_seed = 0;
  std::string random_weights_dtype = "bf16";  // "bf16" | "fp8"
  std::string tokenizer_dir;      // default model_dir; none: token-id prompts only
  std::string backend = "cpu";    // "cpu" | "cuda"
  int num_threads = 0;            // CPU backend: 0 = all cores
  bool batch_invariant = false;   // DEEPINFER_BATCH_INVARIANT=1 also sets it
  int max_num_seqs = 256;         // sequences per step
  int max_num_batched_tokens = 8192;  // tokens per step (prefill chunks + decodes)
  int max_model_len = 0;          // 0: the model's max_position_embeddings
  int kv_block_size = 64;         // tokens per KV block
  int num_kv_blocks = 0;          // 0: from kv_cache_num_bytes, else device memory, else 4 GiB
  // num_kv_blocks and kv_cache_num_bytes are per process (--dp N: each data-parallel rank's own
  // pool; the scheduler holds N of them).
  // > 0: that many bytes of KV cache, capped at what max_num_seqs full-length sequences need.
  // 0: on a device that reports its memory (CUDA), gpu_memory_utilization decides; else 4 GiB.
  int64_t kv_cache_num_bytes = 0;
  // Fraction of device memory the engine may hold (weights, buffers, KV cache); after the
  // weights load and a profile step, the rest of it becomes KV blocks (vLLM's flag).
  double gpu_memory_utilization = 0.9;
  bool enable_prefix_caching = true;
  // Prepare and issue step N+1 while step N runs on the device (steady decode; outputs are
  // identical either way). Off: one step at a time (debugging).
  bool async_scheduling = true;
  bool enforce_eager = false;     // no CUDA graphs for decode steps (debugging, A/B)
  // Sample on the device (Backend::sample) when every row of a step allows it (no penalties,
  // logprobs, grammar or min_tokens mask): the step returns token ids, not logits, and the
  // next step can be issued before they are read. Same tokens as the host sampler; false:
  // the host samples every non-greedy row (A/B, debugging).
  bool device_sampling = true;
  uint64_t seed = 0;              // seeds requests whose SamplingParams have none
  // Loading scans the checkpoint's tensors for NaN/Inf (an error naming the tensor and
  // element); true skips that for trusted checkpoints (random weights are never scanned).
  bool skip_weight_check = false;
  // DeepSeek-V4.1's prefill truncation (bounded replay; model/deepseek_v41/truncation.h):
  // "compact" runs the layers above the last KV source on a prompt's last prefill_keep_tokens
  // rows only, "off" every layer on every row. Empty / 0: DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE /
  // DEEPINFER_YOCO_PREFILL_KEEP_TOKENS (defaults off / 140). Other models ignore them.
  std::string prefill_truncation_mode;
  int64_t prefill_keep_tokens = 0;
  // Speculative decoding (SPEC_DECODING.md): at most this many draft tokens per sequence
  // and step, verified exactly (output is the same token for token as without drafts).
  // -1: DEEPINFER_USE_NEXTN_DECODE, else kDefaultSpecTokens when the checkpoint has an MTP
  // layer (and speculator is mtp), else 0 (off; random weights too). Range 0..16. An engine
  // built from parts (tests) takes -1 as 0.
  int num_speculative_tokens = -1;
  std::string speculator = "mtp";  // "mtp" (the checkpoint's MTP layer) | "ngram" (prompt lookup)
  // DSpark draft depth + verify lengths from measured step times; confidences 1: acceptance history, 2: draft softmax; 0: all k.
  // -1: DEEPINFER_ENABLE_MTP_VARLEN, else 1 when num_speculative_tokens took the default (the
  // checkpoint's MTP layer), 0 when it was set.
  int spec_varlen = -1;
  // spec_varlen: the step times to schedule from; empty (default): measured at start-up on
  // the shapes the engine's steps run as (EngineStats::spec_step_times shows them).
  SpecStepTimes spec_step_times;
  // Several processes (one per GPU, started by mpirun or with torchrun's RANK/WORLD_SIZE;
  // model/parallel.h): attention heads and dense MLPs split over tp ranks (--tp), routed experts
  // split over the ranks (--ep = the number of processes; 1: every expert's intermediate split),
  // attention data parallelism (--dp groups of --tp ranks, dp x tp = the number of processes:
  // each group its own sequences and KV, heads split over its ranks, the MoE over every group's
  // rows). Rank 0 owns the scheduler and the outputs;
  // the others run Engine::follow. Steps then run synchronously, eagerly, without drafts.
  int tp = 1;
  int ep = 1;
  int dp = 1;
};

// A tool call of an assistant turn, rendered back into the prompt in the checkpoint's format.
struct MessageToolCall {
  std::string name;
  std::string arguments;  // JSON text
  std::string type = "function";
};

struct Message {
  std::string role;  // "system" | "user" | "assistant" | "tool"
  std::string content;
  bool content_is_null = false;  // an assistant turn with only tool calls (OpenAI `content: null`)
  std::optional<std::vector<MessageToolCall>> tool_calls = std::nullopt;
};

// One prompt: text, chat messages (the model's chat template is applied), or token ids.
struct Prompt {
  std::string text;
  std::vector<Message> messages;
  std::vector<int32_t> token_ids;
  bool thinking = false;  // chat_template_kwargs.thinking: V3.1's thinking mode (<think> opens the reply)
  static Prompt from_text(std::string text) { return Prompt{std::move(text), {}, {}}; }
  static Prompt from_messages(std::vector<Message> m) { return Prompt{{}, std::move(m), {}}; }
  static Prompt from_tokens(std::vector<int32_t> ids) { return Prompt{{}, {}, std::move(ids)}; }
};

enum class FinishReason { None, Stop, Length, Abort, Error };
const char* to_string(FinishReason reason);  // "", "stop", "length", "abort", "error"

struct TokenLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // SamplingParams::logprobs most likely (raw)
};

// One prompt position's teacher-forced log-probabilities (SamplingParams::prompt_logprobs),
// log-softmax of the raw logits over the sampled vocabulary, in double (perplexity sums them).
struct PromptLogprob {
  int32_t token_id = 0;  // the prompt token
  double logprob = 0.0;  // of token_id given the prompt tokens before it
  int rank = 0;          // 1 + the ids more likely than token_id there (vLLM's rank)
  std::vector<std::pair<int32_t, double>> top;  // the k most likely ids there, most likely first (lower id on ties)
};

// One of the n samples of a request.
struct CompletionOutput {
  int index = 0;
  std::string text;
  std::vector<int32_t> token_ids;
  bool thinking = false;  // chat_template_kwargs.thinking: V3.1's thinking mode (<think> opens the reply)
  FinishReason finish_reason = FinishReason::None;
  std::string stop_reason;  // the stop string, or the stop token id as text
  std::vector<TokenLogprob> logprobs;  // when SamplingParams::logprobs >= 0
  // Streaming: what this update added. Text that may still turn out to start a
  // stop string is held back until it cannot.
  std::string delta_text;
  std::vector<int32_t> delta_token_ids;
};

// Speculative decoding counts (SPEC_DECODING.md, "Metrics"): of one request (all its
// samples) in RequestOutput, of the run in EngineStats.
struct SpecDecodeStats {
  int64_t num_verify_steps = 0;     // steps that verified at least one draft
  int64_t num_draft_tokens = 0;     // drafts verified (proposed and scheduled)
  int64_t num_accepted_tokens = 0;  // drafts accepted
  int64_t num_emitted_tokens = 0;   // tokens those steps emitted (accepted + the target's own)
  std::vector<int64_t> accepted_per_position;  // [k]: drafts accepted at draft position j
  std::vector<int64_t> drafts_per_position;    // [k]: drafts verified at draft position j
  double acceptance_rate() const {
    return num_draft_tokens > 0 ? static_cast<double>(num_accepted_tokens) / num_draft_tokens : 0.0;
  }
  // 1 + accepted drafts per verify step (vLLM's mean acceptance length).
  double mean_accepted_length() const {
    return num_verify_steps > 0 ? 1.0 + static_cast<double>(num_accepted_tokens) / num_verify_steps : 0.0;
  }
  double tokens_per_verify_step() const {
    return num_verify_steps > 0 ? static_cast<double>(num_emitted_tokens) / num_verify_steps : 0.0;
  }
  void add(const SpecDecodeStats& o);
};

struct RequestOutput {
  std::string request_id;
  std::vector<int32_t> prompt_token_ids;
  std::vector<CompletionOutput> outputs;  // [n]
  bool finished = false;
  // Set when the request was rejected, or failed while running (NaN logits: the tokens before
  // it are kept); finish_reason Error.
  std::string error;
  int num_prompt_tokens = 0;
  // SamplingParams::prompt_logprobs >= 0: entry i is prompt token i + 1 (the first token has
  // none), num_prompt_tokens - 1 entries. Set in the first update once the whole prompt is
  // computed (the one with the first token) and in the final one; empty in the others.
  std::vector<PromptLogprob> prompt_logprobs;
  int num_output_tokens = 0;     // over all samples
  int num_cached_tokens = 0;     // prompt tokens served from the prefix cache
  double time_to_first_token_s = 0.0;
  double decode_tokens_per_s = 0.0;  // output tokens after the first / time after the first
  SpecDecodeStats spec;          // speculative decoding counts (zero when off)
};

struct EngineStats {
  int64_t num_steps = 0;
  int64_t num_prefill_steps = 0;  // steps that computed prompt tokens (prefill chunks, alone or mixed into decode)
  int64_t num_step_seqs = 0;      // sequences over all steps (mean batch: num_step_seqs / num_steps)
  int64_t num_prompt_tokens_computed = 0;  // prefill work, recompute included
  int64_t num_generated_tokens = 0;
  int64_t num_cached_tokens = 0;
  int64_t num_preemptions = 0;
  int64_t num_kv_block_copies = 0;  // copy-on-write copies of shared KV blocks (n > 1)
  int64_t num_steps_ahead = 0;   // issued before the previous step's tokens were read (async)
  int64_t num_graph_steps = 0;   // decode and verify (1 + k) steps that replayed a CUDA graph
  int64_t num_mtp_graph_runs = 0;  // MTP passes (drafting) that replayed a CUDA graph
  int64_t num_eplb_replacements = 0;  // expert parallelism: EPLB re-placements of the experts
  // Expert parallelism with DEEPINFER_EP_COMM_TIMING=1: rank 0's seconds in the dispatch's
  // collectives and bytes it sent to other ranks, since the engine started.
  double ep_comm_s = 0;
  int64_t ep_comm_bytes = 0;
  int num_kv_blocks = 0;
  int kv_block_size = 0;
  int num_speculative_tokens = 0;  // resolved k (0: off)
  int spec_varlen = 0;             // resolved EngineConfig::spec_varlen
  SpecDecodeStats spec;            // over the run
  // spec_varlen: the step times verify lengths are chosen from (measured at start-up or given),
  // and the decode steps after which drafting was skipped because it would not pay at that
  // batch (the step ran as k = 0 does).
  SpecStepTimes spec_step_times;
  int64_t num_steps_without_drafts = 0;
  // Verify steps issued before the previous verify step's tokens were read, their drafts made
  // on the device (asynchronous scheduling with drafts in flight).
  int64_t num_spec_steps_ahead = 0;
  // Load right now (read by the server's /metrics): filled in by stats().
  int num_free_kv_blocks = 0;
  int num_running_seqs = 0;
  int num_waiting_seqs = 0;
};

// This process's rank among several started by mpirun or torchrun (0 for one process): a
// program runs Engine::follow instead of its requests on every rank but 0.
int process_rank();

class Engine {
 public:
  explicit Engine(const EngineConfig& config);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Runs every prompt to completion; outputs are in input order. `params` has one
  // entry for all prompts or one per prompt. A bad request gets finish_reason
  // Error and its message in `error`; the others run. `on_output` (optional) sees
  // every streaming update.
  std::vector<RequestOutput> generate(
      const std::vector<Prompt>& prompts, const std::vector<SamplingParams>& params,
      const std::function<void(const RequestOutput&)>& on_output = nullptr);

  // Streaming: queues a request and returns its id (request_id or a fresh one).
  // Throws Error naming the request and the field on bad input.
  std::string add_request(const Prompt& prompt, const SamplingParams& params,
                          std::string request_id = "");
  // Runs one step; returns an update for each request that produced tokens or finished.
  std::vector<RequestOutput> step();
  bool abort(const std::string& request_id);  // false when unknown or finished
  bool has_unfinished() const;

  const EngineStats& stats() const;
  int vocab_size() const;
  int max_model_len() const;
  // The token ids a prompt is run with (chat template applied to messages).
  // Throws Error for an empty prompt or a text prompt without a tokenizer.
  std::vector<int32_t> tokenize(const Prompt& prompt) const;
  // The chat format messages are rendered in and tool calls are written in: "deepseek_v3" or
  // "deepseek_v31" (from the tokenizer's chat_template; "" without a tokenizer).
  std::string chat_format() const;
  // Text of token ids (empty without a tokenizer).
  std::string decode(const std::vector<int32_t>& token_ids, bool skip_special_tokens = true) const;

  // Teacher forcing (perplexity, `deepinfer eval ppl`): entry i is the natural log-probability
  // of token i + 1 of the prompt given tokens 0..i (size: tokens - 1): the logprobs of
  // RequestOutput::prompt_logprobs of one request (SamplingParams::prompt_logprobs = 0,
  // max_tokens 1) run through the engine's own steps. Deterministic for a given backend
  // configuration (a prompt within max_num_batched_tokens is one prefill step). Throws Error when
  // requests are unfinished (their updates would be lost: use add_request with
  // SamplingParams::prompt_logprobs instead), or the prompt has fewer than 2 tokens or does not
  // leave room for one token in max_model_len (engine/engine_score.cpp).
  std::vector<double> prompt_logprobs(const Prompt& prompt);

  // Several processes (EngineConfig::tp/ep/dp): this process's rank and their number.
  int rank() const;
  int world_size() const;
  // On a rank other than 0: runs the steps rank 0's engine broadcasts until that engine is
  // destroyed, then returns the number of steps run. Throws Error on rank 0.
  int64_t follow();
  // Expert parallelism with EPLB (DEEPINFER_EPLB_INTERVAL): holds the statistics flush (the load
  // all-reduce and re-placement) while `hold`, on every rank; a flush that fell due runs on
  // release. Benchmarks hold it during their timed windows. Call between steps (nothing in
  // flight); a no-op without expert parallelism.
  void hold_expert_replacement(bool hold);

  struct Impl;
  explicit Engine(std::unique_ptr<Impl> impl);  // engine/engine_impl.h (tests: fake models)

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace deepinfer
