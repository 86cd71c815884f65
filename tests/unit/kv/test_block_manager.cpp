#include <gtest/gtest.h>

#include <numeric>
#include <random>
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

TEST(BlockManager, GrowTakesBlocksAndReleaseReturnsThem) {
  BlockManager bm(8, 4, true);
  KVBlocks a;
  EXPECT_TRUE(bm.can_grow(a, 9));
  bm.grow(a, 9);  // 3 blocks
  EXPECT_EQ(a.block_ids.size(), 3u);
  EXPECT_EQ(bm.num_free_blocks(), 5);
  bm.grow(a, 12);  // still 3
  EXPECT_EQ(a.block_ids.size(), 3u);
  EXPECT_FALSE(bm.can_grow(a, 33));
  EXPECT_THROW(bm.grow(a, 33), Error);
  bm.release(a);
  EXPECT_EQ(bm.num_free_blocks(), 8);
  EXPECT_TRUE(a.block_ids.empty());
}

TEST(BlockManager, PrefixHitSharesBlocksAndLeavesOneTokenToCompute) {
  BlockManager bm(16, 4, true);
  auto tokens = iota_tokens(10);
  KVBlocks a;
  EXPECT_EQ(bm.acquire_cached_prefix(tokens, a), 0);
  bm.grow(a, 10);
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

TEST(BlockManager, ChainedHashDependsOnParent) {
  BlockManager bm(16, 2, true);
  std::vector<int32_t> x = {1, 2, 3, 4, 5};
  std::vector<int32_t> y = {9, 9, 3, 4, 5};  // same second block, different first
  KVBlocks a;
  bm.grow(a, 5);
  bm.commit(x, 5, a);
  KVBlocks b;
  EXPECT_EQ(bm.acquire_cached_prefix(y, b), 0);
}

TEST(BlockManager, FreedCachedBlocksAreHitUntilEvictedLeastRecentlyUsedFirst) {
  BlockManager bm(4, 2, true);
  auto t1 = iota_tokens(5, 100);
  KVBlocks a;
  bm.grow(a, 5);
  bm.commit(t1, 5, a);  // blocks for [100,101],[102,103] cached; 3rd partial
  bm.release(a);
  EXPECT_EQ(bm.num_free_blocks(), 4);
  KVBlocks b;
  EXPECT_EQ(bm.acquire_cached_prefix(t1, b), 4);  // still cached after release
  bm.release(b);
  // Take 2 blocks: the never-cached ones go first, the cached ones survive.
  KVBlocks c;
  bm.grow(c, 4);
  KVBlocks d;
  EXPECT_EQ(bm.acquire_cached_prefix(t1, d), 4);
  bm.release(d);
  // Taking one more evicts the least recently used cached block (the tail block
  // was freed first), which breaks the chain after block 0.
  KVBlocks e;
  bm.grow(e, 2);
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
  bm.grow(a, 6);
  bm.commit(t, 6, a);
  KVBlocks b;
  EXPECT_EQ(bm.acquire_cached_prefix(t, b), 0);
}

TEST(BlockManager, DuplicateComputeStaysPrivate) {
  BlockManager bm(8, 2, true);
  auto t = iota_tokens(5);
  KVBlocks a, b;
  bm.grow(a, 5);
  bm.grow(b, 5);
  bm.commit(t, 5, a);
  bm.commit(t, 5, b);
  bm.release(b);  // b's blocks are unhashed: they go to the front
  KVBlocks c;
  EXPECT_EQ(bm.acquire_cached_prefix(t, c), 4);
  EXPECT_EQ(c.block_ids[0], a.block_ids[0]);
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
      if (!bm.can_grow(s, tokens.size())) {
        bm.release(s);
        continue;
      }
      bm.grow(s, tokens.size());
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
