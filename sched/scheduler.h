// Scheduler: one rule for prefill, chunked prefill, decode and drafts.
// Each step every running sequence is given num_new_tokens = the tokens it has
// not computed yet, capped by the step's token budget; sequences are served in
// arrival order, running ones first. When the KV cache runs out, the most
// recently admitted running sequence is preempted: its blocks are released and
// it goes back to the front of the waiting queue to be recomputed (its full
// blocks usually survive in the prefix cache, so recompute is cheap).
// Drafts are tokens like the others (a verify step is 1 + k new tokens); when the budget or
// the cache is short they are dropped first, and a preempted sequence loses them.
// Samples 1..n-1 of a request fork sample 0's prompt blocks once it has
// computed them, its partial last block included, and recompute only the last
// prompt token (for their own first sample); blocks are copied on first write.
#pragma once
#include <deque>
#include <vector>

#include "kv/block_manager.h"
#include "sched/sequence.h"

namespace deepinfer {

struct SchedulerConfig {
  int max_num_seqs = 256;               // sequences in one step
  int max_num_batched_tokens = 8192;    // tokens in one step
};

struct ScheduledSeq {
  Sequence* seq;
  int num_new_tokens;  // tokens computed this step, from seq->num_computed_tokens on
  // True when the step reaches the end of the known tokens, so the step's logits
  // for this sequence's last token are sampled (false for a non-final prefill chunk).
  bool needs_sample;
};

struct SchedulerOutput {
  std::vector<ScheduledSeq> seqs;
  std::vector<Sequence*> preempted;
  // Copy-on-write: the runner copies these blocks before the step runs.
  std::vector<BlockCopy> block_copies;
  int num_batched_tokens = 0;
  bool empty() const { return seqs.empty(); }
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, BlockManager& blocks);

  // Queues a sequence (status Waiting). Throws Error when it could never fit the cache.
  void add(Sequence* seq);
  SchedulerOutput schedule();
  // Marks the scheduled tokens computed and commits full blocks for reuse.
  // Call before appending the step's sampled tokens.
  // A sequence's drafts (Sequence::num_draft_tokens) count as computed only once verified:
  // computed positions stop at its verified tokens, and the engine, after removing the
  // drafts and appending the verified run, reports the num_accepted drafts it kept.
  void on_step_done(const SchedulerOutput& out);
  void on_drafts_verified(Sequence* seq, int num_accepted);
  // Drafts in flight: the next step is scheduled before a verify step's outcome is read, as if
  // `count` more tokens (its drafts, no longer counted as drafts) were computed; a negative
  // count undoes that once the outcome is known. Nothing is committed to the prefix cache.
  void on_drafts_assumed(Sequence* seq, int count);
  // Removes a sequence (finished or aborted) and releases its blocks.
  void finish(Sequence* seq);

  bool has_unfinished() const { return !waiting_.empty() || !running_.empty(); }
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  int num_running() const { return static_cast<int>(running_.size()); }

 private:
  void preempt(Sequence* seq);
  bool admissible(const Sequence* seq) const;

  SchedulerConfig config_;
  BlockManager& blocks_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // admission order
};

}  // namespace deepinfer
