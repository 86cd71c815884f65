// StepBatch: everything one forward step needs, built by runner/ from the
// scheduler's {request -> num_tokens} decision. Prefill, chunked prefill, decode
// and speculative verification are all the same shape: each sequence contributes
// a run of new tokens appended after its cached context.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace deepinfer {

// One KV layer group's addressing for a step (Model::kv_groups()[g]; kv/kv_groups.h).
struct KvGroupTables {
  // I32 [num_seqs, max_blocks]: the group's blocks of each sequence; row r of a sequence
  // sits at slot block_tables[s][r / block_size] * block_size + r % block_size. A window
  // group's entries below its window are -1 (freed, never read); padding entries 0.
  Tensor block_tables;
  // I32 [num_tokens]: the slot of the row token t completes; -1 when it completes none
  // (a compressed group's token that does not end its group of tokens_per_row, padding).
  Tensor slot_mapping;
};

struct StepBatch {
  int num_tokens = 0;
  int num_seqs = 0;
  int max_query_len = 0;
  int max_seq_len = 0;
  // Device tensors (on the model's backend).
  Tensor token_ids;       // I32 [num_tokens]
  Tensor positions;       // I32 [num_tokens]
  Tensor query_start;     // I32 [num_seqs + 1]
  Tensor seq_lens;        // I32 [num_seqs] context length after this step
  Tensor block_tables;    // I32 [num_seqs, max_blocks_per_seq]   KV group 0's (= kv_groups[0])
  Tensor slot_mapping;    // I32 [num_tokens]                     KV group 0's (= kv_groups[0])
  Tensor logits_indices;  // I32 [num_logits] rows of the step whose logits are returned
  // Host mirrors for decisions the model makes on the CPU (e.g. direct vs absorbed MLA).
  std::vector<int32_t> host_query_start;  // [num_seqs + 1]
  std::vector<int32_t> host_seq_lens;     // [num_seqs]
  // [num_seqs] or empty (all 0): the first position each sequence's rows are computed from in the
  // layers a model's prefill truncation skips (Model::prefill_truncation); those layers compute
  // no row below it and read none. Host-only (decided on the host, like the KV addressing).
  std::vector<int32_t> host_replay_floor;
  // Attention data parallelism (model/parallel.h): the tokens of each data-parallel rank's step
  // this step ([dp]); empty with one rank. This batch is this rank's.
  std::vector<int32_t> host_dp_num_tokens;
  // Every KV group's tables, in Model::kv_groups() order ([0]: block_tables, slot_mapping).
  std::vector<KvGroupTables> kv_groups;
};

}  // namespace deepinfer
