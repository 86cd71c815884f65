#include "kv/block_manager.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace deepinfer {
namespace {

bool holds_none(const KVBlocks& seq) {
  return seq.block_ids.empty() && std::all_of(seq.more_block_ids.begin(), seq.more_block_ids.end(),
                                              [](const std::vector<int32_t>& ids) { return ids.empty(); });
}

const std::vector<int32_t>& ids_of(const KVBlocks& seq, int g) {
  static const std::vector<int32_t> kEmpty;
  if (g == 0) return seq.block_ids;
  return static_cast<size_t>(g) <= seq.more_block_ids.size() ? seq.more_block_ids[static_cast<size_t>(g - 1)]
                                                              : kEmpty;
}

}  // namespace

BlockManager::BlockManager(int num_blocks, int block_size, bool enable_prefix_caching)
    : BlockManager(std::vector<KvGroupPool>{KvGroupPool{num_blocks, 1, 0}}, block_size, enable_prefix_caching) {}

BlockManager::BlockManager(std::vector<KvGroupPool> groups, int block_size, bool enable_prefix_caching)
    : block_size_(block_size), prefix_caching_(enable_prefix_caching), specs_(std::move(groups)) {
  DI_CHECK(!specs_.empty(), "KV cache: no KV group");
  DI_CHECK(block_size > 0, "KV cache: block_size must be > 0, got ", block_size);
  for (size_t g = 0; g < specs_.size(); ++g) {
    const KvGroupPool& spec = specs_[g];
    if (g == 0) DI_CHECK(spec.num_blocks > 0, "KV cache: num_blocks must be > 0, got ", spec.num_blocks);
    DI_CHECK(spec.num_blocks > 0 && spec.tokens_per_row >= 1 && spec.window >= 0 &&
                 (spec.window == 0 || spec.tokens_per_row == 1),
             "KV cache: group ", g, " needs num_blocks > 0, tokens_per_row >= 1 and a window only on one "
             "row per token, got ", spec.num_blocks, " blocks, tokens_per_row ", spec.tokens_per_row,
             ", window ", spec.window);
    Pool& p = pools_.emplace_back();
    const int n = spec.num_blocks;
    p.ref_counts.assign(n, 0);
    p.hash_of.assign(n, 0);
    p.has_hash.assign(n, false);
    p.cached.resize(n);
    p.free_pos.resize(n);
    p.free_lists.resize(1);
    for (int32_t b = 0; b < n; ++b) p.free_pos[b] = p.free_lists[0].insert(p.free_lists[0].end(), b);
    p.num_free = n;
  }
}

void BlockManager::set_partitions(int n) {
  DI_CHECK(n >= 1, "KV cache: ", n, " partitions");
  for (size_t g = 0; g < pools_.size(); ++g) {
    Pool& p = pools_[g];
    const int blocks = static_cast<int>(p.ref_counts.size());
    DI_CHECK(p.num_free == blocks, "KV cache: set_partitions after blocks were taken");
    DI_CHECK(blocks % n == 0, "KV cache: group ", g, "'s ", blocks, " blocks do not divide into ", n,
             " data-parallel partitions");
    p.free_lists.assign(static_cast<size_t>(n), {});
    for (int32_t b = 0; b < blocks; ++b)
      p.free_pos[b] = p.free_lists[static_cast<size_t>(b % n)].insert(p.free_lists[static_cast<size_t>(b % n)].end(), b);
  }
  partitions_ = n;
}

int BlockManager::partition_of(const KVBlocks& seq) const {
  if (seq.partition >= 0) return seq.partition;
  int best = 0;
  for (int q = 1; q < partitions_; ++q)
    if (num_free_blocks(0, q) > num_free_blocks(0, best)) best = q;
  return best;
}

int BlockManager::min_free_blocks() const {
  int m = num_free_blocks(0);
  for (int g = 1; g < num_groups(); ++g) m = std::min(m, num_free_blocks(g));
  return m;
}

int64_t BlockManager::rows_for(int g, int64_t num_tokens) const {
  return num_tokens / specs_[static_cast<size_t>(g)].tokens_per_row;
}

int BlockManager::table_blocks(int g, int64_t num_tokens) const {
  return static_cast<int>((rows_for(g, num_tokens) + block_size_ - 1) / block_size_);
}

int BlockManager::peak_blocks(int g, int64_t num_tokens, int max_step_tokens) const {
  const int all = table_blocks(g, num_tokens);
  const int window = specs_[static_cast<size_t>(g)].window;
  if (window == 0) return all;
  return std::min<int>(all, (window - 1 + block_size_ - 1) / block_size_ + 1 +
                                (std::max(max_step_tokens, 1) + block_size_ - 1) / block_size_ + 1);
}

std::pair<int64_t, int64_t> BlockManager::written_blocks(int g, int64_t begin, int64_t end) const {
  const int64_t r0 = rows_for(g, begin), r1 = rows_for(g, end);
  if (r0 >= r1) return {0, 0};
  return {r0 / block_size_, (r1 + block_size_ - 1) / block_size_};
}

int64_t BlockManager::first_kept_block(int g, int64_t next) const {
  const int window = specs_[static_cast<size_t>(g)].window;
  if (window == 0) return 0;
  return std::max<int64_t>(next - window + 1, 0) / block_size_;
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

int32_t BlockManager::take_free_block(Pool& p, int partition) {
  std::list<int32_t>& free_list = p.free_lists[static_cast<size_t>(partition)];
  DI_CHECK(!free_list.empty(), "KV cache: no free block", partitions_ > 1 ? " in this partition" : "");
  int32_t b = free_list.front();
  free_list.pop_front();
  --p.num_free;
  if (p.has_hash[b]) {  // evict its cached contents
    p.by_hash.erase(p.hash_of[b]);
    p.has_hash[b] = false;
    p.cached[b].tokens.clear();
  }
  p.ref_counts[b] = 1;
  return b;
}

void BlockManager::add_ref(Pool& p, int32_t b) const {
  if (p.ref_counts[b]++ == 0) {
    p.free_lists[static_cast<size_t>(b % partitions_)].erase(p.free_pos[b]);
    --p.num_free;
  }
}

void BlockManager::drop_ref(Pool& p, int32_t b) const {
  DI_CHECK(p.ref_counts[b] > 0, "KV cache: block ", b, " released more often than taken");
  if (--p.ref_counts[b] == 0) {
    // Blocks with no reusable contents go first in line to be taken.
    std::list<int32_t>& free_list = p.free_lists[static_cast<size_t>(b % partitions_)];
    p.free_pos[b] = p.has_hash[b] ? free_list.insert(free_list.end(), b) : free_list.insert(free_list.begin(), b);
    ++p.num_free;
  }
}

void BlockManager::check_seq(const KVBlocks& seq) const {
  DI_CHECK(seq.more_block_ids.size() <= specs_.size() - 1, "KV cache: a sequence with ",
           seq.more_block_ids.size() + 1, " block tables, the cache has ", specs_.size(), " groups");
}

int32_t BlockManager::lookup(int g, int64_t block, std::span<const uint64_t> hashes,
                             std::span<const int32_t> tokens, int partition) const {
  const int64_t n = specs_[static_cast<size_t>(g)].tokens_per_row;
  const int64_t j = (block + 1) * n - 1;  // its last token block
  if (j >= static_cast<int64_t>(hashes.size())) return -1;
  const Pool& p = pools_[static_cast<size_t>(g)];
  auto it = p.by_hash.find(hashes[j]);
  if (it == p.by_hash.end()) return -1;
  const Cached& c = p.cached[it->second];
  auto block_tokens = tokens.subspan(j * block_size_, block_size_);
  if (c.parent_hash != (j == 0 ? 0 : hashes[j - 1]) ||
      !std::equal(c.tokens.begin(), c.tokens.end(), block_tokens.begin(), block_tokens.end()))
    return -1;
  if (partition >= 0 && it->second % partitions_ != partition) return -1;
  return it->second;
}

bool BlockManager::group_serves(int g, int64_t num_tokens, std::span<const uint64_t> hashes,
                                std::span<const int32_t> tokens, int partition) const {
  const KvGroupPool& spec = specs_[static_cast<size_t>(g)];
  if (spec.window == 0) {
    const int64_t span = int64_t{spec.tokens_per_row} * block_size_;
    if (num_tokens % span != 0) return false;
    for (int64_t i = 0; i < num_tokens / span; ++i)
      if (lookup(g, i, hashes, tokens, partition) < 0) return false;
    return true;
  }
  for (int64_t i = first_kept_block(g, num_tokens); i < num_tokens / block_size_; ++i)
    if (lookup(g, i, hashes, tokens, partition) < 0) return false;
  return true;
}

int BlockManager::acquire_cached_prefix(std::span<const int32_t> tokens, KVBlocks& seq) {
  DI_CHECK(holds_none(seq), "KV cache: acquire_cached_prefix on a non-empty sequence");
  if (!prefix_caching_ || tokens.empty()) return 0;
  const int64_t max_blocks = (static_cast<int64_t>(tokens.size()) - 1) / block_size_;
  std::vector<uint64_t> hashes;
  uint64_t parent = 0;
  for (int64_t i = 0; i < max_blocks; ++i) {
    parent = chain_hash(parent, tokens.subspan(i * block_size_, block_size_));
    hashes.push_back(parent);
  }
  // Partitions: the chain is hit within the partition of group 0's first cached block.
  int partition = -1;
  if (partitions_ > 1) {
    const int32_t first = max_blocks > 0 ? lookup(0, 0, hashes, tokens) : -1;
    if (first < 0) return 0;
    partition = first % partitions_;
  }
  // The longest run every group without a window holds from the start bounds the hit ...
  int64_t hit = max_blocks * block_size_;
  for (int g = 0; g < num_groups(); ++g) {
    const KvGroupPool& spec = specs_[static_cast<size_t>(g)];
    if (spec.window > 0) continue;
    int64_t k = 0;
    while (lookup(g, k, hashes, tokens, partition) >= 0) ++k;
    hit = std::min(hit, k * spec.tokens_per_row * block_size_);
  }
  // ... then the longest prefix within it that every group serves (window groups only need
  // the blocks of their window, so a shorter prefix may be served where a longer is not).
  for (; hit > 0; hit -= block_size_) {
    bool all = true;
    for (int g = 0; g < num_groups() && all; ++g) all = group_serves(g, hit, hashes, tokens, partition);
    if (all) break;
  }
  if (hit <= 0) return 0;
  seq.more_block_ids.resize(specs_.size() - 1);
  for (int g = 0; g < num_groups(); ++g) {
    std::vector<int32_t>& ids = seq.group(g);
    Pool& p = pools_[static_cast<size_t>(g)];
    const int64_t keep = first_kept_block(g, hit);
    for (int64_t i = 0; i < table_blocks(g, hit); ++i) {
      if (i < keep) {
        ids.push_back(kNullBlock);
        continue;
      }
      const int32_t b = lookup(g, i, hashes, tokens, partition);
      DI_CHECK(b >= 0, "KV cache: prefix block ", i, " of group ", g, " vanished");
      add_ref(p, b);
      ids.push_back(b);
    }
  }
  hashes.resize(static_cast<size_t>(hit / block_size_));
  seq.block_hashes = std::move(hashes);
  if (partitions_ > 1) seq.partition = partition;
  return static_cast<int>(hit);
}

int BlockManager::fork(const KVBlocks& parent, int64_t num_tokens, KVBlocks& child) {
  DI_CHECK(holds_none(child), "KV cache: fork into a non-empty sequence");
  check_seq(parent);
  DI_CHECK(num_tokens >= 0, "KV cache: fork of ", num_tokens, " tokens");
  for (int g = 0; g < num_groups(); ++g) {
    const std::vector<int32_t>& ids = ids_of(parent, g);
    const int n = table_blocks(g, num_tokens);
    DI_CHECK(n <= static_cast<int>(ids.size()), "KV cache: fork of ", num_tokens,
             " tokens from a sequence with ", ids.size(), " blocks of ", block_size_,
             g == 0 ? std::string() : " in group " + std::to_string(g));
    for (int64_t i = first_kept_block(g, num_tokens); i < n; ++i)
      if (ids[static_cast<size_t>(i)] == kNullBlock) return 0;  // the parent's window moved past
  }
  child.more_block_ids.resize(specs_.size() - 1);
  for (int g = 0; g < num_groups(); ++g) {
    const std::vector<int32_t>& ids = ids_of(parent, g);
    std::vector<int32_t>& out = child.group(g);
    Pool& p = pools_[static_cast<size_t>(g)];
    const int64_t keep = first_kept_block(g, num_tokens);
    for (int64_t i = 0; i < table_blocks(g, num_tokens); ++i) {
      const int32_t b = i < keep ? kNullBlock : ids[static_cast<size_t>(i)];
      if (b != kNullBlock) add_ref(p, b);
      out.push_back(b);
    }
  }
  const size_t num_full = std::min(parent.block_hashes.size(), static_cast<size_t>(num_tokens / block_size_));
  child.block_hashes.assign(parent.block_hashes.begin(), parent.block_hashes.begin() + num_full);
  child.partition = parent.partition;
  return static_cast<int>(num_tokens);
}

int BlockManager::blocks_needed(int g, const KVBlocks& seq, int64_t begin, int64_t end) const {
  const std::vector<int32_t>& ids = ids_of(seq, g);
  const Pool& p = pools_[static_cast<size_t>(g)];
  const int64_t size = static_cast<int64_t>(ids.size());
  int64_t needed = std::max<int64_t>(table_blocks(g, end) - size, 0);
  const auto [first, last] = written_blocks(g, begin, end);
  for (int64_t i = first; i < std::min(last, size); ++i) {
    const int32_t b = ids[static_cast<size_t>(i)];
    needed += b != kNullBlock && p.ref_counts[b] > 1;
  }
  // Window blocks this step frees come back before it takes any.
  for (int64_t i = 0; i < std::min(first_kept_block(g, begin), size); ++i) {
    const int32_t b = ids[static_cast<size_t>(i)];
    needed -= b != kNullBlock && p.ref_counts[b] == 1;
  }
  return static_cast<int>(std::max<int64_t>(needed, 0));
}

int BlockManager::blocks_needed(const KVBlocks& seq, int64_t begin, int64_t end) const {
  int total = 0;
  for (int g = 0; g < num_groups(); ++g) total += blocks_needed(g, seq, begin, end);
  return total;
}

bool BlockManager::can_allocate_slots(const KVBlocks& seq, int64_t begin, int64_t end) const {
  check_seq(seq);
  const int part = partition_of(seq);
  for (int g = 0; g < num_groups(); ++g)
    if (blocks_needed(g, seq, begin, end) > num_free_blocks(g, part)) return false;
  return true;
}

void BlockManager::allocate_slots(KVBlocks& seq, int64_t begin, int64_t end, std::vector<BlockCopy>& copies) {
  DI_CHECK(0 <= begin && begin <= end, "KV cache: bad token range [", begin, ", ", end, ")");
  const int part = partition_of(seq);
  for (int g = 0; g < num_groups(); ++g)
    DI_CHECK(blocks_needed(g, seq, begin, end) <= num_free_blocks(g, part), "KV cache: writing tokens [", begin,
             ", ", end, ") needs ", blocks_needed(g, seq, begin, end), " blocks, only ", num_free_blocks(g, part),
             " free", g == 0 ? std::string() : " in group " + std::to_string(g),
             partitions_ > 1 ? " in partition " + std::to_string(part) : std::string());
  check_seq(seq);
  if (partitions_ > 1) seq.partition = part;
  seq.more_block_ids.resize(specs_.size() - 1);
  for (int g = 0; g < num_groups(); ++g) {
    std::vector<int32_t>& ids = seq.group(g);
    Pool& p = pools_[static_cast<size_t>(g)];
    const int64_t size = static_cast<int64_t>(ids.size());
    for (int64_t i = 0; i < std::min(first_kept_block(g, begin), size); ++i) {  // left the window
      int32_t& b = ids[static_cast<size_t>(i)];
      if (b == kNullBlock) continue;
      drop_ref(p, b);
      b = kNullBlock;
    }
    const auto [first, last] = written_blocks(g, begin, end);
    for (int64_t i = first; i < std::min(last, size); ++i) {
      const int32_t shared = ids[static_cast<size_t>(i)];
      DI_CHECK(shared != kNullBlock, "KV cache: group ", g, " writes into freed block ", i);
      if (p.ref_counts[shared] <= 1) continue;
      const int32_t copy = take_free_block(p, part);
      --p.ref_counts[shared];  // still >= 1: the other users keep it
      ids[static_cast<size_t>(i)] = copy;
      // A written block is no longer the registered full block (if it was one): the token
      // blocks it covers are hashed again when committed.
      const size_t first_token_block = static_cast<size_t>(i * specs_[static_cast<size_t>(g)].tokens_per_row);
      if (seq.block_hashes.size() > first_token_block) seq.block_hashes.resize(first_token_block);
      copies.push_back({shared, copy, g});
    }
    while (static_cast<int64_t>(ids.size()) < table_blocks(g, end)) ids.push_back(take_free_block(p, part));
  }
}

void BlockManager::commit(std::span<const int32_t> tokens, int64_t num_computed, KVBlocks& seq,
                          int64_t window_floor) {
  if (!prefix_caching_) return;
  check_seq(seq);
  const int64_t num_full =
      std::min<int64_t>(num_computed, static_cast<int64_t>(tokens.size())) / block_size_;
  for (int64_t j = static_cast<int64_t>(seq.block_hashes.size()); j < num_full; ++j) {
    const uint64_t parent = j == 0 ? 0 : seq.block_hashes[j - 1];
    auto block_tokens = tokens.subspan(j * block_size_, block_size_);
    const uint64_t h = chain_hash(parent, block_tokens);
    seq.block_hashes.push_back(h);
    for (int g = 0; g < num_groups(); ++g) {
      const int64_t n = specs_[static_cast<size_t>(g)].tokens_per_row;
      if ((j + 1) % n != 0) continue;  // token block j does not end a block of this group
      if (specs_[static_cast<size_t>(g)].window > 0 && j * block_size_ < window_floor) continue;
      const std::vector<int32_t>& ids = ids_of(seq, g);
      const int64_t i = (j + 1) / n - 1;
      if (i >= static_cast<int64_t>(ids.size()) || ids[static_cast<size_t>(i)] == kNullBlock) continue;
      const int32_t b = ids[static_cast<size_t>(i)];
      Pool& p = pools_[static_cast<size_t>(g)];
      // A block computed twice (two sequences sharing a prefix in the same step)
      // stays private; the first registered copy serves later hits.
      if (p.has_hash[b] || p.by_hash.count(h)) continue;
      p.by_hash[h] = b;
      p.hash_of[b] = h;
      p.has_hash[b] = true;
      p.cached[b] = Cached{parent, {block_tokens.begin(), block_tokens.end()}};
    }
  }
}

void BlockManager::release(KVBlocks& seq) {
  check_seq(seq);
  for (int g = 0; g < num_groups(); ++g) {
    const std::vector<int32_t>& ids = ids_of(seq, g);
    Pool& p = pools_[static_cast<size_t>(g)];
    for (auto it = ids.rbegin(); it != ids.rend(); ++it)
      if (*it != kNullBlock) drop_ref(p, *it);
  }
  seq.block_ids.clear();
  seq.block_hashes.clear();
  seq.more_block_ids.clear();
  seq.partition = -1;
}

}  // namespace deepinfer
