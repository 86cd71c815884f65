#include "kv/block_manager.h"

#include <algorithm>

#include "core/error.h"

namespace deepinfer {

BlockManager::BlockManager(int num_blocks, int block_size, bool enable_prefix_caching)
    : block_size_(block_size), prefix_caching_(enable_prefix_caching) {
  DI_CHECK(num_blocks > 0, "KV cache: num_blocks must be > 0, got ", num_blocks);
  DI_CHECK(block_size > 0, "KV cache: block_size must be > 0, got ", block_size);
  ref_counts_.assign(num_blocks, 0);
  hash_of_.assign(num_blocks, 0);
  has_hash_.assign(num_blocks, false);
  cached_.resize(num_blocks);
  free_pos_.resize(num_blocks);
  for (int32_t b = 0; b < num_blocks; ++b) free_pos_[b] = free_list_.insert(free_list_.end(), b);
}

uint64_t BlockManager::chain_hash(uint64_t parent, std::span<const int32_t> tokens) {
  // splitmix64 finalizer over (parent, tokens); 64 bits, collisions rejected by Cached.
  auto mix = [](uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  };
  uint64_t h = mix(parent ^ 0x6a09e667f3bcc909ull);
  for (int32_t t : tokens) h = mix(h ^ static_cast<uint32_t>(t));
  return h;
}

int32_t BlockManager::take_free_block() {
  DI_CHECK(!free_list_.empty(), "KV cache: no free block");
  int32_t b = free_list_.front();
  free_list_.pop_front();
  if (has_hash_[b]) {  // evict its cached contents
    by_hash_.erase(hash_of_[b]);
    has_hash_[b] = false;
    cached_[b].tokens.clear();
  }
  ref_counts_[b] = 1;
  return b;
}

void BlockManager::add_ref(int32_t b) {
  if (ref_counts_[b]++ == 0) free_list_.erase(free_pos_[b]);
}

int BlockManager::acquire_cached_prefix(std::span<const int32_t> tokens, KVBlocks& seq) {
  DI_CHECK(seq.block_ids.empty(), "KV cache: acquire_cached_prefix on a non-empty sequence");
  if (!prefix_caching_ || tokens.empty()) return 0;
  const int64_t max_blocks = (static_cast<int64_t>(tokens.size()) - 1) / block_size_;
  uint64_t parent = 0;
  for (int64_t i = 0; i < max_blocks; ++i) {
    auto block_tokens = tokens.subspan(i * block_size_, block_size_);
    uint64_t h = chain_hash(parent, block_tokens);
    auto it = by_hash_.find(h);
    if (it == by_hash_.end()) break;
    const Cached& c = cached_[it->second];
    if (c.parent_hash != parent || !std::equal(c.tokens.begin(), c.tokens.end(),
                                               block_tokens.begin(), block_tokens.end()))
      break;
    add_ref(it->second);
    seq.block_ids.push_back(it->second);
    seq.block_hashes.push_back(h);
    parent = h;
  }
  return static_cast<int>(seq.block_ids.size()) * block_size_;
}

int BlockManager::fork(const KVBlocks& parent, int64_t num_tokens, KVBlocks& child) {
  DI_CHECK(child.block_ids.empty(), "KV cache: fork into a non-empty sequence");
  const int num_shared = blocks_for(num_tokens);
  DI_CHECK(num_tokens >= 0 && num_shared <= static_cast<int>(parent.block_ids.size()),
           "KV cache: fork of ", num_tokens, " tokens from a sequence with ",
           parent.block_ids.size(), " blocks of ", block_size_);
  child.block_ids.assign(parent.block_ids.begin(), parent.block_ids.begin() + num_shared);
  for (int32_t b : child.block_ids) add_ref(b);
  const size_t num_full = std::min(parent.block_hashes.size(), static_cast<size_t>(num_tokens / block_size_));
  child.block_hashes.assign(parent.block_hashes.begin(), parent.block_hashes.begin() + num_full);
  return static_cast<int>(num_tokens);
}

int BlockManager::blocks_needed(const KVBlocks& seq, int64_t begin, int64_t end) const {
  const int64_t num_blocks = static_cast<int64_t>(seq.block_ids.size());
  int64_t needed = std::max<int64_t>(blocks_for(end) - num_blocks, 0);
  for (int64_t i = begin / block_size_; i < std::min<int64_t>(blocks_for(end), num_blocks); ++i)
    needed += ref_counts_[seq.block_ids[i]] > 1;
  return static_cast<int>(needed);
}

void BlockManager::allocate_slots(KVBlocks& seq, int64_t begin, int64_t end, std::vector<BlockCopy>& copies) {
  DI_CHECK(0 <= begin && begin <= end, "KV cache: bad token range [", begin, ", ", end, ")");
  DI_CHECK(can_allocate_slots(seq, begin, end), "KV cache: writing tokens [", begin, ", ", end,
           ") needs ", blocks_needed(seq, begin, end), " blocks, only ", num_free_blocks(), " free");
  const int64_t num_blocks = static_cast<int64_t>(seq.block_ids.size());
  for (int64_t i = begin / block_size_; i < std::min<int64_t>(blocks_for(end), num_blocks); ++i) {
    const int32_t shared = seq.block_ids[i];
    if (ref_counts_[shared] <= 1) continue;
    const int32_t copy = take_free_block();
    --ref_counts_[shared];  // still >= 1: the other users keep it
    seq.block_ids[i] = copy;
    // A written block is no longer the registered full block (if it was one).
    if (static_cast<int64_t>(seq.block_hashes.size()) > i) seq.block_hashes.resize(i);
    copies.push_back({shared, copy});
  }
  while (static_cast<int>(seq.block_ids.size()) < blocks_for(end)) seq.block_ids.push_back(take_free_block());
}

void BlockManager::commit(std::span<const int32_t> tokens, int64_t num_computed, KVBlocks& seq) {
  if (!prefix_caching_) return;
  int64_t num_full = std::min<int64_t>(num_computed / block_size_, seq.block_ids.size());
  for (int64_t i = static_cast<int64_t>(seq.block_hashes.size()); i < num_full; ++i) {
    uint64_t parent = i == 0 ? 0 : seq.block_hashes[i - 1];
    auto block_tokens = tokens.subspan(i * block_size_, block_size_);
    uint64_t h = chain_hash(parent, block_tokens);
    seq.block_hashes.push_back(h);
    int32_t b = seq.block_ids[i];
    // A block computed twice (two sequences sharing a prefix in the same step)
    // stays private; the first registered copy serves later hits.
    if (has_hash_[b] || by_hash_.count(h)) continue;
    by_hash_[h] = b;
    hash_of_[b] = h;
    has_hash_[b] = true;
    cached_[b] = Cached{parent, {block_tokens.begin(), block_tokens.end()}};
  }
}

void BlockManager::release(KVBlocks& seq) {
  for (auto it = seq.block_ids.rbegin(); it != seq.block_ids.rend(); ++it) {
    int32_t b = *it;
    DI_CHECK(ref_counts_[b] > 0, "KV cache: block ", b, " released more often than taken");
    if (--ref_counts_[b] == 0) {
      // Blocks with no reusable contents go first in line to be taken.
      free_pos_[b] = has_hash_[b] ? free_list_.insert(free_list_.end(), b)
                                  : free_list_.insert(free_list_.begin(), b);
    }
  }
  seq.block_ids.clear();
  seq.block_hashes.clear();
}

}  // namespace deepinfer
