// KV layer groups: how a model's KV state is declared, accounted, sized and handed to its
// forward (ARCHITECTURE.md "KV cache system"; vLLM's KVCacheSpec / KVCacheManager).
//
// How a model uses it
//  1. Declare: Model::kv_groups() returns one KvGroupSpec (core/kv_group_spec.h) per group:
//     name, num_layers, row_dim + dtype, tokens_per_row (1, or N for compressed rows),
//     window (0, or W for a sliding window). V3 declares one group {"latent", L layers, 576,
//     activation dtype}; V3.2 adds {"indexer_keys", L, 128}; V4 declares its window rows
//     (window 128), compressed entries per ratio (tokens_per_row 4 / 128), indexer keys and
//     its compressors' pending inputs (model/deepseek_v4/kv_layout.h).
//     Model::mtp_kv_group() says which group the MTP layer's cache joins (one layer more,
//     the same block table; V3: group 0).
//  2. Forward: Model::forward(batch, kv, ...) gets kv[g][l] = layer l of group g,
//     [num_blocks_g, block_size, row_dim] (the MTP layer is kv[mtp_kv_group()][num_layers]),
//     and batch.kv_groups[g] = {block_tables [num_seqs, width], slot_mapping [num_tokens]}
//     for every group (batch.block_tables / batch.slot_mapping are group 0's, as before).
//     Row r of a sequence sits at slot block_tables[s][r / block_size] * block_size +
//     r % block_size; slot_mapping[t] is the row token t completes (-1: none, i.e. a
//     compressed group's token that does not end its N-token group). Entries of a window
//     group's table below its window are -1 (freed, never to be read).
//  3. Nothing else: the block manager, scheduler, sizing and runner read the declaration.
//
// State that is not one row per token fits the same shapes. V4's per-sequence partial-group
// buffers (the compressor inputs of tokens whose group of N is not complete, CSA's previous
// group for the overlap) are a window group whose rows are the compressor's per-token
// inputs: a step writing from token b reads rows from floor(b / N) * N - N (overlap) or
// floor(b / N) * N on, which a window of 2N (overlap) or N keeps; chunked and one-shot
// prefill then hold the same rows, and a prefix hit (a multiple of N * block_size tokens)
// restores them like any window group (model/deepseek_v4/kv_layout.h).
//
// Accounting (kv/block_manager.h): one block pool per group, one block table per group per
// sequence, the same chained token hashes for prefix reuse in every group, copy-on-write per
// group, window blocks freed as the window moves. The scheduler's one admission rule asks
// every group (BlockManager::can_allocate_slots is true only if each group's pool has the
// blocks that group needs).
//
// Why a pool per group rather than vLLM's one shared pool: vLLM shares one pool by making
// every group's page the same number of bytes (layers of different groups share one tensor,
// rows padded or block sizes changed to match). Our groups' rows differ a lot in bytes
// (latent 1152 B vs indexer key 256 B in bf16; V4's 584 B window rows vs compressed rows),
// so a shared page would pad the small ones or give each group its own tokens per block
// (breaking the shared token hash per block). Separate pools keep every layer's cache a
// dense [blocks, block_size, row] array (CUDA kernels unchanged) and cost nothing where the
// groups' needs are proportional, which is the case we can size exactly:
//   full attention (N = 1, no window): num_blocks (the cache's unit, what num_kv_blocks and
//       the scheduler's stats count),
//   compressed (N > 1): ceil(num_blocks / N) + max_num_seqs (each sequence's partial block),
//   window W: max_num_seqs * (ceil((W - 1) / block_size) + 3) + ceil(max_num_batched_tokens
//       / block_size), at most num_blocks: the blocks running sequences can hold at once.
// A pool that runs short only makes the scheduler preempt, never fail.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "core/kv_group_spec.h"

namespace deepinfer {

// What a group's pool size depends on besides the cache's num_blocks.
struct KvPoolLimits {
  int block_size = 16;
  int max_num_seqs = 1;
  int max_num_batched_tokens = 1;
};

// One group's pool as the block manager keeps it.
struct KvGroupPool {
  int num_blocks = 0;
  int tokens_per_row = 1;
  int window = 0;
};

// Blocks of group `g`'s pool for a cache of `num_blocks` (rule above).
int64_t kv_pool_blocks(const KvGroupSpec& g, int64_t num_blocks, const KvPoolLimits& limits);
std::vector<KvGroupPool> kv_group_pools(std::span<const KvGroupSpec> groups, int64_t num_blocks,
                                        const KvPoolLimits& limits);
// Device bytes of every group's pool: sum over groups of pool blocks x layers x block_size x row bytes.
int64_t kv_cache_bytes(std::span<const KvGroupSpec> groups, DType activation, int64_t num_blocks,
                       const KvPoolLimits& limits);
// Largest num_blocks whose kv_cache_bytes is at most `bytes` (0 when not even one fits).
int64_t kv_blocks_for_bytes(std::span<const KvGroupSpec> groups, DType activation, int64_t bytes,
                            const KvPoolLimits& limits);

}  // namespace deepinfer
