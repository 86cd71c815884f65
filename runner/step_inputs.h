// Step inputs: the I32 arrays of one StepBatch, built on the host into one buffer and
// uploaded with one copy. StepLayout says where each array sits, so the device tensors
// are views of one device buffer at the same offsets (fixed per shape: a captured decode
// graph finds its inputs at the same addresses every replay).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "core/kv_group_spec.h"

namespace deepinfer {

// One sequence's part of a step: tokens [num_computed, num_computed + num_new)
// of token_ids are computed; their KV rows go to the slots of block_ids.
struct RunSeq {
  std::span<const int32_t> token_ids;
  int num_computed = 0;
  int num_new = 0;
  std::span<const int32_t> block_ids;
  bool needs_logits = false;  // logits of its last new token are returned
  // With needs_logits: logits of its last num_logits new tokens (a verify step of 1 + k
  // tokens returns 1 + k rows), in token order.
  int num_logits = 1;
  // KV groups 1.. of the model (kv/kv_groups.h): each group's block table (KVBlocks::more_block_ids);
  // block_ids above is group 0's. Empty for a model with one group.
  std::span<const std::vector<int32_t>> more_block_ids = {};
  // The model's prefill truncation (StepBatch::host_replay_floor): the first position its upper
  // layers compute for this sequence; 0: all.
  int replay_floor = 0;
};

// Offsets (in int32 elements) of a step's arrays; each starts on a 64-element (256-byte)
// boundary, as a device allocation would.
struct StepLayout {
  int64_t num_tokens = 0, num_seqs = 0, num_logits = 0;
  int64_t max_blocks = 0;  // block table width
  int64_t token_ids = 0, positions = 0, slots = 0;        // [num_tokens]
  int64_t query_start = 0;                                // [num_seqs + 1]
  int64_t seq_lens = 0;                                   // [num_seqs]
  int64_t logits_indices = 0;                             // [num_logits]
  int64_t block_tables = 0;                               // [num_seqs, max_blocks]
  // KV groups beyond the first (none for one group): their tables and slots, group by group.
  int64_t num_groups = 1;
  int64_t group_tables = 0;                               // [num_groups - 1, num_seqs, max_blocks]
  int64_t group_slots = 0;                                // [num_groups - 1, num_tokens]
  int64_t total = 0;                                      // ints in all
  static StepLayout make(int64_t num_tokens, int64_t num_seqs, int64_t num_logits,
                         int64_t max_blocks, int64_t num_groups = 1);
};

// What the model reads on the host (StepBatch's host mirrors and maxima).
struct StepHostInfo {
  int max_query_len = 0;
  int max_seq_len = 0;
  std::vector<int32_t> host_query_start;  // [num_seqs + 1]
  std::vector<int32_t> host_seq_lens;     // [num_seqs]
  std::vector<int32_t> host_replay_floor; // [num_seqs]; empty when every floor is 0
};

// Shape a uniform step (decode: 1 token per sequence; verify: 1 + k) is padded to for a
// graph (DecodeGraphs::shape_for).
struct DecodePadding {
  int num_seqs = 0;        // sequences (>= the real ones)
  int max_blocks = 0;      // block table width
  int max_seq_len = 0;     // attention's context bound (max_blocks * block_size)
  int tokens_per_seq = 1;  // new tokens of every sequence, each with its logits row
};

// Builds the step's arrays into out[0, layout.total) (capacity ints available) and fills
// `info`. Without padding the arrays are exactly the sequences'. With padding (a uniform
// step for a graph: every sequence computes pad->tokens_per_seq = q tokens, all with
// logits) sequences [seqs.size(), pad->num_seqs) are harmless fillers: tokens 0 at
// positions 0..q-1, no KV store (slot -1), a context of q read through a block table row of
// zeros (block 0), logits computed and never read; every row's logits are computed.
// Throws Error naming the sequence when a RunSeq is inconsistent or the step does not fit.
// kv_groups: the model's groups (empty: one group of one row per token); every group's table
// is max_blocks wide, and a token's slot in a group of tokens_per_row N is that of the row it
// completes (-1 when it completes none).
StepLayout build_step_inputs(std::span<const RunSeq> seqs, int block_size,
                             const DecodePadding* pad, int32_t* out, int64_t capacity,
                             StepHostInfo& info, std::span<const KvGroupSpec> kv_groups = {});

}  // namespace deepinfer
