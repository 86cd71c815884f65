// BlockManager: the paged KV cache's bookkeeping, pure CPU. Blocks hold
// `block_size` consecutive tokens of one sequence (per layer a latent row each;
// the runner owns the memory, this class only hands out block ids).
//
// Prefix reuse: once every token of a block is computed, the block is
// registered under a chained hash  h_i = H(h_{i-1}, tokens of block i), so two
// sequences with the same first k*block_size tokens share the same k blocks.
// Reference counts say how many sequences use a block; a block with no users
// goes on the free list but keeps its hash (it can still be hit) until it is
// taken for new data: the least recently freed block is taken first.
#pragma once
#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

namespace deepinfer {

// One sequence's blocks, opaque to the scheduler. block_ids[i] holds tokens
// [i*block_size, (i+1)*block_size); block_hashes[i] is set for the committed
// (full and computed) prefix of block_ids.
struct KVBlocks {
  std::vector<int32_t> block_ids;
  std::vector<uint64_t> block_hashes;
};

class BlockManager {
 public:
  BlockManager(int num_blocks, int block_size, bool enable_prefix_caching);

  int num_blocks() const { return static_cast<int>(ref_counts_.size()); }
  int block_size() const { return block_size_; }
  // Blocks nobody references (including cached ones that may be evicted).
  int num_free_blocks() const { return static_cast<int>(free_list_.size()); }
  int blocks_for(int64_t num_tokens) const {
    return static_cast<int>((num_tokens + block_size_ - 1) / block_size_);
  }
  int ref_count(int32_t block_id) const { return ref_counts_[block_id]; }

  // `seq` must be empty. Takes references on the longest run of cached blocks
  // that prefix `tokens`, leaving at least one token to compute (its logits are
  // needed). Returns the number of tokens covered.
  int acquire_cached_prefix(std::span<const int32_t> tokens, KVBlocks& seq);
  // Whether `seq` can hold `num_tokens` tokens after taking free blocks.
  bool can_grow(const KVBlocks& seq, int64_t num_tokens) const;
  // Appends fresh blocks until `seq` holds `num_tokens` tokens (throws if short).
  void grow(KVBlocks& seq, int64_t num_tokens);
  // Registers the full blocks among the first `num_computed` of `tokens` for reuse.
  void commit(std::span<const int32_t> tokens, int64_t num_computed, KVBlocks& seq);
  // Drops the sequence's references (last block first, so its tail is evicted first).
  void release(KVBlocks& seq);

 private:
  struct Cached {
    uint64_t parent_hash;
    std::vector<int32_t> tokens;  // to reject hash collisions
  };
  int32_t take_free_block();
  void add_ref(int32_t block_id);
  static uint64_t chain_hash(uint64_t parent, std::span<const int32_t> tokens);

  int block_size_;
  bool prefix_caching_;
  std::vector<int> ref_counts_;                  // [num_blocks]
  std::vector<uint64_t> hash_of_;                // [num_blocks]; valid when has_hash_
  std::vector<bool> has_hash_;                   // [num_blocks]
  std::vector<Cached> cached_;                   // [num_blocks]
  std::list<int32_t> free_list_;                 // front = next to take (LRU)
  std::vector<std::list<int32_t>::iterator> free_pos_;  // [num_blocks]
  std::unordered_map<uint64_t, int32_t> by_hash_;
};

}  // namespace deepinfer
