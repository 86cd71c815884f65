// Scheduler tests drive a simulated engine: a fake KV store records which token
// each cache slot holds, and before every step each scheduled sequence's whole
// context is read back through its block table. A block reused while still
// referenced, a wrong prefix hit or a lost token shows up as a mismatch.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <vector>

#include "core/error.h"
#include "sched/scheduler.h"

namespace deepinfer {
namespace {

struct Sim {
  int block_size;
  BlockManager blocks;
  Scheduler sched;
  std::vector<int32_t> slots;  // [num_blocks * block_size] token written there, -1 empty
  std::vector<std::unique_ptr<Sequence>> seqs;
  std::vector<int> target_outputs;
  int steps = 0, preemptions = 0, max_step_tokens = 0, max_step_seqs = 0, num_copies = 0;

  Sim(int num_blocks, int bs, SchedulerConfig cfg, bool prefix = true)
      : block_size(bs), blocks(num_blocks, bs, prefix), sched(cfg, blocks),
        slots(static_cast<size_t>(num_blocks) * bs, -1) {}

  Sequence* add(std::vector<int32_t> prompt, int num_outputs) {
    auto s = std::make_unique<Sequence>();
    s->seq_id = static_cast<int64_t>(seqs.size());
    s->token_ids = std::move(prompt);
    s->num_prompt_tokens = s->num_tokens();
    s->max_total_tokens = s->num_prompt_tokens + num_outputs;
    sched.add(s.get());
    target_outputs.push_back(num_outputs);
    seqs.push_back(std::move(s));
    return seqs.back().get();
  }
  int32_t slot(const Sequence& s, int pos) const {
    return s.kv.block_ids.at(pos / block_size) * block_size + pos % block_size;
  }
  // Next token: a function of the whole context, as a model's would be.
  static int32_t next_token(const std::vector<int32_t>& ctx) {
    uint64_t h = 1469598103934665603ull;
    for (int32_t t : ctx) h = (h ^ static_cast<uint32_t>(t)) * 1099511628211ull;
    return static_cast<int32_t>(h % 1000);
  }
  void step() {
    SchedulerOutput out = sched.schedule();
    preemptions += static_cast<int>(out.preempted.size());
    for (const BlockCopy& c : out.block_copies) {  // copy-on-write, before the "forward"
      std::copy_n(slots.begin() + int64_t{c.src_block_id} * block_size, block_size,
                  slots.begin() + int64_t{c.dst_block_id} * block_size);
      ++num_copies;
    }
    ASSERT_FALSE(out.empty()) << "no progress at step " << steps;
    ASSERT_LE(out.num_batched_tokens, cfg_tokens());
    int total = 0;
    for (auto& ss : out.seqs) {
      Sequence& s = *ss.seq;
      ASSERT_GT(ss.num_new_tokens, 0);
      ASSERT_LE(s.num_computed_tokens + ss.num_new_tokens, s.num_tokens());
      for (int p = 0; p < s.num_computed_tokens; ++p)  // context already cached
        ASSERT_EQ(slots[slot(s, p)], s.token_ids[p]) << "seq " << s.seq_id << " pos " << p;
      total += ss.num_new_tokens;
    }
    ASSERT_EQ(total, out.num_batched_tokens);
    max_step_tokens = std::max(max_step_tokens, total);
    max_step_seqs = std::max(max_step_seqs, static_cast<int>(out.seqs.size()));
    for (auto& ss : out.seqs)  // the "forward": store this step's tokens
      for (int p = ss.seq->num_computed_tokens; p < ss.seq->num_computed_tokens + ss.num_new_tokens; ++p)
        slots[slot(*ss.seq, p)] = ss.seq->token_ids[p];
    sched.on_step_done(out);
    for (auto& ss : out.seqs) {
      Sequence& s = *ss.seq;
      if (!ss.needs_sample) continue;
      s.token_ids.push_back(next_token(s.token_ids));
      if (s.num_output_tokens() >= target_outputs[s.seq_id]) sched.finish(&s);
    }
    ++steps;
  }
  int cfg_tokens_ = 0;
  int cfg_tokens() const { return cfg_tokens_; }
  void run(int max_steps = 1000000) {
    while (sched.has_unfinished() && steps < max_steps) {
      step();
      if (testing::Test::HasFatalFailure()) return;
    }
    ASSERT_FALSE(sched.has_unfinished());
  }
  // The tokens a sequence gets when generated alone, by construction of next_token.
  static std::vector<int32_t> solo(std::vector<int32_t> prompt, int n) {
    for (int i = 0; i < n; ++i) prompt.push_back(next_token(prompt));
    return prompt;
  }
};

std::vector<int32_t> random_prompt(std::mt19937& rng, int len, int vocab = 50) {
  std::vector<int32_t> p(len);
  for (auto& t : p) t = static_cast<int32_t>(rng() % vocab);
  return p;
}

void expect_all_match_solo(Sim& sim, const std::vector<std::vector<int32_t>>& prompts) {
  for (size_t i = 0; i < prompts.size(); ++i)
    ASSERT_EQ(sim.seqs[i]->token_ids, Sim::solo(prompts[i], sim.target_outputs[i])) << "seq " << i;
}

TEST(Scheduler, PrefillThenDecodeOneTokenPerStep) {
  SchedulerConfig cfg{4, 64};
  Sim sim(16, 4, cfg);
  sim.cfg_tokens_ = cfg.max_num_batched_tokens;
  sim.add({1, 2, 3, 4, 5}, 3);
  SchedulerOutput out = sim.sched.schedule();
  ASSERT_EQ(out.seqs.size(), 1u);
  EXPECT_EQ(out.seqs[0].num_new_tokens, 5);
  EXPECT_TRUE(out.seqs[0].needs_sample);
  sim.sched.on_step_done(out);
  sim.seqs[0]->token_ids.push_back(7);
  out = sim.sched.schedule();
  EXPECT_EQ(out.seqs[0].num_new_tokens, 1);
  EXPECT_EQ(out.seqs[0].seq->kv.block_ids.size(), 2u);
}

TEST(Scheduler, ChunkedPrefillUnderBudgetOfOneBlock) {
  SchedulerConfig cfg{8, 4};  // budget = one block of 4 tokens
  Sim sim(64, 4, cfg);
  sim.cfg_tokens_ = cfg.max_num_batched_tokens;
  std::mt19937 rng(1);
  std::vector<std::vector<int32_t>> prompts;
  for (int len : {1, 3, 4, 5, 17, 40}) prompts.push_back(random_prompt(rng, len));
  for (auto& p : prompts) sim.add(p, 5);
  // First step: only the first 4 tokens of the budget are used.
  SchedulerOutput first = sim.sched.schedule();
  EXPECT_EQ(first.num_batched_tokens, 4);
  // Undo nothing: treat it as a normal step by running it through the sim.
  for (auto& ss : first.seqs)
    for (int p = 0; p < ss.num_new_tokens; ++p)
      sim.slots[sim.slot(*ss.seq, ss.seq->num_computed_tokens + p)] = ss.seq->token_ids[ss.seq->num_computed_tokens + p];
  sim.sched.on_step_done(first);
  for (auto& ss : first.seqs)
    if (ss.needs_sample) ss.seq->token_ids.push_back(Sim::next_token(ss.seq->token_ids));
  sim.run();
  expect_all_match_solo(sim, prompts);
  EXPECT_LE(sim.max_step_tokens, 4);
}

TEST(Scheduler, SequenceCapIsRespected) {
  SchedulerConfig cfg{2, 1000};
  Sim sim(256, 4, cfg);
  sim.cfg_tokens_ = cfg.max_num_batched_tokens;
  std::mt19937 rng(2);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 20; ++i) prompts.push_back(random_prompt(rng, 1 + rng() % 9));
  for (auto& p : prompts) sim.add(p, 1 + static_cast<int>(rng() % 6));
  sim.run();
  EXPECT_LE(sim.max_step_seqs, 2);
  expect_all_match_solo(sim, prompts);
}

TEST(Scheduler, ManyTinyRequests) {
  SchedulerConfig cfg{64, 32};
  Sim sim(40, 2, cfg);
  sim.cfg_tokens_ = cfg.max_num_batched_tokens;
  std::mt19937 rng(3);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 500; ++i) prompts.push_back(random_prompt(rng, 1 + rng() % 2, 3));
  for (auto& p : prompts) sim.add(p, 1 + static_cast<int>(rng() % 3));
  sim.run();
  expect_all_match_solo(sim, prompts);
}

TEST(Scheduler, PreemptionByRecomputeFinishesEverything) {
  SchedulerConfig cfg{16, 64};
  Sim sim(12, 4, cfg);  // 48 token slots for 16 concurrent sequences: preemption is certain
  sim.cfg_tokens_ = cfg.max_num_batched_tokens;
  std::mt19937 rng(4);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 60; ++i) prompts.push_back(random_prompt(rng, 1 + rng() % 20));
  for (auto& p : prompts) sim.add(p, 1 + static_cast<int>(rng() % 20));
  sim.run();
  EXPECT_GT(sim.preemptions, 0);
  expect_all_match_solo(sim, prompts);
  EXPECT_EQ(sim.blocks.num_free_blocks(), 12);
}

// --dp 2: the KV pool in two partitions (one data-parallel rank's each): every sequence's blocks
// stay in one partition, preemption frees blocks where they are needed, and every sequence still
// gets its solo tokens.
TEST(Scheduler, PartitionedPoolKeepsEachSequenceOnOneRank) {
  SchedulerConfig cfg{16, 64};
  Sim sim(12, 4, cfg);  // 6 blocks per partition for 16 concurrent sequences: preemption is certain
  sim.blocks.set_partitions(2);
  sim.cfg_tokens_ = cfg.max_num_batched_tokens;
  std::mt19937 rng(6);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 60; ++i) prompts.push_back(random_prompt(rng, 1 + rng() % 12, 4));
  for (auto& p : prompts) sim.add(p, 1 + static_cast<int>(rng() % 10));
  std::vector<int> used(2, 0);
  while (sim.sched.has_unfinished() && sim.steps < 100000) {
    sim.step();
    if (HasFatalFailure()) return;
    for (const auto& seq : sim.seqs) {
      const std::vector<int32_t>& ids = seq->kv.block_ids;
      if (ids.empty()) continue;
      for (int32_t b : ids) ASSERT_EQ(b % 2, ids[0] % 2) << "seq " << seq->seq_id << " spans both partitions";
      ASSERT_EQ(seq->kv.partition, ids[0] % 2);
      ++used[static_cast<size_t>(ids[0] % 2)];
    }
  }
  ASSERT_FALSE(sim.sched.has_unfinished());
  EXPECT_GT(sim.preemptions, 0);
  EXPECT_GT(used[0], 0);
  EXPECT_GT(used[1], 0);
  expect_all_match_solo(sim, prompts);
  EXPECT_EQ(sim.blocks.num_free_blocks(), 12);
}

TEST(Scheduler, PreemptionWithoutPrefixCaching) {
  SchedulerConfig cfg{8, 16};
  Sim sim(10, 4, cfg, /*prefix=*/false);
  sim.cfg_tokens_ = cfg.max_num_batched_tokens;
  std::mt19937 rng(5);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 40; ++i) prompts.push_back(random_prompt(rng, 1 + rng() % 30));
  for (auto& p : prompts) sim.add(p, 1 + static_cast<int>(rng() % 9));
  sim.run();
  EXPECT_GT(sim.preemptions, 0);
  expect_all_match_solo(sim, prompts);
}

TEST(Scheduler, SharedPrefixIsReusedAfterTheFirstComputesIt) {
  SchedulerConfig cfg{8, 1000};
  Sim sim(64, 4, cfg);
  sim.cfg_tokens_ = cfg.max_num_batched_tokens;
  std::mt19937 rng(6);
  auto prefix = random_prompt(rng, 33);
  sim.add(prefix, 2);
  sim.run();
  auto p2 = prefix;
  p2.push_back(7);
  Sequence* s = sim.add(p2, 2);
  sim.run();
  EXPECT_EQ(s->num_cached_prompt_tokens, 32);
  EXPECT_EQ(s->token_ids, Sim::solo(p2, 2));
}

TEST(Scheduler, SamplesWaitForTheFirstPromptThenShareIt) {
  SchedulerConfig cfg{8, 1000};
  Sim sim(64, 4, cfg);
  sim.cfg_tokens_ = cfg.max_num_batched_tokens;
  std::mt19937 rng(7);
  auto prompt = random_prompt(rng, 21);
  Sequence* first = sim.add(prompt, 3);
  Sequence* second = sim.add(prompt, 3);
  second->wait_for_prompt_of = first;
  SchedulerOutput out = sim.sched.schedule();
  ASSERT_EQ(out.seqs.size(), 1u);  // the second waits
  sim.sched.on_step_done(out);
  first->token_ids.push_back(Sim::next_token(first->token_ids));
  for (int p = 0; p < 21; ++p) sim.slots[sim.slot(*first, p)] = first->token_ids[p];
  sim.run();
  EXPECT_EQ(second->num_cached_prompt_tokens, 20);
  EXPECT_EQ(second->token_ids, first->token_ids);
}

// n = 3 on a prompt of 23 tokens (block size 4: block 5 holds tokens 20..22):
// the samples fork the first one's blocks once its prompt is computed, compute
// only token 22 themselves, and each copies the shared partial block 5.
TEST(Scheduler, SamplesForkThePromptAndCopyThePartialBlock) {
  for (bool prefix_caching : {true, false}) {
    SchedulerConfig cfg{8, 1000};
    Sim sim(64, 4, cfg, prefix_caching);
    sim.cfg_tokens_ = cfg.max_num_batched_tokens;
    std::mt19937 rng(9);
    auto prompt = random_prompt(rng, 23);
    Sequence* first = sim.add(prompt, 4);
    Sequence* second = sim.add(prompt, 4);
    Sequence* third = sim.add(prompt, 4);
    second->wait_for_prompt_of = first;
    third->wait_for_prompt_of = first;
    sim.step();  // the first's prompt only
    EXPECT_EQ(first->num_computed_tokens, 23);
    EXPECT_EQ(second->status, SeqStatus::Waiting);
    SchedulerOutput out = sim.sched.schedule();
    ASSERT_EQ(out.seqs.size(), 3u);
    for (const ScheduledSeq& ss : out.seqs) EXPECT_EQ(ss.num_new_tokens, 1);
    EXPECT_EQ(second->num_computed_tokens, 22);
    ASSERT_EQ(out.block_copies.size(), 2u);
    EXPECT_EQ(out.block_copies[0].src_block_id, first->kv.block_ids[5]);
    EXPECT_EQ(out.block_copies[1].src_block_id, first->kv.block_ids[5]);
    EXPECT_EQ(second->kv.block_ids[4], first->kv.block_ids[4]);  // full blocks stay shared
    EXPECT_NE(second->kv.block_ids[5], first->kv.block_ids[5]);
    EXPECT_NE(third->kv.block_ids[5], second->kv.block_ids[5]);
    EXPECT_EQ(second->num_cached_prompt_tokens, 22);
    // Finish the run through the simulator (copies applied, contexts checked).
    for (Sequence* s : {first, second, third}) sim.sched.finish(s);
    EXPECT_EQ(sim.blocks.num_free_blocks(), 64);
  }
}

TEST(Scheduler, ForkedSamplesMatchSoloRuns) {
  for (int len : {1, 4, 5, 8, 23, 40}) {
    SchedulerConfig cfg{6, 7};  // chunked prefill; samples join mid-stream
    Sim sim(40, 4, cfg, len % 2 == 0);
    sim.cfg_tokens_ = cfg.max_num_batched_tokens;
    std::mt19937 rng(static_cast<uint32_t>(len));
    auto prompt = random_prompt(rng, len);
    Sequence* first = sim.add(prompt, 6);
    for (int i = 1; i < 4; ++i) sim.add(prompt, 6)->wait_for_prompt_of = first;
    sim.run();
    if (HasFatalFailure()) return;
    for (auto& s : sim.seqs) EXPECT_EQ(s->token_ids, Sim::solo(prompt, 6)) << "prompt " << len;
    EXPECT_EQ(sim.num_copies, (len - 1) % 4 != 0 ? 3 : 0) << "prompt " << len;  // token len-1 lands in a shared block
    EXPECT_EQ(sim.blocks.num_free_blocks(), 40);
  }
}

TEST(Scheduler, RejectsSequencesThatCanNeverFit) {
  BlockManager blocks(4, 4, true);
  Scheduler sched({4, 16}, blocks);
  Sequence s;
  s.token_ids = std::vector<int32_t>(10, 1);
  s.num_prompt_tokens = 10;
  s.max_total_tokens = 17;  // 5 blocks > 4
  EXPECT_THROW(sched.add(&s), Error);
  Sequence empty;
  EXPECT_THROW(sched.add(&empty), Error);
}

TEST(Scheduler, AbortWhileWaitingOrRunningReleasesBlocks) {
  SchedulerConfig cfg{4, 8};
  Sim sim(16, 4, cfg);
  sim.cfg_tokens_ = cfg.max_num_batched_tokens;
  Sequence* a = sim.add(std::vector<int32_t>(20, 3), 4);
  Sequence* b = sim.add(std::vector<int32_t>(5, 4), 4);
  sim.step();  // a gets a chunk; b waits
  EXPECT_EQ(a->status, SeqStatus::Running);
  sim.sched.finish(a);
  sim.sched.finish(b);
  EXPECT_FALSE(sim.sched.has_unfinished());
  EXPECT_EQ(sim.blocks.num_free_blocks(), 16);
}

// Random adversarial mixes: tiny caches, tiny budgets, long prompts, shared prefixes.
TEST(Scheduler, RandomConfigurationsMatchSoloRuns) {
  std::mt19937 rng(8);
  int total_copies = 0;
  for (int trial = 0; trial < 30; ++trial) {
    int bs = 1 + static_cast<int>(rng() % 5);
    SchedulerConfig cfg{1 + static_cast<int>(rng() % 8), 1 + static_cast<int>(rng() % 40)};
    int num_blocks = 8 + static_cast<int>(rng() % 40);
    Sim sim(num_blocks, bs, cfg, rng() % 2);
    sim.cfg_tokens_ = cfg.max_num_batched_tokens;
    auto shared = random_prompt(rng, 12, 5);
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 25; ++i) {
      int max_len = num_blocks * bs / 2;
      auto p = rng() % 2 ? shared : std::vector<int32_t>{};
      auto tail = random_prompt(rng, 1 + static_cast<int>(rng() % max_len), 5);
      p.insert(p.end(), tail.begin(), tail.end());
      if (static_cast<int>(p.size()) > max_len) p.resize(max_len);
      const int num_outputs = 1 + static_cast<int>(rng() % std::max(1, num_blocks * bs - max_len));
      Sequence* first = sim.add(p, num_outputs);
      prompts.push_back(p);
      for (int k = rng() % 4 == 0 ? 1 + static_cast<int>(rng() % 3) : 0; k > 0; --k, ++i) {
        sim.add(p, num_outputs)->wait_for_prompt_of = first;  // n > 1: forked samples
        prompts.push_back(p);
      }
    }
    sim.run();
    if (HasFatalFailure()) return;
    expect_all_match_solo(sim, prompts);
    EXPECT_EQ(sim.blocks.num_free_blocks(), num_blocks);
    total_copies += sim.num_copies;
  }
  EXPECT_GT(total_copies, 0);
}

}  // namespace
}  // namespace deepinfer

namespace deepinfer {
namespace {

// Drafts (Sequence::num_draft_tokens): a verify step schedules them like tokens, computed
// positions stop at the verified ones, no block is hashed over a draft, and budget or KV
// shortage drops drafts before anything else.
TEST(SchedulerDrafts, VerifyStepCountsOnlyVerifiedTokensAndHashesNoDraft) {
  BlockManager blocks(8, 4, true);
  Scheduler sched({4, 64}, blocks);
  Sequence s;
  s.token_ids = {1, 2, 3, 4, 5, 6, 7};
  s.num_prompt_tokens = 7;
  s.max_total_tokens = 20;
  sched.add(&s);
  SchedulerOutput p = sched.schedule();
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].num_new_tokens, 7);
  sched.on_step_done(p);
  s.token_ids.push_back(8);  // sampled
  // Drafts at positions 8..11 fill block [8, 12) once computed.
  s.token_ids.insert(s.token_ids.end(), {90, 100, 110, 120});
  s.num_draft_tokens = 4;
  p = sched.schedule();
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].num_new_tokens, 5);  // 1 + k
  EXPECT_TRUE(p.seqs[0].needs_sample);
  sched.on_step_done(p);
  EXPECT_EQ(s.num_computed_tokens, 8);  // stops at the verified tokens
  // The engine verifies: drafts out, one accepted (90) plus the target's own token (99).
  s.drop_drafts(4);
  s.token_ids.insert(s.token_ids.end(), {90, 99});
  sched.on_drafts_verified(&s, 1);
  EXPECT_EQ(s.num_computed_tokens, 9);
  // Blocks [0, 4) and [4, 8) are committed; [8, 12), computed over drafts, is not.
  Sequence other;
  other.token_ids = {1, 2, 3, 4, 5, 6, 7, 8, 90, 100, 110, 120, 5};
  other.num_prompt_tokens = 13;
  KVBlocks kv;
  EXPECT_EQ(blocks.acquire_cached_prefix(other.token_ids, kv), 8);
  blocks.release(kv);
}

TEST(SchedulerDrafts, DraftsAreDroppedFirstWhenTheBudgetIsShort) {
  BlockManager blocks(16, 4, false);
  Scheduler sched({4, 6}, blocks);
  Sequence a, b;
  for (Sequence* s : {&a, &b}) {
    s->token_ids = {1, 2};
    s->num_prompt_tokens = 2;
    s->max_total_tokens = 30;
    sched.add(s);
  }
  SchedulerOutput p = sched.schedule();
  sched.on_step_done(p);
  for (Sequence* s : {&a, &b}) {
    s->token_ids.insert(s->token_ids.end(), {3, 4, 5, 6});  // sampled 3, drafts 4 5 6
    s->num_draft_tokens = 3;
  }
  p = sched.schedule();  // budget 6: a gets 1 + 3, b keeps 1 + 1
  ASSERT_EQ(p.seqs.size(), 2u);
  EXPECT_EQ(p.seqs[0].num_new_tokens, 4);
  EXPECT_EQ(p.seqs[1].num_new_tokens, 2);
  EXPECT_EQ(b.num_draft_tokens, 1);
  EXPECT_EQ(b.token_ids, (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_TRUE(p.seqs[1].needs_sample);
}

}  // namespace
}  // namespace deepinfer
