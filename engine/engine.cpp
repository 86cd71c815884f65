// The step loop: schedule -> run -> sample -> append, stop, detokenize -> outputs.
#include <algorithm>

#include "core/error.h"
#include "engine/engine_impl.h"

namespace deepinfer {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

grammar::GrammarSpec grammar_spec(const StructuredOutputArgs& so) {
  using K = grammar::GrammarSpec::Kind;
  grammar::GrammarSpec spec;
  spec.kind = so.kind == "regex" ? K::Regex
              : so.kind == "json_schema" ? K::JsonSchema
              : so.kind == "ebnf" ? K::Ebnf
              : so.kind == "tool_calls" ? K::ToolCalls : K::JsonObject;
  spec.source = so.source;
  spec.json_any_whitespace = so.any_whitespace;
  return spec;
}

}  // namespace

Engine::Impl::Impl(const EngineConfig& cfg, std::unique_ptr<Backend> backend_in,
                   std::unique_ptr<Model> model_in, std::unique_ptr<Tokenizer> tokenizer_in,
                   std::unique_ptr<Communicator> comm_in)
    : config(cfg), backend(std::move(backend_in)), model(std::move(model_in)),
      tokenizer(std::move(tokenizer_in)), comm(std::move(comm_in)) {
  const ModelConfig& mc = model->config();
  max_model_len = cfg.max_model_len > 0 ? cfg.max_model_len
                                        : static_cast<int>(std::min<int64_t>(
                                              mc.max_position_embeddings > 0 ? mc.max_position_embeddings : 4096,
                                              1 << 20));
  sample_vocab = model->vocab_size();
  if (tokenizer) {
    // A tokenizer id the model has no logit for is a mismatched pair; a smaller tokenizer is
    // fine (padding rows), and its missing ids are never sampled.
    DI_CHECK(tokenizer->vocab_size() <= model->vocab_size(), "tokenizer has ",
             tokenizer->vocab_size(), " ids but the model's vocab_size is ", model->vocab_size(),
             " (", mc.source, "): they do not belong together");
    sample_vocab = tokenizer->vocab_size();
  }
  for (int64_t id : mc.eos_token_ids) eos_ids_.push_back(static_cast<int32_t>(id));
  if (tokenizer && tokenizer->eos_id() >= 0) eos_ids_.push_back(tokenizer->eos_id());

  const int bs = cfg.kv_block_size;
  DI_CHECK(bs > 0, "EngineConfig.kv_block_size: must be > 0, got ", bs);
  check_speculation_config(cfg);
  spec_k_ = std::max(cfg.num_speculative_tokens, 0);
  DI_CHECK(spec_k_ == 0 || cfg.speculator != "mtp" || model->num_mtp_layers() > 0 || has_block_drafter(*model),
           "EngineConfig.num_speculative_tokens: ", spec_k_, " MTP drafts asked, but ", mc.source,
           " has no MTP layer loaded (num_nextn_predict_layers ", mc.num_nextn_predict_layers,
           "); use speculator ngram (--speculator ngram) or 0 drafts");
  const RunnerConfig spec_rc = runner_config(cfg, *model, 1, max_model_len);
  // Every KV group's pool follows from num_blocks (kv/kv_groups.h); the runner allocates the same.
  const std::vector<KvGroupSpec> kv_groups = Runner::kv_groups(*model, spec_rc.num_mtp_kv_layers);
  const KvPoolLimits pool_limits = Runner::pool_limits(spec_rc);
  int num_blocks = cfg.num_kv_blocks;
  if (num_blocks <= 0) {
    const int64_t bytes = cfg.kv_cache_num_bytes > 0 ? cfg.kv_cache_num_bytes : int64_t{4} << 30;
    const int64_t fit = kv_blocks_for_bytes(kv_groups, backend->activation_dtype(), bytes, pool_limits);
    const int64_t enough = static_cast<int64_t>(cfg.max_num_seqs) * ((max_model_len + bs - 1) / bs);
    num_blocks = static_cast<int>(std::min<int64_t>(std::max<int64_t>(fit, 1), enough));
  }
  // --dp: num_blocks is each data-parallel rank's pool; the leader's block manager holds every
  // rank's, one partition each (a sequence's blocks all on its rank: runner/runner.h).
  const int dp = comm && comm->size() > 1 ? std::max(cfg.dp, 1) : 1;
  std::vector<KvGroupPool> pools = kv_group_pools(kv_groups, num_blocks, pool_limits);
  for (KvGroupPool& p : pools) p.num_blocks *= dp;
  stats.num_kv_blocks = num_blocks * dp;
  stats.kv_block_size = bs;
  blocks_ = std::make_unique<BlockManager>(std::move(pools), bs, cfg.enable_prefix_caching);
  if (dp > 1) blocks_->set_partitions(dp);
  scheduler_ = std::make_unique<Scheduler>(
      SchedulerConfig{cfg.max_num_seqs, cfg.max_num_batched_tokens}, *blocks_);
  RunnerConfig rc = runner_config(cfg, *model, num_blocks, max_model_len);
  rc.sample_vocab = sample_vocab;
  rc.comm = comm.get();
  rc.dp_size = comm ? cfg.dp : 1;
  runner_ = std::make_unique<Runner>(*model, *backend, rc);
  for (int g = 0; g < blocks_->num_groups(); ++g)
    DI_CHECK(runner_->group_num_blocks(g) * dp == blocks_->num_blocks(g), "engine: KV group ", g, " has ",
             runner_->group_num_blocks(g), " blocks in the runner (x ", dp, " data-parallel ranks), ",
             blocks_->num_blocks(g), " in the block manager");
  sampler_ = std::make_unique<Sampler>(sample_vocab);
  stats.num_speculative_tokens = spec_k_;
  stats.spec_varlen = spec_k_ > 0 ? std::max(cfg.spec_varlen, 0) : 0;
  if (spec_k_ > 0) make_proposer();
}

double Engine::Impl::now_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

std::vector<int32_t> Engine::Impl::tokenize(const Prompt& prompt, const std::string& id) const {
  if (!prompt.token_ids.empty()) return prompt.token_ids;
  if (prompt.messages.empty() && prompt.text.empty()) fail("request ", id, ": empty prompt");
  DI_CHECK(tokenizer != nullptr, "request ", id, ": text prompt but the engine has no tokenizer");
  if (!prompt.messages.empty()) {
    std::vector<ChatMessage> messages;
    for (const Message& m : prompt.messages) {
      ChatMessage c;
      c.role = m.role;
      c.content = m.content;
      c.content_is_null = m.content_is_null;
      if (m.tool_calls) {
        c.tool_calls.emplace();
        for (const MessageToolCall& t : *m.tool_calls) c.tool_calls->push_back({t.type, t.name, t.arguments});
      }
      messages.push_back(std::move(c));
    }
    ChatOptions options;
    options.thinking = prompt.thinking;
    return tokenizer->encode(apply_chat_template(*tokenizer, messages, options), false);
  }
  return tokenizer->encode(prompt.text, true);
}

std::string Engine::Impl::add_request(const Prompt& prompt, const SamplingParams& params,
                                      std::string id) {
  const int64_t request_number = next_request_++;
  if (id.empty()) id = "req-" + std::to_string(request_number);
  DI_CHECK(!requests_.count(id), "request ", id, ": id already in use");
  try {
    params.validate();
  } catch (const Error& e) {
    fail("request ", id, ": ", e.what());
  }
  auto r = std::make_unique<RequestState>();
  r->request_id = id;
  r->params = params;
  r->prompt_token_ids = tokenize(prompt, id);
  const int num_prompt = static_cast<int>(r->prompt_token_ids.size());
  DI_CHECK(num_prompt > 0, "request ", id, ": empty prompt");
  DI_CHECK(num_prompt < max_model_len, "request ", id, ": prompt has ", num_prompt,
           " tokens, the model's context is ", max_model_len, " (room for one new token needed)");
  for (int32_t t : r->prompt_token_ids)
    DI_CHECK(t >= 0 && t < model->vocab_size(), "request ", id, ": prompt token id ", t,
             " outside the vocabulary [0, ", model->vocab_size(), ")");
  if (params.prompt_logprobs >= 0) {
    // Prompt logprobs are a log-softmax over the sampled vocabulary: a prompt token outside it
    // (a model's padding row) has no logprob there.
    for (int i = 1; i < num_prompt; ++i)
      DI_CHECK(r->prompt_token_ids[static_cast<size_t>(i)] < sample_vocab, "request ", id,
               ": prompt_logprobs: prompt token ", r->prompt_token_ids[static_cast<size_t>(i)], " at position ", i,
               " is outside the sampled vocabulary (", sample_vocab, " ids)");
    r->prompt_logprobs.resize(static_cast<size_t>(num_prompt - 1));
  }
  DI_CHECK(params.stop.empty() || tokenizer, "request ", id, ": stop strings need a tokenizer");
  std::shared_ptr<const grammar::CompiledGrammar> compiled;
  if (!params.so_args.kind.empty()) {
    DI_CHECK(tokenizer, "request ", id, ": structured output needs a tokenizer");
    if (!grammar_cache_) {
      grammar_vocab_ = grammar::vocabulary_from_tokenizer(*tokenizer, model->vocab_size());
      grammar_cache_ = std::make_unique<grammar::GrammarCache>(grammar_vocab_);
      bitmask_.resize(grammar_vocab_->num_mask_words());
    }
    try {
      compiled = grammar_cache_->get(grammar_spec(params.so_args));
    } catch (const Error& e) {
      fail("request ", id, ": so_args (", params.so_args.kind, "): ", e.what());
    }
  }
  r->seed = params.seed ? *params.seed : splitmix64(config.seed ^ splitmix64(static_cast<uint64_t>(request_number)));
  for (const auto& s : params.stop) r->max_stop_len = std::max(r->max_stop_len, s.size());
  r->time_added_s = now_s();
  const int max_total =
      static_cast<int>(std::min<int64_t>(int64_t{num_prompt} + params.max_tokens, max_model_len));
  for (int i = 0; i < params.n; ++i) {
    auto s = std::make_unique<SeqState>();
    s->seq_id = next_seq_id_++;
    s->token_ids = r->prompt_token_ids;
    s->num_prompt_tokens = num_prompt;
    s->max_total_tokens = max_total;
    s->request = r.get();
    s->index = i;
    s->stream = params.seq_seed + static_cast<uint64_t>(i);
    if (i > 0) s->wait_for_prompt_of = r->seqs[0].get();
    // Sample 0 computes the prompt logprobs: every prompt position must run, none be taken
    // from the prefix cache (samples 1.. fork its blocks, or use the cache, as usual).
    if (i == 0 && params.prompt_logprobs >= 0 && !r->prompt_logprobs_done()) s->use_prefix_cache = false;
    // The model's prefill truncation (V4.1's bounded replay) skips the upper layers of the prompt's
    // rows before its last `keep`; prompt logprobs need every row's logits: none skipped then.
    if (const PrefillTruncation t = model->prefill_truncation();
        t.keep > 0 && num_prompt > t.keep && params.prompt_logprobs < 0) {
      s->replay_floor = static_cast<int>(num_prompt - t.keep);
      s->reuse_floor = s->replay_floor + t.exact_lag;
    }
    if (tokenizer) s->decoder = std::make_unique<IncrementalDecoder>(*tokenizer, params.skip_special_tokens);
    if (compiled) s->matcher = std::make_unique<grammar::GrammarMatcher>(compiled);
    r->seqs.push_back(std::move(s));
  }
  // The scheduler rejects sequences that could never fit the KV cache; add all or none.
  for (size_t i = 0; i < r->seqs.size(); ++i) {
    try {
      scheduler_->add(r->seqs[i].get());
    } catch (const Error& e) {
      for (size_t j = 0; j < i; ++j) scheduler_->finish(r->seqs[j].get());
      fail("request ", id, ": ", e.what());
    }
  }
  requests_[id] = std::move(r);
  return id;
}

bool Engine::Impl::is_stop_token(const RequestState& r, int32_t token) const {
  if (!r.params.ignore_eos && std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end())
    return true;
  const auto& ids = r.params.stop_token_ids;
  return std::find(ids.begin(), ids.end(), token) != ids.end();
}

void Engine::Impl::finish_seq(SeqState& seq, FinishReason reason, std::string stop_reason) {
  if (seq.finish_reason != FinishReason::None) return;
  // Steps already issued may still compute this sequence: drop it from them.
  for (InFlight& f : in_flight_)
    for (ScheduledSeq& s : f.plan.seqs)
      if (s.seq == &seq) s.seq = nullptr;
  std::erase_if(deferred_.seqs, [&seq](const ScheduledSeq& s) { return s.seq == &seq; });
  seq.finish_reason = reason;
  seq.stop_reason = std::move(stop_reason);
  if (seq.decoder && reason != FinishReason::Stop) seq.text += seq.decoder->flush();
  scheduler_->finish(&seq);
  RequestState& r = *seq.request;
  if (++r.num_finished == static_cast<int>(r.seqs.size())) r.time_finished_s = now_s();
}

void Engine::Impl::fail_seq(SeqState& seq, const std::string& error) {
  if (!seq.token_ids.empty() && seq.token_ids.back() == kPlaceholderToken)
    seq.token_ids.pop_back();  // issued ahead (run_ahead): that step's row is discarded
  seq.error = error;
  finish_seq(seq, FinishReason::Error);
}

void Engine::Impl::append_token(SeqState& seq, const SampleResult& sample) {
  RequestState& r = *seq.request;
  const int32_t token = sample.token_id;
  if (!seq.token_ids.empty() && seq.token_ids.back() == kPlaceholderToken)
    seq.token_ids.back() = token;  // issued ahead (run_ahead)
  else
    seq.token_ids.push_back(token);
  stats.num_generated_tokens++;
  if (r.time_first_token_s < 0) r.time_first_token_s = now_s();
  if (r.params.logprobs >= 0) seq.logprobs.push_back({token, sample.logprob, sample.top_logprobs});
  if (seq.matcher) seq.matcher->accept_token(token);

  if (is_stop_token(r, token)) return finish_seq(seq, FinishReason::Stop, std::to_string(token));
  if (seq.decoder) {
    const size_t old_len = seq.text.size();
    seq.text += seq.decoder->push(token);
    // A stop string can only end in the new text; search from where it could start.
    const size_t from = old_len >= r.max_stop_len ? old_len - r.max_stop_len + 1 : 0;
    size_t best = std::string::npos;
    const std::string* hit = nullptr;
    for (const auto& s : r.params.stop) {
      size_t pos = seq.text.find(s, from);
      if (pos != std::string::npos && pos < best) best = pos, hit = &s;
    }
    if (hit) {
      seq.text.resize(best + (r.params.include_stop_str_in_output ? hit->size() : 0));
      return finish_seq(seq, FinishReason::Stop, *hit);
    }
  }
  if (seq.matcher && seq.matcher->is_complete()) return finish_seq(seq, FinishReason::Stop);
  if (seq.num_output_tokens() >= r.params.max_tokens || seq.num_tokens() >= max_model_len)
    finish_seq(seq, FinishReason::Length);
}

RequestOutput Engine::Impl::make_output(RequestState& r) {
  // delta_outputs: only this update's part is copied (SamplingParams::delta_outputs).
  const bool delta = r.params.delta_outputs;
  RequestOutput out;
  out.request_id = r.request_id;
  if (!delta) out.prompt_token_ids = r.prompt_token_ids;
  out.num_prompt_tokens = static_cast<int>(r.prompt_token_ids.size());
  out.finished = r.finished();
  out.spec = r.spec;
  if (r.params.prompt_logprobs >= 0 && r.prompt_logprobs_done() &&
      (!r.prompt_logprobs_sent || (out.finished && !delta))) {
    out.prompt_logprobs = r.prompt_logprobs;
    r.prompt_logprobs_sent = true;
  }
  for (auto& s : r.seqs) {
    CompletionOutput c;
    c.index = s->index;
    const auto output_begin = s->token_ids.begin() + s->num_prompt_tokens;
    const auto output_end = s->token_ids.end() - s->num_draft_tokens;
    const size_t num_output = static_cast<size_t>(output_end - output_begin);
    if (!delta) c.token_ids.assign(output_begin, output_end);
    c.finish_reason = s->finish_reason;
    c.stop_reason = s->stop_reason;
    if (!s->error.empty() && out.error.empty())
      out.error = "request " + r.request_id +
                  (r.seqs.size() > 1 ? " sample " + std::to_string(s->index) : std::string()) + ": " +
                  s->error;
    // Hold back text that could still become the start of a stop string.
    const bool done = s->finish_reason != FinishReason::None;
    const size_t hold = done || r.max_stop_len == 0 ? 0 : r.max_stop_len - 1;
    const size_t visible = s->text.size() > hold ? s->text.size() - hold : 0;
    if (!delta) c.text = done ? s->text : s->text.substr(0, visible);
    if (visible > s->num_text_emitted) {
      c.delta_text = s->text.substr(s->num_text_emitted, visible - s->num_text_emitted);
      s->num_text_emitted = visible;
    }
    const size_t num_new = num_output > s->num_tokens_emitted ? num_output - s->num_tokens_emitted : 0;
    c.delta_token_ids.assign(output_end - static_cast<std::ptrdiff_t>(num_new), output_end);
    s->num_tokens_emitted = num_output;
    // Logprobs: one entry per output token; the new tokens' entries are the last ones.
    if (delta) c.text = c.delta_text, c.token_ids = c.delta_token_ids;  // the new part only (vLLM's DELTA)
    if (!delta)
      c.logprobs = s->logprobs;
    else
      c.logprobs.assign(s->logprobs.end() - static_cast<std::ptrdiff_t>(std::min(num_new, s->logprobs.size())),
                        s->logprobs.end());
    out.num_output_tokens += static_cast<int>(num_output);
    out.num_cached_tokens = std::max(out.num_cached_tokens, s->num_cached_prompt_tokens);
    out.outputs.push_back(std::move(c));
  }
  if (r.time_first_token_s >= 0) out.time_to_first_token_s = r.time_first_token_s - r.time_added_s;
  const double end = r.time_finished_s >= 0 ? r.time_finished_s : now_s();
  const int after_first = out.num_output_tokens - static_cast<int>(r.seqs.size());
  if (r.time_first_token_s >= 0 && after_first > 0 && end > r.time_first_token_s)
    out.decode_tokens_per_s = after_first / (end - r.time_first_token_s);
  return out;
}

std::vector<RequestOutput> Engine::Impl::step() {
  // A step whose sequences all finished while it ran is only waited for.
  while (!in_flight_.empty() &&
         std::all_of(in_flight_.front().plan.seqs.begin(), in_flight_.front().plan.seqs.end(),
                     [](const ScheduledSeq& s) { return s.seq == nullptr; }))
    collect();
  if (in_flight_.empty()) {
    if (!step_time_batches_.empty()) grow_step_times();
    SchedulerOutput plan = scheduler_->schedule();
    stats.num_preemptions += static_cast<int64_t>(plan.preempted.size());
    if (plan.empty()) return {};
    submit(std::move(plan), false);
  }
  // Speculating, steps run one at a time: a step's drafts depend on the previous step's
  // verified tokens. Only where the verify-length scheduler drafts nothing at this batch
  // (draft depth 0) may a decode step be followed by one issued ahead, as k = 0 does.
  if (spec_k_ > 0) update_draft_depth();
  if (config.async_scheduling && (spec_k_ == 0 || (draft_depth_ == 0 && decode_only(in_flight_.front()))))
    run_ahead();
  else if (config.async_scheduling && spec_k_ > 0)
    spec_run_ahead();
  std::vector<RequestOutput> outputs = collect();
  if (!deferred_.empty()) {  // scheduled ahead but not issued: its tokens are known now
    SchedulerOutput next = std::move(deferred_);
    deferred_ = SchedulerOutput{};
    submit(std::move(next), false);
  }
  return outputs;
}

void Engine::Impl::submit(SchedulerOutput plan, bool tokens_from_previous, int assumed) {
  std::vector<RunSeq> run;
  std::vector<int> begins, rows, logits_rows, prompt_rows, prompt_from;
  int row = 0;
  bool any_prompt_rows = false;
  const int64_t prompt_tokens_before = stats.num_prompt_tokens_computed;
  for (const ScheduledSeq& s : plan.seqs) {
    const SeqState& q = static_cast<const SeqState&>(*s.seq);
    const int begin = q.num_computed_tokens, end = begin + s.num_new_tokens;
    stats.num_prompt_tokens_computed +=
        std::max(0, std::min(end, q.num_prompt_tokens) - std::min(begin, q.num_prompt_tokens));
    // Logits rows are the step's last tokens: prompt-logprob positions (the chunk's positions
    // before the last prompt token not scored yet), then, when sampled, the last token and
    // each draft (a verify step).
    int from = 0;
    const int num_prompt = prompt_logprob_rows(q, begin, end, from);
    const int num_sampled = s.needs_sample ? 1 + q.num_draft_tokens : 0;
    DI_CHECK(num_prompt == 0 || from + num_prompt + num_sampled == end, "engine: sequence ", q.seq_id,
             ": prompt-logprob rows [", from, ", ", from + num_prompt, ") and ", num_sampled,
             " sampled rows are not the last of its step [", begin, ", ", end, ")");
    const int num_logits = num_prompt + num_sampled;
    run.push_back({q.token_ids, begin, s.num_new_tokens, q.kv.block_ids, num_logits > 0, std::max(num_logits, 1),
                   q.kv.more_block_ids, q.replay_floor});
    begins.push_back(begin);
    rows.push_back(row);
    logits_rows.push_back(num_logits);
    prompt_rows.push_back(num_prompt);
    prompt_from.push_back(from);
    any_prompt_rows = any_prompt_rows || num_prompt > 0;
    row += s.num_new_tokens;
  }
  // Rows the device can finish need only their token: plain greedy rows the argmax, other
  // rows Backend::sample when device_sampling is on. If every row is such, the runner
  // returns ids instead of copying [rows, vocab] logits to the host.
  bool argmax_only = !any_prompt_rows, all_greedy = true;  // prompt logprobs need the logits
  std::vector<SampleRowParams> sample_rows;
  for (const ScheduledSeq& s : plan.seqs) {
    if (!s.needs_sample) continue;
    const SeqState& seq = static_cast<const SeqState&>(*s.seq);
    const RequestState& r = *seq.request;
    const SamplingParams& p = r.params;
    const int verified = seq.num_verified_tokens();
    const bool plain = device_samplable(p) && !seq.matcher && verified - seq.num_prompt_tokens >= p.min_tokens;
    argmax_only = argmax_only && plain && (p.greedy() || config.device_sampling);
    all_greedy = all_greedy && p.greedy();
    // The token goes to index num_tokens() (a run-ahead placeholder already holds the
    // previous step's index), as the host sampler's position at collect time; a verify
    // step's row j samples index verified + j.
    for (int j = 0; j <= seq.num_draft_tokens; ++j)
      sample_rows.push_back(device_params(p, r.seed, seq.stream, verified + j));
  }
  if (!argmax_only || all_greedy) sample_rows.clear();
  // A uniform verify step of decoding sequences (1 + k tokens each, every one sampled on the
  // device) has its accepted counts computed on the device: a next step may be issued before
  // it is read (spec_run_ahead).
  SpecStep spec;
  spec.assumed = assumed;
  if (argmax_only && mtp_exec_ && runner_->kv_groups().size() == 1 && !plan.seqs.empty()) {
    const int q = 1 + plan.seqs[0].seq->num_draft_tokens;
    bool uniform = q >= 2;
    for (size_t i = 0; i < plan.seqs.size() && uniform; ++i) {
      const ScheduledSeq& s = plan.seqs[i];
      uniform = s.needs_sample && s.num_new_tokens == q && s.seq->num_draft_tokens == q - 1 &&
                begins[i] >= s.seq->num_prompt_tokens;
    }
    if (uniform) spec.verify_q = q;
  }
  DI_CHECK(assumed < 0 || spec.verify_q > 0, "engine: a step issued on assumed drafts is not a uniform verify step");
  runner_->copy_blocks(plan.block_copies);  // KV copy-on-write, ahead of the step's writes
  stats.num_kv_block_copies += static_cast<int64_t>(plan.block_copies.size());
  runner_->submit(run, argmax_only, tokens_from_previous, sample_rows, spec);
  stats.num_steps++;
  stats.num_prefill_steps += stats.num_prompt_tokens_computed > prompt_tokens_before ? 1 : 0;
  stats.num_step_seqs += static_cast<int64_t>(run.size());
  stats.num_steps_ahead += tokens_from_previous ? 1 : 0;
  stats.num_graph_steps = runner_->stats().num_graph_steps;
  stats.num_mtp_graph_runs = runner_->stats().num_mtp_graph_runs;
  in_flight_.push_back({std::move(plan), std::move(begins), std::move(rows), std::move(logits_rows),
                        std::move(prompt_rows), std::move(prompt_from), argmax_only, false, spec.verify_q,
                        assumed >= 0, -1});
}

// Issues the next step before the running one's tokens are read, when that cannot change
// any output: the running step's tokens are chosen on the device (argmax or Backend::sample), it holds every
// running sequence and each gets a token (one more decode step follows for each), none
// can finish by length, nothing waits for admission (so the next plan is the same
// sequences in the same order, one token each) and there are free blocks for all (no
// preemption). A sequence that then stops on an EOS or stop token has one discarded
// extra step. Anything else waits for collect().
void Engine::Impl::run_ahead() {
  if (in_flight_.size() != 1 || !deferred_.empty()) return;
  InFlight& cur = in_flight_.front();
  if (!cur.argmax_only || cur.step_done || scheduler_->num_waiting() > 0 ||
      static_cast<int>(cur.plan.seqs.size()) != scheduler_->num_running() ||
      blocks_->min_free_blocks() < scheduler_->num_running())
    return;
  for (const ScheduledSeq& s : cur.plan.seqs) {
    if (s.seq == nullptr || !s.needs_sample) return;
    const SeqState& seq = static_cast<const SeqState&>(*s.seq);
    if (seq.num_output_tokens() + 1 >= seq.request->params.max_tokens ||
        seq.num_tokens() + 1 >= max_model_len)
      return;
  }
  scheduler_->on_step_done(cur.plan);
  cur.step_done = true;
  for (const ScheduledSeq& s : cur.plan.seqs) s.seq->token_ids.push_back(kPlaceholderToken);
  SchedulerOutput next = scheduler_->schedule();
  stats.num_preemptions += static_cast<int64_t>(next.preempted.size());
  if (next.empty()) return;
  bool same_rows = next.preempted.empty() && next.seqs.size() == cur.plan.seqs.size();
  for (size_t i = 0; same_rows && i < next.seqs.size(); ++i)
    same_rows = next.seqs[i].seq == cur.plan.seqs[i].seq && next.seqs[i].num_new_tokens == 1 &&
                next.seqs[i].needs_sample;
  if (same_rows) {
    submit(std::move(next), true);
  } else {
    deferred_ = std::move(next);
  }
}

// Samples the token at index seq.num_tokens() from logits row `row` (or takes the device's
// token), as decode does one position at a time.
SampleResult Engine::Impl::sample_next(SeqState& seq, int row, const Tensor* logits,
                                       const std::vector<int32_t>* argmax_ids) {
  RequestState& r = *seq.request;
  SampleResult result;
  if (argmax_ids != nullptr) {
    result.token_id = (*argmax_ids)[row];
    if (result.token_id < 0) {  // the device op's NaN row (sample_rule::kNoToken)
      const bool ahead = !seq.token_ids.empty() && seq.token_ids.back() == kPlaceholderToken;
      result.error = nan_logits_error(seq.num_tokens() - (ahead ? 1 : 0));
    }
  } else {
    SampleRow sr;
    sr.params = &r.params;
    sr.seed = r.seed;
    sr.stream = seq.stream;
    sr.position = seq.num_tokens();
    sr.prompt_tokens = std::span(seq.token_ids).first(seq.num_prompt_tokens);
    sr.output_tokens = std::span(seq.token_ids).subspan(seq.num_prompt_tokens);
    std::vector<int32_t> banned;
    if (seq.num_output_tokens() < r.params.min_tokens) {
      banned = r.params.stop_token_ids;
      if (!r.params.ignore_eos) banned.insert(banned.end(), eos_ids_.begin(), eos_ids_.end());
    }
    sr.banned_tokens = banned;
    if (seq.matcher) {
      seq.matcher->fill_mask(bitmask_.data());
      sr.allowed_bitmask = bitmask_.data();
    }
    try {
      result = sampler_->sample(logits->ptr<float>() + int64_t{row} * logits->size(1), sr);
    } catch (const Error& e) {  // one row's failure is its request's error, not the batch's
      result = SampleResult{};
      result.error = e.what();
    }
  }
  return result;
}

std::vector<RequestOutput> Engine::Impl::collect() {
  InFlight cur = std::move(in_flight_.front());
  in_flight_.pop_front();
  const Tensor* logits = nullptr;
  const std::vector<int32_t>* argmax_ids = nullptr;
  if (cur.argmax_only) argmax_ids = &runner_->collect_argmax();
  else logits = &runner_->collect_logits();
  const std::vector<int32_t>& device_accepted = runner_->accepted();
  DI_CHECK(cur.verify_q == 0 || device_accepted.size() == cur.plan.seqs.size(), "engine: ",
           device_accepted.size(), " accepted counts for a verify step of ", cur.plan.seqs.size(), " sequences");
  // The step after this one, when spec_run_ahead issued it (its sequences in the same order).
  InFlight* next = cur.next_drafts >= 0 && !in_flight_.empty() ? &in_flight_.front() : nullptr;
  if (!cur.step_done) {
    SchedulerOutput live;
    for (const ScheduledSeq& s : cur.plan.seqs)
      if (s.seq != nullptr) live.seqs.push_back(s);
    scheduler_->on_step_done(live);
  }

  std::vector<RequestState*> touched;
  bool drafted = false;  // some sequence of this step verified drafts
  int row = 0;
  for (size_t i = 0; i < cur.plan.seqs.size(); ++i) {
    const ScheduledSeq& s = cur.plan.seqs[i];
    int first_row = row;
    row += cur.logits_rows[i];
    if (s.seq == nullptr) continue;  // finished while the step ran: its token is dropped
    SeqState& seq = static_cast<SeqState&>(*s.seq);
    RequestState& r = *seq.request;
    if (const int num_prompt = cur.prompt_rows[i]; num_prompt > 0) {
      const bool ok = score_prompt(seq, *logits, first_row, cur.prompt_from[i], num_prompt);
      first_row += num_prompt;
      if (!ok && std::find(touched.begin(), touched.end(), &r) == touched.end()) touched.push_back(&r);
      if (!ok) continue;
    }
    if (!s.needs_sample) continue;
    if (next != nullptr) {
      // The next step was issued as if every draft were accepted (spec_run_ahead): its part
      // (a last-token placeholder and its drafts) leaves token_ids, and this step's drafts
      // and computed count are as they were before.
      seq.token_ids.resize(seq.token_ids.size() - static_cast<size_t>(1 + cur.next_drafts));
      seq.num_draft_tokens = cur.logits_rows[i] - 1;
      scheduler_->on_drafts_assumed(&seq, -seq.num_draft_tokens);
    }
    // A verify step: the drafts leave token_ids, then each position is sampled exactly as
    // decode would sample it (processors, grammar, penalties, stops applied one token at a
    // time); a draft equal to the sampled token is accepted and the next row is read. Drafts
    // made on the device are known here by the device's count only (the same rule).
    const std::vector<int32_t> drafts(seq.token_ids.end() - seq.num_draft_tokens, seq.token_ids.end());
    seq.drop_drafts(seq.num_draft_tokens);
    int accepted = 0, emitted = 0;
    for (int j = 0; j <= static_cast<int>(drafts.size()); ++j) {
      const SampleResult result = sample_next(seq, first_row + j, logits, argmax_ids);
      if (result.token_id < 0) {  // NaN logits or a sampling error: this request's error only
        fail_seq(seq, result.error.empty() ? "no token could be sampled" : result.error);
        break;
      }
      append_token(seq, result);
      ++emitted;
      if (seq.finish_reason != FinishReason::None || j == static_cast<int>(drafts.size()) ||
          (cur.device_drafts ? j >= device_accepted[i] : result.token_id != drafts[static_cast<size_t>(j)]))
        break;
      ++accepted;
    }
    DI_CHECK(cur.verify_q == 0 || seq.finish_reason != FinishReason::None || accepted == device_accepted[i],
             "engine: sequence ", seq.seq_id, ": ", accepted, " drafts accepted, the device counted ",
             device_accepted[i]);
    if (!drafts.empty()) count_verified(r, static_cast<int>(drafts.size()), accepted, emitted);
    drafted = drafted || !drafts.empty();
    scheduler_->on_drafts_verified(&seq, accepted);
    if (next != nullptr && seq.finish_reason == FinishReason::None) {
      // The next step computes this step's last token and its drafts (placeholders until it is
      // collected) from the verified length: the device shifted it there.
      seq.token_ids.insert(seq.token_ids.end(), static_cast<size_t>(cur.next_drafts), kPlaceholderToken);
      seq.num_draft_tokens = cur.next_drafts;
      next->begins[i] = seq.num_computed_tokens;
    }
    if (std::find(touched.begin(), touched.end(), &r) == touched.end()) touched.push_back(&r);
  }
  if (spec_k_ > 0) {
    // Drafts follow a step only when nothing else is issued yet. With draft depth 0 a
    // decode-only step drafts nothing and skips the MTP layer (the step after runs as
    // k = 0's); a step with prompt positions still gives them their MTP rows.
    if (in_flight_.empty() && deferred_.empty() && (draft_depth_ > 0 || !decode_only(cur))) {
      propose_drafts(cur);
    } else if (cur.next_drafts < 0) {  // (else the next step's drafts were made on the device)
      ++stats.num_steps_without_drafts;
    }
    // The run's acceptance history fades per step, verified or not: after enough steps
    // without drafts a position counts as unseen again (run_survival's prior), so the depth
    // is probed anew. Else one bad start (a noisy table, a few rejected drafts) would keep
    // the engine at depth 0 for its whole life: no drafts, no new evidence (seen on the H200,
    // batch 1 and 8 of the embedded model, in about one run out of three). Each stop at depth
    // 0 makes the next probe come later (undrafted_fade): probing a batch where drafts do not
    // pay cost 12% at batch 64 when it came every ~20 steps.
    const double fade = drafted ? 0.9 : undrafted_fade();
    for (size_t j = 0; j < drafted_decayed_.size(); ++j) drafted_decayed_[j] *= fade, accepted_decayed_[j] *= fade;
  }
  std::vector<RequestOutput> outputs;
  for (RequestState* r : touched) {
    outputs.push_back(make_output(*r));
    if (r->finished()) {
      stats.num_cached_tokens += outputs.back().num_cached_tokens;
      requests_.erase(r->request_id);
    }
  }
  return outputs;
}

void Engine::Impl::refresh_load_stats() {
  stats.num_free_kv_blocks = blocks_->num_free_blocks();
  stats.num_running_seqs = scheduler_->num_running();
  stats.num_waiting_seqs = scheduler_->num_waiting();
  stats.num_eplb_replacements = model->num_expert_replacements();
  stats.ep_comm_s = model->expert_comm_seconds();
  stats.ep_comm_bytes = model->expert_comm_bytes();
}

bool Engine::Impl::abort(const std::string& request_id) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return false;
  for (auto& s : it->second->seqs) finish_seq(*s, FinishReason::Abort);
  requests_.erase(it);
  return true;
}

}  // namespace deepinfer
