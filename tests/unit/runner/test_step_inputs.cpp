// build_step_inputs (eager and padded decode layouts) and DecodeGraphs' shapes.
#include <gtest/gtest.h>

#include "core/error.h"
#include "runner/decode_graphs.h"
#include "runner/step_inputs.h"

namespace deepinfer {
namespace {

TEST(StepInputs, EagerLayoutHoldsTheSequencesArrays) {
  const std::vector<int32_t> a = {5, 6, 7, 8, 9}, b = {3, 4};
  const std::vector<int32_t> blocks_a = {7, 2}, blocks_b = {4};
  // a: tokens [2, 5) (3 new, context 5), b: token [1, 2) (decode, context 2), block size 4.
  std::vector<RunSeq> seqs = {{a, 2, 3, blocks_a, true}, {b, 1, 1, blocks_b, false}};
  std::vector<int32_t> buf(4096, -7);
  StepHostInfo info;
  const StepLayout l = build_step_inputs(seqs, 4, nullptr, buf.data(), 4096, info);
  ASSERT_EQ(l.num_tokens, 4);
  ASSERT_EQ(l.num_seqs, 2);
  ASSERT_EQ(l.num_logits, 1);
  ASSERT_EQ(l.max_blocks, 2);
  EXPECT_EQ(l.positions % 64, 0);
  EXPECT_EQ(std::vector<int32_t>(buf.begin() + l.token_ids, buf.begin() + l.token_ids + 4),
            (std::vector<int32_t>{7, 8, 9, 4}));
  EXPECT_EQ(std::vector<int32_t>(buf.begin() + l.positions, buf.begin() + l.positions + 4),
            (std::vector<int32_t>{2, 3, 4, 1}));
  // slot = block * 4 + offset: positions 2, 3 in block 7, 4 in block 2; b's 1 in block 4.
  EXPECT_EQ(std::vector<int32_t>(buf.begin() + l.slots, buf.begin() + l.slots + 4),
            (std::vector<int32_t>{30, 31, 8, 17}));
  EXPECT_EQ(std::vector<int32_t>(buf.begin() + l.query_start, buf.begin() + l.query_start + 3),
            (std::vector<int32_t>{0, 3, 4}));
  EXPECT_EQ(std::vector<int32_t>(buf.begin() + l.seq_lens, buf.begin() + l.seq_lens + 2),
            (std::vector<int32_t>{5, 2}));
  EXPECT_EQ(buf[l.logits_indices], 2);
  EXPECT_EQ(std::vector<int32_t>(buf.begin() + l.block_tables, buf.begin() + l.block_tables + 4),
            (std::vector<int32_t>{7, 2, 4, 0}));
  EXPECT_EQ(info.max_query_len, 3);
  EXPECT_EQ(info.max_seq_len, 5);
  EXPECT_EQ(info.host_query_start, (std::vector<int32_t>{0, 3, 4}));
  EXPECT_EQ(info.host_seq_lens, (std::vector<int32_t>{5, 2}));
}

TEST(StepInputs, PaddedDecodeRowsAreHarmless) {
  const std::vector<int32_t> a = {5, 6, 7}, b = {3, 4, 2, 9, 1};
  const std::vector<int32_t> blocks_a = {1}, blocks_b = {3, 6};
  std::vector<RunSeq> seqs = {{a, 2, 1, blocks_a, true}, {b, 4, 1, blocks_b, true}};
  DecodePadding pad{4, 8, 32};
  std::vector<int32_t> buf(4096, -7);
  StepHostInfo info;
  const StepLayout l = build_step_inputs(seqs, 4, &pad, buf.data(), 4096, info);
  ASSERT_EQ(l.num_tokens, 4);
  ASSERT_EQ(l.num_seqs, 4);
  ASSERT_EQ(l.num_logits, 4);
  ASSERT_EQ(l.max_blocks, 8);
  EXPECT_EQ(std::vector<int32_t>(buf.begin() + l.token_ids, buf.begin() + l.token_ids + 4),
            (std::vector<int32_t>{7, 1, 0, 0}));
  EXPECT_EQ(std::vector<int32_t>(buf.begin() + l.slots, buf.begin() + l.slots + 4),
            (std::vector<int32_t>{6, 24, -1, -1}));
  EXPECT_EQ(std::vector<int32_t>(buf.begin() + l.seq_lens, buf.begin() + l.seq_lens + 4),
            (std::vector<int32_t>{3, 5, 1, 1}));
  EXPECT_EQ(std::vector<int32_t>(buf.begin() + l.logits_indices, buf.begin() + l.logits_indices + 4),
            (std::vector<int32_t>{0, 1, 2, 3}));
  for (int64_t i = 0; i < 4 * 8; ++i) {
    const int32_t want = i == 0 ? 1 : i == 8 ? 3 : i == 9 ? 6 : 0;
    EXPECT_EQ(buf[l.block_tables + i], want) << i;
  }
  EXPECT_EQ(info.max_seq_len, 32);
  EXPECT_EQ(info.max_query_len, 1);
  EXPECT_EQ(info.host_query_start, (std::vector<int32_t>{0, 1, 2, 3, 4}));
}

TEST(StepInputs, BadSequencesAndOverflowThrow) {
  const std::vector<int32_t> a = {5, 6, 7}, blocks = {1};
  std::vector<int32_t> buf(4096);
  StepHostInfo info;
  std::vector<RunSeq> past_end = {{a, 2, 2, blocks, true}};  // tokens [2, 4) of 3
  EXPECT_THROW(build_step_inputs(past_end, 4, nullptr, buf.data(), 4096, info), Error);
  std::vector<RunSeq> no_blocks = {{a, 0, 3, {}, true}};
  EXPECT_THROW(build_step_inputs(no_blocks, 4, nullptr, buf.data(), 4096, info), Error);
  std::vector<RunSeq> ok = {{a, 0, 3, blocks, true}};
  EXPECT_THROW(build_step_inputs(ok, 4, nullptr, buf.data(), 100, info), Error);  // capacity
  DecodePadding pad{2, 1, 4};
  EXPECT_THROW(build_step_inputs(ok, 4, &pad, buf.data(), 4096, info), Error);  // not decode
}

TEST(DecodeGraphs, BucketsAndShapes) {
  EXPECT_EQ(DecodeGraphs::batch_buckets(64),
            (std::vector<int>{1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64}));
  EXPECT_EQ(DecodeGraphs::batch_buckets(5), (std::vector<int>{1, 2, 4, 5}));
  const std::vector<int> big = DecodeGraphs::batch_buckets(256);
  EXPECT_EQ(big.back(), 256);
  EXPECT_TRUE(std::is_sorted(big.begin(), big.end()));

  DecodeGraphs g(40, /*max_blocks_per_seq=*/100, /*block_size=*/16);  // 1,600 tokens
  DecodePadding s = g.shape_for(3, 100);
  EXPECT_EQ(s.num_seqs, 4);
  EXPECT_EQ(s.max_blocks, 16);  // 256 tokens
  EXPECT_EQ(s.max_seq_len, 256);
  s = g.shape_for(33, 700);
  EXPECT_EQ(s.num_seqs, 40);
  EXPECT_EQ(s.max_seq_len, 1024);
  s = g.shape_for(8, 1500);  // 2048 capped at the table width
  EXPECT_EQ(s.max_blocks, 100);
  EXPECT_EQ(s.max_seq_len, 1600);
  EXPECT_EQ(g.shape_for(41, 10).num_seqs, 0);    // more rows than any bucket
  EXPECT_EQ(g.shape_for(1, 1601).num_seqs, 0);   // longer than a block table row
}

}  // namespace
}  // namespace deepinfer
