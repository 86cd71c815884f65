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
  };
  const Tensor& run_mtp(std::span<const MtpRows> rows, bool from_target) override {
    Call c{{rows.begin(), rows.end()}, {}, from_target};
    int n = 0;
    for (const MtpRows& r : rows) {
      c.tokens.emplace_back(r.next_tokens.begin() + r.begin, r.next_tokens.begin() + r.begin + r.count);
      n += r.want_logits ? 1 : 0;
    }
    calls.push_back(std::move(c));
    // Row r's argmax: token 10 * call + r.
    logits.assign(static_cast<size_t>(n) * kVocab, 0.0f);
    for (int r = 0; r < n; ++r) logits[static_cast<size_t>(r) * kVocab + 10 * calls.size() + r] = 5.0f;
    out = Tensor(logits.data(), DType::F32, {n, kVocab});
    return out;
  }
  int vocab_size() const override { return kVocab; }
  static constexpr int kVocab = 64;
  std::vector<Call> calls;
  std::vector<float> logits;
  Tensor out;
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
  EXPECT_EQ(ex.calls[1].tokens[0], (std::vector<int32_t>{10}));
  EXPECT_EQ(ex.calls[2].rows[0].begin, 5);
  EXPECT_EQ(ex.calls[2].tokens[0], (std::vector<int32_t>{20}));
  EXPECT_EQ(out[0].drafts, (std::vector<int32_t>{10, 20, 30}));
  ASSERT_EQ(out[0].confidences.size(), 3u);
  EXPECT_GT(out[0].confidences[0], 0.5f);
  EXPECT_TRUE(out[1].drafts.empty());
}

TEST(MtpProposer, TopTokenIsArgmaxAndSoftmaxProbability) {
  const float logits[4] = {0.0f, 2.0f, 2.0f, -1.0f};
  auto [tok, p] = top_token(logits, 4);
  EXPECT_EQ(tok, 1);  // lowest id on ties
  EXPECT_NEAR(p, std::exp(2.0) / (1 + 2 * std::exp(2.0) + std::exp(-1.0)), 1e-6);
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
