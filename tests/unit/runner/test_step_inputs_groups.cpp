// build_step_inputs with several KV groups: every group's table and slots, by hand.
#include <gtest/gtest.h>

#include "core/error.h"
#include "runner/step_inputs.h"

namespace deepinfer {
namespace {

KvGroupSpec group(const char* name, int tokens_per_row, int window = 0) {
  KvGroupSpec g;
  g.name = name;
  g.num_layers = 1;
  g.row_dim = 8;
  g.tokens_per_row = tokens_per_row;
  g.window = window;
  return g;
}

TEST(StepInputsGroups, EveryGroupGetsItsTableAndSlots) {
  const std::vector<KvGroupSpec> groups = {group("latent", 1), group("compressed", 2), group("window", 1, 4)};
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7};
  // Tokens [3, 7) of a 7-token sequence, block size 2. Compressed rows: token p ends row
  // (p + 1) / 2 - 1 when p is odd (rows 1, 2 here); window table with block 0 freed.
  const std::vector<int32_t> latent = {9, 3, 5, 0};
  const std::vector<std::vector<int32_t>> more = {{6, 1}, {-1, 7, 2, 8}};
  std::vector<RunSeq> seqs = {{tokens, 3, 4, latent, true, 1, more}};
  std::vector<int32_t> buf(4096, -7);
  StepHostInfo info;
  const StepLayout l = build_step_inputs(seqs, 2, nullptr, buf.data(), 4096, info, groups);
  ASSERT_EQ(l.num_groups, 3);
  ASSERT_EQ(l.max_blocks, 4);
  auto slice = [&](int64_t at, int64_t n) { return std::vector<int32_t>(buf.begin() + at, buf.begin() + at + n); };
  // Group 0: positions 3..6 in blocks 3 (pos 3), 5 (4, 5), 0 (6).
  EXPECT_EQ(slice(l.slots, 4), (std::vector<int32_t>{7, 10, 11, 0}));
  // Group 1: position 3 ends row 1 (block 6, offset 1) -> 13; 5 ends row 2 (block 1, offset 0) -> 2.
  EXPECT_EQ(slice(l.group_slots, 4), (std::vector<int32_t>{13, -1, 2, -1}));
  // Group 2: like group 0 over its own blocks 7 (pos 3), 2 (4, 5), 8 (6).
  EXPECT_EQ(slice(l.group_slots + 4, 4), (std::vector<int32_t>{15, 4, 5, 16}));
  EXPECT_EQ(slice(l.block_tables, 4), latent);
  EXPECT_EQ(slice(l.group_tables, 4), (std::vector<int32_t>{6, 1, 0, 0}));
  EXPECT_EQ(slice(l.group_tables + 4, 4), (std::vector<int32_t>{-1, 7, 2, 8}));
  // A group table too short for its rows, or a missing table, names the sequence.
  const std::vector<std::vector<int32_t>> short_compressed = {{6}, more[1]};
  seqs[0].more_block_ids = short_compressed;
  EXPECT_THROW(build_step_inputs(seqs, 2, nullptr, buf.data(), 4096, info, groups), Error);
  seqs[0].more_block_ids = {};
  EXPECT_THROW(build_step_inputs(seqs, 2, nullptr, buf.data(), 4096, info, groups), Error);
}

}  // namespace
}  // namespace deepinfer
