// Sequence: what the scheduler tracks for one generated sequence (a request
// with n > 1 samples has n of them). The engine owns sequences and appends
// sampled tokens; the scheduler decides how many tokens each computes per step.
#pragma once
#include <cstdint>
#include <vector>

#include "kv/block_manager.h"

namespace deepinfer {

enum class SeqStatus : uint8_t { Waiting, Running, Finished };

struct Sequence {
  int64_t seq_id = 0;
  std::vector<int32_t> token_ids;  // prompt followed by generated tokens
  int num_prompt_tokens = 0;
  // Tokens whose KV rows are in the cache (computed or reused); the rest of
  // token_ids are computed in coming steps. The last token of a running
  // decode is never computed until the step after it is sampled.
  int num_computed_tokens = 0;
  int num_cached_prompt_tokens = 0;  // prompt tokens served from the prefix cache (first admission)
  int max_total_tokens = 0;          // prompt + max new tokens: the KV a sequence may need
  int num_preemptions = 0;
  bool admitted_once = false;
  SeqStatus status = SeqStatus::Waiting;
  // n > 1: samples 1..n-1 wait until sample 0 has computed its prompt, then
  // fork its prompt blocks (copy-on-write) instead of recomputing them; if
  // sample 0 holds none by then (finished), they use the prefix cache.
  const Sequence* wait_for_prompt_of = nullptr;
  // Speculative decoding: the last num_draft_tokens of token_ids are drafts, scheduled like
  // any other tokens (a verify step computes 1 + k), never hashed into the prefix cache;
  // the scheduler drops them first when the step's budget or the KV cache is short.
  int num_draft_tokens = 0;
  // False: admission computes every token instead of taking cached prefix blocks (a request
  // asking for prompt logprobs needs the logits of every prompt position; vLLM skips the
  // prefix cache for such requests too). Forks of a parent's blocks are not affected.
  bool use_prefix_cache = true;
  // A model's prefill truncation (Model::prefill_truncation, set by the engine): replay_floor is
  // the first prompt position its upper layers compute (0: all; RunSeq::replay_floor), and window
  // blocks go to the prefix cache only from reuse_floor on (BlockManager::commit).
  int replay_floor = 0;
  int64_t reuse_floor = 0;
  KVBlocks kv;

  int num_tokens() const { return static_cast<int>(token_ids.size()); }
  int num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
  int num_verified_tokens() const { return num_tokens() - num_draft_tokens; }
  void drop_drafts(int count) {  // the last `count` drafts
    token_ids.resize(token_ids.size() - static_cast<size_t>(count));
    num_draft_tokens -= count;
  }
};

}  // namespace deepinfer
