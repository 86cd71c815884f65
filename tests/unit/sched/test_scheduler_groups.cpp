// The scheduler over a cache of two KV groups: admission asks every group, and a group that
// runs short preempts even when the other has room; preemption and finish give back every
// group's blocks.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "sched/scheduler.h"

namespace deepinfer {
namespace {

std::unique_ptr<Sequence> make_seq(int64_t id, int prompt_len, int max_total) {
  auto s = std::make_unique<Sequence>();
  s->seq_id = id;
  for (int i = 0; i < prompt_len; ++i) s->token_ids.push_back(static_cast<int32_t>(10 * id + i));
  s->num_prompt_tokens = prompt_len;
  s->max_total_tokens = max_total;
  return s;
}

TEST(SchedulerKvGroups, AShortGroupPreemptsAndEveryGroupGetsItsBlocksBack) {
  // Group 1 (e.g. indexer keys) has 6 blocks of 4 tokens, group 0 plenty.
  BlockManager blocks({{64, 1, 0}, {6, 1, 0}}, 4, false);
  Scheduler sched({4, 64}, blocks);
  std::vector<std::unique_ptr<Sequence>> seqs;
  for (int i = 0; i < 3; ++i) {
    seqs.push_back(make_seq(i, 8, 20));
    sched.add(seqs.back().get());
  }
  SchedulerOutput first = sched.schedule();
  ASSERT_EQ(first.seqs.size(), 3u);  // 2 blocks each in both groups
  EXPECT_EQ(blocks.num_free_blocks(1), 0);
  EXPECT_EQ(blocks.num_free_blocks(0), 64 - 6);
  sched.on_step_done(first);
  for (auto& s : seqs) s->token_ids.push_back(1);
  // Token 8 needs a third block in each group: group 1 has none, so the youngest goes.
  SchedulerOutput second = sched.schedule();
  ASSERT_EQ(second.preempted.size(), 1u);
  EXPECT_EQ(second.preempted[0], seqs[2].get());
  EXPECT_EQ(second.seqs.size(), 2u);
  EXPECT_TRUE(seqs[2]->kv.block_ids.empty());
  EXPECT_TRUE(seqs[2]->kv.more_block_ids.empty());
  EXPECT_EQ(seqs[0]->kv.group(1).size(), 3u);
  EXPECT_EQ(blocks.num_free_blocks(1), 0);
  EXPECT_EQ(blocks.num_free_blocks(0), 64 - 6);  // group 0 had room: only group 1 forced it
  for (auto& s : seqs) sched.finish(s.get());
  EXPECT_EQ(blocks.num_free_blocks(0), 64);
  EXPECT_EQ(blocks.num_free_blocks(1), 6);
}

TEST(SchedulerKvGroups, RefusesASequenceThatNoGroupCouldHold) {
  BlockManager blocks({{64, 1, 0}, {4, 1, 0}, {64, 1, 8}}, 4, false);
  Scheduler sched({4, 64}, blocks);
  auto fits = make_seq(0, 8, 16);  // 4 blocks of group 1
  EXPECT_NO_THROW(sched.add(fits.get()));
  auto too_long = make_seq(1, 8, 17);  // 5 blocks of group 1; the window group needs only its window
  try {
    sched.add(too_long.get());
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("in KV group 1"), std::string::npos) << e.what();
  }
  sched.finish(fits.get());
}

}  // namespace
}  // namespace deepinfer
