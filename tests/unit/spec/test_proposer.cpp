// NgramProposer lookup rules, MtpProposer's row plan and DsparkProposer's blocks (against recording
// executors).
#include <gtest/gtest.h>

#include <cmath>
#include <deque>

#include "spec/proposer.h"
#include "spec/verify_schedule.h"

namespace deepinfer {
namespace {

TEST(NgramProposer, ProposesWhatFollowedTheLatestMatch) {
  const std::vector<int32_t> t = {1, 2, 3, 9, 1, 2, 3, 8, 7, 1, 2, 3};
  // Longest suffix first: "1 2 3" last seen at 4, followed by 8 7 1.
  EXPECT_EQ(NgramProposer::lookup(t, 3, 1, 3), (std::vector<int32_t>{8, 7, 1}));
  EXPECT_EQ(NgramProposer::lookup(t, 1, 1, 3), (std::vector<int32_t>{8}));
  EXPECT_EQ(NgramProposer::lookup(t, 10, 1, 3), (std::vector<int32_t>{8, 7, 1, 2, 3}));
  EXPECT_TRUE(NgramProposer::lookup({{4, 5, 6}}, 3, 1, 3).empty());  // no earlier match
  EXPECT_TRUE(NgramProposer::lookup(t, 0, 1, 3).empty());
  EXPECT_THROW(NgramProposer(0, 2), std::exception);
}

// DSpark: one block per sequence whose last token is sampled and not computed; drafts and the
// confidence head's confidences cut to max_drafts and at a draft that is no token.
class RecordingBlocks final : public BlockDraftExecutor {
 public:
  std::vector<BlockDraftSeq> seen;
  void draft_blocks(std::span<const BlockDraftSeq> seqs, std::vector<Proposal>& out) override {
    out.assign(seqs.size(), Proposal{});
    for (size_t i = 0; i < seqs.size(); ++i) {
      seen.push_back(seqs[i]);
      for (int j = 0; j < 5; ++j) {
        out[i].drafts.push_back(seqs[i].anchor == 99 && j == 2 ? -1 : seqs[i].anchor + 1 + j);
        out[i].confidences.push_back(0.9f - 0.1f * static_cast<float>(j));
      }
    }
  }
  int block_size() const override { return 5; }
};

TEST(DsparkProposer, OneBlockPerDraftingSequenceCutToItsBudget) {
  RecordingBlocks exec;
  DsparkProposer p(exec);
  EXPECT_EQ(p.name(), "dspark");
  const std::vector<int32_t> a = {1, 2, 3, 4}, b = {5, 6, 7}, c = {8, 9, 10, 11, 12}, d = {3, 99};
  const std::vector<int32_t> blocks_a = {7}, blocks_d = {2, 4};
  std::vector<ProposeSeq> seqs(4);
  seqs[0] = {a, 1, 3, blocks_a, 0, 3};    // decoding: drafts 3 of the block after token 4 at position 3
  seqs[1] = {b, 0, 2, {}, 0, 0};          // drafts nothing (max_drafts 0)
  seqs[2] = {c, 0, 3, {}, 0, 5};          // a prefill chunk: its last token is not the next one
  seqs[3] = {d, 0, 1, blocks_d, 0, 16};   // more drafts asked than the block has; draft 3 is no token
  std::vector<Proposal> out;
  p.propose(seqs, out);
  ASSERT_EQ(exec.seen.size(), 2u);
  EXPECT_EQ(exec.seen[0].anchor, 4);
  EXPECT_EQ(exec.seen[0].anchor_pos, 3);
  EXPECT_EQ(exec.seen[0].block_ids.data(), blocks_a.data());
  EXPECT_EQ(exec.seen[1].anchor, 99);
  EXPECT_EQ(exec.seen[1].anchor_pos, 1);
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0].drafts, (std::vector<int32_t>{5, 6, 7}));
  ASSERT_EQ(out[0].confidences.size(), 3u);
  EXPECT_FLOAT_EQ(out[0].confidences[2], 0.7f);
  EXPECT_TRUE(out[1].drafts.empty() && out[2].drafts.empty());
  EXPECT_EQ(out[3].drafts, (std::vector<int32_t>{100, 101}));
  EXPECT_EQ(out[3].confidences.size(), 2u);
}

class RecordingExecutor final : public MtpExecutor {
 public:
  struct Call {
    std::vector<MtpRows> rows;
    std::vector<std::vector<int32_t>> tokens;
    bool from_target;
    bool want_logits;
    bool tokens_from_previous;
  };
  struct Pass {
    std::vector<float> logits;
    std::vector<int32_t> ids;
    bool want_logits = false;
  };
  // Computes at submit (the pass's result waits in a queue, as on a device stream).
  void submit_mtp(std::span<const MtpRows> rows, bool from_target, bool want_logits,
                  bool tokens_from_previous) override {
    Call c{{rows.begin(), rows.end()}, {}, from_target, want_logits, tokens_from_previous};
    EXPECT_LT(pending.size(), 2u) << "more than two passes pending";
    int n = 0;
    for (const MtpRows& r : rows) {
      c.tokens.emplace_back(r.next_tokens.begin() + r.begin, r.next_tokens.begin() + r.begin + r.count);
      if (tokens_from_previous) {  // the device's token: the previous pass's draft of this row
        EXPECT_EQ(r.count, 1);
        c.tokens.back() = {last_ids.at(c.tokens.size() - 1)};
      }
      n += r.want_logits ? 1 : 0;
    }
    calls.push_back(std::move(c));
    // Row r's argmax: token 10 * call + r (or no token: nan_row).
    Pass p;
    p.logits.assign(static_cast<size_t>(n) * kVocab, 0.0f);
    for (int r = 0; r < n; ++r) {
      const int tok = static_cast<int>(10 * calls.size()) + r;
      p.logits[static_cast<size_t>(r) * kVocab + tok] = 5.0f;
      p.ids.push_back(static_cast<int>(calls.size()) == nan_call && r == 0 ? -1 : tok);
    }
    p.want_logits = want_logits;
    last_ids = p.ids;
    pending.push_back(std::move(p));
    max_pending = std::max(max_pending, pending.size());
  }
  MtpResult collect_mtp() override {
    done = std::move(pending.front());
    pending.pop_front();
    out = Tensor(done.logits.data(), DType::F32, {static_cast<int64_t>(done.ids.size()), kVocab});
    MtpResult res;
    res.tokens = done.ids;
    if (done.want_logits) res.logits = &out;
    return res;
  }
  int max_overlapped_rows() const override { return overlapped_rows; }
  int vocab_size() const override { return kVocab; }
  static constexpr int kVocab = 64;
  std::vector<Call> calls;
  std::deque<Pass> pending;
  Pass done;
  std::vector<int32_t> last_ids;
  size_t max_pending = 0;
  int overlapped_rows = 1024;
  Tensor out;
  int nan_call = -1;  // this call's row 0 has no token (a NaN row on the device)
};

TEST(MtpProposer, ExtendsVerifiedPositionsThenChains) {
  RecordingExecutor ex;
  MtpProposer p(ex);
  const std::vector<int32_t> a = {1, 2, 3, 4, 5};  // positions 2..3 computed, token 5 sampled
  const std::vector<int32_t> b = {7, 8, 9};        // a prefill chunk [0, 2): no drafts
  const std::vector<int32_t> blocks = {0};
  std::vector<ProposeSeq> seqs(2);
  seqs[0] = {a, 2, 4, blocks, 0, 3};
  seqs[1] = {b, 0, 2, blocks, 2, 0};
  std::vector<Proposal> out;
  p.propose(seqs, out);
  ASSERT_EQ(ex.calls.size(), 3u);  // extend, then drafts 2 and 3
  // Extend: rows (h_p, t_{p+1}) for the verified positions; hidden from the target step.
  EXPECT_TRUE(ex.calls[0].from_target);
  EXPECT_EQ(ex.calls[0].tokens[0], (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(ex.calls[0].rows[0].begin, 2);
  EXPECT_TRUE(ex.calls[0].rows[0].want_logits);
  EXPECT_EQ(ex.calls[0].tokens[1], (std::vector<int32_t>{8, 9}));
  EXPECT_FALSE(ex.calls[0].rows[1].want_logits);
  EXPECT_EQ(ex.calls[0].rows[1].hidden_row, 2);
  // Chain: one row at the next position, the previous draft as its token, hidden from the
  // previous call's row.
  EXPECT_FALSE(ex.calls[1].from_target);
  EXPECT_EQ(ex.calls[1].rows[0].begin, 4);
  // Draft 2 chains on the output of sequence 0's last row of the first call (its token row
  // 1 of 0..3), not on logits row 0; later calls have one row per sequence.
  EXPECT_EQ(ex.calls[1].rows[0].hidden_row, 1);
  EXPECT_EQ(ex.calls[2].rows[0].hidden_row, 0);
  EXPECT_EQ(ex.calls[1].tokens[0], (std::vector<int32_t>{10}));
  EXPECT_EQ(ex.calls[2].rows[0].begin, 5);
  EXPECT_EQ(ex.calls[2].tokens[0], (std::vector<int32_t>{20}));
  EXPECT_EQ(out[0].drafts, (std::vector<int32_t>{10, 20, 30}));
  // Confidences on (the default): the logits came to the host for each call, and each
  // confidence is the draft's softmax probability e^5 / (e^5 + 63).
  for (const auto& c : ex.calls) EXPECT_TRUE(c.want_logits);
  ASSERT_EQ(out[0].confidences.size(), 3u);
  for (float c : out[0].confidences) EXPECT_NEAR(c, std::exp(5.0) / (std::exp(5.0) + 63), 1e-6);
  EXPECT_TRUE(out[1].drafts.empty());
}

TEST(MtpProposer, WithoutConfidencesNoLogitsAreAskedFor) {
  RecordingExecutor ex;
  MtpProposer p(ex, /*confidences=*/false);
  const std::vector<int32_t> a = {1, 2, 3, 4, 5};
  const std::vector<int32_t> blocks = {0};
  std::vector<ProposeSeq> seqs = {{a, 3, 4, blocks, 0, 3}};
  std::vector<Proposal> out;
  p.propose(seqs, out);
  ASSERT_EQ(ex.calls.size(), 3u);
  for (const auto& c : ex.calls) EXPECT_FALSE(c.want_logits);
  EXPECT_EQ(out[0].drafts, (std::vector<int32_t>{10, 20, 30}));
  EXPECT_TRUE(out[0].confidences.empty());
}

TEST(MtpProposer, ARowWithoutATokenEndsThatSequencesDrafts) {
  RecordingExecutor ex;
  ex.nan_call = 2;  // the second call's row 0 (sequence 0's draft 2) is a NaN row
  MtpProposer p(ex, false);
  const std::vector<int32_t> a = {1, 2, 3, 4, 5}, b = {6, 7, 8};
  const std::vector<int32_t> blocks = {0};
  // Sequence 0 extends 2 rows (positions 2, 3), sequence 1 one (position 1).
  std::vector<ProposeSeq> seqs = {{a, 2, 4, blocks, 0, 3}, {b, 1, 2, blocks, 2, 3}};
  std::vector<Proposal> out;
  p.propose(seqs, out);
  ASSERT_EQ(ex.calls.size(), 3u);
  EXPECT_EQ(ex.calls[1].rows[0].hidden_row, 1);  // sequence 0's last row of call 1
  EXPECT_EQ(ex.calls[1].rows[1].hidden_row, 2);  // sequence 1's row (call 1's token row 2)
  // The chain was issued before the NaN was read: sequence 0 stays in it (its token the
  // device's no-token id), its later drafts are dropped.
  ASSERT_EQ(ex.calls[2].rows.size(), 2u);
  EXPECT_EQ(ex.calls[2].tokens[0], (std::vector<int32_t>{-1}));
  EXPECT_EQ(ex.calls[2].rows[1].hidden_row, 1);
  EXPECT_EQ(out[0].drafts, (std::vector<int32_t>{10}));          // stopped at the NaN row
  EXPECT_EQ(out[1].drafts, (std::vector<int32_t>{11, 21, 31}));
}

// Sequences draft in order of drafts wanted, so each chained pass is a prefix of the one
// before; chained passes take their tokens on the device and each is issued before the host
// reads the previous one (two pending), unless two passes' logits do not fit the host.
TEST(MtpProposer, ChainedPassesTakeTokensOnTheDeviceAndOverlap) {
  for (int overlapped_rows : {1024, 1}) {
    RecordingExecutor ex;
    ex.overlapped_rows = overlapped_rows;
    MtpProposer p(ex);
    const std::vector<int32_t> a = {1, 2, 3}, b = {4, 5, 6}, c = {7, 8, 9};
    const std::vector<int32_t> blocks = {0};
    // One verified position each (1: token 2 is the last sampled); 1, 3 and 2 drafts wanted.
    std::vector<ProposeSeq> seqs = {{a, 1, 2, blocks, 0, 1}, {b, 1, 2, blocks, 1, 3}, {c, 1, 2, blocks, 2, 2}};
    std::vector<Proposal> out;
    p.propose(seqs, out);
    ASSERT_EQ(ex.calls.size(), 3u);
    EXPECT_EQ(ex.calls[0].rows[0].hidden_row, 1);  // b first
    EXPECT_EQ(ex.calls[0].rows[1].hidden_row, 2);  // then c, then a
    EXPECT_EQ(ex.calls[1].rows.size(), 2u);        // drafts 2: b and c
    EXPECT_EQ(ex.calls[2].rows.size(), 1u);        // draft 3: b
    EXPECT_FALSE(ex.calls[0].tokens_from_previous);
    EXPECT_TRUE(ex.calls[1].tokens_from_previous && ex.calls[2].tokens_from_previous);
    EXPECT_EQ(ex.calls[1].tokens[1], (std::vector<int32_t>{11}));  // c's draft 1
    EXPECT_EQ(ex.calls[1].rows[0].begin, 2);
    EXPECT_EQ(ex.calls[2].rows[0].begin, 3);
    EXPECT_EQ(out[1].drafts, (std::vector<int32_t>{10, 20, 30}));
    EXPECT_EQ(out[2].drafts, (std::vector<int32_t>{11, 21}));
    EXPECT_EQ(out[0].drafts, (std::vector<int32_t>{12}));
    EXPECT_EQ(out[2].confidences.size(), 2u);
    EXPECT_EQ(ex.max_pending, overlapped_rows >= 3 ? 2u : 1u);
  }
}

TEST(MtpProposer, SoftmaxProbabilityOfAToken) {
  const float logits[4] = {0.0f, 2.0f, 2.0f, -1.0f};
  EXPECT_NEAR(softmax_probability(logits, 4, 1), std::exp(2.0) / (1 + 2 * std::exp(2.0) + std::exp(-1.0)), 1e-6);
  // Only the first `vocab` columns count (the engine's sample_vocab).
  EXPECT_NEAR(softmax_probability(logits, 2, 1), std::exp(2.0) / (1 + std::exp(2.0)), 1e-6);
  EXPECT_THROW(softmax_probability(logits, 4, 4), std::exception);
}

}  // namespace
}  // namespace deepinfer

namespace deepinfer {
namespace {

// A table of b = 1, 2, 4 sequences and q = 1..3 tokens per sequence, rows `per_batch`.
SpecStepTimes table(std::vector<std::vector<double>> per_batch, std::vector<int> batches = {1, 2, 4}) {
  SpecStepTimes t;
  t.batches = batches;
  t.max_tokens_per_seq = static_cast<int>(per_batch[0].size());
  for (const auto& row : per_batch) t.verify_s.insert(t.verify_s.end(), row.begin(), row.end());
  return t;
}

// Expected emitted tokens of a plan (1 + the survivals of its verified drafts per request).
double tau_of(const std::vector<std::vector<float>>& conf, const std::vector<int>& lengths) {
  double tau = 0;
  for (size_t r = 0; r < conf.size(); ++r) {
    double a = 1;
    tau += 1;
    for (int j = 0; j < lengths[r]; ++j) tau += a *= conf[r][static_cast<size_t>(j)];
  }
  return tau;
}

TEST(VerifySchedule, StepCostInterpolatesTheMeasuredShapes) {
  SpecStepTimes t = table({{1.0, 2.0, 3.0}, {2.0, 3.0, 5.0}, {4.0, 6.0, 8.0}});
  const StepCost c(t);
  EXPECT_DOUBLE_EQ(c.verify_seconds(2, 2.0), 3.0);
  EXPECT_DOUBLE_EQ(c.verify_seconds(3, 1.0), 3.0);   // between batches 2 and 4
  EXPECT_DOUBLE_EQ(c.verify_seconds(2, 2.5), 4.0);   // between 2 and 3 tokens per sequence
  EXPECT_DOUBLE_EQ(c.verify_seconds(6, 1.0), 6.0);   // beyond the last batch: from the last two
  EXPECT_DOUBLE_EQ(c.verify_seconds(1, 4.0), 4.0);   // beyond the last q: from the last two
  EXPECT_DOUBLE_EQ(c.verify_seconds(1, 0.5), 1.0);
  const std::vector<int> uniform = {1, 1}, mixed = {2, 0};
  EXPECT_DOUBLE_EQ(c.step_seconds(uniform), 3.0);
  EXPECT_DOUBLE_EQ(c.step_seconds(mixed), 3.0);  // no mixed_s (the CPU): as its mean length
  EXPECT_DOUBLE_EQ(c.decode_seconds(4, true), 4.0);  // no decode_ahead_s: the measured step
  EXPECT_DOUBLE_EQ(c.draft_seconds(4, 3), 0.0);      // no MTP passes (n-gram)
  t.mixed_s = {3.0, 6.0, 9.0};  // eager: 1 more than uniform at 3 tokens per sequence
  t.decode_ahead_s = {0.5, 1.0, 2.0};
  t.mtp_first_s = {0.2, 0.3, 0.4};
  t.mtp_chain_s = {0.1, 0.1, 0.2};
  const StepCost e(t);
  EXPECT_DOUBLE_EQ(e.step_seconds(mixed), 4.0);
  EXPECT_DOUBLE_EQ(e.step_seconds(uniform), 3.0);
  EXPECT_DOUBLE_EQ(e.decode_seconds(4, true), 2.0);
  EXPECT_DOUBLE_EQ(e.decode_seconds(4, false), 4.0);
  EXPECT_DOUBLE_EQ(e.draft_seconds(4, 3), 0.4 + 2 * 0.2);
  EXPECT_DOUBLE_EQ(e.draft_seconds(4, 0), 0.0);
  // Inconsistent tables are errors naming the field.
  SpecStepTimes bad = t;
  bad.batches = {1, 4, 2};
  EXPECT_THROW(StepCost{bad}, std::exception);
  bad = t;
  bad.verify_s.pop_back();
  EXPECT_THROW(StepCost{bad}, std::exception);
  bad = t;
  bad.mtp_chain_s.clear();
  EXPECT_THROW(StepCost{bad}, std::exception);
  bad = t;
  bad.decode_ahead_s[1] = 0.0;
  EXPECT_THROW(StepCost{bad}, std::exception);
  bad = t;
  bad.mtp_first_s[1] = 0.0;
  EXPECT_THROW(StepCost{bad}, std::exception);
  // A block drafter (DSpark): the block forward costs what it costs whatever the depth.
  SpecStepTimes block = t;
  block.mtp_chain_s = {0.0, 0.0, 0.0};
  EXPECT_DOUBLE_EQ(StepCost(block).draft_seconds(4, 5), StepCost(block).draft_seconds(4, 1));
  block.mtp_chain_s[0] = -0.1;
  EXPECT_THROW(StepCost{block}, std::exception);
}

TEST(VerifySchedule, FlatStepTimeVerifiesEveryDraftSteepOneVerifiesNone) {
  const std::vector<std::vector<float>> conf = {{0.9f, 0.8f}, {0.3f, 0.9f}};
  // Step time independent of tokens: every admission raises expected tokens per second.
  EXPECT_EQ(schedule_verify_lengths(conf, StepCost(table({{1, 1, 1}, {1, 1, 1}, {1, 1, 1}}))),
            (std::vector<int>{2, 2}));
  // Step time proportional to tokens: a draft (survival < 1) never pays for its token.
  EXPECT_EQ(schedule_verify_lengths(conf, StepCost(table({{1, 2, 3}, {2, 4, 6}, {4, 8, 12}}))),
            (std::vector<int>{0, 0}));
  // No table: every draft is verified.
  EXPECT_EQ(schedule_verify_lengths(conf, StepCost()), (std::vector<int>{2, 2}));
}

// Where a step of mixed lengths costs what its tokens do (the CPU), the confident request
// alone verifies its drafts; where it runs eagerly and costs more (CUDA graphs only for
// uniform steps), the best plan is uniform, here no drafts at all.
TEST(VerifySchedule, MixedLengthsOnlyWhereTheTableSaysTheyPay) {
  const std::vector<std::vector<float>> conf = {{0.9f, 0.9f}, {0.1f, 0.1f}};
  SpecStepTimes t = table({{1.0, 1.25, 1.5}, {1.0, 1.5, 2.0}, {2.0, 3.0, 4.0}});
  EXPECT_EQ(schedule_verify_lengths(conf, StepCost(t)), (std::vector<int>{2, 0}));
  t.mixed_s = {1.5, 3.0, 5.0};
  EXPECT_EQ(schedule_verify_lengths(conf, StepCost(t)), (std::vector<int>{0, 0}));
  // Both confident: the uniform plan of two drafts each wins either way.
  const std::vector<std::vector<float>> sure = {{0.95f, 0.95f}, {0.95f, 0.95f}};
  EXPECT_EQ(schedule_verify_lengths(sure, StepCost(t)), (std::vector<int>{2, 2}));
}

// The chooser is the argmax of expected tokens x steps per second over every plan (every
// l_r in 0..k_r), for any table: checked by enumeration on pseudo-random instances.
TEST(VerifySchedule, ChoosesTheBestOfEveryPlan) {
  uint64_t x = 12345;
  auto next = [&] {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>(x >> 11) / static_cast<double>(1ull << 53);
  };
  for (int trial = 0; trial < 200; ++trial) {
    SpecStepTimes t;
    t.batches = {1, 2, 4};
    t.max_tokens_per_seq = 4;
    for (int b = 0; b < 3; ++b) {
      double s = 0.5 + next();
      for (int q = 0; q < 4; ++q) t.verify_s.push_back(s += next() * (b + 1));
    }
    if (trial % 2) t.mixed_s = {t.verify_s[3] * (1 + next()), t.verify_s[7] * (1 + next()), t.verify_s[11] * (1 + next())};
    const StepCost cost(t);
    const int n = 1 + trial % 3;
    std::vector<std::vector<float>> conf(static_cast<size_t>(n));
    for (auto& c : conf) {
      c.resize(static_cast<size_t>(trial / 3 % 4));
      for (float& v : c) v = static_cast<float>(next());
    }
    const std::vector<int> chosen = schedule_verify_lengths(conf, cost);
    const double got = tau_of(conf, chosen) / cost.step_seconds(chosen);
    double best = 0;
    std::vector<int> plan(static_cast<size_t>(n), 0);
    for (;;) {
      best = std::max(best, tau_of(conf, plan) / cost.step_seconds(plan));
      size_t r = 0;
      while (r < plan.size() && plan[r] == static_cast<int>(conf[r].size())) plan[r++] = 0;
      if (r == plan.size()) break;
      ++plan[r];
    }
    EXPECT_NEAR(got, best, 1e-12 * best) << "trial " << trial;
    for (int r = 0; r < n; ++r) EXPECT_LE(chosen[static_cast<size_t>(r)], static_cast<int>(conf[static_cast<size_t>(r)].size()));
  }
}

// Before drafting: the depth that maximises expected tokens per second with the drafting
// itself paid for; 0 (draft nothing, run as k = 0) where drafting does not pay.
TEST(VerifySchedule, DraftDepthFallsBackToZeroWhereDraftingDoesNotPay) {
  // A launch-bound model: at batch 1 a verify step of 4 tokens costs what a decode does; at
  // batch 64 it costs 1.9x, decode steps issued ahead cost 0.8x, and each MTP pass 0.5x.
  SpecStepTimes t;
  t.batches = {1, 64};
  t.max_tokens_per_seq = 4;
  t.verify_s = {1.0, 1.0, 1.0, 1.0, 1.0, 1.3, 1.6, 1.9};
  t.decode_ahead_s = {0.8, 0.8};
  t.mtp_first_s = {0.05, 0.5};
  t.mtp_chain_s = {0.05, 0.5};
  const StepCost cost(t);
  const std::vector<double> high = {0.95, 0.9, 0.85}, none = {0.0, 0.0, 0.0};
  EXPECT_EQ(choose_draft_depth(high, 1, 3, cost, true), 3);
  EXPECT_EQ(choose_draft_depth(high, 64, 3, cost, true), 0);  // best (1 + 1.85) / 2.6 < 1 / 0.8
  EXPECT_EQ(choose_draft_depth(none, 1, 3, cost, true), 0);
  EXPECT_EQ(choose_draft_depth(high, 1, 2, cost, true), 2);   // max_depth caps it
  // Without asynchronous scheduling k = 0 pays 1.0 at batch 64: two drafts (2.85 / 2.6) pay.
  EXPECT_EQ(choose_draft_depth(high, 64, 3, cost, false), 2);
  EXPECT_EQ(choose_draft_depth(high, 64, 3, StepCost(), true), 3);  // no table: always k
  // A required gain: two drafts promise 1.096x over k = 0 (without ahead), not 1.1x.
  EXPECT_EQ(choose_draft_depth(high, 64, 3, cost, false, 1.1), 0);
  EXPECT_EQ(choose_draft_depth(high, 1, 3, cost, true, 1.1), 3);
}

}  // namespace
}  // namespace deepinfer
