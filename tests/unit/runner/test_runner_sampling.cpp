// Runner::submit with sample_rows on the CPU backend: the tokens are Backend::sample's over
// the step's logits (the rule of backend/sample_rule.h per row), a second step fed from the
// first one's sampled tokens on the device equals running it after they are known, and
// sample_rows that do not fit the step are errors.
#include <gtest/gtest.h>

#include "backend/sample_rule.h"
#include "runner_fixture.h"

namespace deepinfer {
namespace {

std::vector<SampleRowParams> rows_at(uint64_t pos_a, uint64_t pos_b) {
  std::vector<SampleRowParams> rows(2);
  rows[0].temperature = 0.9f, rows[0].top_p = 0.8f, rows[0].seed = 5, rows[0].position = pos_a;
  rows[1].temperature = 1.5f, rows[1].top_k = 7, rows[1].seed = 6, rows[1].stream = 1,
  rows[1].position = pos_b;
  return rows;
}

TEST(RunnerSampling, SampledTokensAreTheRuleOverTheLogitsAndFeedTheNextStep) {
  std::vector<int32_t> a = {4, 8, 15, 16, 23}, b = {42, 7, 3};

  // Reference: logits step, the rule on the host, then the next step with known tokens.
  std::vector<int32_t> want1, want2;
  {
    Fixture f;
    Runner* runner = f.runner.get();
    std::vector<RunSeq> s1 = {{a, 0, 5, kBlocksA, true}, {b, 0, 3, kBlocksB, true}};
    const Tensor& logits = runner->execute(s1);
    const auto rows = rows_at(5, 3);
    for (int r = 0; r < 2; ++r)
      want1.push_back(sample_rule::sample_row(logits.ptr<float>() + r * kVocab, kVocab, rows[r]));
    std::vector<int32_t> a2 = a, b2 = b;
    a2.push_back(want1[0]);
    b2.push_back(want1[1]);
    std::vector<RunSeq> s2 = {{a2, 5, 1, kBlocksA, true}, {b2, 3, 1, kBlocksB, true}};
    const Tensor& logits2 = runner->execute(s2);
    const auto rows2 = rows_at(6, 4);
    for (int r = 0; r < 2; ++r)
      want2.push_back(sample_rule::sample_row(logits2.ptr<float>() + r * kVocab, kVocab, rows2[r]));
  }

  Fixture f;
  Runner* runner = f.runner.get();
  std::vector<RunSeq> s1 = {{a, 0, 5, kBlocksA, true}, {b, 0, 3, kBlocksB, true}};
  const auto rows1 = rows_at(5, 3);
  const auto short_rows = std::vector<SampleRowParams>(1);
  EXPECT_THROW(runner->submit(s1, true, false, short_rows), Error);  // one entry per row
  EXPECT_THROW(runner->submit(s1, false, false, rows1), Error);     // logits step
  runner->submit(s1, true, false, rows1);
  a.push_back(-1);  // placeholders: step 2's tokens come from step 1's sampled ids
  b.push_back(-1);
  std::vector<RunSeq> s2 = {{a, 5, 1, kBlocksA, true}, {b, 3, 1, kBlocksB, true}};
  runner->submit(s2, true, /*tokens_from_previous=*/true, rows_at(6, 4));
  EXPECT_EQ(runner->collect_argmax(), want1);
  EXPECT_EQ(runner->collect_argmax(), want2);
}

}  // namespace
}  // namespace deepinfer
