// Speculative decoding in the step loop (SPEC_DECODING.md): after each collected step the
// proposer drafts up to k tokens per decoding sequence; they are appended to its
// token_ids as drafts, the scheduler gives it 1 + k tokens, the runner returns 1 + k
// logits rows, and collect() samples each position exactly as decode would, keeping the
// drafts that equal the sampled tokens (engine/engine.cpp).
//
// Asynchronous scheduling with drafts in flight (issue 13 item 2): spec_run_ahead below,
// Runner::draft_ahead and SpecStep, the device ops Backend::spec_accept / spec_select_rows /
// spec_shift. Where its conditions do not hold a speculating step is synchronous: verify
// step -> host sync (tokens sampled and accepted on the host) -> MTP first pass + chained
// passes (issued one ahead, but each collected on the host) -> the next verify step built on
// the host. The design, vLLM-like (its async scheduler with spec decode treats the drafts'
// outcome as unknown), as built:
//  1. Scope as run_ahead's: every row device-samplable (argmax or Backend::sample), no
//     grammar / penalties / min_tokens / logprobs, nothing waiting, no length stop within the
//     two verify steps' 2 + k_N + k_N+1 tokens, free blocks for 1 + k more slots per sequence
//     (no preemption), one KV group (V3; V4's groups read host lengths), MTP drafts.
//  2. Runner, on the device: after verify step N's tokens, a small op computes each
//     sequence's accepted count a_s (first j where draft j != token j) and its last
//     token; the MTP first pass of step N+1 runs over all 1 + k rows of each sequence
//     (uniform, so graphed: item 3) and takes draft 1 from row a_s (a per-sequence
//     logits-row index read on the device); rows past a_s write MTP KV at positions that
//     the chained passes rewrite (each writes its own position) before a later pass's
//     query reads them. Chained passes as today.
//  3. Step N+1 is built on the host for the optimistic layout (every draft accepted:
//     positions from num_computed + 1 + k, the scheduler reserving those slots) and fixed
//     up on the device from a_s: positions, slot mapping and sequence lengths shift by
//     a_s - k, the input tokens are step N's bonus token and the new drafts (copied from
//     the MTP ids on the device, never via the host), and the sample rows' positions
//     (device_params' (seed, position) key) shift the same way, so every token keeps the
//     random number k = 0 draws for it: same bits as k = 0.
//  4. The host collects step N one step late: takes N+1's placeholders out of token_ids,
//     undoes the assumption (Scheduler::on_drafts_assumed(-k)), replays acceptance with the
//     device's count (the same rule as collect(); checked equal where the host knows the
//     drafts), commits the verified tokens (Scheduler::on_drafts_verified), puts N+1's draft
//     placeholders back and records N+1's true start; it drops step N+1's rows of sequences
//     that step N finished (EOS, stop strings), as run_ahead does with its placeholder token.
//     Blocks reserved for the optimistic positions stay with the sequence (the next steps
//     write them; released when it finishes).
//  5. Verify lengths fixed when N+1 is scheduled: spec_varlen 1 (confidences from the
//     acceptance history, a step old) fits; spec_varlen 2 (the drafts' own softmax) cannot
//     run ahead and keeps the synchronous path.
// The first MTP pass of draft_ahead is uniform (1 + k rows per sequence), so it replays a
// CUDA graph (item 3); the synchronous path's first pass has 1 + the accepted count rows per
// sequence, which differ across the batch, so it runs eagerly. Step 5 as built: every
// sequence gets the same kn = draft_depth_ drafts (spec_varlen 1's per-request lengths are
// not applied ahead; spec_varlen 2 stays synchronous).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>

#include "core/error.h"
#include "core/log.h"
#include "engine/engine_impl.h"
#include "model/deepseek_v41/model.h"

namespace deepinfer {
namespace {

// The MTP proposer's view of the runner. vocab: the engine's sample_vocab (drafts never
// take a padding row's id).
class RunnerMtp final : public MtpExecutor {
 public:
  RunnerMtp(Runner& runner, int vocab, int kv_window) : runner_(runner), vocab_(vocab), kv_window_(kv_window) {}
  void submit_mtp(std::span<const MtpRows> rows, bool hidden_from_target, bool want_logits,
                  bool tokens_from_previous) override {
    seqs_.clear();
    hidden_.clear();
    for (const MtpRows& r : rows) {
      seqs_.push_back({r.next_tokens, r.begin, r.count, r.block_ids, r.want_logits, 1, r.more_block_ids});
      for (int t = 0; t < r.count; ++t) hidden_.push_back(r.hidden_row + t);
    }
    runner_.submit_mtp(seqs_, hidden_, hidden_from_target, want_logits, tokens_from_previous);
  }
  MtpResult collect_mtp() override {
    MtpResult out;
    out.tokens = runner_.collect_mtp();
    if (runner_.mtp_logits().defined()) out.logits = &runner_.mtp_logits();
    return out;
  }
  int max_overlapped_rows() const override { return runner_.max_overlapped_mtp_rows(); }
  int vocab_size() const override { return vocab_; }
  int kv_window() const override { return kv_window_; }

 private:
  Runner& runner_;
  int vocab_;
  int kv_window_;
  std::vector<RunSeq> seqs_;
  std::vector<int32_t> hidden_;
};

// V4.1's DSpark drafter as the DSpark proposer's executor: one block per sequence from the context
// rows in the runner's caches (written by the target's steps). vocab: the engine's sample_vocab.
class RunnerBlockDrafts final : public BlockDraftExecutor {
 public:
  RunnerBlockDrafts(Runner& runner, DeepseekV41Model& model, int vocab)
      : runner_(runner), model_(model), vocab_(vocab) {}
  void draft_blocks(std::span<const BlockDraftSeq> seqs, std::vector<Proposal>& out) override {
    seqs_.clear();
    for (const BlockDraftSeq& s : seqs) seqs_.push_back({s.anchor, s.anchor_pos, s.block_ids});
    model_.propose_blocks(seqs_, runner_.kv_caches(), vocab_, got_);
    out.resize(got_.size());
    for (size_t i = 0; i < got_.size(); ++i) {
      out[i].drafts = std::move(got_[i].drafts);
      out[i].confidences = std::move(got_[i].confidences);
    }
  }
  int block_size() const override { return model_.draft_block_size(); }

 private:
  Runner& runner_;
  DeepseekV41Model& model_;
  int vocab_;
  std::vector<DeepseekV41Model::BlockSeq> seqs_;
  std::vector<DsparkDrafter::Output> got_;
};

DeepseekV41Model* block_drafter(Model& model) {
  auto* m = dynamic_cast<DeepseekV41Model*>(&model);
  return m != nullptr && m->draft_block_size() > 0 ? m : nullptr;
}

// The MTP layer's block tables in `kv` beyond its first group's (kv.group(mtp_kv_group())):
// those of the model's num_mtp_kv_groups() - 1 groups after it.
std::span<const std::vector<int32_t>> mtp_more_tables(const KVBlocks& kv, const Model& model) {
  const int g = model.mtp_kv_group(), n = model.num_mtp_kv_groups();
  if (n <= 1) return {};
  return std::span(kv.more_block_ids).subspan(static_cast<size_t>(g), static_cast<size_t>(n - 1));
}

}  // namespace

bool has_block_drafter(const Model& model) {
  const auto* m = dynamic_cast<const DeepseekV41Model*>(&model);
  return m != nullptr && m->draft_block_size() > 0;
}

void check_speculation_config(const EngineConfig& config) {
  // -1: unset (EngineConfig's default; an engine built from parts takes it as 0).
  DI_CHECK(config.num_speculative_tokens >= -1 && config.num_speculative_tokens <= 16,
           "EngineConfig.num_speculative_tokens (DEEPINFER_USE_NEXTN_DECODE, --num-speculative-tokens): "
           "expected 0..16, got ", config.num_speculative_tokens);
  DI_CHECK(config.spec_varlen >= -1 && config.spec_varlen <= 2,
           "EngineConfig.spec_varlen (DEEPINFER_ENABLE_MTP_VARLEN, --spec-varlen): expected 0, 1 or 2, got ",
           config.spec_varlen);
  DI_CHECK(config.speculator == "mtp" || config.speculator == "ngram",
           "EngineConfig.speculator: expected mtp or ngram, got '", config.speculator, "'");
}

void Engine::Impl::make_proposer() {
  if (DeepseekV41Model* m = config.speculator == "mtp" ? block_drafter(*model) : nullptr) {
    // DSpark: a block of drafts per forward, its confidence head's confidences (when it has one)
    // feeding the scheduled verify lengths.
    block_exec_ = std::make_unique<RunnerBlockDrafts>(*runner_, *m, sample_vocab);
    proposer_ = std::make_unique<DsparkProposer>(*block_exec_);
  } else if (config.speculator == "mtp") {
    // The MTP layer's window: that of its KV group as the model declares it (V4: the
    // sliding window; V3: none).
    const int window = model->kv_groups()[static_cast<size_t>(model->mtp_kv_group())].window;
    mtp_exec_ = std::make_unique<RunnerMtp>(*runner_, sample_vocab, window);
    // Draft probabilities (a softmax over the vocabulary per draft, logits to the host) only
    // for spec_varlen 2; 1 takes confidences from the acceptance history.
    proposer_ = std::make_unique<MtpProposer>(*mtp_exec_, config.spec_varlen >= 2);
  } else {
    proposer_ = std::make_unique<NgramProposer>();
  }
  draft_depth_ = spec_k_;
  if (config.spec_varlen > 0) {
    if (!config.spec_step_times.empty()) {
      stats.spec_step_times = config.spec_step_times;
      step_cost_ = StepCost(stats.spec_step_times);
      log_step_times();
    } else {
      for (int b = 1; b < config.max_num_seqs; b *= 2) step_time_batches_.push_back(b);
      step_time_batches_.push_back(config.max_num_seqs);
    }
  }
}

void Engine::Impl::log_step_times() const {
  const SpecStepTimes& t = stats.spec_step_times;
  std::string line;
  auto ms = [&line](const char* before, double seconds) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "%s%.3f", before, 1e3 * seconds);
    line.append(buf);
  };
  for (size_t i = 0; i < t.batches.size(); ++i) {
    line.append(" | b").append(std::to_string(t.batches[i])).append(":");
    for (int q = 0; q < t.max_tokens_per_seq; ++q)
      ms(" ", t.verify_s[i * static_cast<size_t>(t.max_tokens_per_seq) + static_cast<size_t>(q)]);
    if (!t.mixed_s.empty()) ms(" mixed ", t.mixed_s[i]);
    if (!t.decode_ahead_s.empty()) ms(" ahead ", t.decode_ahead_s[i]);
    if (!t.mtp_first_s.empty()) ms(" mtp ", t.mtp_first_s[i]), ms("+", t.mtp_chain_s[i]);
  }
  log_info("spec-varlen step times (ms; verify 1..", t.max_tokens_per_seq, " tokens per sequence), measured in ",
           t.measure_s, " s:", line.empty() ? std::string(" none (no verify shape fits)") : line);
}

// The DSpark table on the shapes steps run as (deepinfer/spec_step_times.h), measured
// lazily: batch b of the ladder 1, 2, 4, .. max_num_seqs at the first step (nothing in
// flight) where more sequences decode than the table's largest batch, so a run of one
// request measures batch 1 only, after its first token (time to first token unchanged), and
// an engine that never decodes measures nothing. Until the first batch is measured every
// draft is verified (k as asked). Each batch takes scratch KV blocks from the free pool
// (never a block anyone holds; released after) and its context is the mean length of the
// decoding sequences then (whole blocks, at most kMaxContext), because a step's time grows with the rows its attention reads: on the CPU
// ~linearly in context times tokens, so a table measured at a short context overrates long
// contexts' verify steps only through attention's share of the step (small against the
// GEMMs at the embedded model's few hundred tokens); on a bandwidth-bound GPU step the KV
// read grows with context for decode and verify alike (one read serves 1 + k query rows),
// which makes verifying relatively cheaper at long contexts than the table says. Measuring
// stops (larger batches extrapolated from the last two) once kBudgetS is spent, or when a
// batch finds too few free blocks or rows.
void Engine::Impl::grow_step_times() {
  if (step_time_batches_.empty()) return;
  SpecStepTimes& t = stats.spec_step_times;
  int64_t live = 0, tokens = 0;
  for (const auto& [id, r] : requests_)
    for (const auto& seq : r->seqs)
      if (seq->status == SeqStatus::Running && seq->num_output_tokens() > 0) ++live, tokens += seq->num_tokens();
  const int want = static_cast<int>(std::min<int64_t>(live, config.max_num_seqs));
  if (want <= 0 || (!t.batches.empty() && t.batches.back() >= want)) return;
  constexpr double kBudgetS = 2.0;
  constexpr int kMaxContext = 2048;
  const int bs = blocks_->block_size(), Q = 1 + spec_k_;
  const int ctx = std::min({std::max(static_cast<int>((tokens / live + bs - 1) / bs * bs), bs), kMaxContext / bs * bs,
                            (max_model_len - Q - 3) / bs * bs, config.max_num_batched_tokens / bs * bs});
  bool grew = false;
  while (!step_time_batches_.empty() && (t.batches.empty() || t.batches.back() < want)) {
    const int b = step_time_batches_.front();
    if ((!t.batches.empty() && t.measure_s > kBudgetS) || !measure_step_batch(b, ctx)) {
      step_time_batches_.clear();  // nothing more is measured
      break;
    }
    step_time_batches_.erase(step_time_batches_.begin());
    grew = true;
  }
  if (t.batches.empty() && step_time_batches_.empty())
    log_warn("spec-varlen: no step times measured (context ", max_model_len, ", ", blocks_->num_free_blocks(),
             " free KV blocks): every draft is verified");
  if (!grew) return;
  step_cost_ = StepCost(t);
  log_step_times();
}

// One batch of the table: b sequences after a shared context of ctx tokens (prefilled once:
// its rows are real, so tokens chosen from it are real ids), each computing q = 1..1 + k
// tokens with logits rows: the uniform verify step (a graph on CUDA, as the engine's steps
// replay), a mixed one (eager), decode steps issued ahead, and the MTP passes. Median of 3
// after one warm-up (two with graphs: the first of a shape captures its graph): on the
// CPU ~25 steps of the batch. False when
// the step does not fit (rows, free blocks): nothing is added.
bool Engine::Impl::measure_step_batch(int b, int ctx) {
  const auto t_start = std::chrono::steady_clock::now();
  SpecStepTimes& t = stats.spec_step_times;
  const int Q = 1 + spec_k_;
  if (ctx <= 0 || b * Q > std::min(config.max_num_seqs * Q, config.max_num_batched_tokens) ||
      ctx + Q + 3 > max_model_len)
    return false;
  const int64_t len = ctx + Q + 3;  // room for q + 3 more tokens (the chained MTP pass)
  // Scratch sequences: 0 holds the context, the others share its blocks and own their tails.
  std::vector<KVBlocks> kv(static_cast<size_t>(b));
  std::vector<BlockCopy> copies;
  auto release = [&] {
    for (auto it = kv.rbegin(); it != kv.rend(); ++it) blocks_->release(*it);
  };
  if (!blocks_->can_allocate_slots(kv[0], 0, len)) return false;
  blocks_->allocate_slots(kv[0], 0, len, copies);
  const bool graphs = runner_->graphs_enabled();
  const bool one_group = runner_->kv_groups().size() == 1;
  const int mtp_group = mtp_exec_ ? model->mtp_kv_group() : 0;
  const std::vector<int32_t> ids(static_cast<size_t>(len), 0);
  auto run_step = [&](std::span<const RunSeq> seqs) {
    runner_->submit(seqs, true);
    runner_->collect_argmax();
  };
  {  // the shared context: one prefill of its rows in every layer of every group
    const RunSeq prefill{ids, 0, ctx, kv[0].block_ids, false, 1, kv[0].more_block_ids};
    run_step(std::span(&prefill, 1));
  }
  for (size_t s = 1; s < kv.size(); ++s) {
    if (blocks_->fork(kv[0], ctx, kv[s]) == 0 || !blocks_->can_allocate_slots(kv[s], ctx, len)) {
      release();
      return false;
    }
    blocks_->allocate_slots(kv[s], ctx, len, copies);
  }
  runner_->copy_blocks(copies);  // shared partial blocks (compressed groups): the context's rows
  const int warmups = graphs ? 2 : 1;
  auto median_of = [&](const std::function<void()>& f, int warm) {
    for (int i = 0; i < warm; ++i) f();
    std::vector<double> runs;
    for (int i = 0; i < 3; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      f();
      runs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(runs.begin(), runs.end());
    return std::max(runs[1], 1e-9);
  };
  std::vector<RunSeq> seqs(static_cast<size_t>(b));
  auto shape = [&](int q) {
    for (size_t s = 0; s < seqs.size(); ++s) seqs[s] = {ids, ctx, q, kv[s].block_ids, true, q, kv[s].more_block_ids};
  };
  t.batches.push_back(b);
  t.max_tokens_per_seq = Q;
  for (int q = 1; q <= Q; ++q) {
    shape(q);
    t.verify_s.push_back(median_of([&] { run_step(seqs); }, warmups));
  }
  if (graphs && Q >= 2) {  // one sequence a token short: the step is not uniform (eager)
    shape(Q);
    seqs.back().num_new = seqs.back().num_logits = Q - 1;
    t.mixed_s.push_back(b >= 2 ? median_of([&] { run_step(seqs); }, 1) : t.verify_s.back());
  }
  // Decode steps each issued before the last is read: only on a device backend (the CPU
  // backend runs a step when it is submitted, so ahead is plain decode there).
  constexpr int kAheadSteps = 4;
  if (config.async_scheduling && one_group && backend->supports_graphs()) {
    shape(1);
    t.decode_ahead_s.push_back(median_of([&] {
      runner_->submit(seqs, true);
      for (int i = 1; i < kAheadSteps; ++i) {
        runner_->submit(seqs, true, true);
        runner_->collect_argmax();
      }
      runner_->collect_argmax();
    }, 1) / kAheadSteps);
  }
  if (block_exec_) {  // a block drafter: one forward per block whatever the depth (chained passes: 0)
    const int g = block_drafter(*model)->draft_kv_group();
    std::vector<BlockDraftSeq> blocks;
    for (size_t s = 0; s < kv.size(); ++s) blocks.push_back({0, ctx, kv[s].group(g)});  // the context's rows
    std::vector<Proposal> got;
    t.mtp_first_s.push_back(median_of([&] { block_exec_->draft_blocks(blocks, got); }, 1));
    t.mtp_chain_s.push_back(0.0);
  }
  if (mtp_exec_) {
    shape(Q);
    run_step(seqs);  // the target hidden states the first pass reads: b x Q rows
    std::vector<RunSeq> mtp(static_cast<size_t>(b));
    std::vector<int32_t> rows;
    for (size_t s = 0; s < mtp.size(); ++s) {
      mtp[s] = {ids, ctx, 2, kv[s].group(mtp_group), true, 1, mtp_more_tables(kv[s], *model)};
      rows.push_back(static_cast<int32_t>(Q * s));
      rows.push_back(static_cast<int32_t>(Q * s + 1));
    }
    t.mtp_first_s.push_back(median_of([&] { runner_->run_mtp(mtp, rows, true, true); }, 1));
    for (RunSeq& m : mtp) m.num_computed = ctx + 2, m.num_new = 1;
    rows.resize(static_cast<size_t>(b));
    for (int s = 0; s < b; ++s) rows[static_cast<size_t>(s)] = s;
    runner_->run_mtp(mtp, rows, true, true);  // chained passes read its rows
    t.mtp_chain_s.push_back(median_of([&] { runner_->run_mtp(mtp, rows, false, true); }, warmups));
  }
  release();
  t.measure_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  return true;
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
  const size_t k = static_cast<size_t>(num_drafts);
  if (drafted_decayed_.size() < k) drafted_decayed_.resize(k, 0.0), accepted_decayed_.resize(k, 0.0);
  for (size_t j = 0; j < k; ++j) drafted_decayed_[j] += 1.0;
  for (size_t j = 0; j < static_cast<size_t>(num_accepted); ++j) accepted_decayed_[j] += 1.0;
  // The request's own history (decayed per verify step of the request).
  if (r.spec_drafted_decayed.size() < k) r.spec_drafted_decayed.resize(k, 0.0), r.spec_accepted_decayed.resize(k, 0.0);
  for (size_t j = 0; j < r.spec_drafted_decayed.size(); ++j)
    r.spec_drafted_decayed[j] *= 0.9, r.spec_accepted_decayed[j] *= 0.9;
  for (size_t j = 0; j < k; ++j) r.spec_drafted_decayed[j] += 1.0;
  for (size_t j = 0; j < static_cast<size_t>(num_accepted); ++j) r.spec_accepted_decayed[j] += 1.0;
}

std::vector<double> Engine::Impl::run_survival() const {
  std::vector<double> survival(static_cast<size_t>(spec_k_), 1.0);
  for (size_t j = 0; j < survival.size(); ++j) {
    const bool seen = j < drafted_decayed_.size() && drafted_decayed_[j] > 0.5;
    survival[j] = seen ? accepted_decayed_[j] / drafted_decayed_[j] : j > 0 ? survival[j - 1] : 1.0;
  }
  return survival;
}

std::vector<float> Engine::Impl::history_confidences(const RequestState& r, int num_drafts,
                                                     std::span<const double> run) const {
  // Survival a_j of the request, its counts blended with the run's (worth two verify steps),
  // turned into conditional confidences c_j = a_j / a_{j-1}.
  constexpr double kPriorSteps = 2.0;
  std::vector<float> c(static_cast<size_t>(num_drafts), 0.0f);
  double prev = 1.0;
  for (size_t j = 0; j < c.size(); ++j) {
    const double acc = j < r.spec_accepted_decayed.size() ? r.spec_accepted_decayed[j] : 0.0;
    const double dr = j < r.spec_drafted_decayed.size() ? r.spec_drafted_decayed[j] : 0.0;
    const double a = std::min((acc + kPriorSteps * run[j]) / (dr + kPriorSteps), prev);
    c[j] = prev > 0 ? static_cast<float>(a / prev) : 0.0f;
    prev = a;
  }
  return c;
}

void Engine::Impl::update_draft_depth() {
  if (config.spec_varlen <= 0 || step_cost_.empty()) {
    draft_depth_ = spec_k_;
    return;
  }
  // Expected survival by position: the recent acceptance (run_survival).
  // Drafting must promise 10% over k = 0: the table is measured on full batches of equal
  // steps, while a real batch's sequences accept differently and finish apart (on the H200
  // at batch 8 the table promised ~1.1x, the run of 8 x 128 tokens gave 0.75x).
  constexpr double kMinDraftGain = 1.1;
  const int before = draft_depth_;
  draft_depth_ = choose_draft_depth(run_survival(), std::max(scheduler_->num_running(), 1), spec_k_, step_cost_,
                                    config.async_scheduling, kMinDraftGain);
  if (before > 0 && draft_depth_ == 0) ++num_depth_drops_;
}

double Engine::Impl::undrafted_fade() const {
  // 0.9 per step at the first stop, its square root after the second, ..: every stop at depth
  // 0 doubles the steps until the prior comes back (~17 steps from three drafted steps'
  // history at the first; ~1,000 after the seventh). A bad start is retried soon; a batch where
  // drafting truly does not pay is probed ever more rarely.
  return std::pow(0.9, 1.0 / static_cast<double>(1 << std::min(std::max(num_depth_drops_ - 1, 0), 6)));
}

bool Engine::Impl::decode_only(const InFlight& step) {
  for (size_t i = 0; i < step.plan.seqs.size(); ++i) {
    const ScheduledSeq& s = step.plan.seqs[i];
    if (s.seq == nullptr) continue;
    if (s.num_new_tokens != 1 || s.seq->num_draft_tokens != 0 || step.begins[i] < s.seq->num_prompt_tokens)
      return false;
  }
  return true;
}

// Drafts in flight (SPEC_DECODING.md; the plan at the top of this file). Runs only where it
// cannot change any output, as run_ahead: the running step is a uniform verify step (1 + kc
// tokens per sequence, every token chosen on the device, the accepted counts computed there)
// holding every running sequence; nothing waits; MTP drafts of a fixed depth kn (spec_varlen 2
// needs the drafts' softmax on the host: synchronous); one KV group; neither step can take a
// sequence past max_tokens or the context, whatever is accepted; free blocks for every
// sequence's 1 + kn slots (no preemption). The host then assumes all kc drafts accepted (no
// prefix-cache commit over them), schedules 1 + kn tokens per sequence (placeholders),
// has the device draft (Runner::draft_ahead) and submits; the device moves that step back by
// the rejected drafts. A sequence that stops on an EOS or stop string in the running step has
// one discarded step, as with run_ahead.
void Engine::Impl::spec_run_ahead() {
  if (in_flight_.size() != 1 || !deferred_.empty() || !mtp_exec_ || config.spec_varlen >= 2 || draft_depth_ < 1)
    return;
  InFlight& cur = in_flight_.front();
  const int kc = cur.verify_q - 1, kn = draft_depth_;
  const int num_seqs = static_cast<int>(cur.plan.seqs.size());
  const int bs = blocks_->block_size();
  if (cur.verify_q < 2 || !cur.argmax_only || cur.step_done || scheduler_->num_waiting() > 0 ||
      num_seqs != scheduler_->num_running() || num_seqs * (1 + kn) > config.max_num_batched_tokens ||
      blocks_->min_free_blocks() < num_seqs * ((1 + kn + bs - 1) / bs + 1))
    return;
  for (const ScheduledSeq& s : cur.plan.seqs) {
    if (s.seq == nullptr || !s.needs_sample) return;
    const SeqState& seq = static_cast<const SeqState&>(*s.seq);
    // At most 1 + kc tokens from the running step and 1 + kn from the next.
    const int most = seq.num_verified_tokens() + (1 + kc) + (1 + kn);
    if (most - seq.num_prompt_tokens > seq.request->params.max_tokens || most > max_model_len) return;
  }
  scheduler_->on_step_done(cur.plan);
  cur.step_done = true;
  for (const ScheduledSeq& s : cur.plan.seqs) {
    SeqState& seq = static_cast<SeqState&>(*s.seq);
    seq.num_draft_tokens = 0;
    scheduler_->on_drafts_assumed(&seq, kc);
    seq.token_ids.insert(seq.token_ids.end(), static_cast<size_t>(1 + kn), kPlaceholderToken);
    seq.num_draft_tokens = kn;
  }
  SchedulerOutput next = scheduler_->schedule();
  bool same_rows = next.preempted.empty() && static_cast<int>(next.seqs.size()) == num_seqs;
  for (int i = 0; same_rows && i < num_seqs; ++i) {
    const ScheduledSeq& s = next.seqs[static_cast<size_t>(i)];
    same_rows = s.seq == cur.plan.seqs[static_cast<size_t>(i)].seq && s.num_new_tokens == 1 + kn && s.needs_sample;
  }
  DI_CHECK(same_rows, "engine: the step scheduled on assumed drafts is not the running one's sequences with ", 1 + kn,
           " tokens each");
  // Copy-on-write (none in steady decode: the running step's blocks are already private)
  // before the MTP passes write the sequences' blocks.
  runner_->copy_blocks(next.block_copies);
  stats.num_kv_block_copies += static_cast<int64_t>(next.block_copies.size());
  next.block_copies.clear();
  std::vector<DraftAheadSeq> ahead;
  for (int i = 0; i < num_seqs; ++i) {
    const SeqState& seq = static_cast<const SeqState&>(*cur.plan.seqs[static_cast<size_t>(i)].seq);
    ahead.push_back({cur.begins[static_cast<size_t>(i)], seq.kv.group(model->mtp_kv_group())});
  }
  runner_->draft_ahead(ahead, kn);
  cur.next_drafts = kn;
  submit(std::move(next), false, kc);
  ++stats.num_spec_steps_ahead;
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
    int k = seq.num_computed_tokens + 1 == seq.num_tokens() ? std::min(draft_budget(seq), draft_depth_) : 0;
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
    if (block_exec_) {  // the drafter's context rows
      p.block_ids = seq.kv.group(block_drafter(*model)->draft_kv_group());
    } else {
      p.block_ids = seq.kv.group(model->mtp_kv_group());  // the MTP layer's groups (V3: 0)
      p.more_block_ids = mtp_more_tables(seq.kv, *model);
    }
    p.max_drafts = k;
    in.push_back(p);
    seqs.push_back(&seq);
  }
  if (in.empty()) return;
  std::vector<Proposal> out;
  proposer_->propose(in, out);
  if (config.spec_varlen > 0 && !step_cost_.empty()) {
    std::vector<std::vector<float>> conf(out.size());
    const std::vector<double> run = run_survival();
    for (size_t i = 0; i < out.size(); ++i) {
      const size_t n = std::min(out[i].drafts.size(), static_cast<size_t>(in[i].max_drafts));
      // A drafter's confidence head (DSpark) wherever it gave confidences; else the drafts' own
      // (spec_varlen 2) or the acceptance history (1).
      const bool own = !out[i].confidences.empty() && (block_exec_ != nullptr || config.spec_varlen >= 2);
      conf[i] = own ? out[i].confidences : history_confidences(*seqs[i]->request, static_cast<int>(n), run);
      conf[i].resize(n, 0.0f);
    }
    const std::vector<int> lengths = schedule_verify_lengths(conf, step_cost_);
    for (size_t i = 0; i < out.size(); ++i) {
      // Drafts made and not verified count as not accepted for the draft depth (else drafts
      // that are never worth verifying would keep being made).
      for (size_t j = static_cast<size_t>(lengths[i]); j < conf[i].size(); ++j) {
        if (drafted_decayed_.size() <= j) drafted_decayed_.resize(j + 1, 0.0), accepted_decayed_.resize(j + 1, 0.0);
        drafted_decayed_[j] += 1.0;
      }
      out[i].drafts.resize(static_cast<size_t>(lengths[i]));
    }
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
