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
//
// Copy-on-write: fork() lets a sequence share another's blocks, the partial
// last one included (n > 1 samples of one prompt). A block with more than one
// user is never written: allocate_slots() gives the writer a fresh block and
// asks for the shared block's rows to be copied into it first (BlockCopy).
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

// The runner copies every layer's rows of block src into block dst before the
// step that writes dst runs.
struct BlockCopy {
  int32_t src_block_id;
  int32_t dst_block_id;
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
  // `child` must be empty. Shares the blocks of `parent` that hold its first
  // `num_tokens` tokens (a partial last block included) and the hashes of the
  // full ones; returns num_tokens. The child's first write into a shared block copies it.
  int fork(const KVBlocks& parent, int64_t num_tokens, KVBlocks& child);
  // Free blocks `seq` needs before a step writes its tokens [begin, end): new
  // blocks past its end plus a private copy of each shared block in the range.
  int blocks_needed(const KVBlocks& seq, int64_t begin, int64_t end) const;
  bool can_allocate_slots(const KVBlocks& seq, int64_t begin, int64_t end) const {
    return blocks_needed(seq, begin, end) <= num_free_blocks();
  }
  // Makes tokens [begin, end) of `seq` writable (throws if short of blocks):
  // shared blocks in the range are replaced by fresh ones, each with a copy
  // appended to `copies`, and fresh blocks are appended until `end` fits.
  void allocate_slots(KVBlocks& seq, int64_t begin, int64_t end, std::vector<BlockCopy>& copies);
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
