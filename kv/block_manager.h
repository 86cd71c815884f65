// BlockManager: the paged KV cache's bookkeeping, pure CPU. Blocks hold
// `block_size` consecutive rows of one sequence (per layer of its group; the runner
// owns the memory, this class only hands out block ids). A model's KV state is a list of
// layer groups (kv/kv_groups.h: how a model declares and uses them), each with its own
// pool of blocks and its own block table per sequence; the one-group constructor is the
// classic cache (one row per token, every row kept), and everything below holds per group.
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
//
// Groups (KvGroupPool): a compressed group (tokens_per_row N) holds row r once tokens
// [rN, (r+1)N) are computed, so its block i covers tokens [i*N*bs, (i+1)*N*bs) and is
// registered under the chained hash of its last token block. A window group (window W)
// frees, when a step writes tokens from `begin` on, every block whose tokens all lie
// before begin - W + 1 (no query of the sequence reads them again); its table entry
// becomes kNullBlock. A freed window block keeps its hash until taken, like any free
// block. Prefix reuse takes the longest prefix (a multiple of block_size tokens, and of
// N * block_size for compressed groups) that every group can serve: full and compressed
// groups all its blocks, window groups the blocks of the window before its end (vLLM's
// sliding-window cache hit); fork() shares each group's blocks the same way.
#pragma once
#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kv/kv_groups.h"

namespace deepinfer {

inline constexpr int32_t kNullBlock = -1;  // a window group's freed table entry

// One sequence's blocks in every group, opaque to the scheduler. block_ids is group 0's
// table (block_ids[i] holds its rows [i*block_size, (i+1)*block_size)); more_block_ids[g-1]
// group g's. block_hashes[i] is the chained hash of tokens [0, (i+1)*block_size), set for
// the committed (full and computed) token blocks; the same hashes serve every group.
struct KVBlocks {
  std::vector<int32_t> block_ids;
  std::vector<uint64_t> block_hashes;
  std::vector<std::vector<int32_t>> more_block_ids;  // groups 1.. (empty with one group)
  // BlockManager::set_partitions: the partition every block of the sequence comes from (-1:
  // none yet; set by its first blocks, cleared by release).
  int partition = -1;

  std::vector<int32_t>& group(int g) { return g == 0 ? block_ids : more_block_ids[static_cast<size_t>(g - 1)]; }
  const std::vector<int32_t>& group(int g) const {
    return g == 0 ? block_ids : more_block_ids[static_cast<size_t>(g - 1)];
  }
};

// The runner copies every layer's rows of block src into block dst (of group `group`)
// before the step that writes dst runs.
struct BlockCopy {
  int32_t src_block_id;
  int32_t dst_block_id;
  int group = 0;
};

class BlockManager {
 public:
  // One group: one row per token, every row kept.
  BlockManager(int num_blocks, int block_size, bool enable_prefix_caching);
  // One pool per group (kv_group_pools in kv/kv_groups.h makes them from a model's groups).
  BlockManager(std::vector<KvGroupPool> groups, int block_size, bool enable_prefix_caching);

  // Partitions (attention data parallelism, --dp N: runner/runner.h): block b of every group
  // belongs to partition b % n (data-parallel rank b % n holds it as its block b / n), and every
  // block of one sequence comes from one partition: a new sequence's from the partition with the
  // most free blocks of group 0 (lowest on ties), a prefix hit's and a fork's from their source's
  // (a cached chain is only hit within one partition). Before any block is taken; every group's
  // num_blocks must divide by n.
  void set_partitions(int n);
  int num_partitions() const { return partitions_; }
  // Blocks of group g in one partition (what one sequence can hold at most).
  int partition_blocks(int g = 0) const { return num_blocks(g) / partitions_; }
  int num_free_blocks(int g, int partition) const {
    return static_cast<int>(pools_[static_cast<size_t>(g)].free_lists[static_cast<size_t>(partition)].size());
  }
  // The partition `seq` takes its blocks from (its own, or the one a new sequence would get).
  int partition_of(const KVBlocks& seq) const;

  int num_groups() const { return static_cast<int>(pools_.size()); }
  const KvGroupPool& group_pool(int g) const { return specs_[static_cast<size_t>(g)]; }
  // Group 0's pool (the classic cache's), and any group's.
  int num_blocks(int g = 0) const { return static_cast<int>(pools_[static_cast<size_t>(g)].ref_counts.size()); }
  int block_size() const { return block_size_; }
  // Blocks nobody references (including cached ones that may be evicted).
  int num_free_blocks(int g = 0) const { return pools_[static_cast<size_t>(g)].num_free; }
  int min_free_blocks() const;  // over every group
  // Group 0's table length for `num_tokens` tokens (of one row each).
  int blocks_for(int64_t num_tokens) const {
    return static_cast<int>((num_tokens + block_size_ - 1) / block_size_);
  }
  // Table length of group g for a sequence of `num_tokens` tokens (freed window entries included).
  int table_blocks(int g, int64_t num_tokens) const;
  // The most blocks of group g one sequence of `num_tokens` tokens holds at once when it is
  // computed in steps of at most `max_step_tokens` (a window group: its window plus a step).
  int peak_blocks(int g, int64_t num_tokens, int max_step_tokens) const;
  int ref_count(int32_t block_id) const { return ref_count(0, block_id); }
  int ref_count(int g, int32_t block_id) const {
    return pools_[static_cast<size_t>(g)].ref_counts[static_cast<size_t>(block_id)];
  }

  // `seq` must be empty. Takes references on the longest cached prefix of `tokens` that
  // every group serves, leaving at least one token to compute (its logits are needed).
  // Returns the number of tokens covered.
  int acquire_cached_prefix(std::span<const int32_t> tokens, KVBlocks& seq);
  // `child` must be empty. Shares the blocks of `parent` that hold its first
  // `num_tokens` tokens (a partial last block included) and the hashes of the
  // full ones; returns num_tokens. The child's first write into a shared block copies it.
  // Returns 0 with `child` left empty when a window group of the parent has already freed
  // blocks the child would read (the caller then takes the prefix cache).
  int fork(const KVBlocks& parent, int64_t num_tokens, KVBlocks& child);
  // Free blocks `seq` needs before a step writes its tokens [begin, end), summed over the
  // groups: new blocks past its end plus a private copy of each shared block in the range,
  // less the window blocks the step frees.
  int blocks_needed(const KVBlocks& seq, int64_t begin, int64_t end) const;
  int blocks_needed(int g, const KVBlocks& seq, int64_t begin, int64_t end) const;
  // True when every group has the blocks it needs.
  bool can_allocate_slots(const KVBlocks& seq, int64_t begin, int64_t end) const;
  // Makes tokens [begin, end) of `seq` writable in every group (throws if short of blocks):
  // window blocks left behind are freed, shared blocks in the range are replaced by fresh
  // ones, each with a copy appended to `copies`, and fresh blocks are appended until `end` fits.
  void allocate_slots(KVBlocks& seq, int64_t begin, int64_t end, std::vector<BlockCopy>& copies);
  // Registers the full blocks among the first `num_computed` of `tokens` for reuse. Window
  // groups register only blocks whose rows all lie at or after `window_floor` (a model's prefill
  // truncation leaves rows below it unwritten or unlike full prefill's in some of its layers:
  // Model::prefill_truncation, Sequence::reuse_floor); such a block is never registered later.
  void commit(std::span<const int32_t> tokens, int64_t num_computed, KVBlocks& seq,
              int64_t window_floor = 0);
  // Drops the sequence's references in every group (last block first, so its tail is evicted first).
  void release(KVBlocks& seq);

 private:
  struct Cached {
    uint64_t parent_hash;
    std::vector<int32_t> tokens;  // its last token block's, to reject hash collisions
  };
  struct Pool {
    std::vector<int> ref_counts;                  // [num_blocks]
    std::vector<uint64_t> hash_of;                // [num_blocks]; valid when has_hash
    std::vector<bool> has_hash;                   // [num_blocks]
    std::vector<Cached> cached;                   // [num_blocks]
    std::vector<std::list<int32_t>> free_lists;   // [partition]: front = next to take (LRU)
    std::vector<std::list<int32_t>::iterator> free_pos;  // [num_blocks]
    int num_free = 0;                             // over the partitions
    std::unordered_map<uint64_t, int32_t> by_hash;
  };
  int32_t take_free_block(Pool& pool, int partition);
  void add_ref(Pool& pool, int32_t block_id) const;
  void drop_ref(Pool& pool, int32_t block_id) const;
  static uint64_t chain_hash(uint64_t parent, std::span<const int32_t> tokens);
  // Rows of group g's spec that tokens [0, n) complete, and the block range [first, last)
  // a step writing tokens [begin, end) writes in (empty when it completes no row).
  int64_t rows_for(int g, int64_t num_tokens) const;
  std::pair<int64_t, int64_t> written_blocks(int g, int64_t begin, int64_t end) const;
  // First table entry a window group keeps when its next query is token `next`.
  int64_t first_kept_block(int g, int64_t next) const;
  // The cached block of group g's block i for the prefix's token-block hashes (-1: none).
  // partition >= 0: only a block of that partition counts.
  int32_t lookup(int g, int64_t block, std::span<const uint64_t> hashes, std::span<const int32_t> tokens,
                 int partition = -1) const;
  bool group_serves(int g, int64_t num_tokens, std::span<const uint64_t> hashes,
                    std::span<const int32_t> tokens, int partition) const;
  void check_seq(const KVBlocks& seq) const;

  int block_size_;
  bool prefix_caching_;
  int partitions_ = 1;
  std::vector<KvGroupPool> specs_;
  std::vector<Pool> pools_;
};

}  // namespace deepinfer
