// Speculative decoding in the step loop (SPEC_DECODING.md): after each collected step the
// proposer drafts up to k tokens per decoding sequence; they are appended to its
// token_ids as drafts, the scheduler gives it 1 + k tokens, the runner returns 1 + k
// logits rows, and collect() samples each position exactly as decode would, keeping the
// drafts that equal the sampled tokens (engine/engine.cpp).
#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "engine/engine_impl.h"

namespace deepinfer {
namespace {

// The MTP proposer's view of the runner. vocab: the engine's sample_vocab (drafts never
// take a padding row's id).
class RunnerMtp final : public MtpExecutor {
 public:
  RunnerMtp(Runner& runner, int vocab, int kv_window) : runner_(runner), vocab_(vocab), kv_window_(kv_window) {}
  MtpResult run_mtp(std::span<const MtpRows> rows, bool hidden_from_target, bool want_logits) override {
    seqs_.clear();
    hidden_.clear();
    for (const MtpRows& r : rows) {
      seqs_.push_back({r.next_tokens, r.begin, r.count, r.block_ids, r.want_logits, 1});
      for (int t = 0; t < r.count; ++t) hidden_.push_back(r.hidden_row + t);
    }
    MtpResult out;
    out.tokens = runner_.run_mtp(seqs_, hidden_, hidden_from_target, want_logits);
    if (want_logits) out.logits = &runner_.mtp_logits();
    return out;
  }
  int vocab_size() const override { return vocab_; }
  int kv_window() const override { return kv_window_; }

 private:
  Runner& runner_;
  int vocab_;
  int kv_window_;
  std::vector<RunSeq> seqs_;
  std::vector<int32_t> hidden_;
};

}  // namespace

void check_speculation_config(const EngineConfig& config) {
  // -1: unset (EngineConfig's default; an engine built from parts takes it as 0).
  DI_CHECK(config.num_speculative_tokens >= -1 && config.num_speculative_tokens <= 16,
           "EngineConfig.num_speculative_tokens (DEEPINFER_USE_NEXTN_DECODE, --num-speculative-tokens): "
           "expected 0..16, got ", config.num_speculative_tokens);
  DI_CHECK(config.speculator == "mtp" || config.speculator == "ngram",
           "EngineConfig.speculator: expected mtp or ngram, got '", config.speculator, "'");
}

void Engine::Impl::make_proposer() {
  if (config.speculator == "mtp") {
    // The MTP layer's window: that of its KV group as the model declares it (V4: the
    // sliding window; V3: none).
    const int window = model->kv_groups()[static_cast<size_t>(model->mtp_kv_group())].window;
    mtp_exec_ = std::make_unique<RunnerMtp>(*runner_, sample_vocab, window);
    // Confidences (a softmax over the vocabulary per draft, logits to the host) only for
    // confidence-scheduled verification.
    proposer_ = std::make_unique<MtpProposer>(*mtp_exec_, config.spec_varlen > 0);
  } else {
    proposer_ = std::make_unique<NgramProposer>();
  }
  if (config.spec_varlen > 0) measure_step_times();
}

// The DSpark table: one step of B fresh tokens (one sequence, blocks 0.. of the still
// empty cache) for B = 1, 2, 4, .. up to what a step of max_num_seqs x (1 + k) tokens
// can hold; median of 3 runs after a warm-up. (Prefill-shaped steps: on the CPU their
// time is the GEMMs' and MoE's, as a verify step's.)
void Engine::Impl::measure_step_times() {
  const int cap = std::min({config.max_num_batched_tokens, config.max_num_seqs * (1 + spec_k_),
                            blocks_->num_blocks() * blocks_->block_size(), max_model_len, 1024});
  std::vector<int> tokens;
  std::vector<double> seconds;
  std::vector<int32_t> ids(static_cast<size_t>(cap), 0), blocks(static_cast<size_t>(blocks_->blocks_for(cap)));
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<int32_t>(i);
  const std::vector<std::vector<int32_t>> more_blocks = scratch_block_tables(*runner_, 0, cap, blocks_->block_size());
  for (int b = 1; b <= cap; b = b < cap && 2 * b > cap ? cap : 2 * b) {
    const RunSeq seq{ids, 0, b, blocks, true, 1, more_blocks};
    std::vector<double> runs;
    for (int run = 0; run < 4; ++run) {
      const auto t0 = std::chrono::steady_clock::now();
      runner_->execute(std::span(&seq, 1));
      if (run > 0) runs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(runs.begin(), runs.end());
    tokens.push_back(b);
    seconds.push_back(std::max(runs[1], 1e-9));
    if (b == cap) break;
  }
  step_times_ = StepTimeTable(std::move(tokens), std::move(seconds));
}

int Engine::Impl::draft_budget(const SeqState& seq) const {
  const RequestState& r = *seq.request;
  // The verify step emits up to k + 1 tokens: keep them within max_tokens and the context.
  const int by_tokens = r.params.max_tokens - seq.num_output_tokens() - 1;
  const int by_context = max_model_len - seq.num_tokens() - 1;
  return std::max(0, std::min({spec_k_, by_tokens, by_context}));
}

namespace {
// One verify step's counts added in place (no per-step SpecDecodeStats and vectors; the
// per-position vectors grow only when a longer draft run first appears).
void add_verified(SpecDecodeStats& s, int num_drafts, int num_accepted, int num_emitted) {
  s.num_verify_steps += 1;
  s.num_draft_tokens += num_drafts;
  s.num_accepted_tokens += num_accepted;
  s.num_emitted_tokens += num_emitted;
  const size_t k = static_cast<size_t>(num_drafts);
  if (s.drafts_per_position.size() < k) s.drafts_per_position.resize(k, 0);
  if (s.accepted_per_position.size() < k) s.accepted_per_position.resize(k, 0);
  for (size_t j = 0; j < k; ++j) s.drafts_per_position[j] += 1;
  for (size_t j = 0; j < static_cast<size_t>(num_accepted); ++j) s.accepted_per_position[j] += 1;
}
}  // namespace

void Engine::Impl::count_verified(RequestState& r, int num_drafts, int num_accepted, int num_emitted) {
  add_verified(r.spec, num_drafts, num_accepted, num_emitted);
  add_verified(stats.spec, num_drafts, num_accepted, num_emitted);
}

void Engine::Impl::propose_drafts(const InFlight& step) {
  std::vector<ProposeSeq> in;
  std::vector<SeqState*> seqs;
  for (size_t i = 0; i < step.plan.seqs.size(); ++i) {
    const ScheduledSeq& s = step.plan.seqs[i];
    if (s.seq == nullptr || s.seq->status != SeqStatus::Running) continue;
    SeqState& seq = static_cast<SeqState&>(*s.seq);
    DI_CHECK(seq.num_draft_tokens == 0, "engine: sequence ", seq.seq_id, " still holds drafts");
    ProposeSeq p;
    p.token_ids = seq.token_ids;
    p.computed_begin = step.begins[i];
    p.computed_end = seq.num_computed_tokens;
    p.target_row = step.rows[i];
    // Only a sequence whose last token is sampled and not computed yet drafts.
    int k = seq.num_computed_tokens + 1 == seq.num_tokens() ? draft_budget(seq) : 0;
    // Drafts 2..k write the MTP layer's rows at positions num_tokens - 1 ..: make those
    // slots writable now (the verify step needs them anyway); fewer drafts if short.
    if (mtp_exec_) {
      while (k >= 2 && !blocks_->can_allocate_slots(seq.kv, seq.num_computed_tokens, seq.num_tokens() + k - 2)) --k;
      if (k >= 2) {
        std::vector<BlockCopy> copies;
        blocks_->allocate_slots(seq.kv, seq.num_computed_tokens, seq.num_tokens() + k - 2, copies);
        runner_->copy_blocks(copies);
        stats.num_kv_block_copies += static_cast<int64_t>(copies.size());
      }
    }
    p.block_ids = seq.kv.group(model->mtp_kv_group());  // the MTP layer's group (V3: 0)
    p.max_drafts = k;
    in.push_back(p);
    seqs.push_back(&seq);
  }
  if (in.empty()) return;
  std::vector<Proposal> out;
  proposer_->propose(in, out);
  if (config.spec_varlen > 0 && !step_times_.empty()) {
    std::vector<std::vector<float>> conf(out.size());
    for (size_t i = 0; i < out.size(); ++i) {
      conf[i] = out[i].confidences;
      conf[i].resize(std::min(out[i].drafts.size(), static_cast<size_t>(in[i].max_drafts)), 0.0f);
    }
    const std::vector<int> lengths = schedule_verify_lengths(conf, step_times_);
    for (size_t i = 0; i < out.size(); ++i) out[i].drafts.resize(static_cast<size_t>(lengths[i]));
  }
  for (size_t i = 0; i < seqs.size(); ++i) {
    SeqState& seq = *seqs[i];
    std::vector<int32_t>& d = out[i].drafts;
    if (static_cast<int>(d.size()) > in[i].max_drafts) d.resize(static_cast<size_t>(in[i].max_drafts));
    seq.token_ids.insert(seq.token_ids.end(), d.begin(), d.end());
    seq.num_draft_tokens = static_cast<int>(d.size());
  }
}

}  // namespace deepinfer
