#include "sched/scheduler.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace deepinfer {

Scheduler::Scheduler(const SchedulerConfig& config, BlockManager& blocks)
    : config_(config), blocks_(blocks) {
  DI_CHECK(config.max_num_seqs >= 1, "scheduler: max_num_seqs must be >= 1, got ",
           config.max_num_seqs);
  DI_CHECK(config.max_num_batched_tokens >= 1, "scheduler: max_num_batched_tokens must be >= 1, got ",
           config.max_num_batched_tokens);
}

void Scheduler::add(Sequence* seq) {
  DI_CHECK(seq->num_tokens() >= 1, "sequence ", seq->seq_id, ": empty prompt");
  int64_t max_tokens = std::max(seq->max_total_tokens, seq->num_tokens());
  for (int g = 0; g < blocks_.num_groups(); ++g) {
    const int need = blocks_.peak_blocks(g, max_tokens, config_.max_num_batched_tokens);
    // One sequence's blocks come from one partition (--dp: one data-parallel rank's pool).
    DI_CHECK(need <= blocks_.partition_blocks(g), "sequence ", seq->seq_id, ": ", max_tokens, " tokens need ", need,
             " KV blocks, the cache has ", blocks_.partition_blocks(g),
             g == 0 ? std::string() : " in KV group " + std::to_string(g),
             blocks_.num_partitions() > 1 ? " per data-parallel rank" : "");
  }
  seq->status = SeqStatus::Waiting;
  waiting_.push_back(seq);
}

bool Scheduler::admissible(const Sequence* seq) const {
  const Sequence* p = seq->wait_for_prompt_of;
  return p == nullptr || p->status == SeqStatus::Finished ||
         p->num_computed_tokens >= p->num_prompt_tokens;
}

void Scheduler::preempt(Sequence* seq) {
  seq->drop_drafts(seq->num_draft_tokens);
  blocks_.release(seq->kv);
  seq->num_computed_tokens = 0;
  seq->num_preemptions++;
  seq->status = SeqStatus::Waiting;
  waiting_.push_front(seq);
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  int budget = config_.max_num_batched_tokens;

  // Running sequences first, oldest first; the youngest make room when KV runs out.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence* seq = running_[i];
    const int begin = seq->num_computed_tokens;
    // Drafts that do not fit the budget, or the free blocks, go first.
    if (const int over = seq->num_tokens() - begin - budget; over > 0 && seq->num_draft_tokens > 0)
      seq->drop_drafts(std::min(over, seq->num_draft_tokens));
    while (seq->num_draft_tokens > 0 && !blocks_.can_allocate_slots(seq->kv, begin, seq->num_tokens()))
      seq->drop_drafts(1);
    int n = std::min(seq->num_tokens() - seq->num_computed_tokens, budget);
    if (n <= 0) {  // nothing to compute (waiting for the engine to append)
      ++i;
      continue;
    }
    bool fits = true;
    while (!blocks_.can_allocate_slots(seq->kv, begin, begin + n)) {
      // The youngest running sequence of seq's KV partition (--dp: one rank's pool; another
      // rank's blocks would not help): seq itself at the latest.
      auto it = running_.end() - 1;
      while (blocks_.partition_of((*it)->kv) != blocks_.partition_of(seq->kv)) --it;
      Sequence* victim = *it;
      running_.erase(it);
      preempt(victim);
      out.preempted.push_back(victim);
      if (victim == seq) {
        fits = false;
        break;
      }
    }
    if (!fits) break;
    blocks_.allocate_slots(seq->kv, begin, begin + n, out.block_copies);
    out.seqs.push_back({seq, n, begin + n == seq->num_tokens()});
    budget -= n;
    ++i;
  }

  // Then waiting ones, in order, while nothing had to be preempted this step.
  if (out.preempted.empty()) {
    for (size_t i = 0; i < waiting_.size() && budget > 0 &&
                       static_cast<int>(running_.size()) < config_.max_num_seqs;) {
      Sequence* seq = waiting_[i];
      if (!admissible(seq)) {
        ++i;
        continue;
      }
      const Sequence* parent = seq->wait_for_prompt_of;
      // Fork all but the last prompt token: its logits give this sample's first token.
      const bool fork = parent != nullptr && parent->status == SeqStatus::Running &&
                        parent->num_computed_tokens >= seq->num_prompt_tokens;
      int cached = fork ? blocks_.fork(parent->kv, seq->num_prompt_tokens - 1, seq->kv) : 0;
      // No fork (or the parent's window already moved past the prompt): the prefix cache.
      if (cached == 0 && seq->use_prefix_cache) cached = blocks_.acquire_cached_prefix(seq->token_ids, seq->kv);
      int n = std::min(seq->num_tokens() - cached, budget);
      if (!blocks_.can_allocate_slots(seq->kv, cached, cached + n)) {
        blocks_.release(seq->kv);
        break;
      }
      blocks_.allocate_slots(seq->kv, cached, cached + n, out.block_copies);
      seq->num_computed_tokens = cached;
      if (!seq->admitted_once) seq->num_cached_prompt_tokens = std::min(cached, seq->num_prompt_tokens);
      seq->admitted_once = true;
      seq->status = SeqStatus::Running;
      waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(i));
      running_.push_back(seq);
      out.seqs.push_back({seq, n, cached + n == seq->num_tokens()});
      budget -= n;
    }
  }
  out.num_batched_tokens = config_.max_num_batched_tokens - budget;
  return out;
}

void Scheduler::on_step_done(const SchedulerOutput& out) {
  for (const ScheduledSeq& s : out.seqs) {
    Sequence* q = s.seq;
    q->num_computed_tokens = std::min(q->num_computed_tokens + s.num_new_tokens, q->num_verified_tokens());
    blocks_.commit(q->token_ids, q->num_computed_tokens, q->kv, q->reuse_floor);
  }
}

void Scheduler::on_drafts_verified(Sequence* seq, int num_accepted) {
  if (seq->status != SeqStatus::Running || num_accepted <= 0) return;
  DI_CHECK(seq->num_draft_tokens == 0 && seq->num_computed_tokens + num_accepted < seq->num_tokens(),
           "scheduler: sequence ", seq->seq_id, ": ", num_accepted, " accepted drafts past its tokens");
  seq->num_computed_tokens += num_accepted;
  blocks_.commit(seq->token_ids, seq->num_computed_tokens, seq->kv, seq->reuse_floor);
}

void Scheduler::on_drafts_assumed(Sequence* seq, int count) {
  DI_CHECK(seq->status == SeqStatus::Running && seq->num_computed_tokens + count >= 0 &&
               seq->num_computed_tokens + count <= seq->num_tokens(),
           "scheduler: sequence ", seq->seq_id, ": ", count, " assumed tokens from ", seq->num_computed_tokens,
           " computed of ", seq->num_tokens());
  seq->num_computed_tokens += count;
}

void Scheduler::finish(Sequence* seq) {
  if (auto it = std::find(running_.begin(), running_.end(), seq); it != running_.end())
    running_.erase(it);
  if (auto it = std::find(waiting_.begin(), waiting_.end(), seq); it != waiting_.end())
    waiting_.erase(it);
  blocks_.release(seq->kv);
  seq->status = SeqStatus::Finished;
}

}  // namespace deepinfer
