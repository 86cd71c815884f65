#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "core/error.h"
#include "kv/block_manager.h"

namespace deepinfer {
namespace {

std::vector<int32_t> iota_tokens(int n, int start = 0) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}

// Makes room for tokens up to `num_tokens` after those the blocks already hold
// (no sharing involved: no copies expected).
void grow(BlockManager& bm, KVBlocks& seq, int64_t num_tokens) {
  std::vector<BlockCopy> copies;
  const int64_t held = static_cast<int64_t>(seq.block_ids.size()) * bm.block_size();
  bm.allocate_slots(seq, std::min(held, num_tokens), num_tokens, copies);
  ASSERT_TRUE(copies.empty());
}

TEST(BlockManager, GrowTakesBlocksAndReleaseReturnsThem) {
  BlockManager bm(8, 4, true);
  KVBlocks a;
  EXPECT_TRUE(bm.can_allocate_slots(a, 0, 9));
  grow(bm, a, 9);  // 3 blocks
  EXPECT_EQ(a.block_ids.size(), 3u);
  EXPECT_EQ(bm.num_free_blocks(), 5);
  grow(bm, a, 12);  // still 3
  EXPECT_EQ(a.block_ids.size(), 3u);
  EXPECT_FALSE(bm.can_allocate_slots(a, 12, 33));
  std::vector<BlockCopy> copies;
  EXPECT_THROW(bm.allocate_slots(a, 12, 33, copies), Error);
  bm.release(a);
  EXPECT_EQ(bm.num_free_blocks(), 8);
  EXPECT_TRUE(a.block_ids.empty());
}

TEST(BlockManager, PrefixHitSharesBlocksAndLeavesOneTokenToCompute) {
  BlockManager bm(16, 4, true);
  auto tokens = iota_tokens(10);
  KVBlocks a;
  EXPECT_EQ(bm.acquire_cached_prefix(tokens, a), 0);
  grow(bm, a, 10);
  bm.commit(tokens, 10, a);  // blocks 0,1 full; block 2 partial
  EXPECT_EQ(a.block_hashes.size(), 2u);

  KVBlocks b;
  EXPECT_EQ(bm.acquire_cached_prefix(tokens, b), 8);
  ASSERT_EQ(b.block_ids.size(), 2u);
  EXPECT_EQ(b.block_ids[0], a.block_ids[0]);
  EXPECT_EQ(b.block_ids[1], a.block_ids[1]);
  EXPECT_EQ(bm.ref_count(a.block_ids[0]), 2);

  // Exactly 8 tokens: only the first block may be reused (one token must be computed).
  KVBlocks c;
  EXPECT_EQ(bm.acquire_cached_prefix(std::span(tokens).first(8), c), 4);
  // A different second block diverges after the first.
  auto other = tokens;
  other[5] = 99;
  KVBlocks d;
  EXPECT_EQ(bm.acquire_cached_prefix(other, d), 4);
  bm.release(b);
  bm.release(c);
  bm.release(d);
  EXPECT_EQ(bm.ref_count(a.block_ids[0]), 1);
}

// --dp 2: blocks b % 2 form two partitions (one data-parallel rank's pool each); a sequence's
// blocks all come from one, a new one from the partition with more free blocks, a prefix hit and a
// fork from their source's, and a partition's shortage is its own.
TEST(BlockManager, PartitionsKeepASequenceOnOneRank) {
  BlockManager bm(12, 4, true);  // 6 blocks per partition
  bm.set_partitions(2);
  EXPECT_EQ(bm.partition_blocks(), 6);
  auto part = [](const KVBlocks& s) {
    std::set<int> p;
    for (int32_t b : s.block_ids) p.insert(b % 2);
    return p;
  };
  auto t = iota_tokens(10);
  KVBlocks a, b;
  grow(bm, a, 10);  // 3 blocks from partition 0 (both free: the lowest)
  EXPECT_EQ(part(a), std::set<int>{0});
  EXPECT_EQ(a.partition, 0);
  EXPECT_EQ(bm.num_free_blocks(0, 0), 3);
  EXPECT_EQ(bm.partition_of(b), 1);  // the one with more free blocks
  grow(bm, b, 17);                   // 5 blocks from partition 1
  EXPECT_EQ(part(b), std::set<int>{1});
  EXPECT_EQ(bm.num_free_blocks(), 4);
  // 4 free blocks in all, but a's partition has 3: a cannot grow by 4 blocks.
  EXPECT_FALSE(bm.can_allocate_slots(a, 10, 10 + 16));
  EXPECT_TRUE(bm.can_allocate_slots(a, 10, 10 + 8));
  // A prefix hit stays in the partition of the cached chain.
  bm.commit(t, 10, a);
  KVBlocks c;
  EXPECT_EQ(bm.acquire_cached_prefix(t, c), 8);
  EXPECT_EQ(c.partition, 0);
  grow(bm, c, 10);
  EXPECT_EQ(part(c), std::set<int>{0});
  // A fork shares the parent's partition.
  KVBlocks d;
  EXPECT_EQ(bm.fork(b, 17, d), 17);
  EXPECT_EQ(d.partition, 1);
  std::vector<BlockCopy> copies;
  bm.allocate_slots(d, 16, 18, copies);  // the shared partial block copied within partition 1
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src_block_id % 2, 1);
  EXPECT_EQ(copies[0].dst_block_id % 2, 1);
  for (KVBlocks* s : {&a, &b, &c, &d}) bm.release(*s);
  EXPECT_EQ(bm.num_free_blocks(), 12);
  EXPECT_EQ(a.partition, -1);
  // Not after blocks are taken, and only when the pool divides.
  KVBlocks e;
  grow(bm, e, 1);
  EXPECT_THROW(bm.set_partitions(2), Error);
  BlockManager odd(7, 4, true);
  EXPECT_THROW(odd.set_partitions(2), Error);
}

// A chain cached half in each partition (its blocks registered by sequences of both) is hit only
// as far as the first block's partition holds it.
TEST(BlockManager, PartitionedPrefixHitStopsAtAnotherPartition) {
  BlockManager bm(8, 2, true);
  bm.set_partitions(2);
  auto t = iota_tokens(5);
  KVBlocks a, b;
  grow(bm, a, 2);  // partition 0, token block 0
  bm.commit(t, 2, a);
  grow(bm, b, 5);  // partition 1 (more free), token blocks 0 and 1 computed again
  EXPECT_EQ(b.partition, 1);
  bm.commit(t, 4, b);  // block 0's hash is a's already; block 1's is registered from b
  KVBlocks c;
  EXPECT_EQ(bm.acquire_cached_prefix(t, c), 2);  // a's block 0 only: b's block 1 is in partition 1
  EXPECT_EQ(c.partition, 0);
  EXPECT_EQ(c.block_ids, std::vector<int32_t>{a.block_ids[0]});
}

TEST(BlockManager, ChainedHashDependsOnParent) {
  BlockManager bm(16, 2, true);
  std::vector<int32_t> x = {1, 2, 3, 4, 5};
  std::vector<int32_t> y = {9, 9, 3, 4, 5};  // same second block, different first
  KVBlocks a;
  grow(bm, a, 5);
  bm.commit(x, 5, a);
  KVBlocks b;
  EXPECT_EQ(bm.acquire_cached_prefix(y, b), 0);
}

TEST(BlockManager, FreedCachedBlocksAreHitUntilEvictedLeastRecentlyUsedFirst) {
  BlockManager bm(4, 2, true);
  auto t1 = iota_tokens(5, 100);
  KVBlocks a;
  grow(bm, a, 5);
  bm.commit(t1, 5, a);  // blocks for [100,101],[102,103] cached; 3rd partial
  bm.release(a);
  EXPECT_EQ(bm.num_free_blocks(), 4);
  KVBlocks b;
  EXPECT_EQ(bm.acquire_cached_prefix(t1, b), 4);  // still cached after release
  bm.release(b);
  // Take 2 blocks: the never-cached ones go first, the cached ones survive.
  KVBlocks c;
  grow(bm, c, 4);
  KVBlocks d;
  EXPECT_EQ(bm.acquire_cached_prefix(t1, d), 4);
  bm.release(d);
  // Taking one more evicts the least recently used cached block (the tail block
  // was freed first), which breaks the chain after block 0.
  KVBlocks e;
  grow(bm, e, 2);
  KVBlocks f;
  int hit = bm.acquire_cached_prefix(t1, f);
  EXPECT_EQ(hit, 2);
  bm.release(f);
  bm.release(e);
  bm.release(c);
  EXPECT_EQ(bm.num_free_blocks(), 4);
}

TEST(BlockManager, DisabledPrefixCachingNeverHits) {
  BlockManager bm(8, 2, false);
  auto t = iota_tokens(6);
  KVBlocks a;
  grow(bm, a, 6);
  bm.commit(t, 6, a);
  KVBlocks b;
  EXPECT_EQ(bm.acquire_cached_prefix(t, b), 0);
}

TEST(BlockManager, DuplicateComputeStaysPrivate) {
  BlockManager bm(8, 2, true);
  auto t = iota_tokens(5);
  KVBlocks a, b;
  grow(bm, a, 5);
  grow(bm, b, 5);
  bm.commit(t, 5, a);
  bm.commit(t, 5, b);
  bm.release(b);  // b's blocks are unhashed: they go to the front
  KVBlocks c;
  EXPECT_EQ(bm.acquire_cached_prefix(t, c), 4);
  EXPECT_EQ(c.block_ids[0], a.block_ids[0]);
}

// n > 1: a fork shares the partial last block; the first write into it by
// either holder goes to a fresh block after a copy of the shared one.
TEST(BlockManager, ForkSharesPartialBlockAndChildCopiesOnFirstWrite) {
  BlockManager bm(16, 4, true);
  auto tokens = iota_tokens(10);
  KVBlocks parent;
  grow(bm, parent, 10);
  bm.commit(tokens, 10, parent);  // blocks 0,1 full and hashed; block 2 holds tokens 8,9
  KVBlocks child;
  EXPECT_EQ(bm.fork(parent, 9, child), 9);
  ASSERT_EQ(child.block_ids, parent.block_ids);
  EXPECT_EQ(child.block_hashes, parent.block_hashes);
  for (int32_t b : parent.block_ids) EXPECT_EQ(bm.ref_count(b), 2);
  EXPECT_EQ(bm.num_free_blocks(), 13);
  // The child recomputes token 9 (its own logits): block 2 is shared -> one copy.
  EXPECT_EQ(bm.blocks_needed(child, 9, 10), 1);
  std::vector<BlockCopy> copies;
  bm.allocate_slots(child, 9, 10, copies);
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src_block_id, parent.block_ids[2]);
  EXPECT_EQ(copies[0].dst_block_id, child.block_ids[2]);
  EXPECT_NE(child.block_ids[2], parent.block_ids[2]);
  EXPECT_EQ(child.block_ids[0], parent.block_ids[0]);
  EXPECT_EQ(bm.ref_count(parent.block_ids[2]), 1);
  EXPECT_EQ(bm.ref_count(child.block_ids[2]), 1);
  // Now private to each: further writes copy nothing, the next block is fresh.
  copies.clear();
  bm.allocate_slots(parent, 10, 13, copies);
  bm.allocate_slots(child, 10, 13, copies);
  EXPECT_TRUE(copies.empty());
  EXPECT_NE(parent.block_ids[3], child.block_ids[3]);
  bm.release(child);
  bm.release(parent);
  EXPECT_EQ(bm.num_free_blocks(), 16);
  for (int b = 0; b < 16; ++b) EXPECT_EQ(bm.ref_count(b), 0);
}

TEST(BlockManager, ParentWritingFirstCopiesAndChildKeepsTheOriginal) {
  BlockManager bm(8, 4, false);
  KVBlocks parent, child;
  grow(bm, parent, 6);
  bm.fork(parent, 5, child);  // shares blocks 0 and 1 (tokens 4, 5 in block 1)
  const int32_t shared = parent.block_ids[1];
  std::vector<BlockCopy> copies;
  EXPECT_EQ(bm.blocks_needed(parent, 6, 7), 1);
  bm.allocate_slots(parent, 6, 7, copies);
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src_block_id, shared);
  EXPECT_EQ(child.block_ids[1], shared);
  EXPECT_EQ(parent.block_ids[1], copies[0].dst_block_id);
  EXPECT_EQ(bm.ref_count(shared), 1);
  EXPECT_EQ(bm.ref_count(parent.block_ids[0]), 2);  // the full block stays shared
  copies.clear();
  bm.allocate_slots(child, 5, 6, copies);  // sole holder now: no copy
  EXPECT_TRUE(copies.empty());
}

TEST(BlockManager, ForkAtBlockBoundaryCopiesNothing) {
  BlockManager bm(8, 4, true);
  KVBlocks parent, child;
  grow(bm, parent, 9);
  bm.fork(parent, 8, child);  // two full blocks; token 8 goes to a fresh block
  EXPECT_EQ(child.block_ids.size(), 2u);
  std::vector<BlockCopy> copies;
  EXPECT_EQ(bm.blocks_needed(child, 8, 9), 1);
  bm.allocate_slots(child, 8, 9, copies);
  EXPECT_TRUE(copies.empty());
  EXPECT_NE(child.block_ids[2], parent.block_ids[2]);
  KVBlocks too_long;
  EXPECT_THROW(bm.fork(parent, 13, too_long), Error);
  EXPECT_THROW(bm.fork(parent, 4, child), Error);  // child not empty
}

TEST(BlockManager, CopyNeedsAFreeBlock) {
  BlockManager bm(2, 4, false);
  KVBlocks parent, child;
  grow(bm, parent, 6);  // both blocks
  bm.fork(parent, 5, child);
  EXPECT_FALSE(bm.can_allocate_slots(child, 5, 6));
  std::vector<BlockCopy> copies;
  EXPECT_THROW(bm.allocate_slots(child, 5, 6, copies), Error);
  bm.release(parent);  // the child is the only holder: writes in place
  EXPECT_TRUE(bm.can_allocate_slots(child, 5, 6));
}

// Random forks and writes against a slot-level model of the cache: every copy
// is applied to the model, every write goes to the writer's blocks; a holder
// must always read back its own tokens, so no write ever lands in a block
// another sequence still reads.
TEST(BlockManager, RandomForksAndWritesNeverClobberASharedBlock) {
  const int num_blocks = 24, bs = 4;
  BlockManager bm(num_blocks, bs, false);
  std::vector<std::vector<int32_t>> slots(num_blocks, std::vector<int32_t>(bs, -1));
  struct Seq {
    KVBlocks kv;
    std::vector<int32_t> tokens;  // written so far
  };
  std::vector<Seq> live;
  std::mt19937 rng(21);
  int next_token = 0, num_copies = 0;
  auto write = [&](Seq& s, int n) {
    const int64_t begin = static_cast<int64_t>(s.tokens.size());
    if (!bm.can_allocate_slots(s.kv, begin, begin + n)) return;
    std::vector<BlockCopy> copies;
    bm.allocate_slots(s.kv, begin, begin + n, copies);
    for (const BlockCopy& c : copies) slots[c.dst_block_id] = slots[c.src_block_id];
    num_copies += static_cast<int>(copies.size());
    for (int i = 0; i < n; ++i) {
      const int64_t p = begin + i;
      slots[s.kv.block_ids[p / bs]][p % bs] = next_token;
      s.tokens.push_back(next_token++);
    }
  };
  for (int step = 0; step < 3000; ++step) {
    const int op = static_cast<int>(rng() % 4);
    if (op == 0 && live.size() < 8) {
      live.push_back({});
      write(live.back(), 1 + static_cast<int>(rng() % 9));
    } else if (op == 1 && !live.empty() && live.size() < 8) {
      Seq& p = live[rng() % live.size()];
      if (p.tokens.empty()) continue;
      Seq c;
      const int64_t n = 1 + static_cast<int64_t>(rng() % p.tokens.size());
      bm.fork(p.kv, n, c.kv);
      c.tokens.assign(p.tokens.begin(), p.tokens.begin() + n);
      live.push_back(std::move(c));
    } else if (op == 2 && !live.empty()) {
      write(live[rng() % live.size()], 1 + static_cast<int>(rng() % 5));
    } else if (!live.empty()) {
      const size_t i = rng() % live.size();
      bm.release(live[i].kv);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
    std::vector<int> holders(num_blocks, 0);
    for (const Seq& s : live) {
      for (int32_t b : s.kv.block_ids) holders[b]++;
      for (size_t p = 0; p < s.tokens.size(); ++p)
        ASSERT_EQ(slots[s.kv.block_ids[p / bs]][p % bs], s.tokens[p]) << "step " << step;
    }
    for (int b = 0; b < num_blocks; ++b) ASSERT_EQ(bm.ref_count(b), holders[b]) << "block " << b;
  }
  EXPECT_GT(num_copies, 50);
}

// Random workload against an independent model of the invariants: reference
// counts equal the number of holders, free count = blocks with no holder.
TEST(BlockManager, RandomWorkloadKeepsCountsConsistent) {
  const int num_blocks = 32, block_size = 3;
  BlockManager bm(num_blocks, block_size, true);
  std::mt19937 rng(7);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back(iota_tokens(20, i % 2 ? 0 : 1000 * i));
  std::vector<KVBlocks> live;
  std::vector<std::vector<int32_t>> live_tokens;
  for (int step = 0; step < 2000; ++step) {
    if (!live.empty() && (rng() % 3 == 0)) {
      size_t i = rng() % live.size();
      bm.release(live[i]);
      live.erase(live.begin() + i);
      live_tokens.erase(live_tokens.begin() + i);
    } else {
      auto tokens = prompts[rng() % prompts.size()];
      tokens.resize(1 + rng() % tokens.size());
      KVBlocks s;
      int hit = bm.acquire_cached_prefix(tokens, s);
      ASSERT_LT(hit, static_cast<int>(tokens.size()));
      ASSERT_EQ(hit % block_size, 0);
      if (!bm.can_allocate_slots(s, hit, tokens.size())) {
        bm.release(s);
        continue;
      }
      grow(bm, s, tokens.size());
      bm.commit(tokens, tokens.size(), s);
      live.push_back(s);
      live_tokens.push_back(tokens);
    }
    std::vector<int> holders(num_blocks, 0);
    for (auto& s : live)
      for (int32_t b : s.block_ids) holders[b]++;
    int free = 0;
    for (int b = 0; b < num_blocks; ++b) {
      ASSERT_EQ(bm.ref_count(b), holders[b]) << "block " << b << " step " << step;
      free += holders[b] == 0;
    }
    ASSERT_EQ(bm.num_free_blocks(), free);
  }
  // Two holders of the same block must agree on its tokens (prefix reuse is exact).
  std::vector<std::vector<int32_t>> content(num_blocks);
  for (size_t i = 0; i < live.size(); ++i) {
    for (size_t j = 0; j < live[i].block_hashes.size(); ++j) {
      std::vector<int32_t> blk(live_tokens[i].begin() + j * block_size,
                               live_tokens[i].begin() + (j + 1) * block_size);
      auto& c = content[live[i].block_ids[j]];
      if (c.empty()) c = blk;
      ASSERT_EQ(c, blk);
    }
  }
}

}  // namespace
}  // namespace deepinfer
