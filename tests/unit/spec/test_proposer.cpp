// NgramProposer lookup rules and MtpProposer's row plan (against a recording executor).
#include <gtest/gtest.h>

#include <cmath>

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

class RecordingExecutor final : public MtpExecutor {
 public:
  struct Call {
    std::vector<MtpRows> rows;
    std::vector<std::vector<int32_t>> tokens;
    bool from_target;
    bool want_logits;
  };
  MtpResult run_mtp(std::span<const MtpRows> rows, bool from_target, bool want_logits) override {
    Call c{{rows.begin(), rows.end()}, {}, from_target, want_logits};
    int n = 0;
    for (const MtpRows& r : rows) {
      c.tokens.emplace_back(r.next_tokens.begin() + r.begin, r.next_tokens.begin() + r.begin + r.count);
      n += r.want_logits ? 1 : 0;
    }
    calls.push_back(std::move(c));
    // Row r's argmax: token 10 * call + r (or no token: nan_row).
    logits.assign(static_cast<size_t>(n) * kVocab, 0.0f);
    ids.clear();
    for (int r = 0; r < n; ++r) {
      const int tok = static_cast<int>(10 * calls.size()) + r;
      logits[static_cast<size_t>(r) * kVocab + tok] = 5.0f;
      ids.push_back(static_cast<int>(calls.size()) == nan_call && r == 0 ? -1 : tok);
    }
    out = Tensor(logits.data(), DType::F32, {n, kVocab});
    MtpResult res;
    res.tokens = ids;
    if (want_logits) res.logits = &out;
    return res;
  }
  int vocab_size() const override { return kVocab; }
  static constexpr int kVocab = 64;
  std::vector<Call> calls;
  std::vector<float> logits;
  std::vector<int32_t> ids;
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
  EXPECT_EQ(ex.calls[2].rows[0].hidden_row, 1);  // sequence 1 was call 2's row 1
  EXPECT_EQ(out[0].drafts, (std::vector<int32_t>{10}));          // stopped at the NaN row
  EXPECT_EQ(out[1].drafts, (std::vector<int32_t>{11, 21, 30}));  // chains on (row 0 of call 3)
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

TEST(VerifySchedule, FlatStepTimeVerifiesEveryDraftSteepOneVerifiesNone) {
  const std::vector<std::vector<float>> conf = {{0.9f, 0.8f, 0.5f}, {0.3f, 0.9f}};
  // Step time independent of tokens: every admission raises expected tokens per second.
  EXPECT_EQ(schedule_verify_lengths(conf, StepTimeTable({1, 64}, {1.0, 1.0})), (std::vector<int>{3, 2}));
  // Step time proportional to tokens: a draft (survival < 1) never pays for its token.
  EXPECT_EQ(schedule_verify_lengths(conf, StepTimeTable({1, 64}, {1.0, 64.0})), (std::vector<int>{0, 0}));
}

TEST(VerifySchedule, AdmitsByChainSurvivalAndKeepsTheBestPrefix) {
  // 2 requests, step time 1.0 up to 3 tokens, then 10: only one draft fits before the
  // jump; it goes to the request with the higher survival (0.9 > 0.6), and the second
  // request's 0.6 is not worth the jump.
  const std::vector<std::vector<float>> conf = {{0.6f, 0.99f}, {0.9f, 0.1f}};
  const StepTimeTable t({1, 3, 4}, {1.0, 1.0, 10.0});
  EXPECT_EQ(schedule_verify_lengths(conf, t), (std::vector<int>{0, 1}));
  EXPECT_DOUBLE_EQ(t.seconds(2), 1.0);
  EXPECT_DOUBLE_EQ(t.seconds(5), 19.0);  // extrapolated from the last two points
  EXPECT_THROW(StepTimeTable({4, 2}, {1.0, 2.0}), std::exception);
}

}  // namespace
}  // namespace deepinfer
