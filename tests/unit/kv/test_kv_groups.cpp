// Block accounting over several KV layer groups (kv/kv_groups.h): expected tables and free
// counts are worked out by hand from the group rules in kv/block_manager.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "kv/block_manager.h"
#include "kv/kv_groups.h"
#include "kv/kv_sizing.h"

namespace deepinfer {
namespace {

std::vector<int32_t> iota_tokens(int n, int start = 100) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}

KvGroupSpec spec(const char* name, int layers, int64_t row, int tokens_per_row = 1, int window = 0) {
  KvGroupSpec g;
  g.name = name;
  g.num_layers = layers;
  g.row_dim = row;
  g.tokens_per_row = tokens_per_row;
  g.window = window;
  return g;
}

void write(BlockManager& bm, KVBlocks& seq, int64_t begin, int64_t end, std::vector<BlockCopy>* copies = nullptr) {
  std::vector<BlockCopy> local;
  bm.allocate_slots(seq, begin, end, copies ? *copies : local);
  if (!copies) {
    ASSERT_TRUE(local.empty());
  }
}

int count_null(const std::vector<int32_t>& ids) {
  return static_cast<int>(std::count(ids.begin(), ids.end(), kNullBlock));
}

// V3.2's shape: the latent and the indexer keys, both one row per token, one table each.
TEST(KvGroups, TwoFullGroupsKeepATableEachAndBothMustFit) {
  BlockManager bm({{16, 1, 0}, {6, 1, 0}}, 4, true);
  EXPECT_EQ(bm.num_groups(), 2);
  KVBlocks a;
  write(bm, a, 0, 10);  // 3 blocks in each group
  ASSERT_EQ(a.block_ids.size(), 3u);
  ASSERT_EQ(a.more_block_ids.size(), 1u);
  EXPECT_EQ(a.group(1).size(), 3u);
  EXPECT_EQ(bm.num_free_blocks(0), 13);
  EXPECT_EQ(bm.num_free_blocks(1), 3);
  EXPECT_EQ(bm.blocks_needed(a, 10, 20), 2 + 2);
  // Group 0 has room for 20 tokens, group 1 (6 blocks) does not: the step is refused.
  KVBlocks b;
  EXPECT_TRUE(bm.can_allocate_slots(b, 0, 12));
  EXPECT_FALSE(bm.can_allocate_slots(b, 0, 13));
  std::vector<BlockCopy> copies;
  EXPECT_THROW(bm.allocate_slots(b, 0, 13, copies), Error);
  EXPECT_EQ(bm.min_free_blocks(), 3);
  bm.release(a);
  EXPECT_EQ(bm.num_free_blocks(0), 16);
  EXPECT_EQ(bm.num_free_blocks(1), 6);
  EXPECT_TRUE(a.block_ids.empty() && a.more_block_ids.empty());
}

TEST(KvGroups, WindowGroupFreesBlocksThatLeftTheWindow) {
  // Group 1: window 8, block size 4. A step from token `begin` on reads back to
  // begin - 7, so block i is freed once 4 * (i + 1) <= begin - 7.
  BlockManager bm({{32, 1, 0}, {32, 1, 8}}, 4, false);
  KVBlocks a;
  write(bm, a, 0, 12);  // one prefill step: the window group holds all of it for now
  EXPECT_EQ(a.group(1).size(), 3u);
  EXPECT_EQ(count_null(a.group(1)), 0);
  for (int p = 12; p < 40; ++p) {
    const int freed = (p - 7) / 4;  // blocks [0, freed) lie wholly before p - 7
    const int fresh = p % 4 == 0 ? 1 : 0, freed_now = freed - count_null(a.group(1));
    EXPECT_EQ(bm.blocks_needed(1, a, p, p + 1), std::max(fresh - freed_now, 0)) << p;
    write(bm, a, p, p + 1);
    EXPECT_EQ(count_null(a.group(1)), freed) << p;
    EXPECT_EQ(static_cast<int>(a.group(1).size()), p / 4 + 1) << p;
    EXPECT_EQ(bm.num_free_blocks(1), 32 - (p / 4 + 1 - freed)) << p;
    EXPECT_EQ(count_null(a.block_ids), 0);  // the full group keeps everything
  }
  // After token 39 the window [32, 39] spans blocks 8 and 9: all others are back in the pool.
  EXPECT_EQ(bm.num_free_blocks(1), 32 - 2);
  EXPECT_EQ(bm.num_free_blocks(0), 32 - 10);
  bm.release(a);
  EXPECT_EQ(bm.num_free_blocks(1), 32);
}

TEST(KvGroups, CompressedGroupHoldsOneRowPerFourTokens) {
  // Group 1: one row per 4 tokens, 4 rows per block: a block covers 16 tokens.
  BlockManager bm({{32, 1, 0}, {8, 4, 0}}, 4, true);
  EXPECT_EQ(bm.table_blocks(1, 3), 0);   // no row complete
  EXPECT_EQ(bm.table_blocks(1, 4), 1);   // row 0
  EXPECT_EQ(bm.table_blocks(1, 16), 1);  // rows 0..3
  EXPECT_EQ(bm.table_blocks(1, 20), 2);  // rows 0..4
  EXPECT_EQ(bm.table_blocks(1, 37), 3);  // rows 0..8
  KVBlocks a;
  write(bm, a, 0, 3);
  EXPECT_EQ(a.group(1).size(), 0u);
  write(bm, a, 3, 37);
  EXPECT_EQ(a.block_ids.size(), 10u);
  EXPECT_EQ(a.group(1).size(), 3u);
  EXPECT_EQ(bm.num_free_blocks(1), 5);
  // Rows 9..11 fit the third block; row 12 (completed by token 51) needs a fourth.
  EXPECT_EQ(bm.blocks_needed(1, a, 37, 51), 0);
  EXPECT_EQ(bm.blocks_needed(1, a, 37, 52), 1);
  // Pool size for a cache of 100 blocks and 8 sequences: ceil(100 / 4) + 8.
  KvPoolLimits lim{4, 8, 64};
  EXPECT_EQ(kv_pool_blocks(spec("c", 1, 512, 4), 100, lim), 25 + 8);
  EXPECT_EQ(kv_pool_blocks(spec("c", 1, 512, 128), 100, lim), 1 + 8);
}

TEST(KvGroups, PrefixHitIsTheLongestPrefixEveryGroupServes) {
  // Full, compressed (2 tokens per row, a block = 8 tokens) and window 8 groups.
  BlockManager bm({{32, 1, 0}, {32, 2, 0}, {32, 1, 8}}, 4, true);
  const auto tokens = iota_tokens(21);
  KVBlocks a;
  write(bm, a, 0, 20);
  bm.commit(tokens, 20, a);
  EXPECT_EQ(a.block_hashes.size(), 5u);
  KVBlocks b;
  // Full: 5 blocks (20 tokens, one left to compute); compressed: blocks of 8 tokens, 2 full
  // (16 tokens); window: at 16 the next query reads from token 9, blocks 2 and 3.
  EXPECT_EQ(bm.acquire_cached_prefix(tokens, b), 16);
  ASSERT_EQ(b.block_ids.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(b.block_ids[i], a.block_ids[i]);
  ASSERT_EQ(b.group(1).size(), 2u);
  EXPECT_EQ(b.group(1)[0], a.group(1)[0]);
  EXPECT_EQ(b.group(1)[1], a.group(1)[1]);
  ASSERT_EQ(b.group(2).size(), 4u);
  EXPECT_EQ(b.group(2)[0], kNullBlock);
  EXPECT_EQ(b.group(2)[1], kNullBlock);
  EXPECT_EQ(b.group(2)[2], a.group(2)[2]);
  EXPECT_EQ(b.group(2)[3], a.group(2)[3]);
  EXPECT_EQ(bm.ref_count(2, a.group(2)[3]), 2);
  EXPECT_EQ(bm.ref_count(2, a.group(2)[0]), 1);
  EXPECT_EQ(b.block_hashes.size(), 4u);
  bm.release(b);
  bm.release(a);
  for (int g = 0; g < 3; ++g) EXPECT_EQ(bm.num_free_blocks(g), 32);
}

TEST(KvGroups, AWindowGroupThatLostItsBlocksLimitsTheHit) {
  BlockManager bm({{64, 1, 0}, {8, 1, 8}}, 4, true);
  const auto tokens = iota_tokens(40);
  KVBlocks a;
  write(bm, a, 0, 8);
  bm.commit(tokens, 8, a);
  for (int p = 8; p < 30; ++p) {  // the window moves on: blocks 0.. are freed (still hashed)
    write(bm, a, p, p + 1);
    bm.commit(tokens, p + 1, a);
  }
  EXPECT_EQ(a.group(1)[0], kNullBlock);
  // While the freed window blocks are still in the pool, a 13-token prompt hits 12 tokens.
  KVBlocks b;
  const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + 13);
  EXPECT_EQ(bm.acquire_cached_prefix(prompt, b), 12);
  bm.release(b);
  // Another sequence takes every free window block: the freed ones are evicted, and although
  // the full group still holds 3 blocks, no prefix is served by the window group.
  KVBlocks c;
  write(bm, c, 0, 4 * bm.num_free_blocks(1));
  EXPECT_EQ(bm.num_free_blocks(1), 0);
  bm.release(c);
  EXPECT_EQ(bm.acquire_cached_prefix(prompt, b), 0);
  EXPECT_TRUE(b.block_ids.empty());
}

// A model's prefill truncation (Model::prefill_truncation): window rows below a sequence's reuse
// floor are unwritten (or unlike full prefill's) in some layers, so its window blocks there never
// serve a prefix; full groups are unaffected.
TEST(KvGroups, WindowBlocksBelowTheReuseFloorServeNoPrefix) {
  BlockManager bm({{32, 1, 0}, {32, 1, 8}}, 4, true);
  const auto tokens = iota_tokens(41);
  KVBlocks a;
  write(bm, a, 0, 40);
  bm.commit(tokens, 40, a, /*window_floor=*/22);
  EXPECT_EQ(a.block_hashes.size(), 10u);
  // Window blocks 0-5 hold rows below 22 (block 5: rows 20-23): not registered. A hit at h needs
  // the window blocks from (h - 7) / 4: from 6 on, i.e. h >= 31, a multiple of 4 below 41: 40.
  KVBlocks b;
  EXPECT_EQ(bm.acquire_cached_prefix(tokens, b), 40);
  bm.release(b);
  const std::vector<int32_t> shorter(tokens.begin(), tokens.begin() + 30);
  EXPECT_EQ(bm.acquire_cached_prefix(shorter, b), 0);  // would read window blocks 5 and 6
  EXPECT_TRUE(b.block_ids.empty());
  // Without a floor the same prompt serves its 28-token prefix.
  KVBlocks c, d;
  BlockManager plain({{32, 1, 0}, {32, 1, 8}}, 4, true);
  write(plain, c, 0, 40);
  plain.commit(tokens, 40, c);
  EXPECT_EQ(plain.acquire_cached_prefix(shorter, d), 28);
  plain.release(d);
  plain.release(c);
  bm.release(a);
}

TEST(KvGroups, ForkSharesEveryGroupAndCopiesPerGroup) {
  BlockManager bm({{32, 1, 0}, {32, 1, 0}, {32, 4, 0}}, 4, true);
  KVBlocks parent;
  write(bm, parent, 0, 18);  // group 2: rows 0..3 -> 1 block
  KVBlocks child;
  EXPECT_EQ(bm.fork(parent, 17, child), 17);
  EXPECT_EQ(child.block_ids, std::vector<int32_t>(parent.block_ids.begin(), parent.block_ids.begin() + 5));
  EXPECT_EQ(child.group(1), std::vector<int32_t>(parent.group(1).begin(), parent.group(1).begin() + 5));
  EXPECT_EQ(child.group(2), parent.group(2));
  // The child writes token 17 into the shared partial block 4 of groups 0 and 1; its rows
  // of group 2 are complete (token 19 would end row 4, in a block of its own).
  std::vector<BlockCopy> copies;
  write(bm, child, 17, 18, &copies);
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_EQ(copies[0].group, 0);
  EXPECT_EQ(copies[0].src_block_id, parent.block_ids[4]);
  EXPECT_EQ(copies[1].group, 1);
  EXPECT_EQ(copies[1].src_block_id, parent.group(1)[4]);
  EXPECT_EQ(copies[1].dst_block_id, child.group(1)[4]);
  // Writing token 19 completes row 4: a fresh block of group 2, nothing copied.
  copies.clear();
  write(bm, child, 18, 20, &copies);
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(child.group(2).size(), 2u);
  EXPECT_EQ(bm.ref_count(2, child.group(2)[0]), 2);
  // A child that writes into the shared row block of group 2 copies it: fork at 10 tokens
  // (rows 0..1), then write tokens 10, 11 (ending row 2, in the same block).
  KVBlocks second;
  EXPECT_EQ(bm.fork(parent, 10, second), 10);
  copies.clear();
  write(bm, second, 10, 12, &copies);
  ASSERT_EQ(copies.size(), 3u);  // block 2 of groups 0 and 1 (tokens 8..11), row block 0 of group 2
  EXPECT_EQ(copies[2].group, 2);
  EXPECT_EQ(copies[2].src_block_id, parent.group(2)[0]);
  bm.release(second);
  bm.release(child);
  bm.release(parent);
  for (int g = 0; g < 3; ++g) EXPECT_EQ(bm.num_free_blocks(g), 32);
}

TEST(KvGroups, ForkRefusesWhenTheParentsWindowMovedPast) {
  BlockManager bm({{32, 1, 0}, {32, 1, 8}}, 4, false);
  KVBlocks parent;
  write(bm, parent, 0, 12);
  KVBlocks child;
  EXPECT_EQ(bm.fork(parent, 11, child), 11);  // window of token 11: blocks 1, 2
  EXPECT_EQ(child.group(1)[0], kNullBlock);
  EXPECT_EQ(child.group(1)[1], parent.group(1)[1]);
  bm.release(child);
  for (int p = 12; p < 24; ++p) write(bm, parent, p, p + 1);  // frees blocks 0..3
  EXPECT_EQ(bm.fork(parent, 11, child), 0);
  EXPECT_TRUE(child.block_ids.empty());
  bm.release(parent);
  EXPECT_EQ(bm.num_free_blocks(0), 32);
  EXPECT_EQ(bm.num_free_blocks(1), 32);
}

TEST(KvGroups, PoolSizesAndBytesByHand) {
  KvPoolLimits lim{16, 4, 256};
  // V3.2-like: 61 layers of latent 576 and of indexer keys 128, bf16 activations.
  const std::vector<KvGroupSpec> v32 = {spec("latent", 61, 576), spec("indexer_keys", 61, 128)};
  EXPECT_EQ(kv_cache_bytes(v32, DType::BF16, 10, lim), 10 * 61 * 16 * (576 + 128) * 2);
  const int64_t per_block = int64_t{61} * 16 * (576 + 128) * 2;
  EXPECT_EQ(kv_blocks_for_bytes(v32, DType::BF16, 1000 * per_block + per_block - 1, lim), 1000);
  // A window group: 4 sequences x (ceil(127 / 16) + 3) + 256 / 16 = 60 blocks, whatever the cache size.
  const KvGroupSpec window = spec("window", 2, 512, 1, 128);
  EXPECT_EQ(kv_pool_blocks(window, 1000, lim), 4 * 11 + 16);
  EXPECT_EQ(kv_pool_blocks(window, 30, lim), 30);  // never more than a full group would need
  // Fixed-width packed rows (bytes, U8) are not affected by the activation dtype.
  KvGroupSpec fp8 = spec("latent_fp8", 3, 656);
  fp8.activation_dtype = false;
  fp8.dtype = DType::U8;
  EXPECT_EQ(fp8.row_bytes(DType::F32), 656);
  const std::vector<KvGroupSpec> v4 = {window, spec("csa", 1, 512, 4), fp8};
  const int64_t bytes_100 = 60 * 2 * 16 * 512 * 4 + (25 + 4) * 1 * 16 * 512 * 4 + 100 * 3 * 16 * 656;
  EXPECT_EQ(kv_cache_bytes(v4, DType::F32, 100, lim), bytes_100);
  EXPECT_EQ(kv_blocks_for_bytes(v4, DType::F32, bytes_100, lim), 100);
  EXPECT_EQ(kv_blocks_for_bytes(v4, DType::F32, bytes_100 - 1, lim), 99);
  // Bad groups are refused naming them.
  try {
    kv_pool_blocks(spec("broken", 1, 0), 10, lim);
    FAIL() << "row_dim 0 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'broken'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(kv_pool_blocks(spec("w4", 1, 8, 4, 16), 10, lim), Error);  // a window on compressed rows
}

TEST(KvGroups, MemorySizingCountsEveryGroup) {
  KvMemoryBudget b;
  b.total_bytes = int64_t{100} << 30;
  b.free_bytes = int64_t{80} << 30;
  b.utilization = 0.5;
  b.block_size = 16;
  b.max_model_len = 4096;
  b.groups = {spec("latent", 61, 576), spec("indexer_keys", 61, 128)};
  b.activation = DType::BF16;
  b.limits = {16, 4, 256};
  const int64_t kv = (int64_t{50} << 30) - (int64_t{20} << 30);
  EXPECT_EQ(kv_blocks_for_memory(b), kv / (int64_t{61} * 16 * (576 + 128) * 2));
  // One group with bytes_per_block gives the same as the group list.
  KvMemoryBudget one = b;
  one.groups = {spec("latent", 61, 576)};
  KvMemoryBudget classic = b;
  classic.groups.clear();
  classic.bytes_per_block = int64_t{61} * 16 * 576 * 2;
  EXPECT_EQ(kv_blocks_for_memory(one), kv_blocks_for_memory(classic));
}

}  // namespace
}  // namespace deepinfer
