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

// A model's prefill truncation floors (RunSeq::replay_floor) reach the host info per sequence,
// 0 for padding sequences; none set: no floors at all.
TEST(StepInputs, ReplayFloorsReachTheHostInfo) {
  const std::vector<int32_t> a = {5, 6, 7, 8, 9}, b = {3, 4};
  const std::vector<int32_t> blocks_a = {7, 2}, blocks_b = {4};
  std::vector<RunSeq> seqs = {{a, 2, 3, blocks_a, true}, {b, 1, 1, blocks_b, false}};
  std::vector<int32_t> buf(4096, -7);
  StepHostInfo info;
  build_step_inputs(seqs, 4, nullptr, buf.data(), 4096, info);
  EXPECT_TRUE(info.host_replay_floor.empty());
  seqs[1].replay_floor = 1;
  build_step_inputs(seqs, 4, nullptr, buf.data(), 4096, info);
  EXPECT_EQ(info.host_replay_floor, (std::vector<int32_t>{0, 1}));
  DecodePadding pad{4, 8, 32};
  seqs = {{a, 4, 1, blocks_a, true, 1, {}, 3}, {b, 1, 1, blocks_b, true}};
  build_step_inputs(seqs, 4, &pad, buf.data(), 4096, info);
  EXPECT_EQ(info.host_replay_floor, (std::vector<int32_t>{3, 0, 0, 0}));
  seqs[0].replay_floor = -1;
  EXPECT_THROW(build_step_inputs(seqs, 4, nullptr, buf.data(), 4096, info), Error);
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

namespace deepinfer {
namespace {

// A verify step of 1 + k = 3 tokens per sequence padded for a graph: the real sequences'
// tokens and logits rows first, then padding sequences of 3 tokens at positions 0..2 with
// no KV store and a context of 3 (causal inside the run, as a real verify run is).
TEST(StepInputs, PaddedVerifyStepHasQTokensPerSequence) {
  const std::vector<int32_t> a = {5, 6, 7, 8, 9}, b = {3, 4, 2, 9, 1, 6};
  const std::vector<int32_t> blocks_a = {1, 2}, blocks_b = {3, 6};
  // a: positions [2, 5) after 2 cached; b: [3, 6) after 3 cached; block size 4.
  std::vector<RunSeq> seqs = {{a, 2, 3, blocks_a, true, 3}, {b, 3, 3, blocks_b, true, 3}};
  DecodePadding pad{4, 8, 32, 3};
  std::vector<int32_t> buf(4096, -7);
  StepHostInfo info;
  const StepLayout l = build_step_inputs(seqs, 4, &pad, buf.data(), 4096, info);
  ASSERT_EQ(l.num_tokens, 12);
  ASSERT_EQ(l.num_seqs, 4);
  ASSERT_EQ(l.num_logits, 12);
  ASSERT_EQ(l.max_blocks, 8);
  auto span_of = [&](int64_t off, int64_t n) { return std::vector<int32_t>(buf.begin() + off, buf.begin() + off + n); };
  EXPECT_EQ(span_of(l.token_ids, 12), (std::vector<int32_t>{7, 8, 9, 9, 1, 6, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(span_of(l.positions, 12), (std::vector<int32_t>{2, 3, 4, 3, 4, 5, 0, 1, 2, 0, 1, 2}));
  EXPECT_EQ(span_of(l.slots, 12), (std::vector<int32_t>{6, 7, 8, 15, 24, 25, -1, -1, -1, -1, -1, -1}));
  EXPECT_EQ(span_of(l.query_start, 5), (std::vector<int32_t>{0, 3, 6, 9, 12}));
  EXPECT_EQ(span_of(l.seq_lens, 4), (std::vector<int32_t>{5, 6, 3, 3}));
  std::vector<int32_t> all(12);
  for (int i = 0; i < 12; ++i) all[i] = i;
  EXPECT_EQ(span_of(l.logits_indices, 12), all);  // every row, real ones first in token order
  EXPECT_EQ(info.max_query_len, 3);
  EXPECT_EQ(info.max_seq_len, 32);
  EXPECT_EQ(info.host_seq_lens, (std::vector<int32_t>{5, 6, 3, 3}));

  // Not uniform: a sequence with another token count, or without a logits row per token.
  std::vector<RunSeq> mixed = {{a, 2, 3, blocks_a, true, 3}, {b, 4, 2, blocks_b, true, 2}};
  EXPECT_THROW(build_step_inputs(mixed, 4, &pad, buf.data(), 4096, info), Error);
  std::vector<RunSeq> last_only = {{a, 2, 3, blocks_a, true, 1}};
  EXPECT_THROW(build_step_inputs(last_only, 4, &pad, buf.data(), 4096, info), Error);
}

TEST(DecodeGraphs, VerifyShapesAreKeyedByTokensPerSequence) {
  // 40 sequences, 64 tokens (= logits rows) per padded step.
  DecodeGraphs g(40, /*max_blocks_per_seq=*/100, /*block_size=*/16, /*max_tokens=*/64);
  DecodePadding s = g.shape_for(3, 4, 300);  // 3 sequences of 1 + 3 tokens
  EXPECT_EQ(s.num_seqs, 4);
  EXPECT_EQ(s.tokens_per_seq, 4);
  EXPECT_EQ(s.max_blocks, 32);  // 512 tokens
  EXPECT_EQ(s.max_seq_len, 512);
  EXPECT_EQ(g.shape_for(16, 4, 300).num_seqs, 16);  // 64 tokens: fits
  EXPECT_EQ(g.shape_for(17, 4, 300).num_seqs, 0);   // bucket 24 x 4 = 96 tokens > 64
  EXPECT_EQ(g.shape_for(40, 1, 300).num_seqs, 40);  // decode keeps its buckets
  EXPECT_EQ(g.shape_for(3, 0, 300).num_seqs, 0);
  EXPECT_EQ(g.shape_for(3, 300).tokens_per_seq, 1);
  // Graphs of one batch bucket and width but other tokens per sequence are other graphs.
  auto backend = make_cpu_backend();
  const DecodePadding decode = g.shape_for(3, 300), verify = g.shape_for(3, 4, 300);
  ASSERT_EQ(decode.max_blocks, verify.max_blocks);
  g.add(*backend, decode, 5, {0, 0});
  EXPECT_EQ(g.find(*backend, decode, {0, 0}), 5);
  EXPECT_EQ(g.find(*backend, verify, {0, 0}), -1);
  g.add(*backend, verify, 6, {0, 0});
  EXPECT_EQ(g.find(*backend, verify, {0, 0}), 6);
  g.mark_failed(verify);
  EXPECT_TRUE(g.failed(verify));
  EXPECT_FALSE(g.failed(decode));
  EXPECT_EQ(g.find(*backend, decode, {1, 0}), -1);  // a new workspace epoch releases all
  EXPECT_EQ(g.num_live(), 0);
  // Without max_tokens a padded step holds at most max_num_seqs tokens.
  DecodeGraphs d(40, 100, 16);
  EXPECT_EQ(d.shape_for(10, 4, 100).num_seqs, 0);  // 16 x 4 > 40
  EXPECT_EQ(d.shape_for(8, 4, 100).num_seqs, 8);
}

}  // namespace
}  // namespace deepinfer
