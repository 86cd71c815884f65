// Speculative decoding with DeepSeek-V4.1's DSpark drafter (model/deepseek_v41/dspark.h) on the CPU
// backend: a tiny random V4.1 with its drafter (tests/golden/fixtures/v41_dspark/config.json: 4 layers,
// window 8, 3 drafter stages, block of 5, Markov and confidence heads), a batch of four prompts of
// 9-60 tokens prefilled in chunks of 16, gives bitwise the tokens and logprobs of k = 0 with drafts
// verified at fixed lengths and at lengths scheduled from the confidence head, greedy and seeded
// sampling. The drafter's context rows are written by the target's steps (verify steps included):
// only rows before a block's anchor are read, so rejected drafts leave nothing that is read.
#include <gtest/gtest.h>

#include "deepinfer/engine.h"
#include "tests/unit/spec/spec_fixture.h"

namespace deepinfer {
namespace {

using spec_test::expect_same;

const std::string kConfig = std::string(DEEPINFER_SOURCE_DIR) + "/tests/golden/fixtures/v41_dspark/config.json";

EngineConfig config(int k, int varlen = 0) {
  EngineConfig c;
  c.random_weights_config = kConfig;
  c.random_weights_seed = 11;
  c.num_threads = 2;
  c.kv_block_size = 16;
  c.max_model_len = 160;
  c.max_num_batched_tokens = 16;  // prompts prefill in chunks
  c.num_speculative_tokens = k;
  c.spec_varlen = varlen;
  return c;
}

std::vector<RequestOutput> run(const EngineConfig& c, const std::vector<SamplingParams>& sp,
                               EngineStats* stats = nullptr) {
  return spec_test::run(c, spec_test::token_prompts({20, 37, 60, 9}, 7, 3, 60), sp, stats);
}

SamplingParams params(float temperature, uint64_t seed) { return spec_test::seeded(temperature, seed, 20); }

TEST(SpecEngineV41Dspark, GreedyAndSeededSamplingEqualNoSpeculation) {
  std::vector<SamplingParams> sp = {params(0, 0), params(0.8f, 101), params(0, 0), params(1.0f, 103)};
  const auto base = run(config(0), sp);
  for (int k : {5, 2}) {
    EngineStats st;
    expect_same(base, run(config(k), sp, &st), "k=" + std::to_string(k));
    EXPECT_EQ(st.num_speculative_tokens, k);
    EXPECT_GT(st.spec.num_draft_tokens, 0) << "k=" << k;  // the drafter drafted, the target verified
    // Fixed lengths: blocks of k drafts (the block of 5 cut to k) were verified.
    EXPECT_EQ(st.spec.drafts_per_position.size(), static_cast<size_t>(k)) << "k=" << k;
  }
  // Lengths scheduled from the confidence head's confidences.
  EngineStats st;
  expect_same(base, run(config(5, 1), sp, &st), "k=5 scheduled");
}

}  // namespace
}  // namespace deepinfer
