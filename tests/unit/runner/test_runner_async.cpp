// Runner::submit / collect on the CPU backend with the engine tests' FakeModel (its
// logits hash every cached token read back through the block table): two steps in
// flight, the second taking its tokens from the first one's argmax on the device, give
// the same ids as running each step after the last one's tokens are known.
#include <gtest/gtest.h>

#include "runner_fixture.h"

namespace deepinfer {
namespace {

// Three greedy steps (a prefill, two decodes) run one at a time; returns each step's ids.
std::vector<std::vector<int32_t>> run_sync(std::vector<int32_t> a, std::vector<int32_t> b) {
  Fixture f;
  std::vector<std::vector<int32_t>> out;
  int done_a = 0, done_b = 0;
  for (int step = 0; step < 3; ++step) {
    std::vector<RunSeq> seqs = {
        {a, done_a, static_cast<int>(a.size()) - done_a, kBlocksA, true},
        {b, done_b, static_cast<int>(b.size()) - done_b, kBlocksB, true}};
    out.push_back(f.runner->execute_argmax(seqs));
    done_a = static_cast<int>(a.size());
    done_b = static_cast<int>(b.size());
    a.push_back(out.back()[0]);
    b.push_back(out.back()[1]);
  }
  return out;
}

TEST(RunnerAsync, StepFedFromPreviousArgmaxEqualsSyncSteps) {
  const std::vector<int32_t> a0 = {4, 8, 15, 16, 23}, b0 = {42, 7, 3};
  const auto want = run_sync(a0, b0);
  // The reference must depend on the fed tokens, or this test could not fail.
  ASSERT_NE(want[1], run_sync({4, 8, 15, 16, 24}, b0)[1]);

  Fixture f;
  std::vector<int32_t> a = a0, b = b0;
  std::vector<RunSeq> s1 = {{a, 0, 5, kBlocksA, true}, {b, 0, 3, kBlocksB, true}};
  f.runner->submit(s1, true);
  a.push_back(-1);  // placeholders: step 2's tokens come from step 1's argmax
  b.push_back(-1);
  std::vector<RunSeq> s2 = {{a, 5, 1, kBlocksA, true}, {b, 3, 1, kBlocksB, true}};
  f.runner->submit(s2, true, /*tokens_from_previous=*/true);
  EXPECT_EQ(f.runner->num_in_flight(), 2);
  EXPECT_THROW(f.runner->submit(s2, true, true), Error);  // a third in flight
  const std::vector<int32_t> got1 = f.runner->collect_argmax();
  EXPECT_EQ(got1, want[0]);
  a.back() = got1[0];
  b.back() = got1[1];
  a.push_back(-1);
  b.push_back(-1);
  std::vector<RunSeq> s3 = {{a, 6, 1, kBlocksA, true}, {b, 4, 1, kBlocksB, true}};
  f.runner->submit(s3, true, true);
  EXPECT_EQ(f.runner->collect_argmax(), want[1]);
  EXPECT_EQ(f.runner->collect_argmax(), want[2]);
  EXPECT_EQ(f.runner->num_in_flight(), 0);
}

TEST(RunnerAsync, MisuseThrows) {
  Fixture f;
  const std::vector<int32_t> a = {4, 8, 15};
  std::vector<RunSeq> prefill = {{a, 0, 3, kBlocksA, true}};
  EXPECT_THROW(f.runner->submit(prefill, true, true), Error);  // nothing to feed from
  EXPECT_THROW(f.runner->collect_argmax(), Error);              // nothing in flight
  f.runner->submit(prefill, false);
  EXPECT_THROW(f.runner->collect_argmax(), Error);              // a logits step
  EXPECT_THROW(f.runner->submit(prefill, false), Error);        // two logits steps
  const Tensor& logits = f.runner->collect_logits();
  EXPECT_EQ(logits.size(0), 1);
  EXPECT_EQ(logits.size(1), kVocab);
  std::vector<RunSeq> too_many(5, prefill[0]);
  EXPECT_THROW(f.runner->submit(too_many, true), Error);
}

}  // namespace
}  // namespace deepinfer
